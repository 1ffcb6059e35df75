"""The soak's verdict on its per-window figures (no services: the figures are made up here)."""

from tests.reliability import soak_lib


def _window(i: int, *, ticks: int = 30, worker_mb: float = 600.0, lag: float = 8.0) -> dict:
    mem = {role: (100.0, 100.0) for role in soak_lib.JUDGED}
    mem["worker"] = (worker_mb + 100, worker_mb)
    return {"from_s": 300.0 * i, "to_s": 300.0 * (i + 1), "ticks": ticks, "expected_ticks": 30,
            "lag_p95": lag, "update_p95": 10.0, "queue": 0, "rollup_lag_s": 120.0, "mem": mem}


def test_a_steady_run_passes():
    rows = [_window(i) for i in range(6)]
    assert soak_lib.verdict(soak_lib.Tolerance(), rows)["failures"] == []


def test_a_stack_that_cannot_keep_the_interval_fails_even_with_flat_figures():
    # What a 16k run on a slow machine did: 3 ticks a minute of 6, lag flat at ~25 s, memory flat.
    rows = [_window(i, ticks=15, lag=25.0) for i in range(6)]
    failures = soak_lib.verdict(soak_lib.Tolerance(), rows)["failures"]
    assert len(failures) == 6 and all(f.startswith("interval not kept: 15 of 30") for f in failures)


def test_one_late_tick_in_a_window_is_tolerated_and_two_are_not():
    assert soak_lib.verdict(soak_lib.Tolerance(), [_window(0), _window(1, ticks=29)])["failures"] == []
    failures = soak_lib.verdict(soak_lib.Tolerance(), [_window(0), _window(1, ticks=28)])["failures"]
    assert failures == ["interval not kept: 28 of 30 ticks committed in minutes 5.0-10.0"]


def test_memory_growth_past_the_tolerance_fails():
    rows = [_window(0, worker_mb=600.0), _window(1, worker_mb=700.0)]
    v = soak_lib.verdict(soak_lib.Tolerance(), rows)
    assert v["failures"] == ["worker private memory 600 → 700 MB"]
    assert round(v["growth"]["worker"]["pct"], 1) == 16.7


def test_cpu_of_counts_a_child_that_has_exited_once_reaped():
    # The postmaster's backends come and go with connections: their time must still count, through the
    # parent's reaped-children figure. A child that burns ~0.4 s of CPU and exits shows up in ours.
    import subprocess
    import sys

    before = soak_lib.cpu_of([soak_lib.os.getpid()], reaped=True)
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    after = soak_lib.cpu_of([soak_lib.os.getpid()], reaped=True)
    assert after - before >= 0.35
    assert soak_lib.cpu_of([soak_lib.os.getpid()]) < after  # without reaped, only our own time


def test_window_rates_are_per_second_and_per_core():
    a = {"t": 0.0, "cpu": {"daphne": 10.0, "postgres": 5.0}, "machine": {"idle": 100.0, "iowait": 0.0, "steal": 0.0},
         "wal": dict.fromkeys(("bytes", "fpi", "checkpoints", "buf_checkpoint", "buf_clean", "buf_backend",
                               "blks_read"), 0.0)}
    b = {"t": 100.0, "cpu": {"daphne": 60.0, "postgres": 35.0},
         "machine": {"idle": 100.0 + 50.0 * soak_lib.os.cpu_count(), "iowait": 0.0, "steal": 0.0},
         "wal": {**a["wal"], "bytes": 200.0 * soak_lib.MB, "fpi": 1000.0, "checkpoints": 1.0}}
    r = soak_lib._rates([a, {"t": 50.0}, b])
    assert r["cpu"] == {"daphne": 0.5, "postgres": 0.3}
    assert r["machine"]["idle"] == 0.5 and r["wal"]["mb_s"] == 2.0 and r["wal"]["fpi"] == 10.0
    assert r["wal"]["checkpoints"] == 1.0


def _report(**per_kind_ms) -> dict:
    return {"per_kind_p95_ms": {"fleet": 900.0, "heatmap": 1500.0, "jobs-list": None, **per_kind_ms},
            "lag_p95_s": 3.0, "stack_cores": 0.8}


def test_the_targets_judge_every_page_kind_the_lag_and_the_stack():
    targets = soak_lib.Targets()
    assert soak_lib.target_failures(targets, _report()) == []
    assert soak_lib.target_failures(targets, _report(**{"jobs-job": 2400.0})) == [
        "jobs-job page-update p95 2.40 s > 2 s"]
    late = {**_report(), "lag_p95_s": 6.5, "stack_cores": 1.3}
    assert soak_lib.target_failures(targets, late) == ["ingest lag p95 6.50 s > 5 s", "the stack used 1.30 cores > 1"]
    assert soak_lib.target_failures(targets, {**_report(), "stack_cores": None}) == [
        "the stack used - cores > 1"]


def test_stack_cores_adds_the_stack_roles_and_leaves_out_the_simulator_and_clients():
    a = {"t": 0.0, "cpu": {"daphne": 0.0, "postgres": 0.0, "redis": 0.0, "simulator": 0.0, "clients": 0.0}}
    b = {"t": 10.0, "cpu": {"daphne": 4.0, "postgres": 3.0, "redis": 1.0, "simulator": 9.0, "clients": 9.0}}
    assert soak_lib.stack_cores([a, {"t": 5.0}, b]) == 0.8
    assert soak_lib.stack_cores([a]) is None
