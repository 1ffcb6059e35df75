"""A local HTTP receiver for notifications: the demo endpoint of `./dev up`, the tests' provider stand-in.

It records every request (path, headers, JSON body, arrival time), answers the way the provider it
imitates does (PagerDuty 202 with the dedup_key, Opsgenie 202 with a requestId, Slack/Teams 200 "1"/"ok"),
verifies the Breakwater webhook signature when given the secret, and counts incidents by dedup key
the way PagerDuty does: a trigger with a known dedup_key updates that incident, it never opens another.
Scripted answers (`script`) let a test return 500s, 400s or hang before answering; a Behaviour with
status None is the provider's normal answer, processed on arrival (as a real provider does) even when
the answer itself is delayed, so a client that dies while waiting has still opened the incident.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    """One request as it arrived."""

    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    signature_ok: bool | None = None

    def json(self):
        return json.loads(self.body or b"null")


@dataclass
class Behaviour:
    """What to answer next: an HTTP status and body, optionally after a delay (seconds).
    status None: the provider's own answer (incident bookkeeping included), after the delay."""

    status: int | None = 200
    body: str = ""
    delay: float = 0.0


@dataclass
class Receiver:
    """Threaded HTTP server on a loopback port; `url(path)` gives an endpoint, `requests` what came."""

    host: str = "127.0.0.1"
    port: int = 0
    secret: str = ""
    requests: list[Received] = field(default_factory=list)
    script: list[Behaviour] = field(default_factory=list)
    incidents: dict[str, str] = field(default_factory=dict)  # dedup_key -> last event_action (PagerDuty)
    on_request: object = None  # callable(Received) for logging
    max_kept: int | None = None  # a long-running receiver (./dev up) keeps only the newest requests

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._stopping = threading.Event()  # ends scripted delays when the receiver stops
        self._server = ThreadingHTTPServer((self.host, self.port), self._handler())
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    def url(self, path: str = "/") -> str:
        return f"http://{self.host}:{self.port}{path}"

    def start(self) -> Receiver:
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def paths(self) -> list[str]:
        """The paths of the requests received so far, in order."""
        with self._lock:
            return [r.path for r in self.requests]

    def wait_for(self, n: int, timeout: float = 10.0) -> list[Received]:
        """Block until at least n requests arrived; return them (raises TimeoutError otherwise)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.requests) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"receiver got {len(self.requests)} request(s), expected {n}")
                self._cond.wait(left)
            return list(self.requests)

    # ------------------------------------------------------------------ internals
    def _next_behaviour(self) -> Behaviour | None:
        with self._lock:
            return self.script.pop(0) if self.script else None

    def _record(self, rec: Received) -> None:
        with self._cond:
            self.requests.append(rec)
            if self.max_kept is not None and len(self.requests) > self.max_kept:
                del self.requests[: len(self.requests) - self.max_kept]
            self._cond.notify_all()
        if callable(self.on_request):
            self.on_request(rec)

    def check_signature(self, headers: dict[str, str], body: bytes) -> bool | None:
        """Verify X-Breakwater-Signature: v1=hex(HMAC-SHA256(secret, "<timestamp>.<body>"))."""
        if not self.secret or "x-breakwater-signature" not in headers:
            return None
        ts = headers.get("x-breakwater-timestamp", "")
        expected = hmac.new(self.secret.encode(), ts.encode() + b"." + body, hashlib.sha256).hexdigest()
        given = headers["x-breakwater-signature"].removeprefix("v1=")
        return hmac.compare_digest(expected, given)

    def _default_answer(self, path: str, body: bytes) -> tuple[int, str]:
        if "pagerduty" in path:
            try:
                data = json.loads(body)
            except ValueError:
                return 400, json.dumps({"status": "invalid event", "message": "Event object is invalid"})
            key = data.get("dedup_key") or uuid.uuid4().hex
            with self._lock:
                self.incidents[key] = data.get("event_action", "")
            return 202, json.dumps({"status": "success", "message": "Event processed", "dedup_key": key})
        if "opsgenie" in path:
            answer = {"result": "Request will be processed", "took": 0.01, "requestId": str(uuid.uuid4())}
            return 202, json.dumps(answer)
        return 200, "ok"

    def _handler(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                rec = Received(self.path, headers, body, time.time())
                rec.signature_ok = receiver.check_signature(headers, body)
                behaviour = receiver._next_behaviour()
                if behaviour is None or behaviour.status is None:
                    status, text = receiver._default_answer(self.path, body)
                else:
                    status, text = behaviour.status, behaviour.body
                receiver._record(rec)
                if behaviour and behaviour.delay and receiver._stopping.wait(behaviour.delay):
                    return  # stopping: the client is gone or the test is over
                payload = text.encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json" if text.startswith("{") else "text/plain")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:  # the client died while we were waiting (the crash tests do this on purpose)
                    pass

            do_PUT = do_POST  # noqa: N815

            def log_message(self, *args):  # quiet: the recorder is the log
                pass

        return Handler
