"""bench/soak: the production process set at 16,384 GPUs for 30 minutes, with 50 live pages open.

On a scratch database: daphne, a Celery worker (two children, as `./dev up`), Celery beat (rollups, scoring,
alert evaluation, metering on their production schedules) and the simulator at 16,384 GPUs every 10 s, with
50 websocket clients subscribed as the fleet, heatmap and job pages are (tests/reliability/soak_lib.py says how
each figure is measured). The warm-up trains the first models through the worker (a site has them from its
tenth minute on) and lasts until they score (`--no-train` leaves that to the beat). Then it reports, per window:

- ingest lag: a tick's last commit − its sample time, p50/p95/max;
- page-update latency: a commit → the message that reflects it arriving at each client, p95;
- private memory (RssAnon) and RSS of daphne, the worker with its children, beat, the simulator, the PostgreSQL
  backends on the database, and the Redis keys under the run's prefix; the Celery queue and the rollup lag.

Verdict: every page kind's update p95 at most 2 s, the ingest lag p95 at most 5 s and the stack (daphne, the
workers, beat, PostgreSQL and Redis: everything but the simulator and the clients) at most one core on average
(soak_lib.Targets); and no figure grows from the first window after the warm-up to the last beyond
soak_lib.Tolerance. The RESULT line's p95_update_ms is the worst page kind's. A chart of all of it goes to
var/bench/soak.html.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from _common import REPO, drop_database, recreate_database, say, scratch_database_url, setup_django

sys.path.insert(0, str(REPO / "tests" / "reliability"))
import soak_lib  # noqa: E402  (a test-side module, found through the path set above)

CHART = REPO / "var" / "bench" / "soak.html"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="measured minutes, after the warm-up")
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--interval", type=float, default=10.0, help="simulator seconds between ticks")
    ap.add_argument("--warmup-minutes", type=float, default=3.0)
    ap.add_argument("--window-minutes", type=float, default=None,
                    help="window for the figures (default 5, or a fifth of a run shorter than 25 minutes)")
    ap.add_argument("--scenario", action="append", default=[], help="passed to manage.py simulate")
    ap.add_argument("--no-train", action="store_true",
                    help="leave the first model training to the beat (ten minutes in, inside the measured part) "
                         "instead of training in the warm-up and measuring once the models score")
    ap.add_argument("--keep-database", action="store_true", help="leave the scratch database for a look")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    window = args.window_minutes or min(5.0, max(1.0, args.minutes / 5))
    url = scratch_database_url("soak")
    recreate_database(url)
    setup_django(url)
    run_dir = REPO / "var" / "soak"
    tag = f"{os.getpid()}"
    token, cookie = soak_lib.prepare_site("bench-soak", run_dir / "passwords")
    cfg = soak_lib.SoakConfig(
        database_url=url, token=token, collector="bench-soak", session_cookie=cookie,
        queue=f"bw-bench-soak-{tag}", channel_prefix=f"bwbenchsoak{tag}", gpus=args.gpus,
        interval_s=args.interval, clients=args.clients, warmup_s=args.warmup_minutes * 60,
        duration_s=args.minutes * 60, window_s=window * 60, scenarios=tuple(args.scenario), say=say,
        train_models=not args.no_train, targets=soak_lib.Targets(),
    )
    say(f"soak: {args.gpus:,} GPUs every {args.interval:g} s, {args.clients} clients, "
        f"{args.warmup_minutes:g} min warm-up then {args.minutes:g} min in {window:g}-minute windows")
    try:
        report = soak_lib.run_soak(cfg, run_dir)
    finally:
        _forget_queue(cfg.queue)
        shutil.rmtree(run_dir / "passwords", ignore_errors=True)
        (run_dir / "simulator_token").unlink(missing_ok=True)
    if not args.keep_database:
        try:
            drop_database(url)
        except Exception as exc:  # the figures matter more than the scratch database
            say(f"could not drop the scratch database: {exc}")
    for line in soak_lib.report_lines(report):
        say(line)
    soak_lib.dump_raw(report, run_dir / "soak.json")
    soak_lib.write_chart(report, CHART, f"Soak: {args.gpus:,} GPUs every {args.interval:g} s, "
                         f"{args.clients} clients, {args.minutes:g} min")
    say(f"chart: {CHART}")
    ok = not report["failures"] and not report["idle_clients"] and not report["unanswered"]
    worst = max((v for v in report["per_kind_p95_ms"].values() if v is not None), default=0.0)
    targets = cfg.targets
    print(f"RESULT soak p95_update_ms={worst:.0f} ingest_lag_p95_s={report['lag_p95_s'] or 0:.2f} "
          f"stack_cores={report['stack_cores'] or 0:.2f} rss_growth_pct={report['rss_growth_pct']:.1f} "
          f"all_pages_p95_ms={report['update_p95_ms']:.0f} target_update_ms={targets.update_p95_s * 1000:.0f} "
          f"target_lag_s={targets.lag_p95_s:g} target_cores={targets.stack_cores:g} target_growth=none "
          f"{'PASS' if ok else 'FAIL'}", flush=True)


def _forget_queue(queue: str) -> None:
    """Tasks beat sent in the last seconds would wait on Redis for a worker that never comes."""
    import redis

    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    client.delete(queue)
    client.close()


if __name__ == "__main__":
    main()
