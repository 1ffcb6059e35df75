"""Access control for the Dash endpoints that django-plotly-dash serves."""

from __future__ import annotations

from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.http import JsonResponse


def dash_login_required(view_function, **kwargs):
    """Wrap a django-plotly-dash view so that only signed-in users reach it.

    The renderer's XHRs (layout, callbacks) get a 401 JSON answer rather than a redirect to the
    login page, which Dash would try to parse as JSON; a browser opening the URL is redirected.
    """

    @wraps(view_function)
    def wrapper(request, *args, **kw):
        if request.user.is_authenticated:
            return view_function(request, *args, **kw)
        if "text/html" in request.headers.get("Accept", ""):
            return redirect_to_login(request.get_full_path())
        return JsonResponse({"error": {"code": "not_authenticated", "message": "Sign in first."}}, status=401)

    return wrapper
