"""The simulated cluster's jobs: its scheduler's queue and preemptions, the snapshots and per-rank steps it
reports, and a few ticks of the runner against the real API with a straggler armed."""

from __future__ import annotations

import random
import statistics
from collections import defaultdict
from datetime import timedelta

import orjson
import pytest

from telemetry.actions import do_create_collector_token
from telemetry.models import Allocation, JobStateChange, TrainingStep
from telemetry.models import Job as JobRow
from telemetry.simulator.client import IngestClient
from telemetry.simulator.dynamics import Cluster
from telemetry.simulator.jobs import PENDING, PREEMPT_AFTER_S, PREEMPTED, RUNNING, Job, Scheduler, make_job
from telemetry.simulator.runner import Runner
from telemetry.simulator.scenarios import ScenarioSet, parse_spec
from telemetry.simulator.topology import topology_document
from tests.conftest import FIXED_NOW

T = FIXED_NOW.timestamp()


def _scheduler(nodes: int) -> Scheduler:
    scheduler = Scheduler(random.Random(1), [0] * nodes, meta=random.Random(2))
    scheduler.enabled = False  # no random arrivals: the test submits what it needs and runs the queue
    return scheduler


def _job(scheduler: Scheduler, size: int, qos: str, *, submit: float, running: bool) -> Job:
    job = make_job(scheduler.rng, scheduler.new_id(), "finetune", [], submit, minutes=600, size=size)
    scheduler.describe(job, submit=submit)
    job.qos, job.priority = qos, {"high": 30_000, "normal": 10_000, "low": 1_000}[qos]
    scheduler.submit(job)
    if running:
        scheduler.run_queue(submit)
    return job


def _tick(scheduler: Scheduler, t: float) -> list[str]:
    return scheduler.step(t) + scheduler.run_queue(t)


# --- the scheduler -----------------------------------------------------------------------------------------
def test_a_job_that_does_not_fit_waits_then_starts_when_nodes_free():
    s = _scheduler(4)
    first = _job(s, 3, "normal", submit=T - 600, running=True)
    second = _job(s, 2, "normal", submit=T - 300, running=True)
    assert (first.state, second.state, second.nodes) == (RUNNING, PENDING, [])
    first.end = T + 5
    _tick(s, T + 10)
    assert second.state == RUNNING and len(second.nodes) == 2 and second.start == T + 10
    assert first in s.drain_ended() and first.state == "COMPLETED"


def test_a_waiting_high_qos_job_preempts_the_youngest_low_qos_job_which_is_requeued():
    s = _scheduler(4)
    old = _job(s, 2, "low", submit=T - 3600, running=True)
    young = _job(s, 2, "low", submit=T - 1800, running=True)
    high = _job(s, 2, "high", submit=T - PREEMPT_AFTER_S + 20, running=False)
    _tick(s, T)
    assert high.state == PENDING, "it has not waited long enough"
    events = _tick(s, T + 30)
    assert young.state == PREEMPTED and young.end == T + 30 and young in s.preempted
    assert old.state == RUNNING and high.state == RUNNING and high.nodes == young.nodes
    assert any(f"preempted by job {high.id}" in e for e in events)
    _tick(s, T + 40)
    assert (young.state, young.restarts, young.submit) == (PENDING, 1, T + 40)
    assert young in s.queue and young.end - young.start == pytest.approx(young.left)


# --- what the cluster reports --------------------------------------------------------------------------------
def _run(gpus: int, ticks: int, *, seed: int = 3, specs=(), interval: int = 10):
    scenarios = ScenarioSet([parse_spec(s) for s in specs], seed=seed, speed=10) if specs else None
    cluster = Cluster.build(gpus, seed=seed, scenarios=scenarios)
    return cluster, scenarios, [cluster.step(FIXED_NOW + timedelta(seconds=interval * k)) for k in range(ticks)]


def test_first_snapshot_lists_every_live_job_then_only_changes():
    cluster, _, ticks = _run(256, 30)
    first = {j["job_id"]: j for j in ticks[0].jobs["jobs"]}
    live = {f"sim-{j.id}" for j in (*cluster.scheduler.jobs.values(), *cluster.scheduler.queue)}
    assert {"RUNNING", "PENDING"} <= {j["state"] for j in first.values()}
    running = next(j for j in first.values() if j["state"] == "RUNNING")
    assert len(running["allocations"]) == len(running["nodes"]) == running["gpus"] // 8
    assert running["allocations"][0]["gpu_indexes"] == list(range(8))
    assert all(j["submit"] < j["start"] for j in first.values() if j["start"])
    last, later = dict(first), []
    for tick in ticks[1:]:
        for j in tick.jobs["jobs"] if tick.jobs else []:
            assert j != last.get(j["job_id"]), "a job is sent again only when its record changed"
            last[j["job_id"]] = j
            later.append(j)
    assert later, "30 ticks at midday start or end something"
    assert live <= set(last)


def test_same_seed_gives_the_same_snapshots_and_steps():
    def run(seed):
        _, _, ticks = _run(128, 20, seed=seed, specs=["straggler"])
        return orjson.dumps([(t.jobs, t.steps) for t in ticks])

    assert run(4) == run(4)
    assert run(4) != run(5)


def test_diverging_job_gets_no_step_records_of_the_feed():
    _, scenarios, ticks = _run(128, 20, specs=["divergence"], interval=30)
    key = scenarios.records[0]["details"]["training_job"]
    assert any(t.steps for t in ticks), "other training jobs report steps"
    assert key not in {b["job"] for t in ticks for b in t.steps}
    assert key in {b["job"] for t in ticks for b in t.training}


# --- through the API ---------------------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_runner_puts_jobs_allocations_and_a_straggling_rank_into_breakwater(live_server, monkeypatch):
    from telemetry.api import views
    from telemetry.topology import do_import_topology

    # Samples are checked against the server's clock; the simulated ticks run from the fixed time.
    monkeypatch.setattr(views, "_times", lambda: views.TimeParser(FIXED_NOW, timedelta(hours=1), timedelta(days=7)))
    scenarios = ScenarioSet([parse_spec("straggler")], seed=6)
    cluster = Cluster.build(128, seed=6, scenarios=scenarios)
    do_import_topology(topology_document(cluster.layout))
    client = IngestClient(live_server.url, do_create_collector_token("simulator-test"))
    lines: list[str] = []
    runner = Runner(cluster, client, interval=30, write=lines.append, server=live_server.url,
                    clock=FIXED_NOW.timestamp, sleep=lambda s: None)
    try:
        runner.backfill(3)  # six ticks of history before the fixed time, then seven live ones
        runner.run(7)
    finally:
        runner.close()
        client.close()
    assert not [x for x in lines if "not stored" in x or x.startswith("  error")], lines

    live = cluster.scheduler.jobs.values()
    jobs = {j.external_id: j for j in JobRow.objects.all()}
    for sim in live:
        job = jobs[f"sim-{sim.id}"]
        assert (job.state, job.user, job.node_count) == ("running", sim.user, len(sim.nodes))
        held = Allocation.objects.filter(job=job, end__isnull=True)
        assert held.count() == 8 * len(sim.nodes)
        assert not held.filter(gpu__isnull=True).exists(), "allocations land on the imported GPUs"
    for q in cluster.scheduler.queue:
        assert jobs[f"sim-{q.id}"].state == "pending"
    waited = JobStateChange.objects.filter(state="pending").values_list("job_id", flat=True)
    assert waited, "the cluster reports jobs that waited"
    for job in JobRow.objects.filter(pk__in=waited):
        assert job.start_time is None or job.submit_time < job.start_time

    truth = scenarios.records[0]
    straggling = jobs[f"sim-{truth['entity']}"]
    assert straggling.start_time == FIXED_NOW - timedelta(minutes=3), "the backfill reports the job's history"
    rank, slowdown = truth["details"]["rank"], truth["details"]["slowdown"]
    per_rank, compute = defaultdict(list), defaultdict(list)
    for r, step_time, compute_time in TrainingStep.objects.filter(
            job__external_id=f"sim-{truth['entity']}").values_list("rank", "step_time_s", "compute_time_s"):
        per_rank[r].append(step_time)
        compute[r].append(compute_time)
    assert sorted(per_rank) == list(range(16)) and min(map(len, per_rank.values())) >= 3
    assert TrainingStep.objects.filter(job=straggling, time__lt=FIXED_NOW).exists()
    # Lock-step: the slow rank's step time is everyone's; its compute time is its own.
    slow = statistics.median(per_rank.pop(rank))
    gang = statistics.median(x for times in per_rank.values() for x in times)
    assert slow / gang == pytest.approx(1.0, abs=0.01)
    live_compute = [x for x in compute.pop(rank) if x is not None][-3:]  # after it slowed (the story starts at 0)
    gang_compute = statistics.median(x for times in compute.values() for x in times[-3:])
    assert statistics.median(live_compute) / gang_compute == pytest.approx(slowdown, rel=0.05)
