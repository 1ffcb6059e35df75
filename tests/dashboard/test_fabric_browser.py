"""The Fabric page in a real browser against a real daphne: the matrix, the graph, a congested
uplink in both, a switch's details, and a link going down through the real ingest API."""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model

from telemetry.actions import do_create_collector_token
from telemetry.rollups import run_rollups
from telemetry.topology import do_import_topology
from tests.conftest import save_screenshot
from tests.dashboard.test_fabric_page import COUNTERS, TOPOLOGY

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PASSWORD = "correct-horse-battery"
GD = "document.querySelector('#fabric-matrix .js-plotly-plot')"
CY = "document.getElementById('fabric-graph')._cyreg.cy"
# Per-second rates of the leaf uplinks: leaf-a to spine-2 waits 3e5 ticks/s (congested: the
# selector's line is 2e5 per link), the others a few 1e4 at most.
RATES = {
    ("leaf-a", "p3"): {"xmit_data_bytes": 30e9, "rcv_data_bytes": 5e9, "xmit_wait": 1e4},
    ("leaf-a", "p4"): {"xmit_data_bytes": 5e9, "rcv_data_bytes": 5e9, "xmit_wait": 2e4},
    ("leaf-a", "p5"): {"xmit_data_bytes": 5e9, "xmit_wait": 3e5},
    ("leaf-b", "p3"): {"xmit_data_bytes": 10e9, "rcv_data_bytes": 2e9, "xmit_wait": 5e3},
}


def _write_history(server, token: str, now: datetime) -> None:
    """30-s readings around `now` (real time: daphne's selectors read the clock), rolled up.

    The uplinks' counters run three minutes ahead of the clock, so the minute the page reads
    rates from stays rolled up however long the test takes (the rollup beat does not run here).
    spine-1:p8 reports its state up to now only: a newer reading pushed later must replace it.
    """
    times = [now - timedelta(minutes=10) + i * timedelta(seconds=30) for i in range(27)]
    records = [
        {"switch": switch, "port": port, "time": t.isoformat(),
         "fields": {**{c: int(1000 + rates.get(c, 0) * (t - times[0]).total_seconds()) for c in COUNTERS},
                    "link_state": 4}}
        for (switch, port), rates in RATES.items() for t in times
    ]
    records += [{"switch": "spine-1", "port": "p8", "time": t.isoformat(), "fields": {"link_state": 4}}
                for t in times if t <= now]
    assert _push(server, token, records)["rejected"] == 0
    run_rollups(times[-1])


def _push(server, token: str, records: list[dict]) -> dict:
    req = urllib.request.Request(
        f"{server.url}/api/v1/ingest", data=json.dumps({"ports": records}).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


def _login(page, server, path: str) -> None:
    page.goto(f"{server.url}{path}")
    page.fill("input[name=username]", "op")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit], input[type=submit]")


def _edge(page, a: str, b: str) -> dict:
    """The graph's edge between switches named `a` (lower) and `b`, as Cytoscape holds it."""
    return page.evaluate(f"""(() => {{ const cy = {CY};
        const id = n => cy.nodes().filter(x => x.data('label') === n)[0].id();
        const e = cy.getElementById(id('{a}') + '-' + id('{b}'));
        return {{state: e.data('state'), lineStyle: e.style('line-style'), colour: e.style('line-color'),
                 width: parseFloat(e.style('width'))}}; }})()""")


def test_fabric_shows_a_congested_uplink_in_matrix_and_graph_and_follows_ingest(asgi_server, browser_page):
    get_user_model().objects.create_superuser("op", "op@example.com", PASSWORD)
    do_import_topology(TOPOLOGY)
    token = do_create_collector_token("browser-test")
    _write_history(asgi_server, token, datetime.now(UTC))

    page = browser_page
    _login(page, asgi_server, "/fabric/")
    page.wait_for_function("window.BW && BW.fabricStats && BW.fabricStats.graphRenderedAt !== null"
                           " && BW.fabricStats.matrixRenderedAt !== null", timeout=20_000)

    # One cell per leaf × spine pair with a cable: leaf-a to both spines, leaf-b to spine-2 only.
    cells = page.evaluate(f"{GD}.data[0].z.flat().filter(v => v !== null).length")
    assert cells == 3
    assert page.evaluate(f"{GD}.data[0].z[1][0]") is None  # leaf-b and spine-1 share no cable
    assert "leaf-a ↔ spine-1" in page.evaluate(f"{GD}.data[0].customdata[0][0]")

    # The graph: five switch pairs; the congested uplink is drawn dashed in the congested colour,
    # the healthy one solid.
    assert page.evaluate(f"{CY}.edges().length") == 5 and page.evaluate(f"{CY}.nodes('[role]').length") == 5
    congested, healthy = _edge(page, "leaf-a", "spine-2"), _edge(page, "leaf-a", "spine-1")
    assert congested["state"] == "congested" and congested["lineStyle"] == "dashed"
    assert congested["colour"] == "rgb(230,159,0)"
    assert healthy["state"] == "ok" and healthy["lineStyle"] == "solid"
    # Spines sit above leaves.
    ys = page.evaluate(f"Object.fromEntries({CY}.nodes('[role]').map(n => [n.data('label'), n.position('y')]))")
    assert ys["core-1"] < ys["spine-1"] == ys["spine-2"] < ys["leaf-a"] == ys["leaf-b"]
    page.wait_for_selector("#fabric-switch li[data-state=congested]", timeout=5_000)

    # Congestion mode: the uplink's cell carries its rate, the top of the scale and a marker.
    page.click("#fabric-metric")
    page.click("text=Congestion (PortXmitWait) (ticks/s)")
    page.wait_for_function("document.getElementById('bw-fabric-page').dataset.metric === 'congestion'", timeout=10_000)
    page.wait_for_function(f"{GD}.data[0].customdata[0][1].includes('ticks/s')", timeout=10_000)
    tip = page.evaluate(f"{GD}.data[0].customdata[0][1]")
    assert "leaf-a ↔ spine-2" in tip and "300.0 k ticks/s" in tip and "link state: congested" in tip
    z = page.evaluate(f"{GD}.data[0].z[0]")
    assert z[1] > z[0]  # 3e5 against 3e4, on a log scale
    markers = page.evaluate(f"(() => {{ const t = {GD}.data[1]; return [t.x, t.y, t.marker.symbol]; }})()")
    assert markers == [[1], [0], ["x-thin-open"]]
    first = page.text_content("#fabric-worst tbody tr")
    assert "leaf-a ↔ spine-2" in first and "congested" in first
    assert page.get_attribute("#fabric-worst tbody tr a", "href") == "/search/?q=leaf-a"

    # Click leaf-a in the graph: its details list its links, the congested one first.
    page.locator("#fabric-graph").scroll_into_view_if_needed()
    x, y = page.evaluate(f"""(() => {{ const cy = {CY};
        const p = cy.nodes().filter(x => x.data('label') === 'leaf-a')[0].renderedPosition();
        const r = document.getElementById('fabric-graph').getBoundingClientRect();
        return [r.left + p.x, r.top + p.y]; }})()""")
    page.mouse.click(x, y)
    page.wait_for_selector("#fabric-switch h3:has-text('leaf-a')", timeout=5_000)
    first_link = page.text_content("#fabric-switch tbody tr")
    assert "spine-2" in first_link and "congested" in first_link
    page.wait_for_selector("#bw-conn[data-state=live]", timeout=10_000)
    page.wait_for_function("BW.fabricStats.applied > 0", timeout=15_000)  # the full message
    save_screenshot(page, "fabric", full_page=True)

    # spine-1's uplink to core-1 goes down: the push through ingest reaches the graph, alone.
    applied = page.evaluate("BW.fabricStats.applied")
    _push(asgi_server, token, [{"switch": "spine-1", "port": "p8", "time": datetime.now(UTC).isoformat(),
                                "fields": {"link_state": 1}}])
    page.wait_for_function(f"""(() => {{ const cy = {CY};
        const id = n => cy.nodes().filter(x => x.data('label') === n)[0].id();
        return cy.getElementById(id('spine-1') + '-' + id('core-1')).data('state') === 'down'; }})()""",
                           timeout=10_000)
    assert page.evaluate("BW.fabricStats.applied") > applied
    assert page.evaluate("BW.fabricStats.lastEdges") == 1 and page.evaluate("BW.fabricStats.lastCells") == 0
    assert _edge(page, "spine-1", "core-1")["lineStyle"] == "dashed"


def test_empty_fabric_page_says_so_without_errors(asgi_server, browser_page):
    get_user_model().objects.create_superuser("op", "op@example.com", PASSWORD)
    page = browser_page
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    _login(page, asgi_server, "/fabric/")
    page.wait_for_function("window.BW && BW.fabricStats && BW.fabricStats.graphRenderedAt !== null"
                           " && BW.fabricStats.matrixRenderedAt !== null", timeout=20_000)
    page.wait_for_selector("#fabric-matrix text:has-text('No leaf or spine switches yet')", timeout=5_000)
    assert "No links yet" in page.text_content("#fabric-worst")
    assert "No switches yet" in page.text_content("#fabric-switch")
    page.wait_for_function("BW.fabricStats.applied > 0", timeout=10_000)  # the (empty) full message
    assert errors == []
