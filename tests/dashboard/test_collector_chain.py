"""Collector endpoints go through their own lean Django handler (dashboard.asgi), the site through the full chain.

Driven through the real ASGI application, as daphne calls it. Why the split: settings.COLLECTOR_MIDDLEWARE.
"""

from __future__ import annotations

import json

import pytest
from asgiref import sync as asgiref_sync
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.conf import settings
from django.db import connection
from django.urls import resolve

from dashboard.asgi import application
from telemetry.actions import do_create_collector_token

pytestmark = pytest.mark.django_db(transaction=True)


def _request(method: str, path: str, body: bytes = b"", headers: dict | None = None) -> tuple[int, dict, bytes]:
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in {"host": "localhost", **(headers or {})}.items()],
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 80),
    }

    async def run():
        comm = ApplicationCommunicator(application, scope)
        await comm.send_input({"type": "http.request", "body": body, "more_body": False})
        start, chunks = await comm.receive_output(timeout=30), []
        while True:
            msg = await comm.receive_output(timeout=30)
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        await comm.wait(timeout=5)
        return start, b"".join(chunks)

    start, answer = async_to_sync(run)()
    return start["status"], {k.decode().lower(): v.decode() for k, v in start["headers"]}, answer


@pytest.fixture
def sensitive_hops(monkeypatch):
    """Counts sync_to_async calls bound for the request's one thread-sensitive thread."""
    calls = []
    original = asgiref_sync.SyncToAsync.__call__

    async def counting(self, *args, **kwargs):
        if self._thread_sensitive:
            calls.append(getattr(self.func, "__qualname__", repr(self.func)))
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(asgiref_sync.SyncToAsync, "__call__", counting)
    return calls


def test_ingest_runs_through_the_lean_chain_and_keeps_its_security_headers(sensitive_hops):
    token = do_create_collector_token("chain-test")
    body = json.dumps({"gpus": [{"host": "node-chain", "uuid": "GPU-chain-0", "index": 0,
                                 "fields": {"gpu_util": 42.0}}]}).encode()

    status, headers, answer = _request("POST", "/api/v1/ingest", body, {
        "authorization": f"Bearer {token}", "content-type": "application/json", "content-length": str(len(body)),
    })

    assert status == 200, answer[:300]
    assert json.loads(answer)["accepted"] == 1
    with connection.cursor() as cur:
        cur.execute("SELECT l.gpu_util FROM telemetry_gpu_sample_latest l JOIN telemetry_gpu g ON g.id = l.gpu_id "
                    "WHERE g.uuid = 'GPU-chain-0'")
        assert cur.fetchall() == [(42.0,)]
    assert headers.get("x-content-type-options") == "nosniff"  # SecurityMiddleware still ran
    assert "set-cookie" not in headers and "cookie" not in headers.get("vary", "").lower()  # no session
    # Only Django's own request_started / request_finished signals are left on the thread-sensitive thread;
    # the site's chain makes a dozen more hops per request (next test).
    middleware_hops = [c for c in sensitive_hops if "process_" in c]
    assert middleware_hops == [], middleware_hops


def test_a_bad_token_is_still_refused_on_the_lean_chain():
    status, headers, answer = _request("POST", "/api/v1/ingest", b"{}", {
        "authorization": "Bearer nope", "content-type": "application/json", "content-length": "2",
    })

    assert status == 403 and json.loads(answer)["error"]["code"] == "bad_token"


def test_site_pages_keep_the_full_chain(sensitive_hops):
    status, headers, _ = _request("GET", "/login/")

    assert status == 200
    assert headers.get("x-frame-options")  # XFrameOptionsMiddleware
    assert "csrftoken" in headers.get("set-cookie", "")  # CsrfViewMiddleware
    assert sum("process_" in c for c in sensitive_hops) >= 8


def test_every_lean_path_is_a_collector_endpoint():
    # The lean chain has no session, user or CSRF: a path listed there must be a bearer-token endpoint.
    for path in settings.COLLECTOR_PATHS:
        assert getattr(resolve(path).func, "bw_access", None) == "collector", path
