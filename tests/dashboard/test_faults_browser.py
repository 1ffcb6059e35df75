"""Four faults, each seen on every page about it, in Chromium against a real daphne, through the real ingest API.

A GPU reports XID 79 (kernel log) while its page is open: it turns failed without a reload. A GPU stops
reporting: no data, with its age, never its last values as current. A node is down in the scheduler: failed.
A fabric port negotiates half its rated speed: degraded. Then the fleet, its lists, racks, node, GPU, port,
fabric and search pages all carry the same state (`data-health`, docs/health.md), and the fleet's counts
equal the health API's.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from telemetry.actions import do_create_collector_token
from telemetry.models import Gpu, Node, NodeState, Port
from tests.dashboard.test_drilldown_browser import GPU_2, HOST, _login, _post, _push, cluster  # noqa: F401
from tests.dashboard.test_live_pages_browser import READY

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _has(page, selector: str) -> bool:
    return page.evaluate("s => !!document.querySelector(s)", selector)


def _ports(server, token, at: datetime, speeds: dict[str, float]) -> None:
    _post(server, token, {"time": at.isoformat(), "ports": [
        {"host": HOST, "port": name, "fields": {"link_state": 4, "link_speed_gbps": speed}}
        for name, speed in speeds.items()]})


def test_every_fault_shows_on_every_page_about_it(asgi_server, browser_page, cluster):  # noqa: F811
    token = do_create_collector_token("faults-browser")
    now = datetime.now(UTC).replace(microsecond=0)
    gpus = list(Gpu.objects.select_related("node").order_by("node__hostname", "index"))
    silent = next(g for g in gpus if g.node.hostname == HOST and g.uuid != GPU_2)
    others = [g for g in gpus if g.id != silent.id]
    # Every GPU reports at a 10-s interval; the silent one's last two samples are a minute old.
    for t in (now - timedelta(seconds=70), now - timedelta(seconds=60)):
        _push(asgi_server, token, gpus, {"gpu_util": [50.0] * len(gpus)}, t)
    for t in (now - timedelta(seconds=10), now):
        _push(asgi_server, token, others, {"gpu_util": [50.0] * len(others)}, t)
        _ports(asgi_server, token, t, {"mlx5_0/1": 200, "mlx5_1/1": 400})
    down = Node.objects.exclude(hostname=HOST).filter(gpus__isnull=False).order_by("hostname").first()
    Node.objects.filter(pk=down.pk).update(state=NodeState.DOWN)

    page = browser_page
    # The GPU page is open, live, when the kernel log reports XID 79: it turns failed without a reload.
    _login(page, asgi_server, f"/gpus/{GPU_2}/")
    page.wait_for_function(READY, timeout=30_000)
    page.evaluate("window.__bwSameDocument = true")
    assert _has(page, "#bw-gpu-health [data-health='ok']")
    _post(asgi_server, token, {"events": [{
        "host": HOST, "gpu_uuid": GPU_2, "kind": "xid", "code": 79, "source": "kmsg",
        "message": "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.", "time": now.isoformat()}]})
    page.wait_for_function("() => !!document.querySelector(\"#bw-gpu-health [data-health='failed']\")",
                           timeout=15_000)
    assert page.evaluate("window.__bwSameDocument === true")
    assert "XID 79" in page.text_content("#bw-gpu-health")

    def visit(path: str) -> None:
        page.goto(f"{asgi_server.url}{path}")
        page.wait_for_load_state("load")

    # The silent GPU: no data, with its age; its values are not shown as current.
    visit(f"/gpus/{silent.uuid}/")
    assert _has(page, "#bw-gpu-health [data-health='stale']")
    assert "no data for" in page.text_content("#bw-gpu-health")
    assert "Last values" in page.text_content("#bw-values-h")

    # The node: the failed GPU and the silent one in its table, the slow port degraded.
    visit(f"/nodes/{HOST}/")
    assert _has(page, "#bw-node-health [data-health='failed']")
    table = page.inner_html("#bw-node-gpus")
    assert 'data-health="failed"' in table and 'data-health="stale"' in table
    assert page.locator("text=link at 200 of 400 Gb/s").count() >= 1

    visit(f"/nodes/{down.hostname}/")
    assert _has(page, "#bw-node-health [data-health='failed']")
    assert "node down" in page.text_content("#bw-node-health")

    slow = Port.objects.get(node__hostname=HOST, name="mlx5_0/1")
    visit(f"/ports/{slow.id}/")
    assert _has(page, "#bw-port-health [data-health='degraded']")
    visit("/fabric/")
    assert _has(page, f"#bw-fabric-ports tr[data-health='degraded'] a[href='/ports/{slow.id}/']")

    visit(f"/search/?q={silent.uuid[:13]}")
    assert _has(page, "[data-health='stale']")

    # The fleet: each tile's count is its list's length and the health API's count.
    visit("/")
    tiles = {s: int(page.text_content(f"#gpus-{s}").replace(",", "")) for s in ("failed", "stale", "ok")}
    api = page.request.get(f"{asgi_server.url}/api/v1/health").json()["counts"]["gpus"]
    down_gpus = Gpu.objects.filter(node=down).count()
    assert tiles == {"failed": 1 + down_gpus, "stale": 1, "ok": len(gpus) - 2 - down_gpus}
    assert tiles == {s: api[s] for s in tiles}
    visit("/health/gpus/failed/")
    assert page.locator("#bw-health-list tbody tr").count() == tiles["failed"]

    # The rack heatmap's Health metric lists every GPU that is not OK as text beside the canvas.
    visit("/racks/")
    page.wait_for_function("() => !!document.querySelector('#heatmap-attention:not([hidden])')", timeout=30_000)
    attention = page.inner_html("#heatmap-attention")
    assert 'data-health="failed"' in attention and 'data-health="stale"' in attention
