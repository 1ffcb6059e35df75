"""HTTP pusher for the ingest API: gzip bodies, keep-alive connections, retries with backoff.

Each worker thread keeps its own `http.client` connection, so a tick's per-rack requests
reuse warm sockets instead of paying a TCP handshake each. Encoding and compression happen in
the worker threads too (zlib releases the GIL while it compresses).

Retries: connection errors, 5xx and 429 are retried with exponential backoff and full jitter,
honouring Retry-After; other 4xx answers are final. 401/403 raise `AuthError`, because no
amount of retrying fixes a bad token.
"""

from __future__ import annotations

import gzip
import http.client
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

import orjson

from telemetry.ingest.arrow import CONTENT_TYPE as ARROW_TYPE
from telemetry.ingest.arrow import encode_arrow

INGEST_PATH = "/api/v1/ingest"
RETRYABLE = {429, 500, 502, 503, 504}
BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 15.0
RETRY_AFTER_MAX_S = 60.0


class AuthError(RuntimeError):
    """The server refused the token."""


@dataclass(slots=True)
class Result:
    """The outcome of one request, after its retries."""

    ok: bool
    status: int = 0  # 0: no HTTP answer at all
    accepted: int = 0
    rejected: int = 0
    attempts: int = 0
    error: str = ""
    body_bytes: int = 0
    rejection: str = ""  # the server's first reason for rejecting samples, if any


@dataclass(slots=True)
class Summary:
    """A tick's requests added up."""

    requests: int = 0
    failed: int = 0
    accepted: int = 0
    rejected: int = 0
    retries: int = 0
    body_bytes: int = 0
    errors: list[str] = field(default_factory=list)
    rejections: list[str] = field(default_factory=list)

    def add(self, r: Result) -> None:
        self.requests += 1
        self.failed += not r.ok
        self.accepted += r.accepted
        self.rejected += r.rejected
        self.retries += max(0, r.attempts - 1)
        self.body_bytes += r.body_bytes
        if r.error and r.error not in self.errors:
            self.errors.append(r.error)
        if r.rejection and r.rejection not in self.rejections:
            self.rejections.append(r.rejection)

    def merge(self, other: Summary) -> None:
        for name in ("requests", "failed", "accepted", "rejected", "retries", "body_bytes"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.errors.extend(e for e in other.errors if e not in self.errors)
        self.rejections.extend(e for e in other.rejections if e not in self.rejections)


def retry_after_seconds(value: str | None) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class IngestClient:
    """Posts batches to ``{server}/api/v1/ingest`` from a small thread pool.

    `body="arrow"` sends the samples of each batch as an Arrow IPC body (docs/ingest.md), which the
    server checks and encodes a column at a time; a batch that carries fault events still goes as
    JSON, the one form that carries them. Other endpoints (jobs, training) always take JSON."""

    def __init__(self, server: str, token: str, *, concurrency: int = 4, timeout: float = 60.0,
                 max_attempts: int = 6, sleep=time.sleep, body: str = "json"):
        parts = urlsplit(server)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--server must be an http:// or https:// URL, got {server!r}")
        self.server, self.concurrency = server, concurrency
        self.scheme, self.host, self.port = parts.scheme, parts.hostname, parts.port
        self.path = parts.path.rstrip("/") + INGEST_PATH
        self.token, self.timeout, self.max_attempts = token, timeout, max_attempts
        self.sleep = sleep
        if body not in ("json", "arrow"):
            raise ValueError(f"body must be 'json' or 'arrow', got {body!r}")
        self.arrow = body == "arrow"
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="ingest")
        self._local = threading.local()
        self._jitter = random.Random()  # jitter must differ between simulators, so unseeded

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    def for_endpoint(self, path: str) -> IngestClient:
        """A client of its own (pool, connections) for another endpoint of the same server,
        such as ``/api/v1/jobs``, with this one's token and settings."""
        other = IngestClient(self.server, self.token, concurrency=self.concurrency, timeout=self.timeout,
                             max_attempts=self.max_attempts, sleep=self.sleep)
        other.path = other.path.removesuffix(INGEST_PATH) + path
        return other

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            https = self.scheme == "https"
            cls = http.client.HTTPSConnection if https else http.client.HTTPConnection
            conn = self._local.conn = cls(self.host, self.port, timeout=self.timeout)
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def send_many(self, bodies: list[dict]) -> Summary:
        """Post every body (in parallel, up to the concurrency) and add up the results."""
        summary = Summary()
        for result in self.pool.map(self.send, bodies):
            summary.add(result)
        return summary

    def send(self, body: dict) -> Result:
        """Encode and post one body, retrying what is worth retrying."""
        raw = encode_arrow(body) if self.arrow else None
        ctype = ARROW_TYPE if raw is not None else "application/json"
        data = gzip.compress(orjson.dumps(body) if raw is None else raw, compresslevel=1)
        result = Result(ok=False, body_bytes=len(data))
        for attempt in range(1, self.max_attempts + 1):
            result.attempts = attempt
            wait = self._attempt(data, result, ctype)
            if wait is None:
                return result
            if attempt < self.max_attempts:
                self.sleep(wait)
        return result

    def _attempt(self, data: bytes, result: Result, ctype: str = "application/json") -> float | None:
        """One POST; fills `result`; returns seconds to wait before a retry, or None if done."""
        try:
            status, headers, payload = self._post(data, ctype)
        except (OSError, http.client.HTTPException) as exc:
            self._drop_connection()
            result.status, result.error = 0, f"{type(exc).__name__}: {exc}"
            return self._backoff(result.attempts, None)
        result.status = status
        doc = _json(payload)
        if status == 200:
            result.ok, result.error = True, ""
            result.accepted = int(doc.get("accepted", 0))
            result.rejected = int(doc.get("rejected", 0))
            details = doc.get("rejections") or [{}]
            if result.rejected and isinstance(details[0], dict):
                result.rejection = str(details[0].get("reason", ""))
            return None
        err = doc.get("error") if isinstance(doc.get("error"), dict) else {}
        message = err.get("message", payload[:200].decode(errors="replace"))
        result.error = f"HTTP {status} {err.get('code', '')}: {message}"
        if status in (401, 403):
            raise AuthError(result.error)
        if status in RETRYABLE:
            return self._backoff(result.attempts, retry_after_seconds(headers.get("Retry-After")))
        return None

    def _post(self, data: bytes, ctype: str) -> tuple[int, http.client.HTTPMessage, bytes]:
        conn = self._connection()
        conn.request("POST", self.path, body=data, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": ctype,
            "Content-Encoding": "gzip", "Connection": "keep-alive",
        })
        resp = conn.getresponse()
        payload = resp.read()
        if resp.will_close:
            self._drop_connection()
        return resp.status, resp.headers, payload

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, RETRY_AFTER_MAX_S) + self._jitter.uniform(0, 0.25)
        return self._jitter.uniform(0, min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (attempt - 1)))

    def probe(self) -> str | None:
        """None when the server answers HTTP at all (any status), else why it does not."""
        try:
            conn = self._connection()
            conn.request("GET", self.path, headers={"Authorization": f"Bearer {self.token}"})
            conn.getresponse().read()
            return None
        except (OSError, http.client.HTTPException) as exc:
            self._drop_connection()
            return f"{type(exc).__name__}: {exc}"


def _json(payload: bytes) -> dict:
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}
