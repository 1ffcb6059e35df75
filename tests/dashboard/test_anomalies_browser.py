"""The Anomalies page in a real browser against a real daphne: plotly.js (served locally) draws the
chart, the rows render without a JavaScript error, and an anomaly stored afterwards appears on the
page after one telemetry tick, with no reload and no polling."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from anomaly.models import AnomalyKind
from telemetry.live import TELEMETRY_GROUP
from tests import personas
from tests.conftest import FIXED_NOW, save_screenshot
from tests.dashboard.test_anomalies_page import POWER, STEP, TEMP, anomaly

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PASSWORD = personas.PASSWORD
H = timedelta(hours=1)


def _tick() -> None:
    """What ingest (or the scoring pass) sends after a commit. Playwright's loop runs in this thread,
    where async_to_sync refuses to run, so the tick goes out from a thread of its own."""
    send = threading.Thread(target=lambda: async_to_sync(get_channel_layer().group_send)(
        TELEMETRY_GROUP, {"type": "telemetry.tick", "at": "test"}))
    send.start()
    send.join(10)


def test_anomalies_page_draws_rows_and_chart_and_shows_a_new_event_live(asgi_server, browser_page):
    anomaly(AnomalyKind.PEER_NODE, "gpu", "GPU-a", "gpu-0001", FIXED_NOW - 2 * H, score=0.91,
            summary="memory temperature +6.2σ vs peers in node", contributions=[TEMP, POWER])
    anomaly(AnomalyKind.STRAGGLER, "rank", "slurm:100#5", "gpu-0002", FIXED_NOW - 3 * H, score=0.7,
            summary="step time +8.4σ vs gang median", contributions=[STEP])
    personas.operator("anom-op")
    errors, page = [], browser_page
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(f"{asgi_server.url}/login/?next=/anomalies/")
    page.fill("input[name=username]", "anom-op")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{asgi_server.url}/anomalies/")

    page.wait_for_selector("#bw-anom-chart[data-rendered=true] .main-svg", timeout=15_000)
    # The subscription's first answer has been applied: the page is live from here on.
    page.wait_for_function("() => window.BW.anomaliesStats.applied >= 1", timeout=10_000)
    assert page.locator("#bw-anom-table tbody tr").count() == 2
    assert page.locator(".bw-anom-chip[data-level=high]").first.inner_text() == (
        "memory temperature 84.5 °C vs median of peers in node 71 °C (+6.2σ)")
    assert page.locator("#bw-anom-chart .bars .point").count() == len(AnomalyKind.values)

    new = anomaly(AnomalyKind.COHORT, "gpu", "GPU-b", "gpu-0003", FIXED_NOW - 0.1 * H, score=0.8,
                  summary="gpu temperature +5.1σ vs H100 cohort")
    _tick()
    page.wait_for_selector(f'#bw-anom-table tbody tr[data-id="{new.pk}"]', timeout=10_000)
    assert page.locator("#bw-anom-table tbody tr").first.get_attribute("data-id") == str(new.pk)
    # Redrawn by anomalies.js from the pushed row: the same name the server gives, its UUID only in the title.
    entity = page.locator(f'#bw-anom-table tbody tr[data-id="{new.pk}"] .bw-anom-entity')
    assert entity.locator("a").inner_text() == "GPU GPU-b… of gpu-0003" and entity.get_attribute("title") == "GPU-b"
    assert page.locator("#bw-anom-open-total").inner_text() == "3"
    assert page.locator("#bw-conn").get_attribute("data-state") == "live"
    save_screenshot(page, "anomalies-live", full_page=True)
    assert errors == []
