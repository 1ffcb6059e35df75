"""What every transport shares: the Transport contract, the HTTP transport and how errors are classified.

A delivery is two steps so the outbox can record the request before it leaves (alerts.delivery):
`prepare(notification)` renders an `Outbound` (the request, plus a copy that is safe to store), then
`send(outbound)` performs it and returns a `DeliveryResult`. `notify()` does both. Neither `send` nor
`notify` raises: a provider's refusal or an unreachable host becomes a result with outcome "retry" or
"permanent", its status code, the provider's answer and the duration.
"""

from __future__ import annotations

import http.client
import json
import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from django.conf import settings

from alerts import urlguard

log = logging.getLogger(__name__)

REDACTED = "[redacted]"
# How much of a provider's answer is kept on the attempt row and in a disabled channel's reason.
RESPONSE_KEEP_CHARS = 2000
# HTTP answers worth trying again besides 5xx: request timeout, too early, rate limited.
RETRYABLE_STATUS = frozenset({408, 425, 429})
# Header names whose values are credentials and never stored.
SECRET_HEADERS = frozenset({"authorization", "x-api-key", "x-routing-key"})
# Query parameters known to carry no credential (Opsgenie's identifierType, Azure's api-version).
SAFE_QUERY_KEYS = frozenset({"identifierType", "api-version"})


# kind -> transport class, filled by the @register decorator of each module (alerts.transports.get reads it).
REGISTRY: dict[str, type[Transport]] = {}


def register(cls: type[Transport]) -> type[Transport]:
    """Class decorator: make a transport available under its `kind`."""
    REGISTRY[cls.kind] = cls
    return cls


class TransportError(Exception):
    """A delivery that did not succeed. `permanent` means retrying cannot help (bad key, unknown service)."""

    def __init__(self, message: str, *, permanent: bool = False, status_code: int | None = None,
                 response: str = "", retry_after: float | None = None):
        super().__init__(message)
        self.message = message
        self.permanent = permanent
        self.status_code = status_code
        self.response = response
        self.retry_after = retry_after


@dataclass
class DeliveryResult:
    """The outcome of one try: "ok", "retry" or "permanent", with the provider's answer."""

    outcome: str
    status_code: int | None = None
    response: str = ""
    error: str = ""
    duration_ms: float = 0.0
    retry_after: float | None = None

    @property
    def ok(self) -> bool:
        """True when the provider took the message."""
        return self.outcome == "ok"

    @classmethod
    def from_error(cls, exc: TransportError, duration_ms: float = 0.0) -> DeliveryResult:
        """The result a TransportError stands for."""
        return cls(outcome="permanent" if exc.permanent else "retry", status_code=exc.status_code,
                   response=exc.response[:RESPONSE_KEEP_CHARS], error=exc.message,
                   duration_ms=duration_ms, retry_after=exc.retry_after)


@dataclass
class Outbound:
    """One rendered request: `request` is the transport's own object, `record` the copy safe to store."""

    request: Any
    record: dict = field(default_factory=dict)


@dataclass
class HttpRequest:
    """An HTTP request ready to send."""

    method: str
    url: str
    headers: dict[str, str]
    body: bytes


class Transport:
    """Base of every channel kind. Subclasses implement `prepare` and `_send`."""

    kind: ClassVar[str] = ""
    label: ClassVar[str] = ""

    def prepare(self, notification) -> Outbound:
        """Render the request for this notification (raises TransportError(permanent=True) on bad config)."""
        raise NotImplementedError

    def _send(self, outbound: Outbound) -> DeliveryResult:
        """Perform the request; raise TransportError when the provider did not take it."""
        raise NotImplementedError

    def send(self, outbound: Outbound) -> DeliveryResult:
        """Perform a prepared request; never raises. The duration covers the whole exchange."""
        started = time.monotonic()
        try:
            result = self._send(outbound)
        except TransportError as exc:
            result = DeliveryResult.from_error(exc)
        except Exception as exc:  # a transport bug must not kill the worker; the outbox retries
            log.exception("%s transport failed unexpectedly", self.kind)
            result = DeliveryResult(outcome="retry", error=f"unexpected error: {exc!r}"[:RESPONSE_KEEP_CHARS])
        result.duration_ms = (time.monotonic() - started) * 1000
        return result

    def notify(self, notification) -> DeliveryResult:
        """Render and send in one go (no outbox record); never raises."""
        try:
            outbound = self.prepare(notification)
        except TransportError as exc:
            return DeliveryResult.from_error(exc)
        return self.send(outbound)

    # Helpers for subclasses ----------------------------------------------------------------
    @staticmethod
    def config(notification, key: str, default: Any = None) -> Any:
        """A key of the notification's channel config."""
        return (notification.channel.config or {}).get(key, default)

    def require_url(self, notification, default: str = "") -> str:
        """The channel's http(s) URL (or the provider's default); missing is permanent."""
        url = (self.config(notification, "url") or default or "").strip()
        if not url.startswith(("http://", "https://")):
            raise TransportError(f"{self.label} channel needs an http(s) url in its config", permanent=True)
        return url

    def require_secret(self, notification, what: str) -> str:
        """The channel's secret; missing is permanent."""
        secret = (notification.channel.secret or "").strip()
        if not secret:
            raise TransportError(f"{self.label} channel has no {what}", permanent=True)
        return secret


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A webhook that redirects is misconfigured; following it would drop the POST body."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        """Refuse every redirect: the 3xx becomes an HTTPError (permanent)."""
        return None


# Every HTTP delivery passes the outbound URL guard (alerts.urlguard): it resolves the host, refuses
# non-public addresses the allowlist does not name, and connects to the address it checked.
_opener = urlguard.opener(_NoRedirect)


class HttpTransport(Transport):
    """A transport that POSTs JSON. Classifies answers: 2xx ok; 408/425/429/5xx and network errors
    retry; any other status is permanent. Retries are bounded and spaced by the outbox
    (ALERT_DELIVERY_MAX_ATTEMPTS, backoff from ALERT_RETRY_BASE_SECONDS), so every try is on record."""

    # Parts of the URL that carry a credential (Slack and Teams webhook URLs are their own secret).
    url_is_secret: ClassVar[bool] = False

    def json_request(self, url: str, body: dict, *, headers: dict | None = None, secrets: tuple = (),
                     method: str = "POST") -> Outbound:
        """An Outbound for a JSON body; `secrets` are values scrubbed from the stored copy wherever they occur."""
        data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        all_headers = {"Content-Type": "application/json", "User-Agent": "Breakwater-Alerts/1",
                       **(headers or {})}
        record = {
            "method": method,
            "url": redact_url(url, secret_path=self.url_is_secret),
            "headers": {k: (REDACTED if k.lower() in SECRET_HEADERS else v) for k, v in all_headers.items()},
            "body": scrub(body, secrets),
        }
        return Outbound(HttpRequest(method, url, all_headers, data), record)

    def _send(self, outbound: Outbound) -> DeliveryResult:
        """POST the prepared request and classify the answer."""
        req: HttpRequest = outbound.request
        request = urllib.request.Request(req.url, data=req.body, method=req.method, headers=req.headers)
        try:
            with _opener.open(request, timeout=settings.ALERT_HTTP_TIMEOUT_SECONDS) as resp:
                status, text = resp.status, _read(resp)
        except urlguard.RefusedURL as exc:  # a configuration error: retrying reaches the same address
            raise TransportError(f"refused {self.label} url: {exc}", permanent=True) from None
        except urllib.error.HTTPError as exc:
            status, text = exc.code, _read(exc)
            retry_after = _retry_after(exc.headers.get("Retry-After") if exc.headers else None)
            raise TransportError(self.describe_refusal(status, text), permanent=not self.is_retryable(status),
                                 status_code=status, response=text, retry_after=retry_after) from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:  # refused, reset, timed out
            reason = getattr(exc, "reason", exc)
            raise TransportError(f"cannot reach {self.label}: {reason}") from None
        except ValueError as exc:  # an unparseable URL
            raise TransportError(f"bad {self.label} url: {exc}", permanent=True) from None
        self.check_answer(status, text)
        return DeliveryResult(outcome="ok", status_code=status, response=text)

    @staticmethod
    def is_retryable(status: int) -> bool:
        """Whether an HTTP error status is worth another try."""
        return status >= 500 or status in RETRYABLE_STATUS

    def check_answer(self, status: int, text: str) -> None:
        """Hook for providers that report failure inside a 2xx answer."""

    def describe_refusal(self, status: int, text: str) -> str:
        """A one-line reason naming the provider's own answer (becomes a disabled channel's reason)."""
        return f"{self.label} answered HTTP {status}: {answer_message(text)}"


def answer_message(text: str) -> str:
    """The human part of a provider's error body: its JSON message/error fields, or the text itself."""
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip()[:300] or "(empty answer)"
    if not isinstance(data, dict):
        return text.strip()[:300]
    parts = [str(data[k]) for k in ("message", "error", "status") if data.get(k)]
    errors = data.get("errors")
    if errors:
        parts.append("; ".join(map(str, errors)) if isinstance(errors, list) else json.dumps(errors))
    return (" - ".join(parts) or text.strip())[:300]


def _read(resp) -> str:
    """At most RESPONSE_KEEP_CHARS of an answer body, as text."""
    try:
        return resp.read(RESPONSE_KEEP_CHARS * 2).decode(errors="replace")[:RESPONSE_KEEP_CHARS]
    except OSError:
        return ""


def _retry_after(value: str | None) -> float | None:
    """A Retry-After header in seconds (the date form is ignored)."""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:  # an HTTP date: rare for webhooks; fall back to our own backoff
        return None


def redact_url(url: str, *, secret_path: bool = False) -> str:
    """The URL without credentials: no user:password, query values hidden, and for webhook URLs that
    are themselves the secret (Slack, Teams) everything after the first path segment hidden."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    path = parts.path
    if secret_path:
        first = path.strip("/").split("/", 1)[0]
        path = f"/{first}/{REDACTED}" if first else f"/{REDACTED}"
    query = urlencode([(k, v if k in SAFE_QUERY_KEYS else REDACTED)
                       for k, v in parse_qsl(parts.query, keep_blank_values=True)])
    return urlunsplit((parts.scheme, netloc, path, query, ""))


def scrub(value: Any, secrets: tuple) -> Any:
    """A copy of a JSON value with every occurrence of a secret string replaced."""
    secrets = tuple(s for s in secrets if s)
    if not secrets:
        return value
    if isinstance(value, dict):
        return {k: scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, secrets) for v in value]
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, REDACTED)
    return value


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, marking the cut with an ellipsis."""
    text = text or ""
    return text if len(text) <= limit else text[: limit - 1] + "…"
