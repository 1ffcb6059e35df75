"""Access control for the Dash endpoints that django-plotly-dash serves (roles: tenancy.access)."""

from __future__ import annotations

import functools
import json
import re
from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django_plotly_dash.dash_wrapper import all_apps
from django_plotly_dash.models import DashApp

from core.api import ErrorCode, error_response, mark
from dashboard.staticfiles import DASH_ASSET_VERSION, PLOTLY_JS_URL
from tenancy.access import forbidden_page, has_any_role
from tenancy.scoping import is_operator

# Stateless Dash apps whose name starts with this serve tenant pages (the portal): any signed-in user with
# a role may call them, and their callbacks must scope every read with visible_to(request.user). Every
# other app is an operator page's.
TENANT_APP_PREFIX = "portal"
# The renderer's JavaScript and CSS: the same files for everyone, no cluster data in them.
ASSET_PARTS = ("_dash-component-suites", "assets")
# dcc.Location's properties: strings from the browser's address bar, which the callbacks parse as such.
LOCATION_PROPS = frozenset({"pathname", "search", "hash", "href"})


def tenant_app(route_name: str, ident: str | None) -> bool:
    """Whether a Dash route serves a tenant-facing app (stateless "app-…" routes only; instances are operators')."""
    return route_name.startswith("app-") and bool(ident) and ident.startswith(TENANT_APP_PREFIX)


def dash_login_required(view_function, **kwargs):
    """Wrap a django-plotly-dash view: signed-in users only, and operators only for operator apps.

    The renderer's XHRs (layout, callbacks) get a 401/403 JSON answer rather than a redirect to the
    login page, which Dash would try to parse as JSON; a browser opening the URL is redirected (or
    shown the 403 page). `kwargs` are django-plotly-dash's: route_name, url_part, name.
    """
    route_name, url_part = kwargs.get("route_name", ""), kwargs.get("url_part", "")

    @wraps(view_function)
    def wrapper(request, *args, **kw):
        browser = "text/html" in request.headers.get("Accept", "")
        if not request.user.is_authenticated:
            if browser:
                return redirect_to_login(request.get_full_path())
            return error_response(401, ErrorCode.NOT_AUTHENTICATED, "Sign in first.")
        if not _allowed(request.user, url_part, route_name, kw.get("ident")):
            if browser:
                return forbidden_page(request)
            return error_response(403, ErrorCode.FORBIDDEN, "Operators only.")
        ident = kw.get("ident")
        if route_name.startswith("app-") and ident not in all_apps():
            # Unknown names must stop here: django-plotly-dash would otherwise fail looking them up (a 500).
            return error_response(404, ErrorCode.NOT_FOUND, "No such Dash app.")
        if url_part == "_dash-update-component" and route_name.startswith("app-"):
            why = malformed_update(ident, request.body)
            if why:
                return error_response(400, ErrorCode.INVALID, why)
        return _versioned(request, view_function(request, *args, **kw))

    return mark(wrapper, "dash")


@functools.cache
def _callback_specs(ident: str) -> dict[str, dict]:
    """{output: {"inputs": [...], "state": [...]}} of a registered app's callbacks. Built once per process: the
    apps and their callbacks are fixed when the URLconf loads, and building a Dash instance costs milliseconds."""
    callbacks = DashApp.locate_item(ident, stateless=True)[1].callback_map
    return {out: {"inputs": spec.get("inputs", []), "state": spec.get("state", [])} for out, spec in callbacks.items()}


def malformed_update(ident: str, raw: bytes) -> str | None:
    """Why a callback request is not one this app's renderer could have sent, or None.

    django-plotly-dash hands the body to Dash unchecked, and Dash indexes into it: a body of the wrong shape,
    a callback the app does not have, or inputs other than the callback's would raise inside the library.
    """
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return "the body is not JSON"
    if not isinstance(body, dict) or not isinstance(body.get("output"), str):
        return "the body is not a Dash callback request (an object with an output)"
    spec = _callback_specs(ident).get(body["output"])
    if spec is None:
        return f"this app has no callback for {body['output'][:100]!r}"
    for part in ("inputs", "state"):
        sent, declared = body.get(part, []), spec.get(part, [])
        if not isinstance(sent, list) or len(sent) != len(declared) or any(
                not isinstance(s, dict) or s.get("id") != d["id"] or s.get("property") != d["property"]
                for s, d in zip(sent, declared, strict=False)):
            return f"its {part} are not those of the callback for {body['output'][:100]!r}"
        for s in sent:
            if s["property"] in LOCATION_PROPS and not isinstance(s.get("value"), str | None):
                return f"{s['id']}.{s['property']} must be a string"
    changed = body.get("changedPropIds", [])
    if not isinstance(changed, list) or not all(isinstance(c, str) for c in changed):
        return "changedPropIds must be a list of strings"
    if not isinstance(body.get("outputs", {}), dict | list):
        return "outputs must be an object or a list"
    return None


def _allowed(user, url_part: str, route_name: str, ident: str | None) -> bool:
    if url_part in ASSET_PARTS:
        return True
    return has_any_role(user) if tenant_app(route_name, ident) else is_operator(user)


# Where dash-renderer tells dcc.Graph to load plotly.js from when Dash serves its assets locally.
PLOTLY_JS_SUITE = "/_dash-component-suites/plotly/package_data/plotly.min.js"
# Component-suite paths that Dash stamps with the package version and file mtime
# ("dash_renderer.v4_4_0m1796006866.min.js"); async chunks ("async-graph.js") carry none.
_STAMPED = re.compile(r"\.v\d+_\d+_\d+m\d+\.")


def _versioned(request, response):
    """Make django-plotly-dash's component-suite redirects cacheable (see dashboard.staticfiles).

    dcc.Graph's plotly.js goes to the pinned cartesian bundle instead of the plotly package's full one.
    """
    if response.status_code == 302 and "_dash-component-suites" in request.path:
        if request.path.endswith(PLOTLY_JS_SUITE):
            response["Location"] = PLOTLY_JS_URL
        else:
            response["Location"] += ("&" if "?" in response["Location"] else "?") + f"v={DASH_ASSET_VERSION}"
        # A stamped path names one build: keep its redirect for a day; unstamped ones for 10 min,
        # so a restart onto new packages is picked up soon.
        response["Cache-Control"] = f"private, max-age={86400 if _STAMPED.search(request.path) else 600}"
    return response
