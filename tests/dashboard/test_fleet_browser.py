"""The first operator page in a real browser, against a real daphne, fed through the real ingest
API: it shows the truth, and stays true without reloading (websocket push, reconnect)."""

from __future__ import annotations

import json
import time
import urllib.request
from datetime import UTC, datetime

import pytest
from django.contrib.auth import get_user_model

from telemetry.actions import do_create_collector_token

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PASSWORD = "correct-horse-battery"


def _push(server, token: str, host: str, n: int, util: float) -> dict:
    """One columnar batch of `n` GPUs on `host`, stamped now."""
    body = {"gpus": {
        "host": [host] * n, "uuid": [f"GPU-{host}-{i}" for i in range(n)], "index": list(range(n)),
        "time": datetime.now(UTC).isoformat(),
        "fields": {"gpu_util": [util] * n, "power_w": [500.0] * n, "power_limit_w": [700.0] * n},
    }}
    req = urllib.request.Request(
        f"{server.url}/api/v1/ingest", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


@pytest.fixture
def operator(db):
    return get_user_model().objects.create_superuser("op", "op@example.com", PASSWORD)


def _login(page, server) -> None:
    page.goto(f"{server.url}/")
    page.fill("input[name=username]", "op")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit], input[type=submit]")
    page.wait_for_selector("#bw-conn[data-state=live]", timeout=10_000)


def _wait_text(page, selector: str, text: str, timeout_s: float = 5.0) -> float:
    """Seconds until `selector` shows `text` (fails after timeout_s)."""
    t0 = time.monotonic()
    page.wait_for_function(
        "([s, t]) => document.querySelector(s) && document.querySelector(s).textContent.trim() === t",
        arg=[selector, text], timeout=timeout_s * 1000,
    )
    return time.monotonic() - t0


def test_page_shows_ingested_fleet_and_updates_live(asgi_server, browser_page, operator):
    token = do_create_collector_token("browser-test")
    assert _push(asgi_server, token, "node-a", 8, 50.0)["accepted"] == 24
    _login(browser_page, asgi_server)
    assert browser_page.text_content("[data-bind='gpus.total']").strip() == "8"
    # Seen in telemetry but never placed by a topology import: placement is not health, they are OK.
    assert browser_page.text_content("#gpus-ok").strip() == "8"
    assert browser_page.text_content("#util-pct").strip() == "50.0%"

    # New data, no reload: the push must arrive within 2 s of the commit.
    _push(asgi_server, token, "node-b", 8, 100.0)
    waited = _wait_text(browser_page, "[data-bind='gpus.total']", "16", timeout_s=2.0)
    assert browser_page.text_content("#util-pct").strip() == "75.0%"
    assert waited < 2.0


def test_page_reconnects_after_server_restart(asgi_server, browser_page, operator):
    token = do_create_collector_token("browser-test")
    _push(asgi_server, token, "node-a", 8, 10.0)
    _login(browser_page, asgi_server)
    asgi_server.stop()
    browser_page.wait_for_selector("#bw-conn[data-state=offline]", timeout=10_000)
    asgi_server.start()
    browser_page.wait_for_selector("#bw-conn[data-state=live]", timeout=15_000)
    _push(asgi_server, token, "node-c", 4, 10.0)
    _wait_text(browser_page, "[data-bind='gpus.total']", "12", timeout_s=5.0)
