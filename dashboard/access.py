"""Access control for the Dash endpoints that django-plotly-dash serves."""

from __future__ import annotations

import re
from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.http import JsonResponse

from dashboard.staticfiles import DASH_ASSET_VERSION


def dash_login_required(view_function, **kwargs):
    """Wrap a django-plotly-dash view so that only signed-in users reach it.

    The renderer's XHRs (layout, callbacks) get a 401 JSON answer rather than a redirect to the
    login page, which Dash would try to parse as JSON; a browser opening the URL is redirected.
    """

    @wraps(view_function)
    def wrapper(request, *args, **kw):
        if request.user.is_authenticated:
            return _versioned(request, view_function(request, *args, **kw))
        if "text/html" in request.headers.get("Accept", ""):
            return redirect_to_login(request.get_full_path())
        return JsonResponse({"error": {"code": "not_authenticated", "message": "Sign in first."}}, status=401)

    return wrapper


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
