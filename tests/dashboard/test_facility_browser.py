"""The NVLink and power pages in a real browser against a real daphne, fed through the real ingest API.

The cluster is tests/fixtures/topology/good.yaml (see test_facility_pages).
"""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from telemetry.actions import do_create_collector_token
from telemetry.rollups import run_rollups
from telemetry.topology import do_import_topology, load_topology_file
from tests.conftest import save_screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
GOOD = Path(__file__).resolve().parent.parent / "fixtures" / "topology" / "good.yaml"
PASSWORD = "correct-horse-battery"
GB_UUID = "GPU-b0fe4996-1f7c-91f6-0ccd-08ae3b7e23c5"  # gb-0001 GPU 0, the one GPU of nvl72-r02-01
N1_UUIDS = ["GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa", "GPU-47daa2ad-a218-6286-252b-af45f0dfaf00",
            "GPU-167d8376-ee13-fca4-938a-a05167c43cdc", "GPU-afe9f2ed-9dd0-572c-3cd8-b42b58b3bc99"]


@pytest.fixture
def cluster(asgi_server):
    get_user_model().objects.create_superuser("op", "op@example.com", PASSWORD)
    do_import_topology(load_topology_file(GOOD))
    return do_create_collector_token("browser-test")


def post(server, token: str, body: dict) -> dict:
    req = urllib.request.Request(
        f"{server.url}/api/v1/ingest", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        out = json.load(resp)
    assert not out.get("rejected"), out
    return out


def login(page, server, path: str) -> None:
    page.goto(f"{server.url}{path}")
    page.fill("input[name=username]", "op")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit], input[type=submit]")


def power_sample(device: str, **fields) -> dict:
    return {"device": device, "time": datetime.now(UTC).isoformat(), "fields": fields}


def test_power_page_calls_out_a_rack_over_its_cap_and_follows_ingest_live(asgi_server, browser_page, cluster):
    post(asgi_server, cluster, {"power": [
        power_sample("pdu-r01-01-a", watts=43500.0), power_sample("shelf-r02-01", watts=15000.0),
        power_sample("loop-hall-a-1", coolant_supply_temp=30.5, coolant_return_temp=40.2, flow_lpm=620.0,
                     facility_watts=76700.0),
    ], "gpus": [{"host": "gpu-0003", "uuid": "GPU-4ef109e9-e925-4834-2b85-0771b4ef696c", "index": 0,
                 "time": datetime.now(UTC).isoformat(), "fields": {"power_w": 500.0}}]})
    page = browser_page
    login(page, asgi_server, "/power/")
    page.wait_for_function("window.BW && BW.powerStats && BW.powerStats.renderedAt !== null", timeout=15_000)

    # r01-01 draws 43.5 kW against its 40 kW cap: named in the callout, in words, and in the chart.
    callout = page.text_content("#power-overcap-list")
    assert "r01-01" in callout and "43.5 kW of 40.0 kW" in callout and "over" in callout
    assert page.text_content('[data-card="overcap"] .bw-big').startswith("1")
    chart = page.evaluate("document.querySelector('#power-racks .js-plotly-plot').data.map(t => t.name)")
    assert "Over cap" in chart and "Cap" in chart and "No cap set" in chart
    assert "hall-a" in page.text_content("#power-totals") and "row row-01" in page.text_content("#power-totals")
    assert "40.2 °C" in page.text_content("#power-loops-table")
    # The loop covers all three racks: 76.7 kW over 43.5 + 0.5 (r01-02's GPU) + 15 kW.
    assert "1.30" in page.text_content('[data-card="pue"]')
    page.wait_for_selector("#bw-conn[data-state=live]", timeout=10_000)
    page.wait_for_function("BW.powerStats.applied > 0", timeout=10_000)  # the subscription's first message
    save_screenshot(page, "power", full_page=True)

    # A new PDU reading brings r01-01 under its cap: the callout goes, the totals follow, no reload.
    applied = page.evaluate("BW.powerStats.applied")
    post(asgi_server, cluster, {"power": [power_sample("pdu-r01-01-a", watts=36000.0)]})
    page.wait_for_function("!document.querySelector('#power-overcap-list')", timeout=5_000)
    page.wait_for_function("document.querySelector('[data-card=\"total\"] .bw-big').textContent.startsWith('51.5 kW')",
                           timeout=5_000)
    assert page.evaluate("BW.powerStats.applied") > applied
    assert page.evaluate("BW.powerStats.lastRacks") == 1  # the push carried the changed rack only


def nvlink_readings(uuid: str, host: str, index: int, start: datetime, recoveries: list[int]) -> list[dict]:
    """Readings every 30 s over the last four minutes; `recoveries` is the recovery counter's path."""
    out = []
    for i, rec in enumerate(recoveries):
        t = start + timedelta(seconds=30 * i)
        out.append({"host": host, "uuid": uuid, "index": index, "time": t.isoformat(), "fields": {
            "nvlink_crc_flit_errors": 5, "nvlink_crc_data_errors": 0, "nvlink_replay_errors": 0,
            "nvlink_recovery_errors": rec, "nvlink_bandwidth": 1000 + 60_000 * i,
            "nvlink_tx_bps": 2.0e10, "nvlink_rx_bps": 1.9e10}})
    return out


# JS: [row, col] of the grid's top-left GPU cell (the first cell with a colour value, row by row).
_TOP_CELL = """(() => {{ const z = {gd}.data[0].z;
    for (let y = 0; y < z.length; y++) for (let x = 0; x < z[y].length; x++) if (z[y][x] !== null) return [y, x];
    return null; }})()"""


def _cell_xy(page, gd: str, cell: list[int]) -> list[float]:
    """Page coordinates of a grid cell's centre."""
    y, x = cell
    return page.evaluate(f"""(() => {{ const gd = {gd}, fl = gd._fullLayout, r = gd.getBoundingClientRect();
        return [fl.xaxis._offset + fl.xaxis.l2p({x}) + r.left, fl.yaxis._offset + fl.yaxis.l2p({y}) + r.top]; }})()""")


def _hover(page, gd: str, cell: list[int], names: str) -> str:
    """Hover a grid cell, as a person would; the tooltip's text once it names `names`."""
    page.mouse.move(0, 0)  # off the grid first: the tooltip is hidden, then filled for this cell alone
    page.mouse.move(*_cell_xy(page, gd, cell))
    page.wait_for_function("t => { const b = document.getElementById('nvlink-tip'); "
                           "return b && !b.hidden && b.textContent.includes(t); }", arg=names, timeout=5_000)
    return page.text_content("#nvlink-tip")


def test_nvlink_page_puts_the_domain_in_error_first(asgi_server, browser_page, cluster):
    # nvl72-r02-01 (named after nvd-gpu-0001) has a link recovering every minute; gpu-0001's GPUs are clean.
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=4)
    readings = nvlink_readings(GB_UUID, "gb-0001", 0, start, list(range(8)))
    for index, uuid in enumerate(N1_UUIDS):
        readings += nvlink_readings(uuid, "gpu-0001", index, start, [0] * 8)
    post(asgi_server, cluster, {"gpus": readings})
    run_rollups(datetime.now(UTC))

    page = browser_page
    login(page, asgi_server, "/nvlink/")
    page.wait_for_function("window.BW && BW.nvlinkStats && BW.nvlinkStats.renderedAt !== null", timeout=15_000)

    assert page.text_content('[data-tile="errors"] .bw-tile-count') == "1"
    assert page.text_content('[data-tile="ok"] .bw-tile-count') == "1"
    first_row = page.get_attribute("#nvlink-errors tr[data-domain]", "data-domain")
    assert first_row == "nvl72-r02-01"
    assert "gb-0001 · GPU 0" in page.text_content("#nvlink-errors")
    # In the grid the domain in error comes first: the grid's labels, top to bottom, name it under
    # "In error" and the OK domain under "OK"; its GPU sits above every other GPU (the hover at the
    # end shows the top-left cell is GB_UUID's), outlined.
    gd = "document.querySelector('#nvlink-grid .js-plotly-plot')"
    bands = page.evaluate(f"""(() => {{ const out = {{}}; let band = null;
        {gd}.layout.annotations.slice().sort((a, b) => a.y - b.y || a.x - b.x).forEach(a => {{
            if (a.yanchor === 'middle') {{ band = /<b>(.*?)<\\/b>/.exec(a.text)[1]; out[band] = []; }}
            else if (band) out[band].push(a.text); }});
        return out; }})()""")
    assert list(bands)[:2] == ["In error", "OK"], bands
    assert bands["In error"] == ["nvl72-r02-01"] and bands["OK"] == ["nvd-gpu-0001"], bands
    top = page.evaluate(_TOP_CELL.format(gd=gd))
    assert page.evaluate(f"{gd}.layout.shapes.length") == 1
    assert "In error" in page.evaluate(f"{gd}.layout.annotations.map(a => a.text).join(' ')")
    page.wait_for_selector("#bw-conn[data-state=live]", timeout=10_000)
    page.wait_for_function("BW.nvlinkStats.applied > 0", timeout=10_000)
    save_screenshot(page, "nvlink", full_page=True)

    # Colour by throughput; a new reading through the ingest API recolours that one cell in place.
    page.click("#nvlink-metric")
    page.click("text=Throughput, TX + RX (GB/s)")
    page.wait_for_function("document.getElementById('bw-nvlink-page').dataset.metric === 'throughput'", timeout=5_000)
    assert page.evaluate(_TOP_CELL.format(gd=gd)) == top  # recoloured, not rearranged
    builds, applied = page.evaluate("[BW.nvlinkStats.builds, BW.nvlinkStats.applied]")
    post(asgi_server, cluster, {"gpus": [{"host": "gpu-0001", "uuid": N1_UUIDS[2], "index": 2,
                                          "time": datetime.now(UTC).isoformat(),
                                          "fields": {"nvlink_tx_bps": 1.0e10, "nvlink_rx_bps": 1.0e10}}]})
    page.wait_for_function(f"BW.nvlinkStats.applied > {applied} && BW.nvlinkStats.lastCells === 1", timeout=5_000)
    # One cell now reads 20 GB/s (TX + RX), and its tooltip names that GPU.
    cells = page.evaluate(f"""(() => {{ const hits = [];
        {gd}.data[0].z.forEach((r, y) => r.forEach((v, x) => {{
            if (v !== null && Math.abs(v - 20) < 1e-6) hits.push([y, x]); }}));
        return hits; }})()""")
    assert len(cells) == 1, cells
    assert page.evaluate("BW.nvlinkStats.builds") == builds  # patched, not redrawn
    tip = _hover(page, gd, cells[0], N1_UUIDS[2])
    assert "TX 10 GB/s" in tip and "RX 10 GB/s" in tip, tip

    # Hover the top-left GPU, the one in error: host, GPU, uuid and each counter's rate with its unit.
    px, py = _cell_xy(page, gd, top)
    tip = _hover(page, gd, top, GB_UUID)
    for part in ("gb-0001 · GPU 0", GB_UUID, "nvl72-r02-01", "In error", "Recoveries 0.033 errors/s", "TX 20 GB/s"):
        assert part in tip, (part, tip)
    # Click: the GPU's page.
    page.mouse.click(px, py)
    page.wait_for_url(f"**/gpus/{GB_UUID}/", timeout=10_000)


def test_pages_render_an_empty_cluster(asgi_server, browser_page):
    get_user_model().objects.create_superuser("op", "op@example.com", PASSWORD)
    page = browser_page
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    login(page, asgi_server, "/nvlink/")
    page.wait_for_function("window.BW && BW.nvlinkStats && BW.nvlinkStats.renderedAt !== null", timeout=15_000)
    assert "No GPUs yet" in page.text_content("#nvlink-errors")
    assert page.text_content('[data-tile="errors"] .bw-tile-count') == "0"
    page.goto(f"{asgi_server.url}/power/")
    page.wait_for_function("window.BW && BW.powerStats && BW.powerStats.renderedAt !== null", timeout=15_000)
    assert "No racks yet" in page.text_content("#power-totals")
    assert "No cooling loops" in page.text_content("#power-loops-table")
    assert page.text_content('[data-card="pue"] .bw-big').startswith("—")
    assert errors == []
