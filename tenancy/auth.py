"""Who is calling the JSON API: a signed-in session, or `Authorization: Bearer bwt_…` (an ApiToken).

An API token is scoped to one tenant or is an operator token (tenancy.scoping decides what each sees).
Collector tokens (`bwc_…`) only ingest: offered here they are refused with 403 `collector_token`, so a
leaked collector credential reads nothing. Errors are {"error": {"code", "message"}} with 401 (no or bad
credentials) or 403 (credentials that may not do this).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest
from django.utils import timezone

from core.api import COLLECTOR_TOKEN_PREFIX, SAFE_METHODS, ApiError, ErrorCode
from tenancy.models import ApiToken
from tenancy.scoping import scope_for

logger = logging.getLogger(__name__)

TOUCH_EVERY = timedelta(minutes=1)  # last_used is written at most this often, not once per request


class AccessDenied(ApiError):
    """A refusal (401 or 403), answered by the API's one edge (core.api)."""

    def __init__(self, status: int, code: ErrorCode | str, message: str):
        super().__init__(status, code, message)


def _bearer(header: str) -> str:
    scheme, _, raw = header.partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        raise AccessDenied(401, "bad_authorization", "Authorization must be 'Bearer <API token>'")
    return raw.strip()


def token_from_header(header: str, *, now=None) -> ApiToken:
    """The live ApiToken an `Authorization: Bearer …` header names, or AccessDenied saying why not."""
    raw = _bearer(header)
    if raw.startswith(COLLECTOR_TOKEN_PREFIX):
        raise AccessDenied(403, "collector_token", "collector tokens can only ingest")
    if not raw.startswith(ApiToken.PREFIX):
        raise AccessDenied(401, "bad_token", f"not an API token (they start with {ApiToken.PREFIX})")
    token = ApiToken.objects.select_related("tenant", "user").filter(token_hash=ApiToken.hash(raw)).first()
    if token is None:
        raise AccessDenied(401, "bad_token", "unknown API token")
    now = now or timezone.now()
    if token.revoked_at is not None:
        raise AccessDenied(401, "revoked_token", f"API token {token.prefix}… was revoked")
    if token.expires_at is not None and token.expires_at <= now:
        raise AccessDenied(401, "expired_token", f"API token {token.prefix}… expired")
    if token.user_id is not None and not token.user.is_active:
        raise AccessDenied(401, "inactive_user", f"the owner of API token {token.prefix}… is deactivated")
    if token.last_used is None or now - token.last_used > TOUCH_EVERY:
        ApiToken.objects.filter(pk=token.pk).update(last_used=now)
    return token


def authenticate_api(request: HttpRequest):
    """The caller (a user or an ApiToken), also set as `request.who`; AccessDenied(401) when there is none.

    A bearer header wins over a session cookie, so a script's token is never widened by a browser session.
    """
    header = request.headers.get("Authorization")
    if header:
        who = token_from_header(header)
    elif request.user.is_authenticated:
        who = request.user
    else:
        raise AccessDenied(401, "not_authenticated", "Sign in, or send Authorization: Bearer <API token>.")
    request.who = who
    return who


def check_api_access(request: HttpRequest, *, operator: bool = False):
    """Authenticate, then refuse (403) what this caller may not do here; returns the caller.

    operator=True: operators and operator tokens only. Otherwise any role in some tenant will do (the
    endpoint scopes its rows with visible_to). A read-only token may only read.
    """
    who = authenticate_api(request)
    if isinstance(who, ApiToken):
        _check_owner(who)
    scope = scope_for(who)
    if operator and not scope.operator:
        raise AccessDenied(403, "forbidden", "Only operators (or operator tokens) may use this endpoint.")
    if not scope.operator and not scope.roles:
        raise AccessDenied(403, "no_role", "This account holds no role in any tenant; ask an operator for one.")
    if isinstance(who, ApiToken) and who.read_only and request.method not in SAFE_METHODS:
        raise AccessDenied(403, "read_only_token", f"API token {who.prefix}… is read-only")
    return who


def _check_owner(token: ApiToken) -> None:
    """A token never outlives its owner's role: one whose owner lost it answers 403 until it is re-granted."""
    if token.user_id is None:
        return
    owner = scope_for(token.user)
    held = owner.operator if token.tenant_id is None else owner.can(token.tenant_id, "viewer")
    if not held:
        raise AccessDenied(403, "owner_lost_role", f"the owner of API token {token.prefix}… no longer holds the "
                                                   "role it was made with")


def is_token_request(request: HttpRequest) -> bool:
    """Whether the caller came with an API token (no cookies: CSRF does not apply)."""
    return isinstance(getattr(request, "who", None), ApiToken)


def acting_user(request: HttpRequest):
    """The user to record as the actor of a change: the session's, or the token's owner (else anonymous)."""
    who = getattr(request, "who", None)
    if isinstance(who, ApiToken):
        return who.user if who.user_id else AnonymousUser()
    return request.user
