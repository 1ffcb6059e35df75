"""THE ISOLATION MATRIX: every URL pattern and websocket route, tried as every persona.

The endpoint list is built from the URL configuration itself (`get_resolver()`, includes walked), so a new
endpoint is in the matrix the moment it is routed. Each pattern's path parameters are filled from a registry
keyed by parameter name, built from two tenants' fixtures (tests/tenancy/access_world.py); a parameter the
registry cannot fill fails the test with the pattern's name, and so does a view that declares no access rule
(`bw_access`, left by the decorators of tenancy.access), so nothing new can slip past unexamined.

Personas: operator (staff), an acme member, a globex member, a signed-in user with no role, anonymous; and
for /api/ routes the acme token, an operator token and a collector token. What each must get:

- anonymous: never a 200 with data; the login redirect (pages) or 401 (API, Dash XHRs);
- operator-only endpoints: the operator 200 (or 405 on GET for POST-only ones; their POSTs are tried
  separately); everyone else 403;
- tenant endpoints: acme's own objects 200 for acme, globex's objects 403/404 (never 200), the operator 200;
- collector endpoints (ingest): only collector tokens; API tokens 403 `api_token`, sessions 401;
- every response to acme (member or token) is searched for globex's marker strings (job name, invoice
  number, GPU UUID, alert name, hostname): none may appear.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import product
from urllib.parse import unquote

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.test import override_settings
from django.urls import URLPattern, URLResolver, get_resolver
from django_plotly_dash.dash_wrapper import all_apps

from alerts.models import AgentCommand
from core.models import AuditEntry
from dashboard.access import tenant_app
from tenancy.models import Invoice
from tests.alerts import test_pages
from tests.conftest import FIXED_NOW
from tests.tenancy.access_world import make_personas, make_tenant_world, session_cookie

data = test_pages.data  # rules, silences, channels, notifications, remediation actions (operator objects)

# Patterns left out of the matrix, and why.
SKIPPED = {
    r"^admin/": "Django's admin: its own staff-only login (is_staff); tenants' users are never staff",
    r"/(_dash-component-suites|assets)/": "Dash renderer JavaScript/CSS: the same files for every signed-in user, "
                                          "no cluster data",
    r"^django_plotly_dash/add_stateless_apps$": "django-plotly-dash's admin helper: registers app rows and "
                                                "redirects to the (staff-only) admin; it serves no data",
}
# Views anybody may open, by URL name, and why that is safe.
PUBLIC = {
    "login": "the sign-in form",
    "logout": "signing out (POST)",
    "oidc_authentication_init": "starts a login at the identity provider",
    "oidc_authentication_callback": "finishes a login at the identity provider",
    "oidc_logout": "signing out",
}
PARAM = re.compile(r"<(?:(?P<conv>\w+):)?(?P<name>\w+)>")


@dataclass(frozen=True)
class Endpoint:
    """One URL pattern: its full route, name, view and the access rule the view declares."""

    route: str
    name: str | None
    view: object

    @property
    def params(self) -> list[str]:
        return [m["name"] for m in PARAM.finditer(self.route)]

    @property
    def access(self) -> str | None:
        if self.name in PUBLIC:
            return "public"
        return getattr(self.view, "bw_access", None)

    @property
    def api(self) -> bool:
        return self.route.startswith("api/")

    def url(self, values: dict[str, str]) -> str:
        return "/" + PARAM.sub(lambda m: str(values[m["name"]]), self.route)


def endpoints(urlconf=None) -> list[Endpoint]:
    """Every URL pattern under the root URLconf, includes walked, in routing order."""
    def walk(patterns, prefix: str):
        for p in patterns:
            if isinstance(p, URLResolver):
                yield from walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern):
                yield Endpoint(prefix + str(p.pattern), p.name, p.callback)

    return list(walk(get_resolver(urlconf).url_patterns, ""))


def skip_reason(ep: Endpoint) -> str | None:
    return next((why for pattern, why in SKIPPED.items() if re.search(pattern, ep.route)), None)


# --- The registry: what fills each path parameter ---------------------------------------------------------

def dash_idents() -> list[str]:
    """Every registered Dash app (the URLconf imports dashboard.dash_apps, which registers them)."""
    get_resolver().url_patterns  # noqa: B018  (loads the URLconf, and with it the apps)
    return sorted(all_apps())


def build_registry(acme, globex, d) -> dict[str, dict[str, list]]:
    """Parameter name -> {"acme": values, "globex": values}; objects no tenant owns have the same value twice."""
    def owned(attr):
        return {"acme": [attr(acme)], "globex": [attr(globex)]}

    def shared(*values):
        return {"acme": list(values), "globex": list(values)}

    command = AgentCommand.objects.create(hostname=acme.node.hostname, command="gpu_reset", created_at=FIXED_NOW,
                                          expires_at=FIXED_NOW)
    return {
        "key": owned(lambda w: f"slurm:{w.job.external_id}"),
        "uuid": owned(lambda w: w.gpu.uuid),
        "hostname": owned(lambda w: w.node.hostname),
        "port_id": owned(lambda w: w.port.pk),
        "alert_id": owned(lambda w: w.alert.pk),
        "slug": owned(lambda w: w.slug),
        "number": owned(lambda w: w.invoice.number),
        "line_id": owned(lambda w: w.line.pk),
        "rule_id": shared(d["rule"].pk),
        "silence_id": shared(d["silence"].pk),
        "channel_id": shared(d["webhook"].pk),
        "notification_id": shared(d["note"].pk),
        "action_id": shared(d["awaiting"].pk),
        "command_id": shared(command.pk),
        "ident": shared(*dash_idents()),
        "cache_id": shared("c0ffee"),
        "kind": shared("gpus", "nodes", "racks"),
        "state": shared("failed"),
    }


def unfillable(eps: list[Endpoint], registry: dict) -> list[str]:
    """Patterns the matrix cannot try, each with what is missing."""
    problems = []
    for ep in eps:
        if skip_reason(ep):
            continue
        missing = [p for p in ep.params if not (registry.get(p, {}).get("acme") and registry[p].get("globex"))]
        if missing:
            problems.append(f"{ep.route} ({ep.name}): no registry entry for {', '.join(missing)}")
        if ep.access is None:
            problems.append(f"{ep.route} ({ep.name}): its view declares no access rule (decorate it with "
                            "tenancy.access.operator_required / tenant_member_required / api_view, or list it)")
    return problems


def variants(ep: Endpoint, registry: dict) -> list[tuple[str, dict]]:
    """(owner, parameter values): all acme's, all globex's, and acme's slug with globex's objects under it."""
    if not ep.params:
        return [("none", {})]
    out = []
    if all(registry[p]["acme"] == registry[p]["globex"] for p in ep.params):  # nobody's objects: try them once
        return [("none", dict(zip(ep.params, combo, strict=True)))
                for combo in product(*(registry[p]["acme"] for p in ep.params))]
    for owner in ("acme", "globex"):
        choices = [registry[p][owner] for p in ep.params]
        out += [(owner, dict(zip(ep.params, combo, strict=True))) for combo in product(*choices)]
    if "slug" in ep.params and len(ep.params) > 1:
        mixed = {p: registry[p]["acme" if p == "slug" else "globex"][0] for p in ep.params}
        out.append(("mixed", mixed))
    return out


# --- Expectations ---------------------------------------------------------------------------------------

def _login_redirect(resp) -> bool:
    return resp.status_code == 302 and resp["Location"].startswith("/login/")


def _dash(ep: Endpoint) -> bool:
    return ep.access == "dash"


def _effective(ep: Endpoint, values: dict) -> str:
    """A Dash route is a tenant's when it serves a portal app, else an operator's."""
    if _dash(ep):
        route_name = ep.name or ""
        return "tenant" if tenant_app(route_name, values.get("ident")) else "operator"
    return ep.access


def check_anonymous(ep, resp) -> str | None:
    if ep.access == "public":
        return None
    if ep.access == "collector":
        return None if resp.status_code in (401, 405) else f"anonymous got {resp.status_code}"
    if ep.api or _dash(ep):
        return None if resp.status_code == 401 else f"anonymous got {resp.status_code}, not 401"
    return None if _login_redirect(resp) else f"anonymous got {resp.status_code}, not the login redirect"


def check_member(ep, access, owner, persona, resp) -> str | None:
    """A tenant's member (persona "acme" or "globex"), or "nobody" (no role)."""
    code = resp.status_code
    if access in ("public",):
        return None
    if access == "collector":
        return None if code in (401, 405) else f"{persona} (session) got {code} on an ingest endpoint"
    if access == "operator" or persona == "nobody":
        return None if code == 403 else f"{persona} got {code}, not 403"
    own = owner in ("none", persona)
    if own:
        if code == 200 or (code == 302 and resp["Location"].startswith(f"/portal/{persona}")):
            return None
        return f"{persona} got {code} on its own object"
    return None if code in (403, 404) else f"{persona} got {code} on another tenant's object, not 403/404"


def check_operator(ep, access, owner, resp) -> str | None:
    code = resp.status_code
    if access in ("public", "collector"):
        return None
    if owner == "mixed":  # one tenant's slug with another's object: there is no such object under that tenant
        return None if code == 404 else f"operator got {code} for another tenant's object under a slug, not 404"
    if _dash(ep):  # Dash endpoints answer per method and body; only access is checked here
        return None if code not in (401, 403) and not _login_redirect(resp) else f"operator refused ({code})"
    return None if code in (200, 405) else f"operator got {code}, not 200 (or 405 for POST-only)"


def leaked(resp, markers: tuple[str, ...], url: str) -> list[str]:
    """Markers of the other tenant in a response (those the URL itself carries are an echo, not a leak)."""
    body = b"".join(resp) if getattr(resp, "streaming", False) else resp.content
    text = body.decode(errors="replace") + resp.get("Location", "")
    return [m for m in markers if m in text and m not in unquote(url)]


# --- The matrix -----------------------------------------------------------------------------------------

@pytest.fixture
def world(data):
    acme = make_tenant_world("acme", "1001")
    globex = make_tenant_world("globex", "2002")
    personas = make_personas(acme, globex)
    return {"acme": acme, "globex": globex, "personas": personas, "registry": build_registry(acme, globex, data)}


def test_every_url_pattern_is_classified_and_its_parameters_can_be_filled(world):
    eps = endpoints()
    assert len(eps) > 60, "the URL configuration was not walked"
    problems = unfillable(eps, world["registry"])
    assert not problems, "endpoints the isolation matrix cannot try:\n" + "\n".join(problems)


def test_a_new_endpoint_without_access_rule_or_registry_entry_fails_the_matrix(world):
    with override_settings(ROOT_URLCONF="tests.tenancy.isolation_extra_urls"):
        problems = unfillable(endpoints(), world["registry"])
    assert any("portal/<slug:slug>/widgets/<int:widget_id>/" in p and "widget_id" in p for p in problems)
    assert any("unmarked-report" in p and "no access rule" in p for p in problems)


def _session_matrix(ep, world, problems: list[str]) -> int:
    """Try one endpoint as every session persona; returns the number of requests made."""
    p, tried = world["personas"], 0
    for owner, values in variants(ep, world["registry"]):
        access, url = _effective(ep, values), ep.url(values)
        for persona in ("anonymous", "operator", "acme", "globex", "nobody"):
            resp = p.clients[persona].get(url, HTTP_ACCEPT="application/json")
            tried += 1
            if persona == "anonymous":
                why = check_anonymous(ep, resp)
            elif persona == "operator":
                why = check_operator(ep, access, owner, resp)
            else:
                why = check_member(ep, access, owner, persona, resp)
            other = {"acme": "globex", "globex": "acme"}.get(persona)
            leaks = leaked(resp, world[other].markers, url) if other else []
            if leaks:
                why = (why + "; " if why else "") + f"{persona} saw {other}'s {leaks}"
            if why:
                problems.append(f"GET {url} [{ep.name}, {access}, {owner}]: {why}")
    return tried


TOKEN_EXPECT = {
    # access -> token -> (statuses, error code or None)
    "operator": {"acme_token": ((403,), "forbidden"), "operator_token": ((200, 405), None),
                 "collector_token": ((403,), "collector_token")},
    "tenant": {"acme_token": ((200, 404), None), "operator_token": ((200,), None),
               "collector_token": ((403,), "collector_token")},
    "collector": {"acme_token": ((403,), "api_token"), "operator_token": ((403,), "api_token")},
}


def _token_request(client, ep: Endpoint, url: str, token: str):
    """Ingest endpoints are tried with the POST they take (the agent's poll with GET); the rest are read."""
    auth = f"Bearer {token}"
    if ep.access == "collector" and ep.name != "api-agent-commands":
        return "POST", client.post(url, data="{}", content_type="application/json", HTTP_AUTHORIZATION=auth)
    return "GET", client.get(url, HTTP_AUTHORIZATION=auth)


def _token_matrix(ep, world, problems: list[str]) -> int:
    """Try one /api/ endpoint with each API token (no session); token writes are in test_tokens.py."""
    p, tried = world["personas"], 0
    for owner, values in variants(ep, world["registry"]):
        url = ep.url(values)
        for token, (statuses, code) in TOKEN_EXPECT.get(ep.access, {}).items():
            method, resp = _token_request(p.clients["anonymous"], ep, url, p.tokens[token])
            tried += 1
            why = None
            if resp.status_code not in statuses:
                why = f"got {resp.status_code}, not {statuses}"
            elif resp.status_code == 403 and code and resp.json()["error"]["code"] != code:
                why = f"403 with code {resp.json()['error']['code']!r}, not {code!r}"
            leaks = leaked(resp, world["globex"].markers, url) if token == "acme_token" else []
            if leaks:
                why = (why + "; " if why else "") + f"saw globex's {leaks}"
            if why:
                problems.append(f"{method} {url} [{ep.name}, {token}, {owner}]: {why}")
    return tried


def test_isolation_matrix_over_every_endpoint_and_persona(world):
    problems: list[str] = []
    tried = covered = 0
    kinds: dict[str, int] = {}
    for ep in endpoints():
        if skip_reason(ep):
            continue
        covered += 1
        kinds[ep.access] = kinds.get(ep.access, 0) + 1
        tried += _session_matrix(ep, world, problems)
        if ep.api:
            tried += _token_matrix(ep, world, problems)
    assert covered > 60 and tried > 1000
    assert kinds.keys() >= {"operator", "tenant", "collector", "dash", "public"}, kinds
    assert not problems, f"{len(problems)} isolation failures in {tried} requests:\n" + "\n".join(problems)


def test_the_matrix_catches_a_scoping_hole(world, monkeypatch):
    """Break one scoping rule (every invoice visible to everyone): the matrix must report globex's invoice."""
    from tenancy import scoping

    monkeypatch.setitem(scoping._RULES, "tenancy.Invoice", lambda qs, scope: qs)
    problems: list[str] = []
    for ep in endpoints():
        if ep.name in ("portal-invoice", "api-alerts"):
            _session_matrix(ep, world, problems)
    assert any("portal-invoice" in p and "mixed" in p and "acme got 200" in p for p in problems), problems
    assert any("acme saw globex's ['globex-secret-train-2002']" in p for p in problems), problems  # a line's job
    assert not any("api-alerts" in p for p in problems)  # the alert rules were left alone


def test_acme_sees_its_own_objects_where_a_tenant_may(world):
    """The matrix's 200s carry acme's data, not an empty shell: the alert list by session and by token."""
    p = world["personas"]
    by_session = p.clients["acme"].get("/api/v1/alerts").json()
    by_token = p.clients["anonymous"].get("/api/v1/alerts", HTTP_AUTHORIZATION=f"Bearer {p.tokens['acme_token']}")
    assert [a["name"] for a in by_session["alerts"]] == ["AcmeOnlyAlert"]
    assert [a["name"] for a in by_token.json()["alerts"]] == ["AcmeOnlyAlert"]
    everything = p.clients["operator"].get("/api/v1/alerts?state=all").json()
    assert {"AcmeOnlyAlert", "GlobexOnlyAlert"} <= {a["name"] for a in everything["alerts"]}


def test_posts_to_operator_endpoints_are_refused_to_tenants_and_anonymous_and_change_nothing(world):
    p, registry = world["personas"], world["registry"]
    before = (AuditEntry.objects.count(), list(Invoice.objects.values_list("state", "total")))
    problems, tried = [], 0
    for ep in endpoints():
        if skip_reason(ep) or ep.access not in ("operator", "tenant") or (ep.api and ep.access == "tenant"):
            continue
        owner, values = variants(ep, registry)[0]
        url = ep.url(values)
        for persona in ("anonymous", "acme", "globex", "nobody"):
            if ep.access == "tenant" and persona in ("acme", "globex"):
                continue  # tenant pages are read-only (require_safe): their POST is a 405 for everyone
            resp = p.clients[persona].post(url, {"reason": "x", "name": "x", "amount": "-100", "mode": "showback",
                                                 "period": "2026-11"})
            tried += 1
            ok = resp.status_code == (401 if ep.api else 302) if persona == "anonymous" else resp.status_code == 403
            if persona == "anonymous" and not ep.api:
                ok = ok and _login_redirect(resp)
            if not ok:
                problems.append(f"POST {url} [{ep.name}] as {persona}: {resp.status_code}")
    assert tried > 100
    assert not problems, "\n".join(problems)
    assert (AuditEntry.objects.count(), list(Invoice.objects.values_list("state", "total"))) == before


# --- Websocket groups -----------------------------------------------------------------------------------

def _ws_routes():
    from dashboard.routing import websocket_urlpatterns

    return [(str(r.pattern), r.callback) for r in websocket_urlpatterns]


async def _connect(path: str, cookie: bytes | None):
    from dashboard.asgi import application

    headers = [(b"origin", b"http://localhost"), (b"host", b"localhost")]
    if cookie:
        headers.append((b"cookie", cookie))
    ws = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await ws.connect(timeout=10)
    await ws.disconnect()
    return connected, code


@pytest.mark.django_db(transaction=True)
def test_websocket_streams_refuse_tenants_and_anonymous_users():
    acme = make_tenant_world("acme", "1001")
    globex = make_tenant_world("globex", "2002")
    p = make_personas(acme, globex)
    cookies = {name: session_cookie(p.clients[name]) for name in ("operator", "acme", "globex", "nobody")}
    cookies["anonymous"] = None
    routes = _ws_routes()
    assert len(routes) >= 7
    problems = []
    for route, app in routes:
        access = getattr(getattr(app, "consumer_class", None), "bw_access", None)
        if access not in ("operator", "tenant"):
            problems.append(f"ws {route}: its consumer declares no bw_access (operator or tenant)")
            continue
        for persona, cookie in cookies.items():
            got = async_to_sync(_connect)("/" + route, cookie)
            want = {"operator": (True, None), "anonymous": (False, 4401)}.get(
                persona, (False, 4403) if access == "operator" or persona == "nobody" else (True, None))
            if got[0] != want[0] or (not got[0] and got[1] != want[1]):
                problems.append(f"ws {route} as {persona}: {got}, wanted {want}")
    assert not problems, "\n".join(problems)
