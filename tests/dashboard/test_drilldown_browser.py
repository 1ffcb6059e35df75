"""The drill-down pages in a real browser against a real daphne: known points plotted, a live
append through the real ingest API, the heatmap's click-through, and a screenshot of each page."""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from dashboard.dash_apps.inventory import time_str
from telemetry.actions import do_create_collector_token
from telemetry.models import Allocation, Gpu, GpuEvent, Job, Port
from telemetry.topology import do_import_topology, load_topology_file
from tests.conftest import save_screenshot
from tests.telemetry.factories import insert_samples

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PASSWORD = "correct-horse-battery"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
HOST = "gpu-0001"
GPU_2 = "GPU-167d8376-ee13-fca4-938a-a05167c43cdc"  # gpu-0001, index 2
GD = "document.querySelector('#series-graph .js-plotly-plot')"
VALUE = f"{GD}.data.find(t => t.uid === 'value')"


@pytest.fixture
def cluster(db):
    get_user_model().objects.create_superuser("op", "op@example.com", PASSWORD)
    do_import_topology(load_topology_file(FIXTURES / "good.yaml"))
    return {g.uuid: g for g in Gpu.objects.select_related("node")}


def _post(server, token: str, body: dict) -> dict:
    req = urllib.request.Request(
        f"{server.url}/api/v1/ingest", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


def _push(server, token: str, gpus: list[Gpu], fields: dict[str, list[float]], time: datetime) -> dict:
    return _post(server, token, {"gpus": {
        "host": [g.node.hostname for g in gpus], "uuid": [g.uuid for g in gpus], "index": [g.index for g in gpus],
        "time": time.isoformat(), "fields": fields,
    }})


def _login(page, server, path: str) -> None:
    page.goto(f"{server.url}{path}")
    page.fill("input[name=username]", "op")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit], input[type=submit]")


def _pick_field(page, label: str) -> None:
    page.click("#field")
    # Type only once the menu is open: keys pressed before it has focus are lost on a busy machine, and the
    # list is virtualised, so an option far down it is not in the page until the typed filter brings it up.
    page.get_by_role("option").first.wait_for()
    page.keyboard.type(label)
    page.get_by_role("option", name=label, exact=True).click()


def _hold(gpus: list[Gpu], job_id: str, start: datetime, end: datetime | None = None, **job) -> None:
    job = Job.objects.create(source="slurm", external_id=job_id, name=f"train-{job_id}", user="alice",
                             state=job.pop("state", "running"), **job)
    for gpu in gpus:
        Allocation.objects.create(job=job, node=gpu.node, gpu=gpu, gpu_index=gpu.index, start=start, end=end)


def _history(gpus, now: datetime) -> None:
    """Half an hour of utilization and power, one reading a minute, for the node's plot."""
    rows = [(g.id, now - timedelta(minutes=m), {"gpu_util": float((m * 7 + g.index * 13) % 100),
                                                "power_w": 250.0 + g.index * 40 + m})
            for g in gpus for m in range(30, 0, -1)]
    insert_samples("gpu", rows)


def test_gpu_plot_shows_known_points_and_appends_live(asgi_server, browser_page, cluster):
    gpu = cluster[GPU_2]
    node_gpus = [g for g in cluster.values() if g.node.hostname == HOST]
    token = do_create_collector_token("browser-test")
    now = datetime.now(UTC)
    _history(node_gpus, now)
    _push(asgi_server, token, node_gpus, {"gpu_util": [61.0] * len(node_gpus), "power_w": [402.5] * len(node_gpus)},
          now)
    # Between the history's minutes (the wide table holds one row per GPU and time), the newest
    # close enough to the live one that no gap is drawn between them.
    known = [(now - timedelta(minutes=7, seconds=30) + i * timedelta(minutes=1), 40.5 + i) for i in range(8)]
    insert_samples("gpu", [(gpu.id, t, {"gpu_temp": v}) for t, v in known])
    _hold([gpu], "4242", now - timedelta(hours=2), account="team-nlp")
    _hold([gpu], "4100", now - timedelta(days=1), now - timedelta(hours=3), account="team-cv", state="completed")
    GpuEvent.objects.create(gpu=gpu, kind="xid", code=13, first_seen=now - timedelta(hours=1),
                            last_seen=now - timedelta(minutes=50), count=3, source="kmsg",
                            cleared_at=now - timedelta(minutes=40), cleared_reason="job ended")

    page = browser_page
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    _login(page, asgi_server, f"/gpus/{GPU_2}/")
    page.wait_for_function("window.BW && BW.seriesStats && BW.seriesStats.renderedAt !== null", timeout=15_000)
    assert page.text_content("#bw-gpu-uuid") == GPU_2
    _pick_field(page, "GPU temperature (°C)")
    page.click("#range >> text=15 min")
    expected = [[time_str(t) for t, _ in known], [v for _, v in known]]
    page.wait_for_function(f"(() => {{ const t = {VALUE}; return t && JSON.stringify([t.x, t.y]) === "
                           f"'{json.dumps(expected, separators=(',', ':'))}'; }})()", timeout=10_000)
    assert page.text_content("#series-resolution").startswith("raw")
    assert page.locator("#bw-events tbody tr").count() == 1
    assert page.locator("a[href='/jobs/slurm:4242/']").count() == 2  # the current job and the ledger
    page.wait_for_selector("#bw-conn[data-state=live]", timeout=10_000)
    # The drawn window is the one the page follows live (its subscription went out once it was drawn).
    page.wait_for_function("document.getElementById('bw-series-page').dataset.following === 'gpu_temp/15m'",
                           timeout=10_000)

    # One new sample through the ingest API is appended, alone, without a reload.
    at = datetime.now(UTC)
    _push(asgi_server, token, [gpu], {"gpu_temp": [77.25]}, at)
    page.wait_for_function(f"{VALUE}.y[{VALUE}.y.length - 1] === 77.25", timeout=5_000)
    plotted = page.evaluate(f"(() => {{ const t = {VALUE}; return [t.x, t.y]; }})()")
    assert plotted == [expected[0] + [time_str(at)], expected[1] + [77.25]]
    assert page.evaluate("BW.seriesStats.appended") == 1
    start, end = page.evaluate(f"{GD}.layout.xaxis.range")
    assert end[:19] > time_str(at)[:19] and start[:19] < expected[0][0][:19]  # the window slid along

    # A new fault shows up in the events table with the next commit, meaning and action included.
    GpuEvent.objects.create(gpu=gpu, kind="xid", code=79, first_seen=at, last_seen=at, count=1, source="kmsg",
                            message="GPU has fallen off the bus.")
    _push(asgi_server, token, [gpu], {"power_w": [410.0]}, datetime.now(UTC))
    page.wait_for_function("document.querySelectorAll('#bw-events tbody tr').length === 2", timeout=5_000)
    first = page.text_content("#bw-events tbody tr")
    assert "XID 79" in first and "critical" in first and "Drain the node" in first, first
    assert page.evaluate("BW.seriesStats.appended") == 1  # no gpu_temp in that push: nothing appended
    assert errors == []
    save_screenshot(page, "gpu", full_page=True)


def test_node_port_and_search_pages_render(asgi_server, browser_page, cluster):
    node_gpus = sorted((g for g in cluster.values() if g.node.hostname == HOST), key=lambda g: g.index)
    token = do_create_collector_token("browser-test")
    now = datetime.now(UTC)
    _history(node_gpus, now)
    _push(asgi_server, token, node_gpus, {"gpu_util": [97.0, 95.5, 12.0, 0.0], "gpu_temp": [71.0, 69.5, 44.0, 38.0],
                                          "power_w": [655.0, 640.5, 180.0, 95.0]}, now)
    _hold(node_gpus[:2], "4242", now - timedelta(hours=2), account="team-nlp")
    port = Port.objects.get(node__hostname=HOST, name="mlx5_0/1")
    # Twenty minutes of one HCA port through the ingest API: 40 GB/s out, 1 GB/s in.
    _post(asgi_server, token, {"ports": [
        {"host": HOST, "port": port.name, "time": (now - timedelta(seconds=30 * i)).isoformat(),
         "fields": {"xmit_data_bytes": 10**14 - i * 30 * 40 * 10**9, "rcv_data_bytes": 10**13 - i * 30 * 10**9,
                    "link_speed_gbps": 400.0, "link_state": 4}}
        for i in range(40, -1, -1)]})

    page = browser_page
    _login(page, asgi_server, f"/nodes/{HOST}/")
    page.wait_for_function("window.BW && BW.seriesStats && BW.seriesStats.renderedAt !== null", timeout=15_000)
    page.wait_for_function(f"{GD} && {GD}.data.length === {len(node_gpus)}", timeout=10_000)
    names = page.evaluate(f"{GD}.data.map(t => t.name)")
    assert names == [f"GPU {g.index}" for g in sorted(node_gpus, key=lambda g: g.index)]
    assert page.evaluate(f"{GD}.data.every(t => t.y.filter(v => v !== null).length === 31)")  # history + the push
    save_screenshot(page, "node", full_page=True)

    page.click(f"a[href='/ports/{port.id}/']")
    page.wait_for_url(f"**/ports/{port.id}/")
    page.wait_for_function("window.BW && BW.seriesStats && BW.seriesStats.renderedAt !== null", timeout=15_000)
    page.wait_for_function(f"{VALUE} && {VALUE}.y.length === 40", timeout=10_000)
    assert page.evaluate(f"{VALUE}.y.every(v => v === 40e9)")  # bytes per second, from the counter
    page.wait_for_selector("#bw-conn[data-state=live]", timeout=10_000)
    save_screenshot(page, "port", full_page=True)

    page.fill("#bw-q", "gpu-000")
    page.press("#bw-q", "Enter")
    page.wait_for_selector("#bw-results-node")
    assert page.locator("[data-kind=node] li").count() == 3
    save_screenshot(page, "search", full_page=True)
    page.fill("#bw-q", "gpu-0002")
    page.press("#bw-q", "Enter")
    page.wait_for_url("**/nodes/gpu-0002/")


def test_heatmap_cell_click_opens_the_gpu_page(asgi_server, browser_page, cluster):
    page = browser_page
    _login(page, asgi_server, "/racks/")
    page.wait_for_function("window.BW && BW.heatmapStats && BW.heatmapStats.renderedAt !== null", timeout=15_000)
    hm = "document.querySelector('#heatmap .js-plotly-plot')"
    # The cell whose tooltip names GPU_2, exactly one.
    at = page.evaluate(f"""(() => {{ const gd = {hm}, fl = gd._fullLayout, box = gd.getBoundingClientRect(), hits = [];
        gd.data[0].text.forEach((r, row) => r.forEach((t, col) => {{
            if (t && t.split('<br>').includes('{GPU_2}')) hits.push([row, col]); }}));
        if (hits.length !== 1) return null;
        const [row, col] = hits[0];
        return [fl.xaxis._offset + fl.xaxis.l2p(col) + box.left, fl.yaxis._offset + fl.yaxis.l2p(row) + box.top];
    }})()""")
    assert at, f"no single cell names {GPU_2}"
    x, y = at
    page.mouse.click(x, y)
    page.wait_for_url(f"**/gpus/{GPU_2}/", timeout=10_000)
    assert page.text_content("#bw-gpu-uuid") == GPU_2
