"""The soak in CI: bench/soak.py's harness, short (2,048 GPUs every 5 s, 10 pages, about 45 s in all).

The real processes (daphne, a prefork Celery worker, beat, the simulator) run against the test database; the
figures are those of the 30-minute bench, with bounds chosen to hold on a busy two-core machine and still fail
on a broken live path, an ingest backlog or a gross leak (see each assertion). Slow leaks are the bench's job:
half a minute cannot tell a few MB per minute from an allocator settling.
"""

from __future__ import annotations

import os
from urllib.parse import quote

import pytest

from tests.reliability import soak_lib

INTERVAL_S = 5.0
# Memory may rise by 25 % or 50 MB in 30 s (two 15-s windows): first passes of rollups, scoring and the
# heatmap memo settle within the warm-up (every periodic task runs once in it), but pymalloc arenas keep
# climbing a little after. A leak of one tick's request bodies (~1 MB at 2,048 GPUs) does not reach this in
# six ticks; one that keeps every push per page, or a channel whose messages nobody reads, does.
# Latency and lag may rise by 100 % or 5 s between two windows of three ticks each: on a two-core machine
# shared with other jobs a p95 over three ticks moves by seconds (measured: 5.3 → 11 s at load average 10,
# nothing wrong); a consumer that queues ticks instead of folding them falls further behind on every tick.
# Ticks kept are asserted below (one at least per 15-s window, lag under the interval) rather than as a share:
# a window holds only three, and one late tick on a loaded CI machine is not a stack that cannot keep up.
TOLERANCE = soak_lib.Tolerance(rss_pct=25.0, rss_floor_mb=50.0, rise_pct=100.0, rise_floor_s=5.0,
                               queue_rise=20, rollup_rise_s=90.0, min_tick_share=0.0)


@pytest.mark.django_db(transaction=True)
def test_short_soak_keeps_pages_live_and_nothing_grows(settings, tmp_path):
    db = settings.DATABASES["default"]
    url = f"postgresql://{quote(db['USER'])}:{quote(db['PASSWORD'])}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    token, cookie = soak_lib.prepare_site("soak-ci", tmp_path / "passwords")
    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    _purge(queue)  # an earlier run's leftovers would count as backlog
    cfg = soak_lib.SoakConfig(
        database_url=url, token=token, collector="soak-ci", session_cookie=cookie, queue=queue,
        channel_prefix=os.environ["BREAKWATER_CHANNEL_PREFIX"], gpus=2048, interval_s=INTERVAL_S, clients=10,
        warmup_s=12.0, duration_s=30.0, window_s=15.0, sample_s=2.0, progress_s=10.0, log_dir=tmp_path,
        tolerance=TOLERANCE,
    )
    report = soak_lib.run_soak(cfg, tmp_path)
    print("\n".join(soak_lib.report_lines(report)))
    soak_lib.dump_raw(report, tmp_path / "soak.json")

    # Every page got pushes after the warm-up (a job list only when a job starts or ends, so it need only have
    # had its first message), with no error message and no dropped connection.
    assert report["idle_clients"] == [] and report["unanswered"] == []
    assert report["client_errors"] == 0 and report["reconnects"] == 0
    # Each tick's data reached the pages: the design is the 1-s publish slot plus one query (~1.5 s); 15 s
    # leaves a busy CI machine a wide margin (11 s measured at load average 10), yet a change that waits for
    # a later tick (a lost trailing publish: 5 s per tick missed) or a consumer that queues every tick instead
    # of folding them (ten publishes a tick) goes past it.
    assert report["update_p95_ms"] < 15_000, report["per_kind_p95_ms"]
    # A tick's 32 requests commit well within the interval; the simulator skips a tick that overruns it,
    # so lag at or past the interval is ingest falling behind, whatever the machine's load.
    assert report["lag_p95_s"] is not None and report["lag_p95_s"] < INTERVAL_S
    measured = [w["ticks"] for w in report["windows"]]
    assert all(n >= 1 for n in measured), measured
    # Where the time went is accounted in every window: ingest cost daphne and PostgreSQL CPU and wrote WAL,
    # and no window claims more CPU than the machine has (a counter read in the wrong unit or twice would).
    for w in report["windows"]:
        assert w["cpu"]["daphne"] > 0 and w["cpu"]["postgres"] > 0 and w["wal"]["mb_s"] > 0, w
        assert sum(w["cpu"].values()) <= 1.1 * (os.cpu_count() or 1), w["cpu"]
        assert 0 <= w["machine"]["idle"] <= 1, w["machine"]
    # Nothing grew from the first window to the last: memory, lag, latency, the Celery queue, the rollups.
    assert report["failures"] == [], report["failures"]


def _purge(queue: str) -> None:
    import redis

    client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:56379/0"))
    client.delete(queue)
    client.close()
