"""Server-rendered pages kept live over /ws/page/, in a real browser against a real daphne: a new alert, a new
sample through the ingest API and a newly proposed remediation action show without a reload, and a redraw
leaves focus, typed text and its selection, an open <details> and a scroll box's offset where they were."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from alerts.lifecycle import Observation, do_apply_observations
from alerts.models import ActionState, Alert, Rule
from alerts.remediation.actions import do_request_action
from telemetry.actions import do_create_collector_token
from telemetry.models import Gpu
from telemetry.topology import do_import_topology, load_topology_file
from tests.alerts.test_pages import make_action
from tests.conftest import save_screenshot
from tests.dashboard.test_drilldown_browser import FIXTURES, GPU_2, HOST, PASSWORD, _login, _push

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
READY = "window.BW && BW.livePageStats && BW.livePageStats.applied >= 1"


@pytest.fixture
def cluster(db):
    get_user_model().objects.create_superuser("op", "op@example.com", PASSWORD)
    do_import_topology(load_topology_file(FIXTURES / "good.yaml"))
    return {g.uuid: g for g in Gpu.objects.select_related("node")}


def _open(page, server, path: str) -> None:
    """Sign in, land on `path`, wait for its first live message, and mark the document (a reload loses it)."""
    _login(page, server, path)
    page.wait_for_function(READY, timeout=30_000)
    page.evaluate("window.__bwSameDocument = true")


def _same_document(page) -> bool:
    return page.evaluate("window.__bwSameDocument === true")


def test_alert_list_shows_a_new_alert_without_reload(asgi_server, browser_page, cluster):
    rule = Rule.objects.create(name="GpuHot", kind="threshold", metric="gpu_temp", op=">", threshold=87,
                               severity="critical", labels={})
    page = browser_page
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    _open(page, asgi_server, "/alerts/")
    assert page.locator("#bw-open-alerts tr.bw-alert-row").count() == 0
    page.wait_for_selector("#bw-conn[data-state=live]", timeout=20_000)

    # The rule evaluator's own path: observations become a firing alert, committed, then pushed.
    labels = {"alertname": "GpuHot", "severity": "critical", "gpu": GPU_2, "node": HOST}
    do_apply_observations(rule, [Observation(labels=labels, annotations={"summary": "GPU at 91 °C"},
                                             entity_kind="gpu", entity_key=GPU_2, value=91.0)], timezone.now())
    alert = Alert.objects.get(rule=rule)
    page.wait_for_selector(f'#bw-open-alerts tr[data-id="{alert.pk}"]', timeout=20_000)
    count = page.text_content("#bw-alerts-count")
    assert count.startswith("1 open") and "1 firing" in count
    assert _same_document(page)
    save_screenshot(page, "live-alerts")
    assert not errors


def test_gpu_and_node_pages_update_on_ingest(asgi_server, browser_page, cluster):
    gpus = [g for g in cluster.values() if g.node.hostname == HOST]
    token = do_create_collector_token("live-test")
    now = datetime.now(UTC)
    # Samples 20 s apart, as a collector sends them: health learns each source's interval from its
    # samples (telemetry.health), and samples 1 s apart would make the GPUs stale 5 s after the last.
    _push(asgi_server, token, gpus, {"gpu_temp": [50.0] * len(gpus), "gpu_util": [10.0] * len(gpus)},
          now - timedelta(seconds=40))
    page = browser_page

    _open(page, asgi_server, f"/gpus/{GPU_2}/")
    cell = '#bw-values dd[data-field="gpu_temp"]'
    assert page.text_content(cell).strip() == "50.0 °C"
    _push(asgi_server, token, gpus, {"gpu_temp": [77.7] * len(gpus), "gpu_util": [10.0] * len(gpus)},
          now - timedelta(seconds=20))
    page.wait_for_function(f"document.querySelector('{cell}').textContent.trim() === '77.7 °C'", timeout=30_000)
    assert _same_document(page)

    page.goto(f"{asgi_server.url}/nodes/{HOST}/")
    page.wait_for_function(READY, timeout=30_000)
    page.evaluate("window.__bwSameDocument = true")
    assert "77.7 °C" in page.text_content("#bw-node-gpus")
    _push(asgi_server, token, gpus, {"gpu_temp": [66.6] * len(gpus), "gpu_util": [10.0] * len(gpus)}, now)
    page.wait_for_function("document.querySelector('#bw-node-gpus').textContent.includes('66.6 °C')",
                           timeout=30_000)
    assert "77.7 °C" not in page.text_content("#bw-node-gpus")
    assert _same_document(page)


def test_remediation_queue_shows_a_new_action_and_keeps_what_the_operator_is_doing(
        asgi_server, browser_page, cluster):
    waiting = make_action("drain", "gpu-0001", ActionState.AWAITING, created_at=timezone.now() - timedelta(hours=1))
    long_result = {"log": [f"step {i}: cordoned, waiting for jobs to leave" for i in range(80)]}
    done = make_action("drain", "gpu-0003", ActionState.SUCCEEDED, created_at=timezone.now() - timedelta(hours=3),
                       finished_at=timezone.now() - timedelta(hours=2), result=long_result, verified=True)
    page = browser_page
    _open(page, asgi_server, "/remediation/")

    # The operator reads a long result, then is half-way through a reason to reject, the caret inside it.
    details = f'#bw-recent tr[data-id="{done.pk}"] details'
    page.click(f"{details} summary")
    page.evaluate(f"document.querySelector('{details} pre').scrollTop = 120")
    before = page.evaluate(f"document.querySelector('{details} pre').scrollTop")
    assert before > 0
    reason = f'#bw-awaiting tr[data-id="{waiting.pk}"] input[name="reason"]'
    page.fill(reason, "node is fine, checked")
    page.focus(reason)
    page.evaluate(f"document.querySelector('{reason}').setSelectionRange(8, 12)")

    # A playbook proposes a new action: committed, then pushed into the page in place.
    proposed = do_request_action("drain", "gpu-0002", mode="approval", reason="XID 79 on GPU 2", evidence={},
                                 requested_by="playbook:xid-drain")
    page.wait_for_selector(f'[data-live^="remediation"] tr[data-id="{proposed.pk}"]', timeout=20_000)

    state = page.evaluate(f"""() => {{
        const input = document.querySelector('{reason}'), box = document.querySelector('{details} pre');
        return {{focused: document.activeElement === input, value: input.value, start: input.selectionStart,
                 end: input.selectionEnd, open: document.querySelector('{details}').open, scroll: box.scrollTop}};
    }}""")
    assert state == {"focused": True, "value": "node is fine, checked", "start": 8, "end": 12, "open": True,
                     "scroll": before}
    assert _same_document(page)
    save_screenshot(page, "live-remediation")
