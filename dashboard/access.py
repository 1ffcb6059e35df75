"""Access control for the Dash endpoints that django-plotly-dash serves (roles: tenancy.access)."""

from __future__ import annotations

import re
from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.http import JsonResponse

from dashboard.staticfiles import DASH_ASSET_VERSION
from tenancy.access import forbidden_page, has_any_role, mark
from tenancy.scoping import is_operator

# Stateless Dash apps whose name starts with this serve tenant pages (the portal): any signed-in user with
# a role may call them, and their callbacks must scope every read with visible_to(request.user). Every
# other app is an operator page's.
TENANT_APP_PREFIX = "portal"
# The renderer's JavaScript and CSS: the same files for everyone, no cluster data in them.
ASSET_PARTS = ("_dash-component-suites", "assets")


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
            return JsonResponse({"error": {"code": "not_authenticated", "message": "Sign in first."}}, status=401)
        if not _allowed(request.user, url_part, route_name, kw.get("ident")):
            if browser:
                return forbidden_page(request)
            return JsonResponse({"error": {"code": "forbidden", "message": "Operators only."}}, status=403)
        return _versioned(request, view_function(request, *args, **kw))

    return mark(wrapper, "dash")


def _allowed(user, url_part: str, route_name: str, ident: str | None) -> bool:
    if url_part in ASSET_PARTS:
        return True
    return has_any_role(user) if tenant_app(route_name, ident) else is_operator(user)


# Component-suite paths that Dash stamps with the package version and file mtime
# ("dash_renderer.v4_4_0m1796006866.min.js"); async chunks ("async-graph.js") carry none.
_STAMPED = re.compile(r"\.v\d+_\d+_\d+m\d+\.")


def _versioned(request, response):
    """Make django-plotly-dash's component-suite redirects cacheable (see dashboard.staticfiles)."""
    if response.status_code == 302 and "_dash-component-suites" in request.path:
        response["Location"] += ("&" if "?" in response["Location"] else "?") + f"v={DASH_ASSET_VERSION}"
        # A stamped path names one build: keep its redirect for a day; unstamped ones for 10 min,
        # so a restart onto new packages is picked up soon.
        response["Cache-Control"] = f"private, max-age={86400 if _STAMPED.search(request.path) else 600}"
    return response
