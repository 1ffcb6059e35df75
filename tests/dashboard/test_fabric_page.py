"""The Fabric page: access, its Dash callbacks, the graph's layout and the live consumer."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from asgiref.sync import async_to_sync
from django.db import OperationalError, connection
from django.urls import reverse

from dashboard.consumers import fabric as consumer
from dashboard.dash_apps import fabric as dash_fabric
from telemetry.ingest.documents import parse_json
from telemetry.ingest.schema import TimeParser
from telemetry.ingest.writer import write_batch
from telemetry.rollups import run_rollups
from telemetry.selectors import fabric as fabric_selectors
from telemetry.topology import do_import_topology
from tests import personas
from tests.conftest import FIXED_NOW
from tests.dashboard.conftest import assert_dash_app_refuses_anonymous, ws_communicator

SEC = timedelta(seconds=1)
# Readings every 30 s from 11:56:00 to 12:00:30. At FIXED_NOW the rate bucket is 11:58 (the
# 11:57:30 to 11:58:30 readings); at LATER it is 12:00 (11:59:30 to 12:00:30).
TIMES = [FIXED_NOW - timedelta(minutes=4) + i * 30 * SEC for i in range(10)]
LATER = FIXED_NOW + 105 * SEC
COUNTERS = ("xmit_data_bytes", "rcv_data_bytes", "xmit_wait", "symbol_errors", "rcv_errors", "link_downed",
            "link_error_recovery")


def _switch(name: str, role: str) -> dict:
    return {"name": name, "role": role, "port_count": 8, "port_speed_gbps": 400}


def _hca(name: str, rail: int) -> dict:
    return {"name": name, "speed_gbps": 400, "rail": rail}


# Two rails: leaf-a (rail 0) has two cables to spine-1 and one to spine-2; leaf-b (rail 1) one to
# spine-2 and none to spine-1. Both spines go up to core-1.
TOPOLOGY = {
    "version": 1,
    "sites": [{"name": "dc1", "halls": [{"name": "hall-a", "rows": [{"name": "row-01", "racks": [{
        "name": "r01",
        "nodes": [{"hostname": "n1", "hcas": [_hca("mlx5_0/1", 0), _hca("mlx5_1/1", 1)]},
                  {"hostname": "n2", "hcas": [_hca("mlx5_0/1", 0)]}],
        "switches": [_switch("leaf-a", "leaf"), _switch("leaf-b", "leaf")],
    }]}]}]}],
    "switches": [_switch("spine-1", "spine"), _switch("spine-2", "spine"), _switch("core-1", "core")],
    "links": [
        ["n1:mlx5_0/1", "leaf-a:p1"], ["n2:mlx5_0/1", "leaf-a:p2"], ["n1:mlx5_1/1", "leaf-b:p1"],
        ["leaf-a:p3", "spine-1:p1"], ["leaf-a:p4", "spine-1:p2"], ["leaf-a:p5", "spine-2:p1"],
        ["leaf-b:p3", "spine-2:p2"],
        ["spine-1:p8", "core-1:p1"], ["spine-2:p8", "core-1:p2"],
    ],
}


def _readings(switch: str, port: str, per_s: dict[str, float], *, wait_from_1159: float | None = None) -> list[dict]:
    """Readings of a port whose counters grow at `per_s` from 1000; with `wait_from_1159`, its
    XmitWait grows at that rate from the 11:59:30 reading on."""
    out, wait = [], 1000.0
    for i, t in enumerate(TIMES):
        fields = {c: int(1000 + per_s.get(c, 0) * (t - TIMES[0]).total_seconds()) for c in COUNTERS}
        if i:
            late = wait_from_1159 is not None and t > FIXED_NOW - 30 * SEC
            wait += 30 * (wait_from_1159 if late else per_s.get("xmit_wait", 0))
        fields["xmit_wait"] = int(wait)
        out.append({"switch": switch, "port": port, "time": t.isoformat(), "fields": {**fields, "link_state": 4}})
    return out


def _ingest(records: list[dict]) -> None:
    times = TimeParser(LATER, timedelta(minutes=5), timedelta(days=7))
    batch = parse_json(json.dumps({"ports": records}).encode(), times)
    assert batch.rejected == 0, batch.rejections
    write_batch(batch, collector="test", fmt="json")


@pytest.fixture
def clock(monkeypatch):
    """The selectors' clock, pinned (the consumer and the callbacks read it through them)."""
    pinned = SimpleNamespace(value=FIXED_NOW)
    monkeypatch.setattr(fabric_selectors, "timezone", SimpleNamespace(now=lambda: pinned.value))
    return pinned


@pytest.fixture
def fabric():
    """The topology above with known counters: leaf-a's uplinks to spine-1 carry 30 and 10 GB/s
    (240 + 40 Gb/s over 800), its one to spine-2 is congested (XmitWait 3e5 ticks/s); leaf-b's
    uplink reports from its spine end only; the spine-core links report nothing."""
    do_import_topology(TOPOLOGY)
    _ingest(
        _readings("leaf-a", "p3", {"xmit_data_bytes": 30e9, "rcv_data_bytes": 5e9, "xmit_wait": 1e4},
                  wait_from_1159=5e5)
        + _readings("leaf-a", "p4", {"xmit_data_bytes": 5e9, "rcv_data_bytes": 5e9, "xmit_wait": 2e4})
        + _readings("leaf-a", "p5", {"xmit_data_bytes": 5e9, "xmit_wait": 3e5})
        + _readings("spine-2", "p2", {"xmit_data_bytes": 10e9, "rcv_data_bytes": 2e9})
    )
    run_rollups(FIXED_NOW + 3 * timedelta(minutes=1))


# --- access ------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_page_and_dash_endpoints_need_a_login(client, django_user_model):
    page = client.get(reverse("fabric"))
    assert page.status_code == 302 and page["Location"].startswith("/login/")
    assert_dash_app_refuses_anonymous(client, "fabric")

    personas.signed_in(personas.operator("op"), client)
    page = client.get(reverse("fabric"))
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="react-entry-point"' in html and "DashRenderer" in html  # embedded, not framed
    assert "DJANGO_PLOTLY_DASH" not in html
    assert 'data-live-url="/ws/fabric/"' in html and "breakwater/fabric.js?v=" in html
    layout = client.get("/django_plotly_dash/app/fabric/_dash-layout")
    assert layout.status_code == 200
    assert {"fabric-matrix", "fabric-graph", "fabric-worst", "fabric-live"} <= set(_ids(layout.json()))


def _ids(node) -> list[str]:
    if isinstance(node, list):
        return [i for n in node for i in _ids(n)]
    if not isinstance(node, dict):
        return []
    props = node.get("props", {})
    own = [props["id"]] if "id" in props else []
    return own + _ids(props.get("children"))


# --- Dash callbacks ------------------------------------------------------------------------------

def _dash_update(client, output: tuple[str, str], inputs: list[tuple[str, str, object]]) -> dict:
    """POST one single-output callback the way the Dash renderer does; returns the output's value."""
    body = {
        "output": f"{output[0]}.{output[1]}", "outputs": {"id": output[0], "property": output[1]},
        "inputs": [{"id": i, "property": p, "value": v} for i, p, v in inputs],
        "changedPropIds": [f"{i}.{p}" for i, p, _ in inputs], "state": [],
    }
    resp = client.post("/django_plotly_dash/app/fabric/_dash-update-component", data=json.dumps(body),
                       content_type="application/json")
    assert resp.status_code == 200, resp.content[:500]
    return json.loads(resp.content)["response"][output[0]][output[1]]


def _matrix(client, metric) -> dict:
    return _dash_update(client, ("fabric-matrix-data", "data"),
                        [("fabric-metric", "value", metric), ("fabric-reload", "data", 0)])


def _graph(client) -> dict:
    return _dash_update(client, ("fabric-graph-data", "data"), [("fabric-reload", "data", 0)])


@pytest.fixture
def operator(client, django_user_model):
    personas.signed_in(personas.operator("op"), client)


@pytest.mark.django_db
@pytest.mark.usefixtures("fabric", "operator", "clock")
def test_matrix_callback_returns_the_selectors_matrix_per_metric(client):
    for metric in ("utilization", "congestion", "errors"):
        data = _matrix(client, metric)
        assert data["matrix"] == json.loads(json.dumps(fabric_selectors.fabric_matrix(metric, now=FIXED_NOW)))
        assert data["view"] == dash_fabric.METRIC_VIEW[metric]

    m = _matrix(client, "utilization")["matrix"]
    assert (m["leaves"], m["spines"], m["leaf_rails"]) == (["leaf-a", "leaf-b"], ["spine-1", "spine-2"], [0, 1])
    assert m["links"] == [[2, 1], [0, 1]] and m["unit"] == "%"
    assert m["z"][0][0] == pytest.approx(35.0) and m["z"][1][0] is None  # 280 Gb/s over 2 × 400
    congestion = _matrix(client, "congestion")["matrix"]
    assert congestion["z"][0] == [pytest.approx(3e4), pytest.approx(3e5)]
    assert congestion["worst"][0] | {"value": 0} == {"leaf": "leaf-a", "spine": "spine-2", "rail": 0, "value": 0,
                                                   "links": 1}
    # An unknown metric falls back to the default rather than failing the page.
    assert _matrix(client, "latency")["matrix"]["metric"] == dash_fabric.DEFAULT_METRIC


@pytest.mark.django_db
@pytest.mark.usefixtures("fabric", "operator", "clock")
def test_graph_callback_returns_the_selectors_elements_placed_in_tiers(client):
    data = _graph(client)
    selector = json.loads(json.dumps(fabric_selectors.fabric_graph(now=FIXED_NOW)))
    switches = [e for e in data["elements"] if "role" in e["data"]]
    edges = [e for e in data["elements"] if "source" in e["data"]]
    assert sorted(switches, key=lambda e: e["data"]["id"]) == sorted(
        ({**e, "position": _position(data, e["data"]["id"])} for e in selector if "source" not in e["data"]),
        key=lambda e: e["data"]["id"])
    assert edges == [e for e in selector if "source" in e["data"]]
    assert data["styles"] == dash_fabric.EDGE_STYLES
    y = {e["data"]["label"]: e["position"]["y"] for e in switches}
    assert y["core-1"] < y["spine-1"] == y["spine-2"] < y["leaf-a"] == y["leaf-b"]
    state = {(e["data"]["source"], e["data"]["target"]): e["data"]["state"] for e in edges}
    ids = {e["data"]["label"]: e["data"]["id"] for e in switches}
    assert state[(ids["leaf-a"], ids["spine-2"])] == "congested"
    assert state[(ids["leaf-a"], ids["spine-1"])] == "ok"
    assert state[(ids["spine-1"], ids["core-1"])] == "no data"
    labels = [e["data"]["label"] for e in data["elements"] if e.get("classes") == "bw-rail"]
    assert labels == ["Rail 0", "Rail 1", "No rail"]  # spine-2 serves both rails


def _position(data: dict, element_id: str) -> dict:
    return next(e["position"] for e in data["elements"] if e["data"]["id"] == element_id)


@pytest.mark.django_db
@pytest.mark.usefixtures("operator")
def test_empty_fabric_renders_without_error(client):
    assert client.get(reverse("fabric")).status_code == 200
    for metric in ("utilization", "congestion", "errors"):
        m = _matrix(client, metric)["matrix"]
        assert (m["leaves"], m["spines"], m["z"], m["links"], m["worst"]) == ([], [], [], [], [])
    assert _graph(client)["elements"] == []


def _clos(rails: int, leaves: int, spines: int) -> list[dict]:
    """A rail-optimised fabric as `fabric_graph` returns it: every leaf to every spine of its rail."""
    nodes, edges = [], []
    for r in range(rails):
        for role, count in (("leaf", leaves), ("spine", spines)):
            nodes += [{"data": {"id": f"{role}{r}-{k}", "label": f"{role}-r{r}-{k:02d}", "role": role, "rail": r,
                                "rack": None, "nodes": 0}} for k in range(count)]
        edges += [{"data": {"id": f"l{r}{a}-s{r}{b}", "source": f"leaf{r}-{a}", "target": f"spine{r}-{b}",
                            "state": "ok"}} for a in range(leaves) for b in range(spines)]
    return nodes + edges


def test_layout_puts_each_rail_in_a_plane_with_spines_above_leaves():
    placed = dash_fabric.place_switches(_clos(rails=8, leaves=64, spines=32))
    pos = {e["data"]["id"]: e["position"] for e in placed if "position" in e}
    assert sum("source" in e["data"] for e in placed) == 8 * 64 * 32
    for r in range(8):
        spine_y = {pos[f"spine{r}-{k}"]["y"] for k in range(32)}
        leaf_y = {pos[f"leaf{r}-{k}"]["y"] for k in range(64)}
        assert len(spine_y) == len(leaf_y) == 1 and spine_y.pop() < leaf_y.pop()
        # A plane's spines spread over the same span as its leaves.
        xs = [pos[f"leaf{r}-{k}"]["x"] for k in range(64)]
        assert min(xs) <= pos[f"spine{r}-0"]["x"] < pos[f"spine{r}-31"]["x"] <= max(xs)
    # No two switches share a place, and the planes wrap into rows instead of one long line.
    assert len({(p["x"], p["y"]) for p in pos.values()}) == len(pos)
    width = max(p["x"] for p in pos.values()) - min(p["x"] for p in pos.values())
    height = max(p["y"] for p in pos.values()) - min(p["y"] for p in pos.values())
    assert 1 <= width / height <= 5
    assert dash_fabric.place_switches([]) == []


# --- live consumer -------------------------------------------------------------------------------

def _communicator(cookie: bytes | None = None):
    return ws_communicator("/ws/fabric/", cookie)


def _rows(columns: dict) -> list[tuple]:
    keys = list(columns)
    return sorted(zip(*(columns[k] for k in keys), strict=True))


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fabric")
def test_consumer_sends_everything_then_only_changed_cells_and_edges(session_cookie, clock):
    ids = {e["data"]["label"]: e["data"]["id"] for e in fabric_selectors.fabric_graph(now=FIXED_NOW)
           if "source" not in e["data"]}

    async def scenario():
        ws = _communicator(session_cookie)
        assert (await ws.connect())[0]
        await ws.send_json_to({"subscribe": "congestion"})
        first = await ws.receive_json_from(timeout=10)
        await ws.send_input({"type": "telemetry.tick", "at": "x"})  # nothing changed: nothing sent
        quiet = await ws.receive_nothing(timeout=0.5)
        clock.value = LATER  # the next minute: leaf-a's uplinks to spine-1 back up
        await ws.send_input({"type": "telemetry.tick", "at": "x"})
        second = await ws.receive_json_from(timeout=10)
        await ws.send_json_to({"subscribe": "no-such-metric"})
        error = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return first, quiet, second, error

    first, quiet, second, error = async_to_sync(scenario)()

    assert (first["type"], first["metric"], first["full"], first["seq"]) == ("fabric", "congestion", True, 1)
    assert _rows(first["cells"]) == [("leaf-a", "spine-1", 3e4), ("leaf-a", "spine-2", 3e5),
                                     ("leaf-b", "spine-2", None)]
    assert len(first["edges"]["id"]) == 5 and first["removed"] == []
    states = dict(zip(first["edges"]["id"], first["edges"]["state"], strict=True))
    assert states[f"{ids['leaf-a']}-{ids['spine-2']}"] == "congested"
    assert quiet is True
    a1 = f"{ids['leaf-a']}-{ids['spine-1']}"
    assert second["full"] is False and second["seq"] == 2
    assert _rows(second["cells"]) == [("leaf-a", "spine-1", 5.2e5)]  # 5e5 + 2e4
    assert second["edges"]["id"] == [a1] and second["edges"]["state"] == ["congested"]
    assert second["edges"]["xmit_wait_per_s"] == [5.2e5]
    assert error["type"] == "error" and "no-such-metric" in error["message"]


@pytest.mark.django_db
@pytest.mark.usefixtures("fabric")
@pytest.mark.parametrize("metric", ["utilization", "congestion", "errors"])
def test_consumer_cells_are_the_matrix_values(metric):
    """The consumer reads the graph only; its cells must be the matrix the page loaded."""
    cells, _ = consumer.snapshot(fabric_selectors.fabric_graph(now=FIXED_NOW), metric)
    m = fabric_selectors.fabric_matrix(metric, now=FIXED_NOW)
    expected = {(leaf, spine): m["z"][i][j] for i, leaf in enumerate(m["leaves"])
                for j, spine in enumerate(m["spines"]) if m["links"][i][j]}
    assert cells.keys() == expected.keys()
    for key, value in expected.items():
        assert cells[key] == (None if value is None else pytest.approx(value, rel=1e-3)), key


def test_change_reports_only_what_moved_and_what_left():
    cells = {("a", "s"): 1.0, ("b", "s"): None}
    edges = {"e1": ("ok", 10.0, 1, 0, 0.0, 1.0), "e2": ("no data", None, 1, 0, None, None)}
    full = consumer.change({}, {}, cells, edges, full=True)
    assert full["full"] is True and len(full["cells"]["leaf"]) == 2 and len(full["edges"]["id"]) == 2
    assert consumer.change(cells, edges, cells, edges, full=False) is None
    moved = consumer.change(cells, edges, {("a", "s"): 2.0, ("b", "s"): None},
                            {"e1": ("congested", 10.0, 1, 0, 0.0, 3e5)}, full=False)
    assert moved["cells"] == {"leaf": ["a"], "spine": ["s"], "value": [2.0]}
    assert moved["edges"]["id"] == ["e1"] and moved["edges"]["state"] == ["congested"]
    assert moved["removed"] == ["e2"]


@pytest.mark.django_db(transaction=True)
def test_consumer_on_an_empty_fabric_sends_an_empty_full_message(session_cookie):
    async def scenario():
        ws = _communicator(session_cookie)
        assert (await ws.connect())[0]
        await ws.send_json_to({"subscribe": "utilization"})
        msg = await ws.receive_json_from(timeout=10)
        await ws.disconnect()
        return msg

    msg = async_to_sync(scenario)()
    assert msg["full"] is True and msg["cells"]["leaf"] == [] and msg["edges"]["id"] == []


@pytest.mark.django_db(transaction=True)
def test_consumer_rejects_anonymous_users():
    async def scenario():
        ws = _communicator(None)
        connected, code = await ws.connect()
        await ws.disconnect()
        return connected, code

    assert async_to_sync(scenario)() == (False, 4401)


def test_a_large_change_goes_out_in_parts_under_the_message_limit():
    cells = {(f"leaf-r{r}-{k:02d}", f"spine-r{r}-{k % 32:02d}"): 123456.7 for r in range(8) for k in range(2048)}
    edges = {f"sw{n}-sw{n + 20000}": ("congested", 12.34, 1, 0, 0.01667, 1.234e5) for n in range(16384)}
    msg = consumer.change({}, {}, cells, edges, full=True)
    msg["removed"] = ["sw1-sw2"]

    out = consumer.parts(msg)

    assert [(p["part"], p["parts"], p["full"]) for p in out] == [(k, 5, True) for k in range(1, 6)]
    assert sum(len(p["cells"]["leaf"]) for p in out) == sum(len(p["edges"]["id"]) for p in out) == 16384
    assert [p["removed"] for p in out] == [[], [], [], [], ["sw1-sw2"]]
    assert max(len(json.dumps(p)) for p in out) < 1_000_000
    assert consumer.parts(consumer.change({}, {}, {}, {}, full=True))[0]["parts"] == 1


@pytest.mark.django_db
def test_a_live_read_that_runs_too_long_is_cancelled(monkeypatch):
    def stuck(*args, **kwargs):
        with connection.cursor() as cur:
            cur.execute("SELECT pg_sleep(5)")

    monkeypatch.setattr(fabric_selectors, "_fabric", stuck)  # the graph's read, under the consumer's timeout
    monkeypatch.setattr(consumer, "READ_TIMEOUT_MS", 100)
    started = time.monotonic()
    with pytest.raises(OperationalError, match="statement timeout"):
        consumer.read_graph()
    assert time.monotonic() - started < 2
