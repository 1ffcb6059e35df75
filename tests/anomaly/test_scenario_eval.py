"""The scenario evaluation: the in-process harness writes through the real paths, matching anomalies
to ground truth counts what it should, and a straggler is caught end to end within two minutes."""

from __future__ import annotations

from datetime import datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from anomaly.models import Anomaly
from anomaly.scoring import score_fleet
from anomaly.simulation import (
    Every,
    FaultLog,
    FaultWatch,
    Seen,
    Simulation,
    canonical_entities,
    match_scenario,
    quiet_precision,
    truth_targets,
)
from telemetry.models import Job, Port, TrainingStep
from telemetry.simulator.dynamics import Cluster
from telemetry.simulator.scenarios import ScenarioSet, parse_spec
from telemetry.simulator.topology import build_layout, topology_document
from telemetry.topology import do_import_topology
from tests.conftest import FIXED_NOW

START = FIXED_NOW
MIN = timedelta(minutes=1)
LAYOUT = build_layout(64, 1)
GPU_A, GPU_B = LAYOUT.nodes[0].gpus[0].uuid, LAYOUT.nodes[1].gpus[3].uuid


def _count(sql: str, *params) -> int:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone()[0]


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _truth(scenario: str, kind: str, entity: str, *, fails: datetime | None = None, **details) -> dict:
    return {"scenario": scenario, "entity_kind": kind, "entity": entity, "host": "gpu-0001", "starts_at": _iso(START),
            "fails_at": _iso(fails) if fails else None, "details": details}


def _seen(kind: str, entity_kind: str, entity, minutes: float, *signals: tuple[str, float]) -> Seen:
    return Seen(kind, entity_kind, entity, START + timedelta(minutes=minutes), signals=signals)


# --- the harness ---------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_harness_writes_raw_and_rollup_rows_at_simulated_times():
    calls = []
    sim = Simulation(gpus=16, start=START, interval_s=30, specs=[parse_spec("straggler")],
                     callbacks=[Every(60, calls.append, "probe")])
    result = sim.run(3)
    assert (result.ticks, result.end, result.rejected) == (7, START + 3 * MIN, 0)
    times = _count("SELECT count(DISTINCT time) FROM telemetry_gpu_sample WHERE time BETWEEN %s AND %s",
                   START, result.end)
    assert times == 7 and _count("SELECT count(*) FROM telemetry_gpu_sample") == 7 * 16
    # Rolled up as of the simulated clock: at 12:03:00 the minutes up to 12:01 are final, 12:02 has just
    # ended (it is recomputed 15 s in, telemetry.rollups.OPEN_SETTLE) and 12:03 is in progress.
    with connection.cursor() as cur:
        cur.execute("SELECT DISTINCT bucket FROM telemetry_gpu_sample_1m WHERE bucket >= %s ORDER BY 1", [START])
        assert [b for (b,) in cur.fetchall()] == [START, START + MIN]
    assert _count("SELECT max(bucket) FROM telemetry_port_sample_1m") == START + MIN
    assert calls == [START + k * MIN for k in range(4)]  # once per simulated minute, after that minute's rollup
    job = Job.objects.get(external_id=f"sim-{result.truth[0]['entity']}")  # through the jobs endpoint's action
    steps = TrainingStep.objects.filter(job=job)  # through the training endpoint's parser and action
    assert job.start_time == START and steps.count() % 16 == 0 and steps.count() > 0  # every rank, once warm
    assert {t for t in steps.values_list("time", flat=True)} <= {START + k * MIN / 2 for k in range(7)}


@pytest.mark.django_db
def test_harness_one_request_per_tick_writes_the_same_rows():
    per_rack = Simulation(gpus=16, start=START, interval_s=60).run(1)
    rows = _count("SELECT count(*) FROM telemetry_port_sample")
    per_tick = Simulation(gpus=16, start=START + timedelta(days=1), interval_s=60, per_request="tick").run(1)
    assert per_tick.accepted == per_rack.accepted > 0
    assert _count("SELECT count(*) FROM telemetry_port_sample") == 2 * rows


@pytest.mark.django_db
def test_harness_records_a_failing_scorer_and_goes_on_only_when_told():
    def broken(t):
        raise RuntimeError(f"no features at {t:%H:%M}")

    result = Simulation(gpus=8, start=START, interval_s=60, callbacks=[Every(60, broken, "broken")],
                        tolerate_errors=True).run(2)
    assert result.ticks == 3 and [m[11:] for m in result.errors["broken"]] == [
        "12:00 RuntimeError: no features at 12:00", "12:01 RuntimeError: no features at 12:01",
        "12:02 RuntimeError: no features at 12:02"]
    with pytest.raises(RuntimeError, match="no features"):
        Simulation(gpus=8, start=START + timedelta(days=1), interval_s=60, callbacks=[Every(60, broken)]).run(1)


def test_fault_watch_sees_injected_faults_and_latent_defects():
    scenarios = ScenarioSet([parse_spec("ib-link-flap")], seed=3)
    cluster = Cluster.build(64, seed=3, scenarios=scenarios)
    watch = FaultWatch(cluster)
    for k in range(3):
        watch.observe(cluster.step(START + timedelta(seconds=10 * k)))
    flap = scenarios.records[0]
    assert {flap["entity"], flap["details"]["peer"]} <= set(watch.log.ports)  # the flap restarts on tick 2
    weak = [g.spec.uuid for gs in cluster.gpus for g in gs if g.weak]
    assert weak and all(watch.log.latent[("gpu", u)].startswith("latent: weak") for u in weak)


# --- matching ------------------------------------------------------------------------------------------
def test_match_counts_the_first_hit_after_the_start_not_before():
    truth = _truth("nvlink-crc", "gpu", GPU_A)
    seen = [_seen("peer_node", "gpu", GPU_A, -3), _seen("baseline", "gpu", GPU_B, 1),
            _seen("baseline", "gpu", GPU_A, 1.5), _seen("peer_node", "gpu", GPU_A, 4)]
    outcome = match_scenario(truth, seen, LAYOUT)
    assert (outcome.detected, outcome.ttd_s, outcome.first_kind) == (True, 90.0, "baseline")
    assert (outcome.matching, outcome.elsewhere) == (2, 1)


def test_match_is_a_miss_when_only_other_entities_or_earlier_events_are_flagged():
    truth = _truth("fallen-off-bus", "gpu", GPU_A)
    seen = [_seen("peer_node", "gpu", GPU_A, -0.5), _seen("peer_node", "gpu", GPU_B, 2)]
    outcome = match_scenario(truth, seen, LAYOUT)
    assert (outcome.detected, outcome.ttd_s, outcome.matching) == (False, None, 0)
    assert not match_scenario(truth, [_seen("baseline", "gpu", GPU_A, 9)], LAYOUT, until=START + 5 * MIN).detected


def test_failure_risk_lead_time_is_the_failure_minus_the_first_risk_event():
    truth = _truth("gpu-degrading", "gpu", GPU_A, fails=START + timedelta(hours=3))
    seen = [_seen("baseline", "gpu", GPU_A, 10), _seen("failure_risk", "gpu", GPU_A, 50),
            _seen("failure_risk", "gpu", GPU_A, 80)]
    outcome = match_scenario(truth, seen, LAYOUT)
    assert (outcome.ttd_s, outcome.first_kind, outcome.lead_s) == (600.0, "baseline", 130 * 60.0)
    assert match_scenario(truth, seen[:1], LAYOUT).lead_s is None  # found, but never predicted


def test_straggler_matches_its_rank_or_its_gpu_but_not_another_rank():
    truth = _truth("straggler", "job", "7", rank=3, gpu_uuid=GPU_B)
    assert truth_targets(truth, LAYOUT) == {("rank", ("sim-7", 3)), ("gpu", GPU_B)}
    assert not match_scenario(truth, [_seen("straggler", "rank", ("sim-7", 4), 1)], LAYOUT).detected
    assert not match_scenario(truth, [_seen("divergence", "job", "sim-7", 1)], LAYOUT).detected
    assert match_scenario(truth, [_seen("straggler", "rank", ("sim-7", 3), 1)], LAYOUT).ttd_s == 60.0
    assert match_scenario(truth, [_seen("peer_job", "gpu", GPU_B, 2)], LAYOUT).ttd_s == 120.0


def test_cooling_failure_is_found_through_its_racks_or_the_heat_of_their_gpus():
    truth = _truth("cooling-failure", "cooling_loop", "loop-row-01", racks=["r01-01"])
    targets = truth_targets(truth, LAYOUT)
    in_rack = {g.uuid for n in LAYOUT.nodes if LAYOUT.racks[n.rack].name == "r01-01" for g in n.gpus}
    assert ("rack", "r01-01") in targets and {u for k, u in targets if k == "gpu"} == in_rack
    # A GPU of the row flagged for something else is not the cooling failure; its heat is.
    other = [_seen("peer_job", "gpu", GPU_A, 1, ("gpu_util", -9.0)),
             _seen("cohort", "gpu", GPU_A, 1, ("sm_clock", 20.0))]
    assert not match_scenario(truth, other, LAYOUT).detected  # busier than idle GPUs is no heat
    hot = [_seen("cohort", "gpu", GPU_A, 2, ("power_w", -7.0), ("gpu_temp", 9.5))]
    assert match_scenario(truth, other + hot, LAYOUT).ttd_s == 120.0
    assert match_scenario(truth, [_seen("peer_node", "gpu", GPU_A, 3, ("sm_clock", -12.0))], LAYOUT).ttd_s == 180.0


def test_noise_is_the_share_of_other_entities_flagged_after_the_start():
    truth = _truth("nvlink-crc", "gpu", GPU_A)
    seen = [_seen("baseline", "gpu", GPU_A, 1), _seen("peer_node", "gpu", GPU_B, 2), _seen("cohort", "gpu", GPU_B, 3),
            _seen("peer_node", "gpu", "GPU-other", -1), _seen("peer_leaf", "port", "leaf-r0-01:p1", 1)]
    assert match_scenario(truth, seen, LAYOUT, population={"gpu": 5}).noise == pytest.approx(1 / 4)
    assert match_scenario(truth, seen, LAYOUT).noise is None


@pytest.mark.django_db
def test_canonical_entities_maps_database_ids_to_simulator_names():
    do_import_topology(topology_document(LAYOUT))
    port = Port.objects.select_related("node").filter(node__isnull=False).first()
    job = Job.objects.create(source="slurm", external_id="sim-5", state="running")
    rows = [Anomaly(kind="peer_leaf", entity_kind="port", entity_id=str(port.pk)),
            Anomaly(kind="straggler", entity_kind="rank", entity_id="slurm:sim-5#2"),
            Anomaly(kind="divergence", entity_kind="job", entity_id=str(job.pk)),
            Anomaly(kind="rack_power", entity_kind="rack", entity_id="r01-01"),
            Anomaly(kind="peer_node", entity_kind="gpu", entity_id=GPU_A)]
    for a in rows:
        a.started_at = START
    got = [(s.entity_kind, s.entity) for s in canonical_entities(rows)]
    assert got == [("port", f"{port.node.hostname}:{port.name}"), ("rank", ("sim-5", 2)), ("job", "sim-5"),
                   ("rack", "r01-01"), ("gpu", GPU_A)]


def test_quiet_precision_counts_unexplained_anomalies_as_false_positives():
    log = FaultLog(gpus={GPU_A: START}, hosts={"gpu-0005": START}, ports={"leaf-r0-01:p3": START},
                   latent={("gpu", GPU_B): "latent: hot GPU (poor heat sink)"},
                   gpu_at={(n.hostname, g.index): g.uuid for n in LAYOUT.nodes for g in n.gpus},
                   gpu_host={g.uuid: n.hostname for n in LAYOUT.nodes for g in n.gpus},
                   job_hosts={"sim-9": ["gpu-0004", "gpu-0005"], "sim-10": ["gpu-0007"]})
    seen = [_seen("baseline", "gpu", GPU_A, 1), _seen("peer_node", "gpu", GPU_B, 1),
            _seen("peer_leaf", "port", "leaf-r0-01:p3", 1), _seen("peer_leaf", "port", "leaf-r0-01:p4", 1),
            _seen("straggler", "rank", ("sim-9", 9), 1),  # rank 9 is gpu-0005's GPU 1: its host went down
            _seen("straggler", "rank", ("sim-10", 1), 1), _seen("rack_power", "rack", "r01-01", 1)]
    p = quiet_precision(seen, log)
    assert (p.total, p.true_positives) == (7, 4)
    assert p.precision == pytest.approx(4 / 7) and p.strict_precision == pytest.approx(3 / 7)
    assert [(s.entity_kind, s.entity) for s in p.unexplained] == [
        ("port", "leaf-r0-01:p4"), ("rank", ("sim-10", 1)), ("rack", "r01-01")]
    assert quiet_precision([], log).precision is None


# --- end to end -------------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_straggler_is_flagged_within_two_minutes_end_to_end():
    sim = Simulation(gpus=64, start=START, interval_s=10, specs=[parse_spec("straggler@2")],
                     callbacks=[Every(60, score_fleet, "score_fleet")])
    result = sim.run(6)
    truth = result.truth[0]
    seen = canonical_entities(Anomaly.objects.all())
    targets = truth_targets(truth, sim.layout)
    flagged = [s.started_at for s in seen if s.kind == "straggler" and (s.entity_kind, s.entity) in targets]
    outcome = match_scenario(truth, seen, sim.layout, until=result.end)
    assert flagged and outcome.detected
    assert min(flagged) - datetime.fromisoformat(truth["starts_at"]) <= timedelta(minutes=2)
    assert outcome.ttd_s <= 120


@pytest.mark.django_db
def test_command_prints_a_table_and_the_result_line():
    out = StringIO()
    call_command("scenario_eval", "--in-place", "--scenario", "straggler", "--gpus", "16", "--lead-in", "2",
                 "--train-minutes", "0", "--failure-runs", "0", "--quiet-minutes", "2", "--fleet-gpus", "16",
                 "--warmup", "1", stdout=out)
    lines = out.getvalue().splitlines()
    row = next(line for line in lines if line.startswith("straggler ") and "ticks of" not in line)
    assert "yes" in row and row.endswith("PASS")
    result = dict(kv.split("=") for kv in lines[-1].removeprefix("RESULT scenario_eval ").split())
    assert lines[-1].startswith("RESULT scenario_eval ") and set(result) == {
        "straggler_ttd_s", "degrading_lead_h", "quiet_precision", "recall"}
    assert float(result["straggler_ttd_s"]) <= 120 and result["degrading_lead_h"] == "nan"
    assert float(result["recall"]) == 1.0
