"""Rollups against the real TimescaleDB: values per field kind, resets, watermarks, idempotency."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.db import connection

from telemetry import rollups
from telemetry.fields import KINDS
from telemetry.models import RollupWatermark
from telemetry.rollups import BY_NAME, LATE_SAMPLE_GRACE, LOCK_NAMESPACE, OPEN_REFRESH, OPEN_SETTLE, run_rollups
from tests.telemetry.factories import (
    count_rows,
    fill_gpu_fleet,
    insert_narrow,
    insert_sample,
    insert_samples,
    insert_series,
    rollup_row,
    rollup_rows,
)

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)
SEC = timedelta(seconds=1)


def _mark(name: str) -> datetime:
    return RollupWatermark.objects.get(name=name).done_until


def _run(name: str, runs: list) -> rollups.RollupRun:
    return next(r for r in runs if r.name == name)


@pytest.mark.django_db
def test_gauge_bucket_holds_min_avg_max_last():
    insert_sample("gpu", 1, T0, gpu_util=10.0)
    insert_sample("gpu", 1, T0 + 10 * SEC, gpu_util=30.0)
    insert_sample("gpu", 1, T0 + 20 * SEC, gpu_temp=60.0)  # gpu_util not reported: skipped
    insert_sample("gpu", 1, T0 + 50 * SEC, gpu_util=20.0)
    run_rollups(NOW)
    row = rollup_row("gpu", "1m", 1, T0)
    assert row["samples"] == 4
    assert (row["gpu_util_min"], row["gpu_util_avg"], row["gpu_util_max"]) == (10.0, 20.0, 30.0)
    assert row["gpu_util_last"] == 20.0
    assert row["gpu_temp_last"] == 60.0 and row["gpu_temp_avg"] == 60.0
    hour = rollup_row("gpu", "1h", 1, T0)
    assert (hour["gpu_util_min"], hour["gpu_util_max"], hour["gpu_util_last"]) == (10.0, 30.0, 20.0)


@pytest.mark.django_db
def test_counter_delta_counts_resets_and_steps_across_buckets():
    # 100,110,120 | reset 5,15 | 25: +20 in the first minute, 5 (reset) + 10 in the second,
    # and the step 15 -> 25 belongs to the third minute: 45 in all.
    readings = [(0, 100), (20, 110), (40, 120), (60, 5), (90, 15), (130, 25)]
    insert_series("gpu", 1, "energy_mj", [(T0 + s * SEC, v) for s, v in readings])
    insert_sample("gpu", 1, T0 + 100 * SEC, gpu_util=1.0)  # a row without the counter
    run_rollups(NOW)
    deltas = [r["energy_mj_delta"] for r in rollup_rows("gpu", "1m", 1)]
    assert deltas == [20.0, 15.0, 10.0]
    hour = rollup_row("gpu", "1h", 1, T0)
    assert hour["energy_mj_delta"] == 45.0
    assert hour["energy_mj_last"] == 25
    assert hour["samples"] == 7


@pytest.mark.django_db
def test_counter_step_from_previous_minute_is_found_across_a_quiet_minute():
    # A 90 s scrape interval leaves minute 10:01 empty; 10:02 still steps from 10:00's reading.
    insert_series("gpu", 1, "pcie_replay", [(T0, 7), (T0 + 150 * SEC, 9)])
    run_rollups(NOW)
    assert [r["pcie_replay_delta"] for r in rollup_rows("gpu", "1m", 1)] == [None, 2.0]


@pytest.mark.django_db
def test_a_pass_steps_from_the_last_closed_minute_without_its_raw_rows():
    # A pass starting at the watermark takes each counter's previous reading from the closed minute's
    # `_last`, so the raw rows behind the watermark are not needed (retention may already have dropped them).
    insert_series("gpu", 1, "pcie_replay", [(T0 + 10 * SEC, 7), (T0 + 50 * SEC, 8), (T0 + 70 * SEC, 12)])
    run_rollups(T0 + 2 * MIN + 5 * SEC)  # closes 10:00; 10:01 is still open
    assert _mark("gpu_1m") == T0 + MIN
    with connection.cursor() as cur:
        cur.execute("DELETE FROM telemetry_gpu_sample WHERE time < %s", [T0 + MIN])
    run_rollups(T0 + 3 * MIN + 5 * SEC)  # closes 10:01
    assert [r["pcie_replay_delta"] for r in rollup_rows("gpu", "1m", 1)] == [1.0, 4.0]


@pytest.mark.django_db
def test_hour_rollup_equals_its_minutes_and_the_true_values():
    rng = random.Random(7)
    counter, points, gauges = 1_000, [], []
    for i in range(2 * 360):  # two hours at 10 s
        counter = rng.randrange(0, 50) if rng.random() < 0.01 else counter + rng.randrange(0, 100)
        points.append((T0 + i * 10 * SEC, counter))
        gauges.append(rng.uniform(0, 100))
    insert_samples("gpu", [
        (3, t, {"ecc_sbe_vol": c, "power_w": g}) for (t, c), g in zip(points, gauges, strict=True)
    ])
    run_rollups(NOW + OPEN_SETTLE)  # 11:59 ended, and is recomputed once it settled
    truth = sum(b - a if b >= a else b for (_, a), (_, b) in zip(points, points[1:], strict=False))
    minutes = rollup_rows("gpu", "1m", 3)
    hours = rollup_rows("gpu", "1h", 3)
    assert [h["bucket"] for h in hours] == [T0, T0 + 60 * MIN]
    assert sum(m["ecc_sbe_vol_delta"] or 0 for m in minutes) == truth
    assert sum(h["ecc_sbe_vol_delta"] for h in hours) == truth
    for h in hours:
        mine = [m for m in minutes if h["bucket"] <= m["bucket"] < h["bucket"] + 60 * MIN]
        assert h["ecc_sbe_vol_delta"] == sum(m["ecc_sbe_vol_delta"] or 0 for m in mine)
        assert h["samples"] == 360
    first_hour = gauges[:360]
    assert hours[0]["power_w_avg"] == pytest.approx(sum(first_hour) / 360, rel=1e-5)
    assert hours[0]["power_w_max"] == pytest.approx(max(first_hour), rel=1e-6)


@pytest.mark.django_db
def test_rerunning_changes_nothing():
    insert_series("gpu", 1, "energy_mj", [(T0 + i * 15 * SEC, 100 * i) for i in range(40)])
    insert_narrow("gpu", 1, "DCGM_FI_DEV_NEW", T0, 3.0)
    run_rollups(NOW)
    before = [rollup_rows("gpu", res, 1) for res in ("1m", "1h")]
    marks = dict(RollupWatermark.objects.values_list("name", "done_until"))
    run_rollups(NOW)
    run_rollups(NOW + 10 * SEC)
    assert [rollup_rows("gpu", res, 1) for res in ("1m", "1h")] == before
    assert dict(RollupWatermark.objects.values_list("name", "done_until")) == marks
    assert sum(r["energy_mj_delta"] for r in before[0] if r["energy_mj_delta"]) == 3900.0


@pytest.mark.django_db
def test_watermark_starts_at_first_data_and_advances_with_now():
    insert_series("gpu", 1, "gpu_util", [(T0 + i * MIN, 1.0) for i in range(30)])
    runs = run_rollups(T0 + 10 * MIN + 30 * SEC)
    # Final up to the bucket holding now - grace (10:09:30 -> 10:09); the minute that ended is
    # computed, the one in progress is not.
    assert _mark("gpu_1m") == T0 + 9 * MIN
    assert _run("gpu_1m", runs).done_until == T0 + 9 * MIN
    assert rollup_row("gpu", "1m", 1, T0 + 9 * MIN) is not None
    assert rollup_row("gpu", "1m", 1, T0 + 10 * MIN) is None
    assert _mark("gpu_1h") == T0  # the hour is not over
    run_rollups(T0 + 70 * MIN)
    assert _mark("gpu_1m") == T0 + 69 * MIN
    assert _mark("gpu_1h") == T0 + 60 * MIN
    mark = RollupWatermark.objects.get(name="gpu_1m")
    assert mark.last_rows > 0 and mark.last_ms > 0


@pytest.mark.django_db
def test_naive_now_is_rejected():
    with pytest.raises(ValueError, match="naive"):
        run_rollups(datetime(2026, 11, 30, 12, 0))  # noqa: DTZ001 - the point of the test


@pytest.mark.django_db
def test_watermark_without_data_starts_now():
    run_rollups(NOW + 30 * SEC)
    assert _mark("gpu_1m") == NOW and _mark("narrow_1h") == NOW


@pytest.mark.django_db
def test_long_backlog_is_done_in_bounded_slices():
    insert_series("gpu", 1, "gpu_util", [(T0 + i * MIN, float(i)) for i in range(150)])
    runs = run_rollups(T0 + 151 * MIN + OPEN_SETTLE)
    gpu = _run("gpu_1m", runs)
    # 150 final buckets at 60 per slice: 3 slices, then one pass over the open buckets.
    assert gpu.slices == 4
    assert gpu.done_until == T0 + 150 * MIN
    assert len(rollup_rows("gpu", "1m", 1)) == 150


@pytest.mark.django_db
def test_ended_minutes_are_refreshed_once_they_settle_without_moving_the_watermark():
    insert_sample("gpu", 1, T0 + 5 * MIN + 10 * SEC, gpu_util=10.0)
    run_rollups(T0 + 5 * MIN + 30 * SEC)
    assert _mark("gpu_1m") == T0 + 5 * MIN  # created at the first data; nothing final yet
    assert rollup_row("gpu", "1m", 1, T0 + 5 * MIN) is None  # the minute in progress is not computed
    insert_sample("gpu", 1, T0 + 5 * MIN + 20 * SEC, gpu_util=30.0)
    run_rollups(T0 + 6 * MIN + OPEN_SETTLE - SEC)  # ended, but its last samples may still be arriving
    assert rollup_row("gpu", "1m", 1, T0 + 5 * MIN) is None
    run_rollups(T0 + 6 * MIN + OPEN_SETTLE)
    row = rollup_row("gpu", "1m", 1, T0 + 5 * MIN)
    assert (row["samples"], row["gpu_util_max"], row["gpu_util_last"]) == (2, 30.0, 30.0)
    assert _mark("gpu_1m") == T0 + 5 * MIN
    # Once a minute: a sample later still waits for the final pass, which counts it.
    insert_sample("gpu", 1, T0 + 5 * MIN + 50 * SEC, gpu_util=40.0)
    run_rollups(T0 + 6 * MIN + 45 * SEC)
    assert rollup_row("gpu", "1m", 1, T0 + 5 * MIN)["samples"] == 2
    run_rollups(T0 + 7 * MIN + 5 * SEC)
    assert _mark("gpu_1m") == T0 + 6 * MIN
    assert rollup_row("gpu", "1m", 1, T0 + 5 * MIN)["samples"] == 3


@pytest.mark.django_db
def test_open_hour_is_refreshed_at_most_every_open_refresh():
    insert_sample("gpu", 1, T0 + 5 * MIN + 10 * SEC, gpu_util=10.0)
    now = T0 + 6 * MIN + OPEN_SETTLE
    run_rollups(now)
    # The open hour was computed on the first pass and is recomputed at most every OPEN_REFRESH.
    assert rollup_row("gpu", "1h", 1, T0)["gpu_util_max"] == 10.0
    insert_sample("gpu", 1, T0 + 6 * MIN + 10 * SEC, gpu_util=30.0)
    run_rollups(T0 + 8 * MIN)  # closes 10:06 in the 1m rollup
    run_rollups(now + OPEN_REFRESH["1h"] - SEC)
    assert rollup_row("gpu", "1h", 1, T0)["gpu_util_max"] == 10.0
    run_rollups(now + OPEN_REFRESH["1h"])
    assert rollup_row("gpu", "1h", 1, T0)["gpu_util_max"] == 30.0
    assert _mark("gpu_1h") == T0  # still open: the watermark has not moved


@pytest.mark.django_db
def test_a_new_open_hour_is_computed_at_once_and_the_closed_one_finalised():
    insert_sample("gpu", 1, T0 + 50 * MIN, gpu_util=10.0)
    run_rollups(T0 + 58 * MIN)
    insert_sample("gpu", 1, T0 + 59 * MIN, gpu_util=20.0)
    insert_sample("gpu", 1, T0 + 61 * MIN, gpu_util=40.0)
    run_rollups(T0 + 62 * MIN + 30 * SEC)  # 4.5 min after the last refresh, but in the next hour
    assert rollup_row("gpu", "1h", 1, T0 + 60 * MIN)["gpu_util_max"] == 40.0
    run_rollups(T0 + 63 * MIN)
    assert _mark("gpu_1h") == T0 + 60 * MIN
    assert rollup_row("gpu", "1h", 1, T0)["gpu_util_max"] == 20.0  # the closed hour holds its last sample


@pytest.mark.django_db
def test_late_sample_within_grace_is_counted_but_behind_watermark_is_not():
    insert_sample("gpu", 1, T0, gpu_util=10.0)
    run_rollups(T0 + 60 * SEC + LATE_SAMPLE_GRACE - SEC)  # bucket 10:00 still open
    insert_sample("gpu", 1, T0 + 50 * SEC, gpu_util=50.0)  # late by ~70 s, inside the grace
    run_rollups(T0 + 2 * MIN + 30 * SEC)  # closes 10:00 with the late sample in it
    assert _mark("gpu_1m") == T0 + MIN
    assert rollup_row("gpu", "1m", 1, T0)["gpu_util_max"] == 50.0
    insert_sample("gpu", 1, T0 + 55 * SEC, gpu_util=90.0)  # behind the watermark: not rolled
    run_rollups(T0 + 3 * MIN)
    assert rollup_row("gpu", "1m", 1, T0)["gpu_util_max"] == 50.0


@pytest.mark.django_db
def test_narrow_fields_roll_up_as_gauges():
    for i, v in enumerate([4.0, 8.0, 6.0]):
        insert_narrow("node", 9, "node_load1", T0 + i * 20 * SEC, v)
    insert_narrow("node", 9, "node_load1", T0 + 90 * SEC, 2.0)
    run_rollups(NOW)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT bucket, samples, value_min, value_avg, value_max, value_last"
            " FROM telemetry_narrow_sample_1m ORDER BY bucket"
        )
        assert cur.fetchall() == [(T0, 3, 4.0, 6.0, 8.0, 6.0), (T0 + MIN, 1, 2.0, 2.0, 2.0, 2.0)]
        cur.execute("SELECT samples, value_avg, value_last FROM telemetry_narrow_sample_1h")
        assert cur.fetchall() == [(4, 5.0, 2.0)]


@pytest.mark.django_db
def test_other_kinds_roll_up_their_own_fields():
    port = [(T0, 0), (T0 + 30 * SEC, 4096), (T0 + 70 * SEC, 10)]
    insert_series("port", 4, "xmit_data_bytes", port)
    insert_series("power", 5, "energy_j", [(T0, 1.5), (T0 + 30 * SEC, 3.0)])
    insert_series("mig", 6, "xid", [(T0, 1), (T0 + 10 * SEC, 4), (T0 + 20 * SEC, 0)])
    run_rollups(NOW)
    assert [r["xmit_data_bytes_delta"] for r in rollup_rows("port", "1m", 4)] == [4096.0, 10.0]
    assert rollup_row("power", "1m", 5, T0)["energy_j_delta"] == 1.5
    xid = rollup_row("mig", "1m", 6, T0)
    assert (xid["xid_or"], xid["xid_last"]) == (5, 0)


def _other_connection() -> psycopg.Connection:
    s = connection.settings_dict
    return psycopg.connect(
        host=s["HOST"], port=s["PORT"], user=s["USER"], password=s["PASSWORD"], dbname=s["NAME"]
    )


@pytest.mark.django_db
def test_rollup_locked_by_another_process_is_skipped():
    insert_sample("gpu", 1, T0, gpu_util=1.0)
    with _other_connection() as other, other.transaction():
        other.execute(
            "SELECT pg_advisory_xact_lock(%s, %s)", [LOCK_NAMESPACE, BY_NAME["gpu_1m"].lock_key]
        )
        runs = run_rollups(NOW)
    assert _run("gpu_1m", runs).skipped
    assert not _run("mig_1m", runs).skipped
    assert count_rows("telemetry_gpu_sample_1m") == 0
    run_rollups(NOW)
    assert count_rows("telemetry_gpu_sample_1m") == 1


@pytest.mark.django_db
def test_an_hour_whose_minutes_this_pass_finished_waits_for_another_process_instead_of_skipping():
    """Two workers running one pass: one rolls up the minutes, the other, finding their lock held, goes on to the
    hours and holds that lock while it works from the minutes' old watermark. The first must not skip the hours
    then, or the hour it just completed stays open until the next pass."""
    import threading

    insert_sample("gpu", 1, T0, gpu_util=1.0)
    insert_sample("gpu", 1, T0 + 70 * MIN, gpu_util=2.0)
    held, release = threading.Event(), threading.Event()

    def other_worker():
        with _other_connection() as other, other.transaction():
            other.execute("SELECT pg_advisory_xact_lock(%s, %s)", [LOCK_NAMESPACE, BY_NAME["gpu_1h"].lock_key])
            held.set()
            release.wait(5)

    thread = threading.Thread(target=other_worker)
    thread.start()
    assert held.wait(5)
    threading.Timer(0.5, release.set).start()
    t0 = time.monotonic()
    runs = run_rollups(NOW)
    thread.join()
    assert not _run("gpu_1h", runs).skipped
    assert time.monotonic() - t0 >= 0.4  # it waited for the other worker's lock
    assert _mark("gpu_1m") == NOW - MIN and _mark("gpu_1h") == T0 + 60 * MIN
    assert not _run("mig_1h", runs).skipped  # nothing waits on a lock nobody holds


@pytest.mark.django_db(transaction=True)
def test_task_runs_in_a_real_celery_worker():
    from celery._state import _set_task_join_will_block
    from celery.contrib.testing.worker import start_worker
    from celery.signals import task_postrun

    from dashboard.celery import app
    from telemetry import tasks

    def close_worker_connection(**kwargs):
        # The worker thread's connection would outlive the test and block dropping the test DB.
        connection.close()

    insert_sample("gpu", 1, T0, gpu_util=5.0)
    app.control.purge()  # leftovers from an interrupted run must not run against this DB
    task_postrun.connect(close_worker_connection, weak=False)
    try:
        with start_worker(app, perform_ping_check=False, pool="solo", shutdown_timeout=10):
            tasks.run_rollups.apply_async(kwargs={"now": NOW.isoformat()})
            deadline = time.monotonic() + 30
            while not RollupWatermark.objects.filter(name=rollups.ROLLUPS[-1].name).exists():
                assert time.monotonic() < deadline, "the worker did not run the rollup task"
                time.sleep(0.1)
    finally:
        task_postrun.disconnect(close_worker_connection)
        # start_worker marks this process as a worker ("never call result.get() within a task"): a later test
        # in the same process that runs a task eagerly and reads its result would fail for it.
        _set_task_join_will_block(False)
    assert _mark("gpu_1m") == NOW - MIN
    assert rollup_row("gpu", "1m", 1, T0)["gpu_util_last"] == 5.0


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.django_db
def test_rollup_pass_for_2048_gpus_at_6_samples_a_minute(capsys):
    """Times the steady-state pass (every 30 s) and an hour of backlog; prints both."""
    every = timedelta(seconds=10)
    rows = fill_gpu_fleet(2048, T0 - 10 * MIN, 80 * MIN, every)
    run_rollups(T0)  # baseline: sets the watermarks at T0 - 10 min and catches up
    t = time.perf_counter()
    backlog = run_rollups(T0 + 61 * MIN)
    backlog_s = time.perf_counter() - t
    steady = []
    for step in range(1, 5):
        t = time.perf_counter()
        runs = run_rollups(T0 + 61 * MIN + step * 30 * SEC)
        steady.append((time.perf_counter() - t, runs))
    report = [f"{rows} raw rows written (2048 GPUs x 6/min x 80 min)",
              f"hour of backlog: {backlog_s:.2f} s; " + _per_rollup(backlog)]
    report += [f"steady pass: {s:.2f} s; " + _per_rollup(r) for s, r in steady]
    with capsys.disabled():
        print("\n" + "\n".join(report))
    assert max(s for s, _ in steady) < 30, "a pass must finish within its 30 s beat"


def _per_rollup(runs: list[rollups.RollupRun]) -> str:
    return ", ".join(f"{r.name} {r.ms:.0f} ms/{r.rows} rows" for r in runs if r.rows)


def _executed(monkeypatch) -> list[tuple[str, datetime, datetime]]:
    calls, real = [], rollups._execute

    def spy(r, start, end):
        calls.append((r.name, start, end))
        return real(r, start, end)

    monkeypatch.setattr(rollups, "_execute", spy)
    return calls


def _wait_until_no_older_transaction_runs(table: str, timeout: float = 30.0) -> None:
    """Wait until every transaction older than the newest row of `table` has ended, in the whole cluster.

    A refresh's snapshot xmin is the oldest transaction still running anywhere on the server; while another
    session (a parallel test worker's, in another database) holds one older than these rows, the final pass
    rightly cannot tell whether the refresh saw them, and computes the minute again."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cur:
        cur.execute(f"SELECT max(xmin::text::bigint) FROM {table}")
        newest = cur.fetchone()[0]
        while time.monotonic() < deadline:
            cur.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint % 4294967296")
            if cur.fetchone()[0] > newest:
                return
            time.sleep(0.05)
    raise AssertionError(f"a transaction older than {table}'s rows still runs after {timeout} s")


@pytest.mark.django_db(transaction=True)
def test_final_pass_keeps_a_settled_minute_that_nothing_was_written_to_since(monkeypatch):
    for s, v in ((0, 100), (20, 110), (40, 130)):
        insert_sample("gpu", 1, T0 + 5 * MIN + s * SEC, gpu_util=float(v), pcie_replay=v)
    _wait_until_no_older_transaction_runs(KINDS["gpu"].table)
    run_rollups(T0 + 6 * MIN + OPEN_SETTLE)  # the settled refresh computes 10:05
    settled = rollup_row("gpu", "1m", 1, T0 + 5 * MIN)
    assert settled["samples"] == 3
    calls = _executed(monkeypatch)
    run_rollups(T0 + 7 * MIN + 5 * SEC)  # 10:05 turns final: nothing changed, so it is not computed again
    assert ("gpu_1m", T0 + 5 * MIN, T0 + 6 * MIN) not in calls
    assert _mark("gpu_1m") == T0 + 6 * MIN
    assert rollup_row("gpu", "1m", 1, T0 + 5 * MIN) == settled
    rollups._execute(BY_NAME["gpu_1m"], T0 + 5 * MIN, T0 + 6 * MIN)  # what a recompute gives: the same row
    assert rollup_row("gpu", "1m", 1, T0 + 5 * MIN) == settled


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("late", ["new row", "re-sent row merged"])
def test_final_pass_recomputes_a_settled_minute_written_to_since(monkeypatch, late):
    for s, v in ((0, 100), (20, 110), (40, 130)):
        insert_sample("gpu", 1, T0 + 5 * MIN + s * SEC, gpu_util=float(v), pcie_replay=v)
    run_rollups(T0 + 6 * MIN + OPEN_SETTLE)
    assert rollup_row("gpu", "1m", 1, T0 + 5 * MIN)["gpu_util_max"] == 130.0
    if late == "new row":  # committed after the refresh, inside the grace
        insert_sample("gpu", 1, T0 + 5 * MIN + 50 * SEC, gpu_util=150.0, pcie_replay=150)
    else:  # what the writer's ON CONFLICT merge does to a stored row: a new row version, same count
        with connection.cursor() as cur:
            cur.execute("UPDATE telemetry_gpu_sample SET gpu_util = 150 WHERE gpu_id = 1 AND time = %s",
                        [T0 + 5 * MIN + 40 * SEC])
    calls = _executed(monkeypatch)
    run_rollups(T0 + 7 * MIN + 5 * SEC)
    assert ("gpu_1m", T0 + 5 * MIN, T0 + 6 * MIN) in calls
    row = rollup_row("gpu", "1m", 1, T0 + 5 * MIN)
    assert row["gpu_util_max"] == 150.0
    assert row["samples"] == (4 if late == "new row" else 3)


def _plan_nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _plan_nodes(child)


@pytest.mark.django_db
def test_counter_rollup_runs_every_plan_node_once_when_statistics_lag_behind_the_data():
    """The minutes a pass rolls up lie past the last ANALYZE, where the planner expects almost no rows. With the
    counter seed joined to the raw rows it then picked a nested loop that aggregated the seed again for every raw
    row: quadratic in the ports. No node may run more than once."""
    ports = range(1, 201)

    def minutes(first: int, last: int) -> list:
        return [(p, T0 + m * MIN, {"xmit_data_bytes": 1000 * m + p}) for m in range(first, last) for p in ports]

    r = BY_NAME["port_1m"]
    insert_samples("port", minutes(0, 3))
    rollups._execute(r, T0, T0 + 3 * MIN)
    with connection.cursor() as cur:  # the statistics end at 10:03, as autovacuum would leave them
        cur.execute("ANALYZE telemetry_port_sample")
        cur.execute("ANALYZE telemetry_port_sample_1m")
    insert_samples("port", minutes(3, 12))
    rollups._execute(r, T0 + 3 * MIN, T0 + 11 * MIN)
    with connection.cursor() as cur:  # 10:11, its raw rows and its seed's minutes (10:06-10:10) all past them
        cur.execute("SET LOCAL jit = off")
        cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + r.sql, rollups.sql_params(r, T0 + 11 * MIN, T0 + 12 * MIN))
        plan = cur.fetchone()[0][0]["Plan"]
    assert [n["Node Type"] for n in _plan_nodes(plan) if n["Actual Loops"] > 1] == []
    # Each port's one reading of 10:11 steps from its 10:10 reading, which only the seed holds.
    deltas = [rollup_row("port", "1m", p, T0 + 11 * MIN)["xmit_data_bytes_delta"] for p in ports]
    assert deltas == [1000.0] * len(ports)
