"""Hostile requests to every route end in a 4xx, never a 500 or a debug page.

The routes come from the URL configuration itself (the isolation matrix's walk), so a new endpoint is probed the
moment it is routed. Each is tried as anonymous, a tenant's member, an operator and (for /api/) with the tenant's,
an operator's and a collector's token, with:

- the plain request, for a baseline;
- a NUL byte in each path parameter and in the query string (PostgreSQL refuses NUL in text: a lookup that passes
  it through fails in the database);
- path traversal in each path parameter;
- a JSON body nested far deeper than any parser's recursion limit, a body that is not UTF-8, and NUL inside JSON
  strings, posted to every route;
- a wrong method;
- a foreign Host header.

Static files and the collector endpoints are answered before Django's middleware (dashboard.asgi), so those are
sent through the real ASGI application.
"""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator
from django_plotly_dash.models import StatelessApp

from tests.tenancy.access_world import make_personas, make_tenant_world, session_cookie
from tests.tenancy.test_isolation import build_registry, data, endpoints, variants  # noqa: F401  (data: fixture)

NUL = "%00"
TRAVERSAL = "..%2F..%2F..%2Fetc%2Fpasswd"
QUERY_KEYS = ("q", "limit", "state", "kind", "since", "until", "host", "gpu", "job", "tenant", "period", "page",
              "severity", "entity", "metric", "window", "format", "before", "after", "next", "sort", "status")
DEEP_ARRAY = "[" * 100_000 + "]" * 100_000
DEEP_OBJECT = '{"a":' * 5_000 + "1" + "}" * 5_000
NUL_JSON = json.dumps({k: "x\u0000y" for k in ("name", "comment", "reason", "matchers", "host", "state", "q",
                                               "expression", "url", "kind", "batch", "events")})
NOT_UTF8 = b"\xff\xfe\xfa{\"a\": \"\xc3\x28\"}"


def _debug_page(resp) -> bool:
    body = b"".join(resp) if getattr(resp, "streaming", False) else resp.content
    return b"Traceback" in body or b"technical_500" in body or b"Server Error (500)" in body


@pytest.fixture
def world(data):  # noqa: F811
    acme = make_tenant_world("acme", "1001")
    globex = make_tenant_world("globex", "2002")
    personas = make_personas(acme, globex)
    return {"acme": acme, "globex": globex, "personas": personas, "registry": build_registry(acme, globex, data)}


def _values(ep, registry: dict) -> dict:
    """Acme's objects where the isolation registry knows the parameter, else a plausible id (admin's routes)."""
    if all(registry.get(p, {}).get("acme") for p in ep.params):
        return variants(ep, registry)[0][1]
    return {p: registry[p]["acme"][0] if registry.get(p, {}).get("acme") else "1" for p in ep.params}


def _requests(ep, values: dict) -> list[tuple[str, str, dict]]:
    """(method, url, extra client kwargs) for one route."""
    url = ep.url(values)
    out = [("GET", url, {}),  # the plain request first: a page that fails on its own data fails here
           ("GET", url + "?" + "&".join(f"{k}={NUL}" for k in QUERY_KEYS), {}),
           ("GET", url + "?" + "&".join(f"{k}=x{NUL}y" for k in QUERY_KEYS), {}),
           ("DELETE", url, {}), ("PATCH", url, {"data": "{}", "content_type": "application/json"})]
    for p in ep.params:
        out.append(("GET", ep.url({**values, p: f"{values[p]}{NUL}"}), {}))
        out.append(("GET", ep.url({**values, p: TRAVERSAL}), {}))
    for body, ctype in ((DEEP_ARRAY, "application/json"), (DEEP_OBJECT, "application/json"),
                        (NUL_JSON, "application/json"), (NOT_UTF8, "application/json"),
                        (DEEP_ARRAY, "application/x-ndjson"),
                        ("name=x%00y&reason=%00", "application/x-www-form-urlencoded")):
        out.append(("POST", url, {"data": body, "content_type": ctype}))
    return out


def _send(client, method: str, url: str, kwargs: dict, token: str | None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return getattr(client, method.lower())(url, **kwargs, **headers)


def test_no_route_answers_500_to_hostile_input_as_any_persona(world):
    p = world["personas"]
    callers = [("anonymous", None), ("acme", None), ("operator", None)]
    problems, tried = [], 0
    for ep in endpoints():
        values = _values(ep, world["registry"])
        who = callers + ([("anonymous", p.tokens[t]) for t in ("acme_token", "operator_token", "collector_token")]
                         if ep.api else [])
        for persona, token in who:
            for method, url, kwargs in _requests(ep, values):
                resp = _send(p.clients[persona], method, url, kwargs, token)
                tried += 1
                if resp.status_code >= 500 or _debug_page(resp):
                    label = persona if token is None else "token " + next(k for k, v in p.tokens.items() if v == token)
                    problems.append(f"{method} {url[:120]} {kwargs.get('content_type', '')} [{ep.name}] as {label}: "
                                    f"{resp.status_code}")
    assert tried > 5000
    assert not problems, f"{len(problems)} of {tried} hostile requests ended in a 500:\n" + "\n".join(problems[:80])


def test_a_foreign_host_is_refused_on_every_route(world):
    p = world["personas"]
    problems = []
    for ep in endpoints():
        values = _values(ep, world["registry"])
        for persona in ("anonymous", "operator"):
            resp = p.clients[persona].get(ep.url(values), HTTP_HOST="evil.example")
            if resp.status_code != 400 or _debug_page(resp):
                problems.append(f"{ep.url(values)} as {persona}: {resp.status_code}")
    assert not problems, "\n".join(problems)


def test_dash_routes_refuse_unknown_apps_and_malformed_callbacks(world):
    p = world["personas"]
    update = {"output": "store.data", "outputs": {"id": "store", "property": "data"},
              "inputs": [{"id": "url", "property": "pathname", "value": 12345}], "changedPropIds": ["url.pathname"]}
    problems = []
    for persona in ("anonymous", "acme", "operator"):
        c = p.clients[persona]
        for ident in ("portalnope", "portal-nope", "nope", "portal" + "x" * 300, "portal%00"):
            for path in ("_dash-layout", "_dash-dependencies"):
                resp = c.get(f"/django_plotly_dash/app/{ident}/{path}")
                if resp.status_code >= 500 or resp.status_code == 200:
                    problems.append(f"{persona} GET {ident}/{path}: {resp.status_code}")
        for ident in sorted(world["registry"]["ident"]["acme"]):
            for body in (update, {**update, "inputs": "x"}, [], "x", {"inputs": [{"value": {"a": [1]}}]}):
                resp = c.post(f"/django_plotly_dash/app/{ident}/_dash-update-component", json.dumps(body),
                              content_type="application/json")
                if resp.status_code >= 500:
                    problems.append(f"{persona} POST {ident} update {str(body)[:60]}: {resp.status_code}")
    assert not problems, "\n".join(problems)


def test_anonymous_callers_cannot_register_dash_apps(world):
    before = StatelessApp.objects.count()
    for persona in ("anonymous", "acme"):
        resp = world["personas"].clients[persona].get("/django_plotly_dash/add_stateless_apps")
        assert resp.status_code in (302, 401, 403), (persona, resp.status_code)
        if resp.status_code == 302:
            assert resp["Location"].startswith("/login/")
    assert StatelessApp.objects.count() == before


async def _asgi(path: str, *, method="GET", host=b"localhost", cookie: bytes | None = None, body=b"",
                query: bytes = b"") -> tuple[int, bytes]:
    from dashboard.asgi import application

    headers = [(b"host", host)] + ([(b"cookie", cookie)] if cookie else [])
    comm = HttpCommunicator(application, method, path, body=body, headers=headers)
    comm.scope["query_string"] = query
    comm.scope["raw_path"] = path.encode("latin-1")
    resp = await comm.get_response(timeout=30)
    return resp["status"], resp["body"]


@pytest.mark.django_db(transaction=True)
def test_static_files_and_collector_paths_refuse_traversal_nul_and_foreign_hosts():
    acme = make_tenant_world("acme", "1001")
    globex = make_tenant_world("globex", "2002")
    p = make_personas(acme, globex)
    problems = []
    paths = ["/static/..%2f..%2fsettings.py", "/static/../../etc/passwd", "/static/%2e%2e/%2e%2e/etc/passwd",
             "/static/breakwater/%00.js", "/static/breakwater/..\\..\\x", "/static/\x00", "/api/v1/ingest\x00",
             "/api/v1/ingest/prometheus", "/%00", "/jobs/slurm:1%00/"]
    for cookie in (None, session_cookie(p.clients["operator"])):
        for path in paths:
            for method in ("GET", "POST"):
                status, body = async_to_sync(_asgi)(path, method=method, cookie=cookie, body=DEEP_ARRAY.encode(),
                                                    query=b"host=%00&v=%00")
                if status >= 500 or b"Traceback" in body:
                    problems.append(f"{method} {path!r}: {status}")
            status, _ = async_to_sync(_asgi)(path, host=b"evil.example", cookie=cookie)
            if status != 400:
                problems.append(f"foreign host {path!r}: {status}")
    assert not problems, "\n".join(problems)
