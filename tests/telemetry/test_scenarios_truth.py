"""Ground truth for everything the simulator plants: latent defects from the first tick, injected faults as
they happen, each with its entity, time and signal families, in the same JSON-lines file as the scenarios."""

from __future__ import annotations

from datetime import datetime, timedelta

import orjson
import pytest

from telemetry.simulator.dynamics import Cluster
from telemetry.simulator.scenarios import ScenarioSet, parse_spec
from telemetry.simulator.truth import ANY, SIGNALS, defect, family_of, latent_defects
from tests.conftest import FIXED_NOW

MIN = timedelta(minutes=1)


def _lines(path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_latent_defects_are_declared_from_the_first_tick_with_where_and_which_signals():
    cluster = Cluster.build(512, seed=2)
    declared = latent_defects(cluster, FIXED_NOW.timestamp())
    by = {}
    for d in declared:
        by.setdefault(d["defect"], []).append(d)
    weak = {g.spec.uuid for gs in cluster.gpus for g in gs if g.weak}
    assert {d["entity"] for d in by["weak-gpu"]} == weak and len(by["hot-gpu"]) == 512 // 250
    assert {d["entity"] for d in by["hot-gpu"]} == cluster.hot_gpus
    assert all(d["latent"] and d["starts_at"] == FIXED_NOW.isoformat().replace("+00:00", "Z")
               and d["ends_at"] is None for d in declared)
    [leaf] = by["hot-leaf"]  # 512 GPUs: 8 leaves, one in twenty of them hot (at least one)
    assert leaf["entity_kind"] == "switch" and leaf["signals"] == ["congestion"]
    ports = cluster.fabric.leaf_down[leaf["entity"]] + cluster.fabric.leaf_up[leaf["entity"]]
    related = {tuple(r) for r in leaf["related"]}
    assert {("port", f"{p.owner}:{p.name}") for p in ports} <= related  # its ports
    assert {("port", f"{p.peer.owner}:{p.peer.name}") for p in ports} <= related  # and the ports feeding them
    cable = by["marginal-cable"][0]
    far = cluster.fabric.ports[cable["entity"]].peer
    assert cable["related"] == [["port", f"{far.owner}:{far.name}"]] and cable["signals"] == ["port errors"]


def test_injected_faults_are_declared_as_they_happen_with_their_entity_time_and_signal(tmp_path):
    path = tmp_path / "truth.jsonl"
    scenarios = ScenarioSet([], seed=4, truth=path, faults=True)
    cluster = Cluster.build(256, seed=4, interval=60, scenarios=scenarios)
    times = [FIXED_NOW + k * MIN for k in range(61)]
    for t in times[:30]:
        cluster.step(t)
    host = cluster.layout.nodes[3].hostname
    cluster.reboot_node(host, times[30], down_s=240)
    for t in times[30:]:
        cluster.step(t)
    lines = _lines(path)
    injected = [d for d in lines if not d["latent"]]
    assert [d for d in lines if d["latent"]] == latent_defects(cluster, FIXED_NOW.timestamp())  # written first
    assert injected == scenarios.declared[len(lines) - len(injected):]
    kinds = {d["defect"] for d in injected}
    assert {"symbol-errors", "reboot"} <= kinds and kinds & {"sbe", "pcie-replay", "nvlink-crc"}
    [reboot] = [d for d in injected if d["defect"] == "reboot" and d["entity"] == host]
    assert reboot["signals"] == [ANY] and reboot["starts_at"] == times[30].isoformat().replace("+00:00", "Z")
    assert datetime.fromisoformat(reboot["ends_at"]) - datetime.fromisoformat(reboot["starts_at"]) == 4 * MIN
    for d in injected:
        assert times[1] <= datetime.fromisoformat(d["starts_at"]) <= times[-1]
        assert set(d["signals"]) <= set(SIGNALS) | {ANY}
    errors = {d["defect"]: d["signals"] for d in injected}
    assert errors.get("sbe", ["gpu errors"]) == ["gpu errors"] and errors["symbol-errors"] == ["port errors"]


def test_a_scenarios_own_nodes_are_left_to_its_own_line():
    scenarios = ScenarioSet([parse_spec("nvlink-crc")], seed=3, speed=20, faults=True)
    cluster = Cluster.build(64, seed=3, scenarios=scenarios)
    for k in range(40):
        cluster.step(FIXED_NOW + timedelta(seconds=10 * k))
    gpu = scenarios.records[0]["entity"]
    assert not [d for d in scenarios.declared if d["entity"] == gpu and not d["latent"]]


def test_signal_families_cover_telemetry_fields_and_derived_features():
    assert [family_of(f) for f in ("gpu_temp", "xmit_wait", "symbol_errors", "sm_active", "sbe_trend",
                                   "nvlink_crc_1h", "hot_hours_24h", "step_time_s", "loss")] == [
        "thermal", "congestion", "port errors", "activity", "gpu errors", "nvlink errors", "thermal", "activity",
        "training"]
    assert family_of("age_days") is None
    with pytest.raises(ValueError, match="signal families"):
        defect("odd", "gpu", "GPU-1", starts=FIXED_NOW, signals=["vibes"])
