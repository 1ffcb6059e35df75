"""The rack heatmap in a real browser against a real daphne, fed through the real ingest API."""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime

import pytest
from django.contrib.auth import get_user_model

from telemetry.actions import do_create_collector_token
from telemetry.topology import do_import_topology
from tests.conftest import save_screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PASSWORD = "correct-horse-battery"
HOSTS = [f"gpu-{n:04d}" for n in range(1, 7)]


def _topology() -> dict:
    """Two rows of racks, three 8-GPU nodes each."""
    rows = []
    for r in range(2):
        racks = [{"name": f"r{r}-{k}", "position": k, "u_height": 16, "nodes": [
            {"hostname": HOSTS[r * 3 + k], "u": 2, "u_height": 4,
             "gpus": [{"index": i, "uuid": f"GPU-{HOSTS[r * 3 + k]}-{i}", "model": "NVIDIA H100 80GB HBM3"}
                      for i in range(8)]}]} for k in range(3)]
        rows.append({"name": f"row-{r}", "racks": racks})
    return {"version": 1, "sites": [{"name": "dc1", "halls": [{"name": "hall-a", "rows": rows}]}]}


def _push(server, token: str, host: str, temps: list[float]) -> dict:
    body = {"gpus": {
        "host": [host] * len(temps), "uuid": [f"GPU-{host}-{i}" for i in range(len(temps))],
        "index": list(range(len(temps))), "time": datetime.now(UTC).isoformat(),
        "fields": {"gpu_temp": temps, "gpu_util": [50.0] * len(temps)},
    }}
    req = urllib.request.Request(
        f"{server.url}/api/v1/ingest", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


def _login(page, server, path: str) -> None:
    page.goto(f"{server.url}{path}")
    page.fill("input[name=username]", "op")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit], input[type=submit]")


GD = "document.querySelector('#heatmap .js-plotly-plot')"


def _cell_js(uuid: str) -> str:
    """JS expression: [row, col] of the one cell whose tooltip names `uuid` (null unless exactly one)."""
    return (f"(() => {{ const hits = []; {GD}.data[0].text.forEach((r, y) => r.forEach((t, x) => {{"
            f" if (t && t.split('<br>').includes('{uuid}')) hits.push([y, x]); }}));"
            f" return hits.length === 1 ? hits[0] : null; }})()")


def test_heatmap_has_a_cell_per_gpu_and_follows_ingest_live(asgi_server, browser_page):
    get_user_model().objects.create_superuser("op", "op@example.com", PASSWORD)
    do_import_topology(_topology())
    token = do_create_collector_token("browser-test")
    for host in HOSTS:
        _push(asgi_server, token, host, [40.0] * 8)

    page = browser_page
    _login(page, asgi_server, "/racks/")
    page.wait_for_function("window.BW && BW.heatmapStats && BW.heatmapStats.renderedAt !== null", timeout=15_000)
    # One cell per GPU: cells whose tooltip names a GPU.
    cells = page.evaluate(f"{GD}.data[0].text.flat().filter(t => t && t.includes(' · GPU ')).length")
    assert cells == 48
    page.click("#metric")
    page.click("text=GPU temperature (°C)")
    page.wait_for_function(f"{GD}.data[0].customdata.flat().some(c => c && c.includes('GPU temperature: 40.0 °C'))",
                           timeout=10_000)
    page.wait_for_selector("#bw-conn[data-state=live]", timeout=10_000)
    save_screenshot(page, "racks")

    # A new value through the ingest API reaches that cell, and its tooltip, without a reload.
    applied = page.evaluate("BW.heatmapStats.applied")
    _push(asgi_server, token, "gpu-0005", [40.0, 40.0, 40.0, 93.5, 40.0, 40.0, 40.0, 40.0])
    cell = page.evaluate(_cell_js("GPU-gpu-0005-3"))
    assert cell, "no single cell names GPU-gpu-0005-3"
    row, col = cell
    page.wait_for_function(f"{GD}.data[0].customdata[{row}][{col}].includes('93.5 °C')", timeout=5_000)
    assert page.evaluate("BW.heatmapStats.applied") > applied
    assert page.evaluate("BW.heatmapStats.lastCells") == 1  # the push carried the change only

    # Hover the cell: the tooltip names the host, GPU, UUID, model and the new value.
    x, y = page.evaluate(f"""(() => {{ const gd = {GD}, fl = gd._fullLayout;
        return [fl.xaxis._offset + fl.xaxis.l2p({col}) + gd.getBoundingClientRect().left,
                fl.yaxis._offset + fl.yaxis.l2p({row}) + gd.getBoundingClientRect().top]; }})()""")
    page.mouse.move(x, y)
    page.wait_for_selector("g.hovertext", timeout=5_000)
    tip = page.text_content("g.hovertext")
    for part in ("gpu-0005 · GPU 3", "GPU-gpu-0005-3", "NVIDIA H100 80GB HBM3", "93.5 °C", "No job"):
        assert part in tip, (part, tip)
    save_screenshot(page, "racks-tooltip")
