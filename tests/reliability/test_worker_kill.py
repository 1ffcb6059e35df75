"""A Celery worker killed with SIGKILL in the middle of a rollup pass and of a scoring pass.

Each test stops the worker at a known point inside the pass's write transaction, proves with a query that the
pass was under way there (its lock held, its earlier work committed, the rest invisible), SIGKILLs it, starts a
new worker that runs beat's next pass as it comes (the killed one is not sent again: it would only return after
Redis's visibility timeout), and compares the result with an uninterrupted single-process run: from their
watermarks, the rollups and the scoring resume with nothing missing and nothing twice.
(The notification case is tests/alerts/test_delivery.py::test_worker_killed_mid_delivery_is_redelivered_...)
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.db import connection

from anomaly import tasks as anomaly_tasks
from anomaly.lifecycle import LOCK_NAMESPACE as SCORING_LOCK_NAMESPACE
from anomaly.lifecycle import SCORING_LOCK_KEY
from anomaly.models import Anomaly, EntityScore, ScoringWatermark
from dashboard.celery import app
from telemetry import tasks as telemetry_tasks
from telemetry.live import wait_for_trailing_publish
from telemetry.models import Allocation, Gpu, Job, Node, RollupWatermark
from telemetry.rollups import BY_NAME, LOCK_NAMESPACE
from tests.reliability import procs
from tests.reliability.test_multiprocess import recompute_rollups, rollup_snapshot
from tests.telemetry.factories import fill_gpu_fleet, insert_rollup

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
MIN = timedelta(minutes=1)
SECOND = timedelta(seconds=1)


@pytest.fixture
def workers(django_db_setup):
    """Factory: start a worker (extra env for it alone) and wait until it consumes; all stopped afterwards."""
    started: list[procs.Worker] = []
    app.control.purge()

    def start(label: str, *, wait: bool = True, **extra: str) -> procs.Worker:
        w = procs.Worker(procs.child_env(**extra), label).start()
        started.append(w)
        if wait:
            procs.wait_ready([w])
        return w

    yield start
    procs.stop_all(started)


def _other_connection() -> psycopg.Connection:
    s = connection.settings_dict
    return psycopg.connect(host=s["HOST"], port=s["PORT"], user=s["USER"], password=s["PASSWORD"], dbname=s["NAME"])


def _wait(predicate, what: str, worker: procs.Worker | None = None, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        assert worker is None or worker.alive(), worker.failure()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


def _query(sql: str, params=()) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


def _gone(pid: int) -> bool:
    """A killed client's backend lingers until PostgreSQL notices; its transaction is rolled back then."""
    return not _query("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid])


# --- Rollups ------------------------------------------------------------------------------------------------

T0 = datetime(2026, 11, 30, 6, 0, tzinfo=UTC)
HOURS, GPUS = 4, 8
END = T0 + timedelta(hours=HOURS, minutes=2)  # every bucket final


def _lock_holder(rollup: str) -> list[tuple]:
    """(pid, state) of the backend holding the rollup's advisory lock in this database, if any."""
    key = BY_NAME[rollup].lock_key & 0xFFFFFFFF  # pg_locks shows the int4 key as an unsigned oid
    return _query(
        "SELECT l.pid, a.state FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s AND l.objid = %s AND l.objsubid = 2 "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        [LOCK_NAMESPACE, key])


def _minute_rows() -> int:
    return _query("SELECT count(*) FROM telemetry_gpu_sample_1m")[0][0]


def test_rollup_worker_killed_mid_slice_resumes_from_the_watermark_without_gap_or_double_count(workers):
    fill_gpu_fleet(GPUS, T0, timedelta(hours=HOURS), timedelta(seconds=10))  # 4 slices of 60 minutes for gpu_1m
    # The first worker stops inside gpu_1m's second slice: rows written, watermark moved, nothing committed.
    first = workers("paused", **{procs.PAUSE_ENV: "gpu_1m:2:120"})
    telemetry_tasks.run_rollups.delay(now=END.isoformat())

    [(pid, state)] = _wait(lambda: _lock_holder("gpu_1m"), "the pass to hold gpu_1m's lock", first)
    second = workers("fresh", wait=False)  # importing takes seconds: overlap it with the wait; the queue is empty
    _wait(lambda: RollupWatermark.objects.filter(name="gpu_1m", done_until=T0 + 60 * MIN).exists(),
          "slice 1 to commit", first)
    [(pid, state)] = _wait(lambda: [h for h in _lock_holder("gpu_1m") if h[1] == "idle in transaction"],
                           "the pause inside slice 2", first)
    assert _minute_rows() == GPUS * 60  # slice 1 committed; slice 2 written but not visible

    first.kill()
    _wait(lambda: _gone(pid), "the killed worker's backend to go")
    assert not _lock_holder("gpu_1m"), "the lock outlived the worker"
    assert RollupWatermark.objects.get(name="gpu_1m").done_until == T0 + 60 * MIN
    assert _minute_rows() == GPUS * 60, "the killed slice left rows behind"

    procs.wait_ready([second])
    telemetry_tasks.run_rollups.delay(now=END.isoformat())  # beat's next pass
    procs.wait_idle([second])
    mark = RollupWatermark.objects.get(name="gpu_1m")
    assert mark.done_until == END - MIN
    # Resumed at the watermark: slices 2-4 only (slice 1 again would make it GPUS * 240).
    assert mark.last_rows == GPUS * 180
    resumed = rollup_snapshot()
    assert len(resumed["telemetry_gpu_sample_1m"]) == GPUS * HOURS * 60
    assert resumed == recompute_rollups(END)


# --- Scoring ------------------------------------------------------------------------------------------------

AT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
LEVELS = {"gpu_util_avg": 95.0, "sm_clock_avg": 1980.0, "mem_clock_avg": 2619.0, "gpu_temp_avg": 62.0,
          "memory_temp_avg": 70.0, "power_w_avg": 650.0, "fb_used_avg": 70000.0, "sm_active_avg": 0.8,
          "tensor_active_avg": 0.5, "ecc_sbe_vol_delta": 0, "pcie_replay_delta": 0}
MINUTES = (AT, AT + MIN, AT + 2 * MIN, AT + 3 * MIN)  # the minutes beat's passes score, one each


def _fleet() -> None:
    """Two nodes of 8 GPUs, node-a on one job. A pass at t flags a GPU hot in both buckets it reads (t-3, t-2):
    GPU 3 is hot until bucket AT-1, so its event opens at AT and closes at AT+2; GPU 5 from bucket AT-2 on, so
    the killed pass (AT+1) is the one that opens its event, and every later minute extends it."""
    gpus = []
    for host in ("node-a", "node-b"):
        node = Node.objects.create(hostname=host)
        gpus += [Gpu.objects.create(uuid=f"GPU-{host}-{i}", node=node, index=i, model="NVIDIA H100 80GB HBM3")
                 for i in range(8)]
    job = Job.objects.create(source="slurm", external_id="4242", state="running", start_time=AT - 2 * 60 * MIN)
    for g in gpus[:8]:
        Allocation.objects.create(job=job, node=g.node, gpu=g, gpu_index=g.index, start=AT - 2 * 60 * MIN)
    rows = []
    for bucket in [AT + m * MIN for m in range(-3, 2)]:
        for k, g in enumerate(gpus):
            hot = (k == 3 and bucket <= AT - MIN) or (k == 5 and bucket >= AT - 2 * MIN)
            rows.append((g.id, bucket, {**LEVELS, "gpu_temp_avg": 62.0 + (k % 3) * 0.5,
                                        "memory_temp_avg": 84.0 if hot else 70.0}))
    insert_rollup("gpu", "1m", rows)


def anomaly_state() -> tuple[list, list, dict]:
    """Events, current scores, and per scoring kind: the last minute scored, minutes scored, minutes skipped."""
    events = list(Anomaly.objects.order_by("kind", "entity_id", "started_at").values_list(
        "kind", "entity_id", "started_at", "last_seen", "ended_at", "score", "last_score", "summary"))
    scores = list(EntityScore.objects.order_by("entity_kind", "entity_id").values_list(
        "entity_kind", "entity_id", "anomaly_score", "anomaly_at"))
    marks = {m.kind: (m.done_until, m.minutes_scored, m.minutes_skipped) for m in ScoringWatermark.objects.all()}
    return events, scores, marks


def _blocked_on(holder_pid: int) -> list[tuple]:
    """Backends waiting for a lock that `holder_pid` holds, with their query."""
    return _query("SELECT pid, query FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", [holder_pid])


def _scoring_lock_holders() -> list[int]:
    """Backends holding the scoring pass's advisory lock in this database."""
    return [pid for (pid,) in _query(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = %s AND objid = %s "
        "AND objsubid = 2 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        [SCORING_LOCK_NAMESPACE, SCORING_LOCK_KEY])]


def test_scoring_worker_killed_mid_minute_is_caught_up_by_the_next_pass_like_an_uninterrupted_run(workers):
    from anomaly.lifecycle import score_all
    from anomaly.registry import load_active
    from anomaly.scoring import clear_caches

    _fleet()
    first = workers("first")
    anomaly_tasks.score.delay(now=(AT + 5 * SECOND).isoformat())  # as beat sends it: a few seconds into AT
    _wait(lambda: ScoringWatermark.objects.filter(kind="failure_risk", done_until=AT).exists(), "pass 1", first)
    after_first = anomaly_state()
    [open_event] = Anomaly.objects.filter(ended_at=None)

    # Hold the open event's row: the next pass takes the scoring lock, computes minute AT+1's findings, enters
    # its write and waits there for the row (do_record_findings locks the open events first).
    with _other_connection() as other:
        other.execute("SELECT id FROM anomaly_anomaly WHERE id = %s FOR UPDATE", [open_event.pk])
        holder = other.info.backend_pid
        anomaly_tasks.score.delay(now=(AT + MIN + 5 * SECOND).isoformat())
        [(pid, query)] = _wait(lambda: _blocked_on(holder), "pass 2 to reach its write", first)
        assert "anomaly_anomaly" in query and "FOR UPDATE" in query
        assert _scoring_lock_holders() == [pid]  # mid-minute, under the lock
        second = workers("second", wait=False)  # starts while the pass waits; the queue is empty
        first.kill()
        other.rollback()  # the dead pass's backend gets the row, finds its client gone and rolls back
    _wait(lambda: _gone(pid), "the killed worker's backend to go")
    assert not _scoring_lock_holders(), "the scoring lock outlived the worker"
    assert anomaly_state() == after_first, "the killed pass left part of its minute behind"

    # Beat's pass for AT+2 found no worker; the killed message returns only after Redis's visibility timeout and
    # then expires. The new worker runs beat's next pass, at AT+3, as it comes: it scores AT+1, AT+2 and AT+3.
    procs.wait_ready([second])
    anomaly_tasks.score.delay(now=(AT + 3 * MIN + 5 * SECOND).isoformat())
    _wait(lambda: ScoringWatermark.objects.filter(kind="failure_risk", done_until=MINUTES[-1]).exists(),
          "the catch-up pass", second)
    interrupted = anomaly_state()
    assert interrupted[2] == {"detectors": (MINUTES[-1], 4, 0), "failure_risk": (MINUTES[-1], 4, 0)}
    # GPU 5 joined GPU 3's event in the killed minute: one event per host (anomaly.grouping), open within its
    # hold, showing its worst (latest) moment.
    assert [(e[1], e[2], e[4]) for e in interrupted[0]] == [("GPU-node-a-5", AT, None)]
    assert [m["entity_id"] for m in Anomaly.objects.get().members] == ["GPU-node-a-3", "GPU-node-a-5"]

    Anomaly.objects.all().delete()
    EntityScore.objects.all().delete()
    ScoringWatermark.objects.all().delete()
    clear_caches()
    load_active.cache_clear()
    for at in MINUTES:  # one pass a minute in this process: the run nothing interrupted
        score_all(at + 5 * SECOND)
    wait_for_trailing_publish()
    assert interrupted == anomaly_state()
