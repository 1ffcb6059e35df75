"""A page's live regions as its own view renders them now, for the subscriber who has the page open.

A live page marks what changes with `{% live "name" %}…{% endlive %}` (dashboard.templatetags.bw_live). To
push, the page's URL is resolved and its view run for the socket's user, with a GET request built from the
socket's scope; the regions the template rendered are collected instead of parsing HTML. Hence:

- the live and the first render can never disagree: same view, same selectors, same template;
- access is the page's own: the view's decorators decide (a redirect to the login page, a 403, a 404), so a
  tenant's socket gets its own tenant's portal and nothing of an operator page or another tenant.

`LIVE_PAGES` says which URL names may be subscribed to and which channel-layer groups change them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, QueryDict
from django.urls import Resolver404, resolve
from django_plotly_dash.middleware import ContentCollector

from alerts import live
from dashboard.templatetags.bw_live import SINK
from telemetry.live import TELEMETRY_GROUP

ALERTS_GROUP, REMEDIATION_GROUP = live.group_name(live.ALERTS), live.group_name(live.REMEDIATION)
# URL name -> the groups whose messages may change it (telemetry: a tick after each ingest commit).
LIVE_PAGES: dict[str, tuple[str, ...]] = {
    "alerts": (ALERTS_GROUP,),
    "alert": (ALERTS_GROUP, REMEDIATION_GROUP),
    "remediation": (REMEDIATION_GROUP,),
    "action": (REMEDIATION_GROUP,),
    "node": (TELEMETRY_GROUP, ALERTS_GROUP),
    "gpu": (TELEMETRY_GROUP, ALERTS_GROUP),
    "port": (TELEMETRY_GROUP,),
    "fabric": (TELEMETRY_GROUP,),
    "portal": (TELEMETRY_GROUP, ALERTS_GROUP),
}
MAX_PATH = 2000
# Django masks the CSRF secret anew on every render; compared without it, an unchanged form is unchanged.
_CSRF_VALUE = re.compile(r'(name="csrfmiddlewaretoken" value=")[^"]*(")')


class Refused(Exception):
    """The page cannot be pushed to this socket: `close` with a websocket code, or answer `message`."""

    def __init__(self, message: str, *, status: int, close: int | None = None):
        super().__init__(message)
        self.status, self.close = status, close


@dataclass(frozen=True)
class PageRef:
    """A subscribed page: its path and query, what resolves it, and the groups that change it."""

    path: str
    query: str
    url_name: str
    groups: tuple[str, ...] = field(default=())


def page_ref(raw) -> PageRef:
    """The live page that `raw` (the browser's location.pathname + location.search) names; raises Refused."""
    if not isinstance(raw, str) or not raw.startswith("/") or raw.startswith("//") or len(raw) > MAX_PATH:
        raise Refused(f"expected the page's path, got {str(raw)[:100]!r}", status=400)
    path, _, query = raw.partition("?")
    try:
        match = resolve(path)
    except Resolver404:
        raise Refused(f"no page at {path}", status=404) from None
    if match.url_name not in LIVE_PAGES:
        raise Refused(f"{path} is not a live page", status=400)
    return PageRef(path, query, match.url_name, LIVE_PAGES[match.url_name])


def render_regions(ref: PageRef, scope: dict) -> dict[str, str]:
    """{region name: HTML} of the page as its view renders it for the scope's user now; raises Refused."""
    request = _request(ref, scope)
    match = resolve(ref.path)
    request.resolver_match = match
    try:
        response = match.func(request, *match.args, **match.kwargs)
    except Http404:
        raise Refused("no such page", status=404) from None
    except PermissionDenied:
        raise Refused("not allowed", status=403) from None
    if hasattr(response, "render") and not getattr(response, "is_rendered", True):
        response.render()
    status = response.status_code
    if 300 <= status < 400:
        raise Refused("signed out", status=401, close=4401)  # the page's guard sends anonymous users to log in
    if status in (403, 404):
        raise Refused("not allowed" if status == 403 else "no such page", status=status)
    regions = getattr(request, SINK)
    if status >= 500 or not regions:
        raise Refused(f"the page answered {status} without live regions", status=status)
    return regions


def comparable(html: str) -> str:
    """A region's HTML as compared between pushes (without the per-render CSRF mask)."""
    return _CSRF_VALUE.sub(r"\1\2", html)


def _request(ref: PageRef, scope: dict) -> HttpRequest:
    headers = {k.decode("latin1").lower(): v.decode("latin1") for k, v in scope.get("headers", ())}
    request = HttpRequest()
    request.method = "GET"
    request.path = request.path_info = ref.path
    request.GET = QueryDict(ref.query)
    server = scope.get("server") or ("localhost", 80)
    request.META = {"REQUEST_METHOD": "GET", "PATH_INFO": ref.path, "QUERY_STRING": ref.query,
                    "HTTP_HOST": headers.get("host", ""), "SERVER_NAME": str(server[0]), "SERVER_PORT": str(server[1])}
    request.COOKIES = scope.get("cookies", {})
    # The browser's own CSRF secret, so a form that first appears in a push (a new alert's Ack) posts as the
    # page's others do; without it Django would invent a secret that the browser's cookie does not hold.
    secret = request.COOKIES.get(settings.CSRF_COOKIE_NAME, "")
    if len(secret) == 32 and secret.isalnum():
        request.META["CSRF_COOKIE"] = secret
    request.user = scope["user"]
    request.session = scope.get("session")
    # What DashContentMiddleware gives every page: {% plotly_direct %} and {% plotly_header %} write into it.
    request.dpd_content_handler = ContentCollector()
    setattr(request, SINK, {})
    return request
