"""NVLink selector: domains (declared and implicit), per-GPU error and bandwidth rates, states."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from telemetry.ingest.documents import parse_json
from telemetry.ingest.schema import TimeParser
from telemetry.ingest.writer import write_batch
from telemetry.rollups import run_rollups
from telemetry.selectors import nvlink_domains
from telemetry.topology import do_import_topology
from tests.conftest import FIXED_NOW

SEC = timedelta(seconds=1)
# Readings every 30 s from 11:56:00 to 11:59:30; at FIXED_NOW the rate bucket is 11:58, whose
# delta steps from the 11:57:30 reading to the 11:58:30 one.
TIMES = [FIXED_NOW - timedelta(minutes=4) + i * 30 * SEC for i in range(8)]
COUNTERS = ("nvlink_crc_flit_errors", "nvlink_crc_data_errors", "nvlink_replay_errors", "nvlink_recovery_errors",
            "nvlink_bandwidth")


def _node(host: str, gpus: int, domain: str | None) -> dict:
    node = {"hostname": host, "gpus": [{"index": i, "uuid": f"GPU-{host}-{i}"} for i in range(gpus)]}
    return node | ({"nvlink_domain": domain} if domain else {})


# n1: an HGX node with its own NVSwitch domain; t1 and t2: trays of one NVL72 rack domain; n3: a
# node the file gives no domain; nvd-empty: a declared domain with no GPUs.
TOPOLOGY = {
    "version": 1,
    "sites": [{"name": "dc1", "halls": [{"name": "hall-a", "rows": [{"name": "row-01", "racks": [
        {"name": "r01", "nodes": [_node("n1", 2, "nvd-n1"), _node("n3", 1, None)]},
        {"name": "r02", "nodes": [_node("t1", 1, "nvl-r02"), _node("t2", 1, "nvl-r02")]},
    ]}]}]}],
    "nvlink_domains": [
        {"name": "nvd-n1", "kind": "node"}, {"name": "nvl-r02", "kind": "rack", "rack": "r02"},
        {"name": "nvd-empty", "kind": "node"},
    ],
}


def _ingest(records: list[dict]) -> None:
    times = TimeParser(FIXED_NOW, timedelta(minutes=5), timedelta(days=7))
    batch = parse_json(json.dumps({"gpus": records}).encode(), times)
    assert batch.rejected == 0, batch.rejections
    write_batch(batch, collector="test", fmt="json")


def _gpu(host: str, per_s: dict[str, float], series: dict[str, list[int]] | None = None, **gauges) -> list[dict]:
    """Readings of GPU 0 of `host`: counters grow at `per_s` from 10 (others stay put), except those
    given reading by reading in `series`."""
    out = []
    for i, t in enumerate(TIMES):
        fields = {c: int(10 + per_s.get(c, 0) * (t - TIMES[0]).total_seconds()) for c in COUNTERS}
        fields.update({c: values[i] for c, values in (series or {}).items()}, **gauges)
        out.append({"host": host, "uuid": f"GPU-{host}-0", "index": 0, "time": t.isoformat(), "fields": fields})
    return out


@pytest.fixture
def domains():
    do_import_topology(TOPOLOGY)
    # In the rate's minute, n1's GPU 0 has one link recovery, its GPU 1 twelve replays, and t1
    # three flit CRC errors (below the line).
    recovery = {"nvlink_recovery_errors": [0, 0, 0, 0, 1, 1, 1, 1]}
    replays = {"nvlink_replay_errors": [0, 0, 0, 0, 8, 12, 12, 12]}
    second = [dict(r, uuid="GPU-n1-1", index=1) for r in _gpu("n1", {}, replays)]
    # Throughputs are 4-byte reals: these are exact in one.
    _ingest(
        _gpu("n1", {"nvlink_bandwidth": 1000}, recovery, nvlink_tx_bps=2e10, nvlink_rx_bps=1e10) + second
        + _gpu("t1", {"nvlink_bandwidth": 500}, {"nvlink_crc_flit_errors": [0, 0, 0, 0, 2, 3, 3, 3]},
               nvlink_tx_bps=5e9)
        # t2 was reset at 11:58:00: every counter restarts and counts from zero.
        + _gpu("t2", {}, {"nvlink_crc_flit_errors": [50, 50, 50, 50, 0, 0, 0, 0],
                          "nvlink_bandwidth": [10**9, 10**9 + 30_000, 10**9 + 60_000, 10**9 + 90_000, 60_000,
                                               120_000, 180_000, 240_000]})
    )
    run_rollups(FIXED_NOW)
    return {d["name"]: d for d in nvlink_domains(FIXED_NOW)["domains"]}


@pytest.mark.django_db
def test_every_declared_domain_then_implicit_node_domains(domains):
    assert list(domains) == ["nvd-empty", "nvd-n1", "nvl-r02", "n3"]
    shape = {n: (d["kind"], d["implicit"], d["rack"], d["id"] is None) for n, d in domains.items()}
    assert shape == {"nvd-empty": ("node", False, None, False), "nvd-n1": ("node", False, None, False),
                     "nvl-r02": ("rack", False, "r02", False), "n3": ("node", True, None, True)}
    assert [(g["host"], g["index"], g["uuid"]) for g in domains["nvl-r02"]["gpus"]] == [
        ("t1", 0, "GPU-t1-0"), ("t2", 0, "GPU-t2-0")]


@pytest.mark.django_db
def test_gpu_rates_come_from_the_settled_bucket_with_resets_handled(domains):
    n1_0, n1_1 = domains["nvd-n1"]["gpus"]
    assert (n1_0["nvlink_bandwidth"], n1_0["nvlink_tx_bps"], n1_0["nvlink_rx_bps"]) == (1000.0, 2e10, 1e10)
    # +8 across the bucket's first step, +4 in its second: 12 replays a minute.
    assert (n1_1["nvlink_replay_errors"], n1_1["errors_per_s"]) == (0.2, 0.2)
    assert n1_1["nvlink_tx_bps"] is None
    t2 = domains["nvl-r02"]["gpus"][1]
    # The drop to 0 is a reset, not -50; bandwidth restarts at 60 000 then adds 60 000.
    assert (t2["nvlink_crc_flit_errors"], t2["nvlink_bandwidth"], t2["state"]) == (0.0, 2000.0, "ok")


@pytest.mark.django_db
def test_gpu_state_flags_any_recovery_and_a_steady_crc_or_replay_stream(domains):
    n1_0, n1_1 = domains["nvd-n1"]["gpus"]
    t1 = domains["nvl-r02"]["gpus"][0]
    assert (n1_0["nvlink_recovery_errors"], n1_0["state"]) == (pytest.approx(1 / 60), "errors")
    assert n1_1["state"] == "errors"
    assert (t1["nvlink_crc_flit_errors"], t1["errors_per_s"], t1["state"]) == (0.05, 0.05, "ok")


@pytest.mark.django_db
def test_domain_state_and_totals(domains):
    n1, r02, implicit, empty = domains["nvd-n1"], domains["nvl-r02"], domains["n3"], domains["nvd-empty"]
    assert (n1["state"], r02["state"], implicit["state"], empty["state"]) == ("errors", "ok", "no data", "no data")
    assert n1["totals"] == {
        "gpus": 2, "gpus_reporting": 2, "gpus_with_errors": 2, "errors_per_s": pytest.approx(0.2 + 1 / 60),
        "nvlink_crc_flit_errors": 0.0, "nvlink_crc_data_errors": 0.0, "nvlink_replay_errors": 0.2,
        "nvlink_recovery_errors": pytest.approx(1 / 60), "nvlink_bandwidth": 1000.0, "nvlink_tx_bps": 2e10,
        "nvlink_rx_bps": 1e10,
    }
    assert (r02["totals"]["nvlink_bandwidth"], r02["totals"]["nvlink_tx_bps"]) == (2500.0, 5e9)
    assert (r02["totals"]["gpus_with_errors"], r02["totals"]["errors_per_s"]) == (0, 0.05)
    assert implicit["gpus"] == [{
        "uuid": "GPU-n3-0", "host": "n3", "index": 0, "nvlink_crc_flit_errors": None, "nvlink_crc_data_errors": None,
        "nvlink_replay_errors": None, "nvlink_recovery_errors": None, "nvlink_bandwidth": None,
        "nvlink_tx_bps": None, "nvlink_rx_bps": None, "errors_per_s": None, "state": "no data",
    }]
    assert empty["gpus"] == [] and empty["totals"]["gpus"] == 0 and empty["totals"]["errors_per_s"] is None


@pytest.mark.django_db
def test_summary_counts_domains_by_state_and_names_units(domains):
    out = nvlink_domains(FIXED_NOW)
    assert out["by_state"] == {"errors": 1, "ok": 1, "no data": 2}
    assert out["units"]["nvlink_replay_errors"] == "errors/s" and out["units"]["nvlink_tx_bps"] == "B/s"


@pytest.mark.django_db
def test_rates_fade_to_no_data_once_the_bucket_is_behind_us(domains):
    later = nvlink_domains(FIXED_NOW + timedelta(minutes=10))
    assert later["by_state"] == {"errors": 0, "ok": 0, "no data": 4}


@pytest.mark.django_db
def test_empty_cluster():
    assert nvlink_domains(FIXED_NOW)["domains"] == []
    assert nvlink_domains(FIXED_NOW)["by_state"] == {"errors": 0, "ok": 0, "no data": 0}
