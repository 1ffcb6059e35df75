"""Fabric selectors: the leaf × spine matrix, the switch graph and one port, from real ingest + rollups."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.db import connection

from telemetry.ingest.documents import parse_json
from telemetry.ingest.schema import TimeParser
from telemetry.ingest.writer import write_batch
from telemetry.models import Gpu, Link, Node, NvlinkDomain, Port, Rack, Switch
from telemetry.rollups import run_rollups
from telemetry.selectors import fabric_graph, fabric_matrix, nvlink_domains, port_detail
from telemetry.selectors.fabric import _edge_state, rate_bucket
from telemetry.simulator.topology import build_layout, topology_document
from telemetry.topology import do_import_topology
from tests.conftest import FIXED_NOW

SEC = timedelta(seconds=1)
# Readings every 30 s from 11:56:00 to 11:59:30. At FIXED_NOW (12:00) the settled rate bucket is
# 11:58, whose delta steps from the 11:57:30 reading to the 11:58:30 one: exactly 60 s.
TIMES = [FIXED_NOW - timedelta(minutes=4) + i * 30 * SEC for i in range(8)]
COUNTERS = ("xmit_data_bytes", "rcv_data_bytes", "xmit_wait", "symbol_errors", "rcv_errors", "link_downed",
            "link_error_recovery")


def _switch(name: str, role: str) -> dict:
    return {"name": name, "role": role, "port_count": 8, "port_speed_gbps": 400}


def _hca(name: str, rail: int) -> dict:
    return {"name": name, "speed_gbps": 400, "rail": rail}


# Two rails: leaf-a (rail 0) and leaf-b (rail 1). leaf-a has two cables to spine-1 and one to
# spine-2; leaf-b has one to spine-2 and none to spine-1. Both spines go up to core-1.
TOPOLOGY = {
    "version": 1,
    "sites": [{"name": "dc1", "halls": [{"name": "hall-a", "rows": [{"name": "row-01", "racks": [{
        "name": "r01",
        "nodes": [
            {"hostname": "n1", "hcas": [_hca("mlx5_0/1", 0), _hca("mlx5_1/1", 1)]},
            {"hostname": "n2", "hcas": [_hca("mlx5_0/1", 0)]},
        ],
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


def _ingest(records: list[dict]) -> None:
    times = TimeParser(FIXED_NOW, timedelta(minutes=5), timedelta(days=7))
    batch = parse_json(json.dumps({"ports": records}).encode(), times)
    assert batch.rejected == 0, batch.rejections
    write_batch(batch, collector="test", fmt="json")


def _steady(switch: str, port: str, per_s: dict[str, float], series: dict[str, list[int]] | None = None,
            **gauges) -> list[dict]:
    """Readings of a port whose counters grow at `per_s` from 1000 (others stay put), except those
    given reading by reading in `series`."""
    out = []
    for i, t in enumerate(TIMES):
        fields = {c: int(1000 + per_s.get(c, 0) * (t - TIMES[0]).total_seconds()) for c in COUNTERS}
        fields.update({c: values[i] for c, values in (series or {}).items()}, **gauges)
        out.append({"switch": switch, "port": port, "time": t.isoformat(), "fields": fields})
    return out


@pytest.fixture
def fabric():
    do_import_topology(TOPOLOGY)
    records = (
        # 3 symbol errors a minute: counted, but below the line for the graph's "errors".
        _steady("leaf-a", "p3", {"xmit_data_bytes": 25e9, "rcv_data_bytes": 5e9, "xmit_wait": 1e4,
                                 "symbol_errors": 0.05})
        + _steady("leaf-a", "p4", {"xmit_data_bytes": 5e9, "rcv_data_bytes": 5e9, "xmit_wait": 2e4})
        # Trained down to 200 Gb/s and blocked on credits.
        + _steady("leaf-a", "p5", {"xmit_data_bytes": 5e9, "xmit_wait": 3e5}, link_speed_gbps=200.0, link_state=4)
        # leaf-b:p3 reports nothing; its spine end does. Symbol errors reset at 11:58:00 (the
        # new reading counts from zero: +3, then +2) and the link went down once in that minute.
        + _steady("spine-2", "p2", {"xmit_data_bytes": 10e9, "rcv_data_bytes": 2e9},
                  {"symbol_errors": [90, 95, 100, 100, 3, 5, 5, 5], "link_downed": [7, 7, 7, 7, 8, 8, 8, 8]})
        + _steady("spine-1", "p8", {}, link_state=1)
    )
    _ingest(records)
    run_rollups(FIXED_NOW)


@pytest.mark.django_db
def test_rate_bucket_is_the_newest_minute_the_rollup_beat_has_settled():
    assert rate_bucket(FIXED_NOW) == FIXED_NOW - timedelta(minutes=2)
    assert rate_bucket(FIXED_NOW + 44 * SEC) == FIXED_NOW - timedelta(minutes=2)
    assert rate_bucket(FIXED_NOW + 45 * SEC) == FIXED_NOW - timedelta(minutes=1)


@pytest.mark.django_db
def test_matrix_shape_groups_by_rail_and_counts_links(fabric):
    m = fabric_matrix("utilization", now=FIXED_NOW)
    assert (m["metric"], m["unit"]) == ("utilization", "%")
    assert (m["leaves"], m["leaf_rails"]) == (["leaf-a", "leaf-b"], [0, 1])
    # spine-1 serves rail 0 only; spine-2 serves both rails, so it has none and sorts last.
    assert (m["spines"], m["spine_rails"]) == (["spine-1", "spine-2"], [0, None])
    assert m["links"] == [[2, 1], [0, 1]]
    assert m["rate_bucket"] == (FIXED_NOW - timedelta(minutes=2)).isoformat()


@pytest.mark.django_db
def test_matrix_utilization_is_the_busier_direction_over_the_bundle(fabric):
    z = fabric_matrix("utilization", now=FIXED_NOW)["z"]
    # leaf-a→spine-1: (25e9 + 5e9) B/s up = 240 Gb/s over 2 × 400 Gb/s.
    assert z[0][0] == pytest.approx(30.0, rel=1e-12)
    # leaf-a→spine-2: 40 Gb/s over the negotiated 200 Gb/s.
    assert z[0][1] == pytest.approx(20.0, rel=1e-12)
    assert z[1][0] is None
    # leaf-b→spine-2 mirrored from the spine end: it sends 80 Gb/s down.
    assert z[1][1] == pytest.approx(20.0, rel=1e-12)


@pytest.mark.django_db
def test_matrix_congestion_sums_leaf_uplink_xmit_wait(fabric):
    m = fabric_matrix("congestion", now=FIXED_NOW)
    assert m["unit"] == "ticks/s"
    assert m["z"] == [[pytest.approx(3e4), pytest.approx(3e5)], [None, None]]
    assert [(w["leaf"], w["spine"], w["rail"]) for w in m["worst"]] == [("leaf-a", "spine-2", 0),
                                                                      ("leaf-a", "spine-1", 0)]


@pytest.mark.django_db
def test_matrix_errors_handle_counter_resets_at_either_end(fabric):
    m = fabric_matrix("errors", now=FIXED_NOW)
    # 3 + 2 symbol errors across the reset and one link downed, over 60 s.
    assert m["z"][1][1] == pytest.approx(6 / 60, rel=1e-12)
    assert m["z"][0] == [pytest.approx(3 / 60, rel=1e-12), 0.0]
    assert m["worst"][:2] == [
        {"leaf": "leaf-b", "spine": "spine-2", "rail": 1, "value": pytest.approx(0.1), "links": 1},
        {"leaf": "leaf-a", "spine": "spine-1", "rail": 0, "value": pytest.approx(0.05), "links": 2},
    ]


@pytest.mark.django_db
def test_unknown_metric_is_refused():
    with pytest.raises(ValueError, match="unknown metric"):
        fabric_matrix("latency", now=FIXED_NOW)


@pytest.mark.django_db
def test_graph_has_switch_nodes_with_host_counts_and_edge_states(fabric):
    elements = fabric_graph(now=FIXED_NOW)
    nodes = {e["data"]["label"]: e["data"] for e in elements if "source" not in e["data"]}
    edges = {(e["data"]["source"], e["data"]["target"]): e["data"] for e in elements if "source" in e["data"]}
    assert sorted(nodes) == ["core-1", "leaf-a", "leaf-b", "spine-1", "spine-2"]
    assert {n: (d["role"], d["rail"], d["nodes"]) for n, d in nodes.items()} == {
        "core-1": ("core", None, 0), "leaf-a": ("leaf", 0, 2), "leaf-b": ("leaf", 1, 1),
        "spine-1": ("spine", 0, 0), "spine-2": ("spine", None, 0),
    }
    ids = {name: d["id"] for name, d in nodes.items()}
    state = {(a, b): edges[(ids[a], ids[b])]["state"] for a, b in [
        ("leaf-a", "spine-1"), ("leaf-a", "spine-2"), ("leaf-b", "spine-2"), ("spine-1", "core-1"),
        ("spine-2", "core-1")]}
    assert state == {
        ("leaf-a", "spine-1"): "ok", ("leaf-a", "spine-2"): "congested", ("leaf-b", "spine-2"): "errors",
        ("spine-1", "core-1"): "down", ("spine-2", "core-1"): "no data",
    }
    assert len(edges) == 5
    ok = edges[(ids["leaf-a"], ids["spine-1"])]
    assert (ok["links"], ok["links_down"], ok["util_pct"]) == (2, 0, pytest.approx(30.0))


@pytest.mark.parametrize(("numbers", "state"), [
    ({"reporting": 0}, "no data"),
    ({"down": 2}, "down"),
    ({"down": 1}, "errors"),  # one of two cables lost
    ({"events": 1 / 60}, "errors"),  # a single flap or recovery in the minute
    ({"line_errors": 10 / 60}, "errors"),
    ({"line_errors": 9 / 60, "wait_max": 2e5}, "congested"),
    ({"line_errors": 9 / 60, "wait_max": 1.9e5}, "ok"),
])
def test_edge_state_thresholds(numbers, state):
    pair = {"links": 2, "reporting": 2, "down": 0, "events": 0.0, "line_errors": 0.0, "wait_max": None}
    assert _edge_state(pair | numbers) == state


@pytest.mark.django_db
def test_port_detail_has_peer_latest_values_units_and_rates(fabric):
    port = Port.objects.get(switch__name="leaf-a", name="p5")
    d = port_detail(port.id, now=FIXED_NOW)
    assert d["port"] | {"id": None} == {
        "id": None, "name": "p5", "owner_kind": "switch", "owner": "leaf-a", "role": "leaf", "rack": "r01",
        "guid": None, "lid": None, "link_layer": "infiniband", "speed_gbps": 400.0, "rail": None,
    }
    assert (d["peer"]["owner"], d["peer"]["name"], d["peer"]["role"]) == ("spine-2", "p1", "spine")
    latest = d["latest"]
    assert latest["time"] == TIMES[-1].isoformat() and latest["stale"] is False
    assert latest["fields"]["link_speed_gbps"] == {"value": 200.0, "unit": "Gb/s", "kind": "gauge",
                                                   "help": "Negotiated link speed"}
    assert latest["fields"]["xmit_wait"]["value"] == 1000 + 3e5 * 210
    assert latest["fields"]["ecn_marked"]["value"] is None
    rates = d["rates"]["fields"]
    assert rates["xmit_wait"] == {"value": pytest.approx(3e5), "unit": "ticks/s"}
    assert rates["xmit_data_bytes"]["unit"] == "B/s" and rates["pfc_pause_rx"]["value"] is None
    assert d["utilization"] == {"xmit_pct": pytest.approx(20.0), "rcv_pct": 0.0}


@pytest.mark.django_db
def test_port_detail_of_a_silent_hca_port_and_of_no_port():
    do_import_topology(TOPOLOGY)
    port = Port.objects.get(node__hostname="n1", name="mlx5_1/1")
    d = port_detail(port.id, now=FIXED_NOW)
    assert (d["port"]["owner_kind"], d["port"]["role"], d["port"]["rail"]) == ("node", "hca", 1)
    assert (d["peer"]["owner"], d["peer"]["name"]) == ("leaf-b", "p1")
    assert d["latest"]["time"] is None and d["latest"]["stale"] is True
    assert all(f["value"] is None for f in d["latest"]["fields"].values())
    assert d["rates"]["bucket"] is None and d["utilization"] == {"xmit_pct": None, "rcv_pct": None}
    unlinked = Port.objects.get(switch__name="core-1", name="p5")
    assert port_detail(unlinked.id, now=FIXED_NOW)["peer"] is None
    assert port_detail(10**9, now=FIXED_NOW) is None


@pytest.mark.django_db
def test_empty_cluster_and_cluster_without_samples():
    assert fabric_graph(now=FIXED_NOW) == []
    empty = fabric_matrix("errors", now=FIXED_NOW)
    assert (empty["leaves"], empty["spines"], empty["z"], empty["links"], empty["worst"]) == ([], [], [], [], [])
    do_import_topology(TOPOLOGY)
    m = fabric_matrix("utilization", now=FIXED_NOW)
    assert m["z"] == [[None, None], [None, None]] and m["worst"] == []
    assert {e["data"]["state"] for e in fabric_graph(now=FIXED_NOW) if "source" in e["data"]} == {"no data"}


def _timed(fn, *args, **kwargs):
    started = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - started


@pytest.mark.slow
@pytest.mark.django_db
def test_selectors_at_16k_gpus_answer_well_under_a_second():
    do_import_topology(topology_document(build_layout(16_384)))
    # The import is not committed (the test's transaction), so an autovacuum pass over the rows
    # earlier tests rolled back can leave pg_class saying these tables are empty, and a planner
    # that believes that loops over 65k ports per link. Production rows are committed and
    # analyzed; give the planner the same here.
    tables = [m._meta.db_table for m in (Switch, Port, Link, Node, Gpu, NvlinkDomain, Rack)]
    with connection.cursor() as cur:
        cur.execute(f"ANALYZE {', '.join(tables)}")
    # The first call also warms the catalog caches of a brand-new connection; a page calls again.
    m, matrix_cold = _timed(fabric_matrix, "utilization", now=FIXED_NOW)
    n, nvlink_cold = _timed(nvlink_domains, FIXED_NOW)
    matrix_s, nvlink_s = _timed(fabric_matrix, "utilization", now=FIXED_NOW)[1], _timed(nvlink_domains, FIXED_NOW)[1]
    print(f"\n16,384 GPUs, no samples: fabric_matrix {matrix_s * 1000:.0f} ms (first {matrix_cold * 1000:.0f}),"
          f" nvlink_domains {nvlink_s * 1000:.0f} ms (first {nvlink_cold * 1000:.0f})")
    assert (len(m["leaves"]), len(m["spines"]), sum(map(sum, m["links"]))) == (512, 256, 16_384)
    assert len(n["domains"]) == 2048 and n["by_state"]["no data"] == 2048
    assert matrix_s < 1.0 and nvlink_s < 1.0
