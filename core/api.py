"""The JSON API's one edge: one error body, one set of codes, one mapping from exceptions to statuses.

Every JSON endpoint answers an error as {"error": {"code", "message", ...}} with its HTTP status, where `code` is
an `ErrorCode`. A view raises `ApiError` (or an exception that subclasses it: ingest's BatchError, the token
checks' refusals, admission's Refused) or lets one of the exceptions `api_error` knows escape; `json_edge` answers
both. Anything else is a bug and stays a 500, so it is seen.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from enum import StrEnum
from functools import wraps

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.core.exceptions import NON_FIELD_ERRORS, ObjectDoesNotExist, RequestDataTooBig, ValidationError
from django.db import DataError, InterfaceError, OperationalError
from django.http import Http404, HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

log = logging.getLogger(__name__)

# A JSON document nested deeper than this is refused before the parser recurses into it (Python's own limit is
# ~1,000 frames; no document the API takes nests more than a few levels).
MAX_JSON_DEPTH = 64


class ErrorCode(StrEnum):
    """What went wrong, for a program to act on (the message says it for a person)."""

    MALFORMED = "malformed"  # 400: the request cannot be read (not JSON, not UTF-8, nested too deep, a NUL byte)
    INVALID = "invalid"  # 400: read, but a value is refused; `field` / `where` names it
    BAD_PAYLOAD = "bad_payload"  # 400: an Alertmanager webhook body that is not Alertmanager's shape
    BAD_ENCODING = "bad_encoding"  # 400/415: a Content-Encoding other than gzip/deflate, or a broken gzip stream
    BAD_CONTENT_TYPE = "bad_content_type"  # 415
    TOO_LARGE = "too_large"  # 413
    NOT_AUTHENTICATED = "not_authenticated"  # 401: no credentials
    BAD_AUTHORIZATION = "bad_authorization"  # 401: an Authorization header that is not `Bearer <token>`
    BAD_TOKEN = "bad_token"  # 401 (403 on the collector endpoints): an unknown token
    REVOKED_TOKEN = "revoked_token"  # 401 (403 on the collector endpoints)
    EXPIRED_TOKEN = "expired_token"  # 401
    INACTIVE_USER = "inactive_user"  # 401: the token's owner is deactivated
    FORBIDDEN = "forbidden"  # 403: these credentials may not do this
    NO_ROLE = "no_role"  # 403: signed in, but no role in any tenant
    OWNER_LOST_ROLE = "owner_lost_role"  # 403: the token's owner no longer holds the role it needs
    READ_ONLY_TOKEN = "read_only_token"  # 403: a write with a read-only token
    COLLECTOR_TOKEN = "collector_token"  # 403: a collector token offered to an endpoint that is not ingest
    API_TOKEN = "api_token"  # 403: an API token offered to ingest
    CSRF_FAILED = "csrf_failed"  # 403: a session write without its CSRF token
    NOT_FOUND = "not_found"  # 404
    METHOD_NOT_ALLOWED = "method_not_allowed"  # 405, with Allow
    CONFLICT = "conflict"  # 409: the object's state refuses the change
    EXPIRED = "expired"  # 410: an agent command's result after the command expired
    OVERLOADED = "overloaded"  # 429: the server is at capacity; Retry-After
    RATE_LIMITED = "rate_limited"  # 429: this token is over its rate; Retry-After
    UNAVAILABLE = "unavailable"  # 503: the database is unavailable; nothing was stored; Retry-After


class ApiError(Exception):
    """An error answered as {"error": {"code", "message", ...}} with an HTTP status.

    `where` names the line or JSON path at fault (ingest); `extra` adds fields (`field`, `fields`); `headers`
    go on the response (WWW-Authenticate, Retry-After, Allow).
    """

    def __init__(self, status: int, code: ErrorCode | str, message: str, *, where: str = "",
                 headers: dict | None = None, **extra):
        super().__init__(message)
        self.status, self.code, self.message, self.where = status, ErrorCode(code), message, where
        self.headers, self.extra = dict(headers or {}), extra

    def response(self) -> JsonResponse:
        body = {"code": str(self.code), "message": self.message, **({"where": self.where} if self.where else {}),
                **self.extra}
        resp = JsonResponse({"error": body}, status=self.status)
        for k, v in self.headers.items():
            resp[k] = v
        if self.status == 401 and "WWW-Authenticate" not in resp:
            resp["WWW-Authenticate"] = 'Bearer realm="breakwater"'
        return resp


def error_response(status: int, code: ErrorCode | str, message: str, **kwargs) -> JsonResponse:
    return ApiError(status, code, message, **kwargs).response()


def invalid(exc: ValidationError) -> ApiError:
    """A ValidationError as a 400 that names its first field, and lists every field's messages."""
    fields = exc.message_dict if hasattr(exc, "error_dict") else {NON_FIELD_ERRORS: exc.messages}
    name, msgs = next(iter(fields.items()))
    message = msgs[0] if name == NON_FIELD_ERRORS else f"{name}: {msgs[0]}"
    return ApiError(400, ErrorCode.INVALID, message, field=None if name == NON_FIELD_ERRORS else name, fields=fields)


def api_error(exc: BaseException) -> ApiError | None:
    """The one mapping from an exception to the API's answer; None for an exception that is a bug (a 500)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ValidationError):
        return invalid(exc)
    if isinstance(exc, ObjectDoesNotExist | Http404):
        return ApiError(404, ErrorCode.NOT_FOUND, str(exc) or "no such object")
    if isinstance(exc, RequestDataTooBig):
        return ApiError(413, ErrorCode.TOO_LARGE, "the body exceeds the size limit")
    if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError | RecursionError):
        return ApiError(400, ErrorCode.MALFORMED, f"the body is not valid JSON: {str(exc)[:200]}")
    if isinstance(exc, DataError):
        # A value the validator let through but PostgreSQL refuses: retrying cannot fix it, so it is the client's.
        log.warning("a request's value was refused by the database: %s", exc)
        return ApiError(400, ErrorCode.INVALID, f"the database refused a value: {str(exc).splitlines()[0][:300]}")
    if isinstance(exc, OperationalError | InterfaceError):
        # The database went away (restart, failover, lost connection): nothing was committed, a retry is safe.
        # Other database errors are our bugs and stay 500s.
        log.warning("a request failed on the database, nothing stored: %s", exc)
        return ApiError(503, ErrorCode.UNAVAILABLE, "the database is unavailable; retry", headers={"Retry-After": "5"})
    return None


def _answer(exc: Exception) -> JsonResponse:
    """The error body for `exc`, or `exc` raised again when it is a bug."""
    err = api_error(exc)
    if err is None:
        raise exc
    return err.response()


def json_edge(view: Callable) -> Callable:
    """Answer every exception `api_error` knows with the one error body (sync or async views)."""
    if iscoroutinefunction(view):
        @wraps(view)
        async def async_wrapper(request: HttpRequest, *args, **kwargs):
            try:
                return await view(request, *args, **kwargs)
            except Exception as exc:
                return _answer(exc)

        return async_wrapper

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs):
        try:
            return view(request, *args, **kwargs)
        except Exception as exc:
            return _answer(exc)

    return wrapper


def method_not_allowed(request: HttpRequest, allowed: tuple[str, ...]) -> ApiError:
    allow = ", ".join(allowed)
    return ApiError(405, ErrorCode.METHOD_NOT_ALLOWED, f"{request.method} is not allowed here; use {allow}",
                    headers={"Allow": allow})


def json_depth_ok(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether no array or object in a JSON text nests deeper than `limit` (brackets inside strings skipped).

    Checked before parsing: a deep enough document makes the parser, or any code walking the result, overflow
    Python's recursion limit.
    """
    data = text.encode() if isinstance(text, str) else text
    if data.count(b"[") + data.count(b"{") <= limit:
        return True
    depth, in_string, escaped = 0, False, False
    for b in data:
        if in_string:
            if escaped:
                escaped = False
            elif b == 0x5C:  # backslash
                escaped = True
            elif b == 0x22:
                in_string = False
        elif b == 0x22:
            in_string = True
        elif b in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return False
        elif b in (0x5D, 0x7D):
            depth -= 1
    return True


def read_json(raw: bytes, *, want: type | None = dict, what: str = "the body", where: str = ""):
    """Parse a request body as JSON, or raise the edge's 400 `malformed` saying why."""
    if not json_depth_ok(raw):
        raise ApiError(400, ErrorCode.MALFORMED, f"{what} nests deeper than {MAX_JSON_DEPTH} levels", where=where)
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ApiError(400, ErrorCode.MALFORMED, f"{what} is not valid JSON: {str(exc)[:200]}", where=where) from exc
    if want is not None and not isinstance(doc, want):
        kind = "object" if want is dict else want.__name__
        raise ApiError(400, ErrorCode.MALFORMED, f"{what} must be a JSON {kind}", where=where)
    return doc


# --- Access: who may call an endpoint -----------------------------------------------------------------------

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
# Token prefixes: a collector's credential writes telemetry, an API token reads and changes the console.
COLLECTOR_TOKEN_PREFIX = "bwc_"
API_TOKEN_PREFIX = "bwt_"

# Authenticates a session or API token for an endpoint and refuses (ApiError 401/403) what the caller may not do;
# sets `request.who`. The rules are tenancy's (roles, tokens), installed when Django starts (tenancy.apps).
_api_check: Callable[[HttpRequest, bool], None] | None = None


def install_api_check(check: Callable[[HttpRequest, bool], None]) -> None:
    global _api_check
    _api_check = check


def _check(request: HttpRequest, operator: bool) -> None:
    if _api_check is None:
        raise RuntimeError("API access checks are not installed: add 'tenancy' to INSTALLED_APPS")
    _api_check(request, operator)


def mark(view: Callable, access: str) -> Callable:
    """Record what kind of access `view` enforces ("operator", "tenant", "collector", "public", "dash"); the
    isolation test reads it for every URL and fails on a view without one."""
    view.bw_access = access
    return view


def collector_endpoint(view: Callable) -> Callable:
    """Marks an ingest endpoint: it accepts collector tokens only (telemetry.api.auth checks them)."""
    return mark(view, "collector")


def public(view: Callable) -> Callable:
    """Marks a view anyone may open (it shows no cluster or tenant data)."""
    return mark(view, "public")


def api_view(operator: bool = False, methods: tuple[str, ...] = ("GET",),
             tenant_reads: bool = False) -> Callable[[Callable], Callable]:
    """The JSON edge for sessions and API tokens (sync or async views); `request.who` is the caller.

    Order: credentials (401/403), then the method (405 with Allow; HEAD where GET is allowed), then the view,
    whose errors (ApiError, or what `api_error` maps) become the one error body. `operator`: operators and
    operator tokens only; `tenant_reads`: tenants' users and tokens may read, only operators write. The view
    scopes its rows with visible_to(request.who).
    """
    allowed = tuple(methods) + (("HEAD",) if "GET" in methods and "HEAD" not in methods else ())

    def gate(request: HttpRequest) -> None:
        _check(request, operator or (tenant_reads and request.method not in SAFE_METHODS))
        if request.method not in allowed:
            raise method_not_allowed(request, tuple(methods))

    def decorate(view: Callable) -> Callable:
        if iscoroutinefunction(view):
            @wraps(view)
            async def async_wrapper(request: HttpRequest, *args, **kwargs):
                await sync_to_async(gate)(request)
                return await view(request, *args, **kwargs)

            wrapper = async_wrapper
        else:
            @wraps(view)
            def sync_wrapper(request: HttpRequest, *args, **kwargs):
                gate(request)
                return view(request, *args, **kwargs)

            wrapper = sync_wrapper
        # csrf_exempt: a session write's CSRF token is checked by the access check, after the 401/403, so every
        # refusal stays JSON.
        return mark(csrf_exempt(json_edge(wrapper)), "operator" if operator else "tenant")

    return decorate
