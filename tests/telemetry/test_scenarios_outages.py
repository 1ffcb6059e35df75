"""The outage scenarios: a GPU that goes silent, a node that goes down, a degraded fabric port.

Each must tell its story only through what a real cluster would report (records that stop, a
job ended NODE_FAIL, counters and a negotiated rate), and declare what it planted in its truth.
"""

from __future__ import annotations

from datetime import timedelta

from telemetry.simulator.topology import PORT_SPEED_GBPS
from tests.conftest import FIXED_NOW
from tests.telemetry.test_scenarios import _at, _events, _gpu_series, _port_series, _run


def test_gpu_silent_stops_its_records_without_any_event_while_its_peers_report():
    cluster, scenarios, ticks = _run(64, ["gpu-silent@1"], 12)
    truth = scenarios.records[0]
    assert truth["entity_kind"] == "gpu" and truth["details"]["event"] is None
    series = _gpu_series(ticks, truth["entity"])
    gone = series.index(None)
    assert gone > 0 and all(f is None for f in series[gone:])
    assert ticks[gone].time == _at(truth["fails_at"]) == FIXED_NOW + timedelta(minutes=1)
    assert series[gone - 1]["xid"] == 0
    assert _events(ticks) == [], "no XID, no kernel-log line: it just goes quiet"
    i = cluster.node_index[truth["host"]]
    peers = [g.spec.uuid for g in cluster.gpus[i] if g.spec.uuid != truth["entity"]]
    assert all(_gpu_series(ticks[-1:], uuid)[0] is not None for uuid in peers)


def test_node_down_silences_its_gpus_and_ports_and_ends_its_job_node_fail():
    cluster, scenarios, ticks = _run(64, ["node-down@1"], 10)
    truth = scenarios.records[0]
    host, details = truth["host"], truth["details"]
    i = cluster.node_index[host]
    # The first ticks' scheduler fills the node like any other; a job started there dies with it.
    job_id = cluster.scheduler.node_job[i]
    assert truth["entity_kind"] == "node" and truth["entity"] == host
    assert details["gpu_uuids"] == [g.spec.uuid for g in cluster.gpus[i]] and len(details["hca_ports"]) == 8
    fails = _at(truth["fails_at"])
    for tick in ticks:
        reporting = {r["uuid"] for r in tick.records("gpus")} & set(details["gpu_uuids"])
        hosts = {r.get("host") for r in tick.records("ports")}
        assert (reporting == set(details["gpu_uuids"]) and host in hosts) == (tick.time < fails)
    leaf = _port_series([t for t in ticks if t.time >= fails], details["leaf_ports"][0])
    assert {f["link_state"] for f in leaf} == {1}, "the leaf still reports and sees its link down"
    assert job_id is None and i in cluster.scheduler.unavailable and i in cluster.down_until
    snapshots = [j for t in ticks if t.jobs for j in t.jobs["jobs"] if host in j["nodes"]]
    ended = [j for j in snapshots if j["state"] == "NODE_FAIL"]
    assert [j["job_id"] for j in ended] == [f"sim-{details['job']}"] and _at(ended[0]["end"]) == fails
    assert not [j for j in snapshots if j["state"] == "RUNNING" and _at(j["start"]) >= fails]


def test_port_degraded_retrains_lower_and_collects_rising_symbol_errors_while_up():
    _, scenarios, ticks = _run(64, ["port-degraded@1"], 14, speed=1)
    truth = scenarios.records[0]
    fails = _at(truth["fails_at"])
    for key in (truth["entity"], truth["details"]["peer"]):
        series = _port_series(ticks, key)
        before = [f for t, f in zip(ticks, series, strict=True) if t.time < fails]
        after = [f for t, f in zip(ticks, series, strict=True) if t.time >= fails]
        assert {f["link_speed_gbps"] for f in before} == {PORT_SPEED_GBPS}
        assert {f["link_speed_gbps"] for f in after} == {truth["details"]["speed_gbps"]["after"]} == {200}
        assert {f["link_state"] for f in series} == {4}, "degraded, never down"
        assert before[-1]["symbol_errors"] == before[0]["symbol_errors"]
        rise = [b["symbol_errors"] - a["symbol_errors"] for a, b in zip(after, after[1:], strict=False)]
        assert all(r > 0 for r in rise) and sum(rise[-3:]) > sum(rise[:3])
        assert after[-1]["rcv_errors"] > after[0]["rcv_errors"]
        assert after[-1]["link_downed"] == before[0]["link_downed"]
