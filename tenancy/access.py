"""Access at the edge of every view: who may open a page, call an API endpoint or join a live stream.

What a caller may *see* is decided in one place, tenancy.scoping (`visible_to`); this module only decides
whether the caller may be here at all:

- `operator_required(view)`: operator pages. Anonymous -> the login page; anyone else -> 403 (a page that
  points a tenant's user at their portal).
- `tenant_member_required(view)`: tenant pages (the portal). Any role in any tenant, or an operator.
- `api_check`: the access check behind core.api's JSON edge (`api_view`): a session or an
  `Authorization: Bearer bwt_…` API token (tenancy.auth); `request.who` is the caller (user or token) for
  `visible_to`. Errors are JSON 401/403. core.api also marks ingest (`collector_endpoint`) and public views.

Each decorator leaves `bw_access` on the view ("operator", "tenant", "collector", "public", "dash"): the
isolation test (tests/tenancy/test_isolation.py) reads it to know what to expect of every URL, and fails
on a view that has none, so a new endpoint cannot slip in without an access rule.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.shortcuts import render

from core.api import SAFE_METHODS, ErrorCode, mark
from tenancy.auth import AccessDenied, check_api_access, is_token_request
from tenancy.scoping import is_operator, scope_for

PORTAL_URL = "/portal/"


def forbidden_page(request: HttpRequest, message: str = "") -> HttpResponse:
    """The 403 page: says why, and sends a tenant's user to their portal."""
    scope = scope_for(request.user)
    return render(request, "access/forbidden.html", {
        "message": message or "This page is for the cluster's operators.",
        "portal_url": PORTAL_URL if scope.roles else None,
    }, status=403)


def _page_guard(allowed: Callable[[object], bool], message: str) -> Callable[[Callable], Callable]:
    def decorate(view: Callable) -> Callable:
        @wraps(view)
        def wrapper(request: HttpRequest, *args, **kwargs):
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            if not allowed(request.user):
                return forbidden_page(request, message)
            return view(request, *args, **kwargs)

        return wrapper

    return decorate


def operator_required(view: Callable) -> Callable:
    """Operators only: the login page for anonymous visitors, 403 for everyone else."""
    return mark(_page_guard(is_operator, "This page is for the cluster's operators.")(view), "operator")


def has_any_role(user) -> bool:
    """An operator, or a role in at least one tenant."""
    scope = scope_for(user)
    return scope.operator or bool(scope.roles)


def tenant_member_required(view: Callable) -> Callable:
    """Any role in any tenant (or an operator); the view scopes its rows with visible_to."""
    guarded = _page_guard(has_any_role, "Your account holds no role in any tenant yet; ask an operator for one.")
    return mark(guarded(view), "tenant")


class _CsrfCheck(CsrfViewMiddleware):
    # Django's own check, answering with the reason instead of its 403 page.
    def _reject(self, request, reason):
        return reason


def csrf_failure_reason(request: HttpRequest) -> str | None:
    """Why a session write fails Django's CSRF check, or None when it passes."""
    check = _CsrfCheck(lambda req: None)
    check.process_request(request)
    return check.process_view(request, None, (), {})


def api_check(request: HttpRequest, operator: bool) -> None:
    """The access check of core.api's JSON edge (installed by tenancy.apps): credentials, role, CSRF."""
    check_api_access(request, operator=operator)
    # A token comes without cookies, so only session writes can be forged across sites.
    if request.method not in SAFE_METHODS and not is_token_request(request):
        reason = csrf_failure_reason(request)
        if reason:
            raise AccessDenied(403, ErrorCode.CSRF_FAILED, f"CSRF check failed: {reason}; send the csrftoken cookie's "
                                                   "value as X-CSRFToken")


