"""Web security controls: the foreign-Host guard, the Content-Security-Policy, the login rate limit and lockout.

Settings (dashboard/settings.py, "Web security" block): CSP_REPORT_ONLY, CSP_REPORT_URI, LOGIN_FAILURE_LIMIT,
LOGIN_FAILURE_WINDOW, LOGIN_LOCKOUT, LOGIN_RATE_LIMIT, LOGIN_RATE_WINDOW, CLIENT_IP_PROXY_COUNT; and ALLOWED_HOSTS.
docs/security.md explains each control and every source the policy allows.

Counters live in Redis, not in process memory, so several web processes share one count: an attacker
spreading guesses over the workers behind a load balancer gets no more tries than against one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

import redis
from asgiref.sync import sync_to_async
from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpResponse
from django.http.request import split_domain_port, validate_host
from django.urls import reverse
from django.utils import timezone

from core.audit import do_audit
from core.middleware import HybridMiddleware
from core.redis_client import shared_client

logger = logging.getLogger(__name__)

# --- Foreign Host ------------------------------------------------------------------------------------

BAD_HOST_BODY = b"Bad Request (400)\n"


def _header(scope, name: bytes) -> str | None:
    # Repeated headers are joined with commas, as Django's ASGIRequest does: two Host headers are not a host.
    values = [value.decode("latin1") for key, value in scope.get("headers") or () if key == name]
    return ",".join(values) if values else None


def requested_host(scope) -> str:
    """The host an ASGI request names, read the way Django's HttpRequest.get_host() reads it."""
    forwarded = _header(scope, b"x-forwarded-host") if settings.USE_X_FORWARDED_HOST else None
    host = forwarded or _header(scope, b"host")
    if host is not None:
        return host
    server = scope.get("server")  # an HTTP/1.0 request may name no host: the address it reached
    if not server:
        return ""
    default_port = 443 if scope.get("scheme") in ("https", "wss") else 80
    return server[0] if server[1] in (None, default_port) else f"{server[0]}:{server[1]}"


def host_allowed(host: str) -> bool:
    """Django's own ALLOWED_HOSTS rule, DEBUG's fallback for an empty list included."""
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    domain, _port = split_domain_port(host)
    return bool(domain) and validate_host(domain, allowed)


class AllowedHostGuard:
    """The outermost ASGI layer: a request whose Host is not in ALLOWED_HOSTS gets a plain 400, a websocket
    handshake a refusal, before static files, the collector handler, Django or Channels see it.

    Why not leave it to Django: with DEBUG on, its DisallowedHost answer is the technical page, which lists
    the settings; static files and websockets never ask Django about the host at all. One check here covers
    every path, every user and every mode the same way.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or host_allowed(host := requested_host(scope)):
            return await self.app(scope, receive, send)
        # %r: the host and path are the client's bytes; a log line must not be forged through them.
        logger.warning("refused a %s request for %r: Host %r is not in ALLOWED_HOSTS", scope["type"],
                       scope.get("path", "")[:200], host[:200])
        if scope["type"] == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008})  # before accept: the handshake gets 403
            return
        await send({"type": "http.response.start", "status": 400, "headers": [
            (b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(BAD_HOST_BODY)).encode()),
            (b"x-content-type-options", b"nosniff")]})
        await send({"type": "http.response.body", "body": BAD_HOST_BODY})


# --- Content-Security-Policy -------------------------------------------------------------------------

# The one inline script we cannot move to a file: django-plotly-dash's `{% plotly_direct %}` writes this
# exact launcher after the Dash bundles. It is a constant, so a hash admits it and nothing else (a nonce
# would mean rewriting the library's HTML). Dash's `_dash-config` is a JSON data block: never executed,
# so CSP does not apply to it. Every other script of ours is a file under /static/.
DASH_RENDERER_LAUNCHER = "var renderer = new DashRenderer();"


def script_hash(source: str) -> str:
    """The CSP source expression that admits an inline script with exactly this text."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"


def _frame_ancestors() -> str:
    # The same rule as X-Frame-Options (which older browsers read): no page of ours is framed, Dash apps
    # included (they are embedded directly with `{% plotly_direct %}`, not in iframes).
    return "'none'" if getattr(settings, "X_FRAME_OPTIONS", "DENY").upper() == "DENY" else "'self'"


def build_policy(*, websocket_origin: str) -> str:
    """The policy for one response; only the websocket origin depends on the request."""
    directives = {
        "default-src": "'self'",
        "script-src": f"'self' {script_hash(DASH_RENDERER_LAUNCHER)}",
        # 'unsafe-inline' for styles only (never scripts): plotly.js and Dash's table/core components create
        # <style> elements at run time (no way to hand them a nonce), and templates colour badges, tiles and
        # bars with data-driven style="--badge: …" attributes. A style cannot run script.
        "style-src": "'self' 'unsafe-inline'",
        # data: plotly.js loads a tiny data: WebP image to test the browser's image support (blocked otherwise).
        "img-src": "'self' data:",
        "font-src": "'self'",
        # Dash callbacks (XHR/fetch) go to this origin; live pages hold a websocket to it. Chrome lets 'self'
        # match ws(s): of the same host, but CSP level 2 browsers do not, so the origin is named.
        "connect-src": f"'self' {websocket_origin}",
        "object-src": "'none'",
        "base-uri": "'self'",
        "form-action": "'self'",
        "frame-ancestors": _frame_ancestors(),
    }
    if settings.CSP_REPORT_URI:
        directives["report-uri"] = settings.CSP_REPORT_URI
    return "; ".join(f"{name} {value}" for name, value in directives.items())


class ContentSecurityPolicyMiddleware(HybridMiddleware):
    """Sets Content-Security-Policy (or its -Report-Only twin, CSP_REPORT_ONLY) on every HTML response.

    Other responses (ingest, JSON, static files) run no script, so they are left alone and the
    ingest path stays lean. Sync and async capable, so ingest keeps an async middleware chain.
    """

    def __call__(self, request):
        if self.async_mode:
            return self.__acall__(request)
        return self._apply(request, self.get_response(request))

    async def __acall__(self, request):
        return self._apply(request, await self.get_response(request))

    @staticmethod
    def _apply(request, response):
        if not response.get("Content-Type", "").startswith("text/html"):
            return response
        header = "Content-Security-Policy-Report-Only" if settings.CSP_REPORT_ONLY else "Content-Security-Policy"
        scheme = "wss" if request.is_secure() else "ws"
        response.headers.setdefault(header, build_policy(websocket_origin=f"{scheme}://{request.get_host()}"))
        return response


# --- Login rate limit and lockout (Redis) ------------------------------------------------------------

# INCR and set the expiry on the first hit, atomically; answer the count and the milliseconds left.
_COUNT_SCRIPT = """
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return {n, redis.call('PTTL', KEYS[1])}
"""


def _key(kind: str, value: str) -> str:
    # Per Celery queue, like alerts' flags: the test suite and a `./dev up` on the same Redis never share
    # counts. Usernames are hashed so the keys hold no personal data and no odd characters.
    digest = hmac.new(settings.SECRET_KEY.encode(), value.encode(), hashlib.sha256).hexdigest()[:32]
    return f"{settings.CELERY_TASK_DEFAULT_QUEUE}:login:{kind}:{digest}"


def _count(key: str, window: timedelta) -> tuple[int, float]:
    """(hits in the current window including this one, seconds until the window ends)."""
    n, pttl = shared_client().eval(_COUNT_SCRIPT, 1, key, int(window.total_seconds() * 1000))
    return int(n), max(int(pttl), 0) / 1000


def client_ip(request) -> str:
    """The client's address: REMOTE_ADDR, or with CLIENT_IP_PROXY_COUNT proxies in front, the address the
    outermost trusted proxy saw (X-Forwarded-For read from the right, so a client cannot forge it)."""
    proxies = settings.CLIENT_IP_PROXY_COUNT
    if proxies:
        hops = [h.strip() for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if h.strip()]
        if len(hops) >= proxies:
            return hops[-proxies]
    return request.META.get("REMOTE_ADDR", "")


def _normal_username(username: str) -> str:
    # One count for "Admin" and "admin": varying the case must not buy more guesses.
    return (username or "").strip().casefold()


@dataclass(frozen=True)
class Lock:
    """A username that may not sign in until `until`."""

    until: datetime

    @property
    def message(self) -> str:
        minutes = max(1, math.ceil((self.until - timezone.now()).total_seconds() / 60))
        return (f"Too many failed sign-ins for this account. Sign-in is paused until "
                f"{self.until:%H:%M} UTC (in about {minutes} minute{'s' if minutes != 1 else ''}); try again then.")


def locked_until(username: str) -> Lock | None:
    """The lock on this username, if any. Fails open when Redis is down (logged): an outage of Redis must
    not lock every operator out of the console in the middle of an incident."""
    try:
        pttl = shared_client().pttl(_key("lock", _normal_username(username)))
    except redis.RedisError:
        logger.exception("login lockout: Redis unavailable, lock not checked")
        return None
    return Lock(timezone.now() + timedelta(milliseconds=pttl)) if pttl > 0 else None


def record_failure(username: str, ip: str) -> Lock | None:
    """Count one failed sign-in for this username; the LOGIN_FAILURE_LIMIT-th within the window locks it.

    1. INCR the username's failure count (its expiry starts with the first failure of a window).
    2. At the limit: set the lock key with LOGIN_LOCKOUT as its expiry and drop the count, so the next
       window after the lock starts from zero.
    3. Log the lock and write it to the audit log. Unknown usernames are counted and locked the same way,
       so the answer never tells whether an account exists.
    """
    name = _normal_username(username)
    try:
        failures, _ = _count(_key("fail", name), settings.LOGIN_FAILURE_WINDOW)
        if failures < settings.LOGIN_FAILURE_LIMIT:
            return None
        lockout_ms = int(settings.LOGIN_LOCKOUT.total_seconds() * 1000)
        pipe = shared_client().pipeline()
        pipe.set(_key("lock", name), ip or "-", px=lockout_ms).delete(_key("fail", name)).execute()
    except redis.RedisError:
        logger.exception("login lockout: Redis unavailable, failure not counted")
        return None
    lock = Lock(timezone.now() + settings.LOGIN_LOCKOUT)
    logger.warning("login lockout: %r locked until %s after %d failed sign-ins (last from %s)",
                   username[:150], lock.until.isoformat(), failures, ip)
    _audit_lock(username, ip, failures, lock)
    return lock


def _audit_lock(username: str, ip: str, failures: int, lock: Lock) -> None:
    do_audit("system:login-lockout", "login.lock", "user", username[:150], outcome="locked",
             reason=f"{failures} failed sign-ins within {settings.LOGIN_FAILURE_WINDOW}",
             detail={"ip": ip, "until": lock.until.isoformat()})


def reset_failures(username: str) -> None:
    """A successful sign-in starts the count again."""
    try:
        shared_client().delete(_key("fail", _normal_username(username)))
    except redis.RedisError:
        logger.exception("login lockout: Redis unavailable, failure count not reset")


class LockoutFormMixin:
    """For an AuthenticationForm: refuse a locked username before its password is checked, count failures,
    reset the count on success. The lock message is the same whether or not the account exists."""

    def clean(self):
        username = self.cleaned_data.get("username") or ""
        ip = client_ip(self.request) if self.request is not None else ""
        lock = locked_until(username)
        if lock:
            raise forms.ValidationError(lock.message, code="locked")
        try:
            cleaned = super().clean()
        except forms.ValidationError:
            lock = record_failure(username, ip) if username else None
            if lock:
                raise forms.ValidationError(lock.message, code="locked") from None
            raise
        reset_failures(username)
        return cleaned


class LockoutAuthenticationForm(LockoutFormMixin, AuthenticationForm):
    """The console's sign-in form with the lockout."""


class LockoutAdminAuthenticationForm(LockoutFormMixin, AdminAuthenticationForm):
    """Django admin's sign-in form (staff only) with the same lockout."""


class LoginRateLimitMiddleware(HybridMiddleware):
    """At most LOGIN_RATE_LIMIT sign-in POSTs per client IP per LOGIN_RATE_WINDOW, on the console's and the
    admin's login; beyond that 429 with Retry-After. Every other request passes without touching Redis."""

    def __init__(self, get_response):
        super().__init__(get_response)
        self._paths: frozenset[str] | None = None

    def __call__(self, request):
        if self.async_mode:
            return self.__acall__(request)
        if self._applies(request):
            refused = self._check(request)
            if refused:
                return refused
        return self.get_response(request)

    async def __acall__(self, request):
        if self._applies(request):
            refused = await sync_to_async(self._check, thread_sensitive=False)(request)
            if refused:
                return refused
        return await self.get_response(request)

    def _applies(self, request) -> bool:
        if request.method != "POST":
            return False
        if self._paths is None:  # reversed on first use: the URLconf is not loaded when this is built
            self._paths = frozenset({reverse("login"), reverse("admin:login")})
        return request.path in self._paths

    @staticmethod
    def _check(request) -> HttpResponse | None:
        ip = client_ip(request)
        try:
            hits, left = _count(_key("rate", ip), settings.LOGIN_RATE_WINDOW)
        except redis.RedisError:
            logger.exception("login rate limit: Redis unavailable, request not counted")
            return None
        if hits <= settings.LOGIN_RATE_LIMIT:
            return None
        if hits == settings.LOGIN_RATE_LIMIT + 1:  # once per window, not once per refused request
            logger.warning("login rate limit: %s sent more than %d sign-in requests in %s", ip,
                           settings.LOGIN_RATE_LIMIT, settings.LOGIN_RATE_WINDOW)
        retry_after = max(1, math.ceil(left))
        response = HttpResponse(f"Too many sign-in attempts from your address. Try again in {retry_after} s.\n",
                                status=429, content_type="text/plain; charset=utf-8")
        response["Retry-After"] = str(retry_after)
        return response


def clear_login_counters() -> int:
    """Drop every failure count, lock and rate count (all users, all addresses); answers how many keys.

    For an operator lifting locks after a password reset, and for the test suite, whose tests would
    otherwise share counts through Redis."""
    pattern = f"{settings.CELERY_TASK_DEFAULT_QUEUE}:login:*"
    keys = list(shared_client().scan_iter(match=pattern, count=1000))
    return shared_client().delete(*keys) if keys else 0
