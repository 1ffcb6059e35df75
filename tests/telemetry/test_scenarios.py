"""Scripted simulator scenarios: the telemetry each one promises, and its ground truth.

Most tests step small clusters directly from the fixed epoch with compressed timelines; one
runs the real `simulate` command against the live server and checks the GPU events it caused.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import orjson
import pytest
from django.core.management import call_command

from telemetry.actions import do_create_collector_token
from telemetry.models import GpuEvent, TrainingStep
from telemetry.simulator.dynamics import Cluster
from telemetry.simulator.gpus import REASON_HW_POWER_BRAKE, REASON_HW_THERMAL, REASON_SW_THERMAL
from telemetry.simulator.scenarios import SCENARIOS, ScenarioError, ScenarioSet, parse_spec
from telemetry.simulator.topology import RACK_POWER_CAP_W
from tests.conftest import FIXED_NOW

INTERVAL = 10
THERMAL = REASON_HW_THERMAL | REASON_SW_THERMAL


def _run(gpus: int, specs: list[str], ticks: int, *, speed: float = 10.0, seed: int = 3, truth=None,
         interval: float = INTERVAL):
    scenarios = ScenarioSet([parse_spec(s) for s in specs], seed=seed, speed=speed, truth=truth)
    cluster = Cluster.build(gpus, seed=seed, scenarios=scenarios)
    out = [cluster.step(FIXED_NOW + timedelta(seconds=interval * k)) for k in range(ticks)]
    return cluster, scenarios, out


def _gpu_series(ticks, uuid: str) -> list[dict | None]:
    return [next((r["fields"] for r in t.records("gpus") if r["uuid"] == uuid), None) for t in ticks]


def _port_series(ticks, key: str) -> list[dict]:
    owner, port = key.split(":", 1)
    return [next(r["fields"] for r in t.records("ports")
                 if (r.get("host") or r.get("switch")) == owner and r["port"] == port) for t in ticks]


def _at(iso: str) -> datetime:
    return datetime.fromisoformat(iso)


def _events(ticks) -> list[dict]:
    return [e for t in ticks for b in t.batches for e in b["events"]]


# --- specs ------------------------------------------------------------------------------------
def test_scenario_spec_parses_start_and_entity():
    assert parse_spec("gpu-degrading") == parse_spec("gpu-degrading@0")
    spec = parse_spec("ib-link-flap@7.5:gpu-0002:mlx5_3/1")
    assert (spec.name, spec.start_min, spec.entity) == ("ib-link-flap", 7.5, "gpu-0002:mlx5_3/1")
    with pytest.raises(ValueError, match="gpu-degrading"):
        parse_spec("gpu-melting")


def test_chosen_entities_are_used():
    _, scenarios, _ = _run(64, ["gpu-degrading:gpu-0003/5", "ib-link-flap:leaf-r2-01:p6",
                                "cooling-failure:row-01", "rack-over-cap:r01-01"], 1)
    degrading, flap, cooling, rack = scenarios.records
    assert degrading["host"] == "gpu-0003" and degrading["details"]["gpu_index"] == 5
    assert flap["entity"] == "gpu-0006:mlx5_2/1" and flap["details"]["peer"] == "leaf-r2-01:p6"
    assert cooling["entity"] == "loop-row-01" and rack["entity"] == "r01-01"


def test_unknown_entity_is_refused():
    with pytest.raises(ScenarioError, match="no rack"):
        _run(64, ["rack-over-cap:r09-09"], 1)


# --- each scenario's telemetry ------------------------------------------------------------------
def test_gpu_degrading_goes_sbe_remaps_dbe_xid48_then_falls_off_the_bus():
    # 60x: the three-hour story plays in 180 s, 18 ticks of 10 s.
    _, scenarios, ticks = _run(64, ["gpu-degrading"], 24, speed=60)
    truth = scenarios.records[0]
    series = _gpu_series(ticks, truth["entity"])
    alive = [f for f in series if f is not None]
    sbe = [f["ecc_sbe_vol"] for f in alive]
    assert sbe == sorted(sbe) and sbe[-1] - sbe[0] >= 50
    first = {name: next(k for k, f in enumerate(alive) if f[name] > alive[0][name])
             for name in ("ecc_sbe_vol", "remapped_rows_correctable", "remapped_rows_uncorrectable", "ecc_dbe_vol")}
    assert first["ecc_sbe_vol"] < first["remapped_rows_correctable"] < first["remapped_rows_uncorrectable"]
    assert first["remapped_rows_uncorrectable"] < first["ecc_dbe_vol"]
    assert alive[first["ecc_dbe_vol"]]["xid"] == 48 and alive[first["ecc_dbe_vol"]]["row_remap_pending"] == 1
    gone = series.index(None)
    assert all(f is None for f in series[gone:]), "a GPU off the bus never reports again"
    assert ticks[gone].time >= _at(truth["fails_at"]) > ticks[gone - 1].time
    (event,) = _events(ticks)
    assert (event["gpu_uuid"], event["kind"], event["code"], event["source"]) == (truth["entity"], "xid", 79, "kmsg")
    assert "events" in ticks[gone].body(next(b for b in ticks[gone].batches if b["events"]))


def test_gpu_degrading_warns_at_least_an_hour_before_its_first_uncorrectable_error():
    # Real time (speed 1), one-minute ticks: the precursors must lead the DBE by hours, not minutes.
    _, scenarios, ticks = _run(64, ["gpu-degrading"], 200, speed=1.0, interval=60)
    truth = scenarios.records[0]
    stages = {name: _at(at) for name, at in truth["details"]["stages"].items()}
    alive = [(t.time, f) for t, f in zip(ticks, _gpu_series(ticks, truth["entity"]), strict=True) if f is not None]
    first_sbe_jump = next(t for t, f in alive if f["ecc_sbe_vol"] - alive[0][1]["ecc_sbe_vol"] >= 5)
    first_remap = next(t for t, f in alive if f["remapped_rows_correctable"] > alive[0][1]["remapped_rows_correctable"])
    first_dbe = next(t for t, f in alive if f["ecc_dbe_vol"] > 0)
    assert first_dbe == stages["xid48_dbe"] and _at(truth["fails_at"]) - first_dbe == timedelta(minutes=45)
    assert first_dbe - first_sbe_jump >= timedelta(hours=2)
    assert first_dbe - first_remap >= timedelta(hours=1)
    assert alive[-1][0] < _at(truth["fails_at"]) <= ticks[len(alive)].time


def test_cooling_failure_throttles_only_the_affected_row():
    # Two rows; the same seed without the scenario is the control for the other row.
    cluster, scenarios, ticks = _run(1024, ["cooling-failure:row-01"], 36)
    control_cluster = Cluster.build(1024, seed=3)
    control = [control_cluster.step(FIXED_NOW + timedelta(seconds=INTERVAL * k)) for k in range(36)]
    row1 = set(scenarios.records[0]["details"]["racks"])
    hit = [r for b in ticks[-1].batches if b["rack"] in row1 for r in b["gpus"]]
    loop = {b["rack"]: p["fields"] for t in (ticks[-1],) for b in t.batches for p in b["power"]
            if p["device"].startswith("loop-")}
    before = next(p["fields"] for b in ticks[0].batches for p in b["power"] if p["device"] == "loop-row-01")
    assert loop["r01-01"]["flow_lpm"] < 0.35 * before["flow_lpm"]
    assert loop["r01-01"]["coolant_supply_temp"] > loop["r02-01"]["coolant_supply_temp"] + 25
    busy = [r["fields"] for r in hit if r["fields"]["gpu_util"] > 50]
    throttled = [f for f in busy if f["throttle_reasons"] & THERMAL]
    assert len(throttled) > 0.8 * len(busy) > 0
    assert any(f["throttle_reasons"] & REASON_HW_THERMAL for f in throttled)
    assert max(f["sm_clock"] for f in throttled) < 1980
    # A job with nodes in both rows runs in lock-step: its GPUs in the other row wait for the throttled ones.
    layout = cluster.layout
    spans = {j.id for j in cluster.scheduler.jobs.values() if any(layout.racks[layout.nodes[i].rack].name in row1
                                                                   for i in j.nodes)}
    waiting = {layout.nodes[i].hostname for i, j in enumerate(cluster.scheduler.node_job) if j and j.id in spans}

    def others(tick):
        return [(b["rack"], [r for r in b["gpus"] if r["host"] not in waiting]) for b in tick.batches
                if b["rack"] not in row1]

    assert sum(len(gpus) for _, gpus in others(ticks[-1])) > 256, "most of the other row"
    assert others(ticks[-1]) == others(control[-1])


def test_nvlink_crc_errors_grow_faster_and_faster():
    _, scenarios, ticks = _run(64, ["nvlink-crc"], 24)
    series = _gpu_series(ticks, scenarios.records[0]["entity"])
    flits = [f["nvlink_crc_flit_errors"] for f in series]
    windows = [flits[k + 6] - flits[k] for k in (0, 6, 12, 17)]
    assert windows == sorted(windows) and windows[-1] > 4 * windows[0] > 0
    assert series[-1]["nvlink_crc_data_errors"] > series[0]["nvlink_crc_data_errors"]
    fails = _at(scenarios.records[0]["fails_at"])
    recovering = [t.time >= fails for t, f in zip(ticks, series, strict=True) if f["nvlink_recovery_errors"]]
    assert recovering and all(recovering)


def test_ib_link_flap_toggles_link_state_and_counts_each_drop():
    _, scenarios, ticks = _run(64, ["ib-link-flap"], 16)
    truth = scenarios.records[0]
    hca, leaf = _port_series(ticks, truth["entity"]), _port_series(ticks, truth["details"]["peer"])
    states = [f["link_state"] for f in hca]
    assert states[0] == 1 and states.count(1) == 4 and "4,1,4" in ",".join(map(str, states))
    assert [f["link_state"] for f in leaf] == states
    for port in (hca, leaf):
        assert port[-1]["link_downed"] - port[0]["link_downed"] == 3  # the first flap is already in tick 0
        assert port[-1]["link_error_recovery"] >= 4 and port[-1]["symbol_errors"] > port[0]["symbol_errors"]


def test_congested_uplink_xmit_wait_rises_on_the_leaf_uplinks_and_downlinks():
    _, scenarios, ticks = _run(64, ["congested-uplink"], 13)
    details = scenarios.records[0]["details"]
    up = _port_series(ticks, details["uplinks"][0])
    down = _port_series(ticks, details["downlinks"][0])
    other_leaf = next(k for k in ("leaf-r0-01", "leaf-r1-01") if k != details["leaf"])
    other = _port_series(ticks, f"{other_leaf}:{details['uplinks'][0].split(':')[1]}")
    rise = [up[k + 1]["xmit_wait"] - up[k]["xmit_wait"] for k in range(12)]
    assert rise[1] < rise[5] < rise[11]  # the ramp, well clear of the ±15 % jitter
    assert rise[-1] > 100 * max(1, other[-1]["xmit_wait"] - other[-2]["xmit_wait"])
    assert down[-1]["xmit_wait"] - down[-2]["xmit_wait"] > 0.2 * rise[-1]


def _straggler(name: str, seed: int = 3, ticks: int = 20):
    cluster, scenarios, out = _run(64, [name], ticks, seed=seed)
    details = scenarios.records[0]["details"]
    job = cluster.scheduler.jobs[int(scenarios.records[0]["entity"])]
    uuids = [g.spec.uuid for i in job.nodes for g in cluster.gpus[i]]
    assert uuids[details["rank"]] == details["gpu_uuid"]
    return details, job, uuids, out


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_a_straggler_is_busy_while_its_peers_wait_and_every_rank_reports_the_same_step_time(seed):
    details, job, uuids, ticks = _straggler("straggler", seed)
    assert details["slowdown"] == 1.15 and details["reports"] == "step and compute time"
    fields = {r["uuid"]: r["fields"] for r in ticks[-1].records("gpus") if r["uuid"] in uuids}
    slow, peers = fields.pop(details["gpu_uuid"]), list(fields.values())
    sm = sorted(f["sm_active"] for f in peers)
    ratio = slow["sm_active"] / sm[len(sm) // 2]
    # In lock-step the busy ratio is the compute ratio, diluted a little by the collective's own SM use.
    assert 1.08 < ratio < 1.17, ratio
    # Utilisation counts the waiting collective's kernel: it does not tell the slow rank apart.
    util = sorted(f["gpu_util"] for f in peers)
    assert abs(slow["gpu_util"] / util[len(util) // 2] - 1) < 0.03
    body = next(b for b in ticks[-1].steps if b["job"] == f"slurm:sim-{job.id}")
    walls = [r["step_time_s"] for r in body["records"]]
    assert max(walls) / min(walls) < 1.01, "a synchronous step takes the same wall time on every rank"
    compute = {r["rank"]: r["compute_time_s"] for r in body["records"]}
    mine = compute.pop(details["rank"])
    others = sorted(compute.values())
    assert mine / others[len(others) // 2] == pytest.approx(1.15, rel=0.06)
    assert max(walls) > mine, "the step is the slow rank's compute plus the all-reduce"


def test_the_slow_cause_shows_in_the_gpus_clocks_and_throttle_bits():
    seen = {}
    for seed in range(3, 12):
        details, _, uuids, ticks = _straggler("straggler", seed, ticks=12)
        fields = {r["uuid"]: r["fields"] for r in ticks[-1].records("gpus") if r["uuid"] in uuids}
        slow, peers = fields.pop(details["gpu_uuid"]), list(fields.values())
        clocks = sorted(f["sm_clock"] for f in peers)
        seen[details["cause"]] = (slow["sm_clock"] / clocks[len(clocks) // 2], slow["throttle_reasons"])
    assert set(seen) == {"thermal", "power", "hidden"}, "nine seeds draw every cause"
    assert seen["thermal"][0] < 0.92 and seen["thermal"][1] & REASON_SW_THERMAL
    assert seen["power"][0] < 0.92 and seen["power"][1] & REASON_HW_POWER_BRAKE
    assert seen["hidden"][0] > 0.97 and not seen["hidden"][1] & (REASON_SW_THERMAL | REASON_HW_POWER_BRAKE)


def test_a_hardware_only_straggler_job_reports_no_steps():
    details, job, _, ticks = _straggler("straggler-hw")
    assert details["reports"] == "nothing"
    assert any(t.steps for t in ticks), "other training jobs report steps"
    assert f"slurm:sim-{job.id}" not in {b["job"] for t in ticks for b in t.steps}


def test_rack_over_cap_pdus_draw_more_than_the_cap():
    _, scenarios, ticks = _run(64 * 4, ["rack-over-cap:r01-02"], 8)
    truth = scenarios.records[0]

    def draw(tick, rack):
        return sum(p["fields"]["watts"] for b in tick.batches if b["rack"] == rack for p in b["power"]
                   if p["device"].startswith("pdu-"))

    assert draw(ticks[0], "r01-02") < RACK_POWER_CAP_W
    assert draw(ticks[-1], "r01-02") > 1.05 * RACK_POWER_CAP_W and truth["details"]["cap_w"] == RACK_POWER_CAP_W
    assert all(draw(ticks[-1], r) < RACK_POWER_CAP_W for r in ("r01-01", "r01-03", "r01-04"))
    over = [t.time for t in ticks if draw(t, "r01-02") > RACK_POWER_CAP_W]
    assert abs((over[0] - _at(truth["fails_at"])).total_seconds()) <= INTERVAL


def test_divergence_records_per_rank_loss_spike_then_nans():
    _, scenarios, ticks = _run(64, ["divergence"], 14)
    truth = scenarios.records[0]
    series, fails = truth["details"]["series"], _at(truth["fails_at"])
    before = [x for p in series if _at(p["time"]) < _at(truth["details"]["spike_at"]) for x in p["loss"]]
    assert before and max(before) < 5
    assert all(sum(p["nan_count"]) == 0 for p in series if _at(p["time"]) < fails)
    last = series[-1]
    assert all(n > 0 for n in last["nan_count"]) and all(x is None for x in last["loss"])
    spiking = [p for p in series if _at(p["time"]) < fails and max(p["loss"]) > 3 * max(before)]
    assert spiking, "the loss spikes before the NaNs"
    assert {body["job"] for t in ticks for body in t.training} == {truth["details"]["training_job"]}
    sent = [r for t in ticks for body in t.training for r in body["records"]]
    assert len(sent) == len(series) * 16
    assert {(r["time"], r["rank"], r["loss"], r["nan_count"]) for r in sent} == {
        (p["time"], k, p["loss"][k], p["nan_count"][k]) for p in series for k in range(16)}


def test_fallen_off_bus_gpu_stops_reporting_after_kmsg_xid79():
    _, scenarios, ticks = _run(64, ["fallen-off-bus@1"], 12)
    truth = scenarios.records[0]
    assert _at(truth["starts_at"]) == FIXED_NOW + timedelta(minutes=1)
    series = _gpu_series(ticks, truth["entity"])
    gone = series.index(None)
    assert all(f is None for f in series[gone:]) and ticks[gone].time == _at(truth["fails_at"])
    assert series[gone - 1]["pcie_replay"] > series[0]["pcie_replay"] and series[gone - 1]["xid"] == 0
    (event,) = _events(ticks)
    assert event["source"] == "kmsg" and event["code"] == 79 and event["time"] == truth["fails_at"]


# --- ground truth -------------------------------------------------------------------------------
def test_truth_file_lists_every_armed_scenario_with_its_entity_and_times(tmp_path):
    specs = [f"{name}@{k}" for k, name in enumerate(SCENARIOS)]
    # One node each and a few for the job stories: 16 nodes leave room for every scenario.
    cluster, scenarios, _ = _run(128, specs, 1, speed=5, truth=tmp_path / "truth.jsonl")
    lines = [orjson.loads(x) for x in (tmp_path / "truth.jsonl").read_bytes().splitlines()]
    assert [x["scenario"] for x in lines] == list(SCENARIOS)
    uuids = {g.spec.uuid: g.host for gs in cluster.gpus for g in gs}
    for k, (line, scenario) in enumerate(zip(lines, scenarios.active, strict=True)):
        assert set(line) == {"scenario", "entity_kind", "entity", "host", "starts_at", "fails_at", "details"}
        assert _at(line["starts_at"]) == FIXED_NOW + timedelta(minutes=k)
        if scenario.fails_after_s is not None:
            assert _at(line["fails_at"]) == _at(line["starts_at"]) + timedelta(seconds=scenario.fails_after_s / 5)
        kind, entity = line["entity_kind"], line["entity"]
        if kind == "gpu":
            assert uuids[entity] == line["host"]
        elif kind == "port":
            assert entity in cluster.fabric.ports
        elif kind == "job":  # its first node, or a straggler's slow rank's
            hosts = [cluster.layout.nodes[i].hostname for i in cluster.scheduler.jobs[int(entity)].nodes]
            assert hosts[line["details"].get("rank", 0) // 8] == line["host"]
    _run(128, specs, 1, speed=5, truth=tmp_path / "again.jsonl")
    assert (tmp_path / "again.jsonl").read_bytes() == (tmp_path / "truth.jsonl").read_bytes()


@pytest.mark.slow
def test_two_scenarios_on_the_largest_cluster_build_within_the_tick_budget():
    cluster, _, _ = _run(16_384, ["gpu-degrading", "cooling-failure"], 1, speed=60)
    timings = []
    for k in range(1, 4):
        started = time.perf_counter()
        tick = cluster.step(FIXED_NOW + timedelta(seconds=INTERVAL * k))
        timings.append(time.perf_counter() - started)
    print(f"\n16,384-GPU tick with two scenarios: {max(timings) * 1000:.0f} ms (worst of 3)")
    assert len(tick.records("gpus")) == 16_384
    assert max(timings) < 0.5 * INTERVAL


# --- end to end -----------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_simulate_with_scenarios_leaves_xid_48_and_79_events_on_the_truth_gpu(live_server, tmp_path):
    token = do_create_collector_token("scenario-test")
    truth = tmp_path / "truth.jsonl"
    # 1500x: XID 48 lands 5.4 s and XID 79 7.2 s after the first tick, on different 2 s ticks.
    call_command("simulate", "--server", live_server.url, "--token", token, "--gpus", "64", "--seed", "9",
                 "--interval", "2", "--ticks", "5", "--scenario", "gpu-degrading@0",
                 "--scenario", "fallen-off-bus@0", "--scenario", "divergence@0",
                 "--scenario-speed", "1500", "--truth", str(truth))
    lines = [orjson.loads(x) for x in truth.read_bytes().splitlines()]
    records = [r for r in lines if "scenario" in r]
    # The same file declares what else the simulator planted: the cluster's latent defects first.
    assert {r["defect"] for r in lines if r.get("latent")} >= {"weak-gpu", "hot-leaf"}
    degrading = next(r for r in records if r["scenario"] == "gpu-degrading")
    codes = set(GpuEvent.objects.filter(gpu__uuid=degrading["entity"], kind="xid").values_list("code", flat=True))
    assert codes == {48, 79}
    assert GpuEvent.objects.filter(gpu__uuid=degrading["entity"], kind="ecc_dbe").exists()
    off_bus = next(r for r in records if r["scenario"] == "fallen-off-bus")
    assert GpuEvent.objects.filter(gpu__uuid=off_bus["entity"], kind="xid", code=79, source="kmsg").exists()
    # The diverging job's per-rank steps reach the training endpoint, NaN counts included.
    divergence = next(r for r in records if r["scenario"] == "divergence")
    steps = TrainingStep.objects.filter(job__external_id=divergence["details"]["training_job"].split(":")[1])
    assert steps.count() == 16 * len(divergence["details"]["series"])
    assert steps.filter(nan_count__gt=0, loss__isnull=True).exists()
