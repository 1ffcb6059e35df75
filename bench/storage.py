"""bench/storage: bytes on disk per sample and ingest rows per second, the inputs to TimescaleDB sizing.

The simulator backfills MINUTES of history for a cluster (GPUs, fabric ports, power devices) through
the real ingest API into a scratch database; the rollups are then filled as the beat task would.
We measure, per kind and resolution, rows and bytes on disk (heap + indexes + TOAST of every chunk,
`hypertable_size`), and project the disk needed for 16,384 and 100,000 GPUs at a 10 s interval
under the default retention (raw 7 d, 1 min 90 d, 1 h 2 y). docs/deployment.md quotes the figures.

Baseline, in the same run: the same GPU samples stored the way a generic metrics schema stores them,
one narrow row per (entity, field, time) — our own narrow table, which is where unmapped fields go.
The wide rows must cost less per field value than that (target: at most half).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from datetime import UTC, datetime

from _common import (
    REPO,
    daphne_server,
    drop_database,
    procs,
    recreate_database,
    result,
    say,
    scratch_database_url,
    setup_django,
)

KINDS = ("gpu", "port", "power", "mig")
RETENTION_DAYS = {"raw": 7, "1m": 90, "1h": 730}
INTERVAL_S = 10


def table_stats(cur, table: str) -> tuple[int, int]:
    cur.execute(f"SELECT count(*) FROM {table}")
    rows = cur.fetchone()[0]
    cur.execute("SELECT coalesce(hypertable_size(%s::regclass), 0)", [table])
    return rows, int(cur.fetchone()[0])


def field_values(cur, table: str, columns: list[str]) -> int:
    """Non-null field values in a wide table: the unit a narrow schema stores one row for."""
    cur.execute(f"SELECT sum({' + '.join(f'({c} IS NOT NULL)::int' for c in columns)}) FROM {table}")
    return int(cur.fetchone()[0] or 0)


def narrow_baseline(cur, columns: list[str]) -> tuple[int, int]:
    """Copy every GPU field value into the narrow table; its rows and bytes."""
    values = ", ".join(f"('{c}', {c}::float8)" for c in columns)
    cur.execute(
        "INSERT INTO telemetry_narrow_sample (entity_kind, entity_id, field, time, value) "
        f"SELECT 'gpu', s.gpu_id, v.field, s.time, v.value FROM telemetry_gpu_sample s "
        f"CROSS JOIN LATERAL (VALUES {values}) AS v(field, value) WHERE v.value IS NOT NULL"
    )
    cur.execute("ANALYZE telemetry_narrow_sample")
    return table_stats(cur, "telemetry_narrow_sample")


def gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB" if n < 2**40 else f"{n / 2**40:,.2f} TiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=512)
    ap.add_argument("--minutes", type=int, default=20, help="history to backfill through the API (default 20)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch database for inspection")
    args = ap.parse_args()
    url = scratch_database_url("storage")
    recreate_database(url)
    setup_django(url)
    from django.db import connection

    from telemetry.actions import do_create_collector_token
    from telemetry.fields import KINDS as FIELD_KINDS
    from telemetry.rollups import run_rollups

    token = do_create_collector_token("bench-storage", replace=True)
    try:
        with daphne_server(url) as base:
            say(f"simulating {args.gpus:,} GPUs: {args.minutes} min of history at {INTERVAL_S} s through {base}")
            t0 = time.perf_counter()
            env = {**os.environ, "DATABASE_URL": url}
            subprocess.run(
                procs.simulator_argv(base, "--token", token, "--gpus", str(args.gpus), "--backfill",
                                     str(args.minutes), "--once", "--concurrency", "4", "-v", "1"),
                cwd=REPO, env=env, check=True,
            )
            ingest_s = time.perf_counter() - t0
        say("filling the 1-minute and 1-hour rollups")
        t1 = time.perf_counter()
        marks = None
        for _ in range(100):  # each pass is time-boxed; repeat until no watermark moves
            now_marks = [r.done_until for r in run_rollups(datetime.now(UTC))]
            if now_marks == marks:
                break
            marks = now_marks
        rollup_s = time.perf_counter() - t1
        with connection.cursor() as cur:
            # Closed buckets are never rewritten; compacting removes the dead versions left by the passes
            # that kept updating the open bucket, so the figures are the steady-state bytes per row.
            cur.execute("VACUUM FULL ANALYZE")
            stats = {}
            for kind in KINDS:
                spec = FIELD_KINDS[kind]
                for res, suffix in (("raw", ""), ("1m", "_1m"), ("1h", "_1h")):
                    stats[kind, res] = table_stats(cur, spec.table + suffix)
            gpu_cols = [f.name for f in FIELD_KINDS["gpu"].fields]
            gpu_values = field_values(cur, FIELD_KINDS["gpu"].table, gpu_cols)
            narrow_rows, narrow_bytes = narrow_baseline(cur, gpu_cols)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            drop_database(url)

    raw_rows = sum(stats[k, "raw"][0] for k in KINDS)
    say(f"ingest: {raw_rows:,} raw rows in {ingest_s:.1f} s through the API = {raw_rows / ingest_s:,.0f} rows/s "
        f"(simulator, API and database on one machine); rollups {rollup_s:.1f} s")
    print(f"{'table':<28}{'rows':>12}{'bytes':>14}{'bytes/row':>11}")
    for (kind, res), (rows, size) in stats.items():
        if rows:
            print(f"{FIELD_KINDS[kind].table + ('' if res == 'raw' else '_' + res):<28}{rows:>12,}{size:>14,}"
                  f"{size / rows:>11.0f}")
    gpu_rows, gpu_bytes = stats["gpu", "raw"]
    per_row = gpu_bytes / gpu_rows
    per_value_wide = gpu_bytes / gpu_values
    per_value_narrow = narrow_bytes / narrow_rows
    say(f"GPU raw: {per_row:.0f} B per GPU sample row ({gpu_values / gpu_rows:.1f} fields) = "
        f"{per_value_wide:.1f} B per field value; narrow baseline {per_value_narrow:.1f} B per value")

    # Projection: per GPU, everything the cluster stores (ports and power devices scale with GPUs).
    per_gpu = {}
    for res in RETENTION_DAYS:
        rows = sum(stats[k, res][0] for k in KINDS)
        size = sum(stats[k, res][1] for k in KINDS)
        span_s = args.minutes * 60 if res != "1h" else max(3600, args.minutes * 60)
        per_gpu[res] = (size / max(rows, 1), rows / args.gpus / span_s)  # bytes/row, rows per GPU per second
    print(f"{'cluster':<12}{'raw 7 d':>14}{'1 min 90 d':>14}{'1 h 2 y':>14}{'total':>14}{'rows/s':>10}")
    for n in (16384, 100000):
        raw_rows_s = n * per_gpu["raw"][1]
        sizes = {
            "raw": raw_rows_s * 86400 * RETENTION_DAYS["raw"] * per_gpu["raw"][0],
            # Rollups hold one row per entity per bucket, whatever the sample interval.
            "1m": raw_rows_s * INTERVAL_S / 60 * 86400 * RETENTION_DAYS["1m"] * per_gpu["1m"][0],
            "1h": raw_rows_s * INTERVAL_S / 3600 * 86400 * RETENTION_DAYS["1h"] * per_gpu["1h"][0],
        }
        print(f"{n:>7,} GPUs{gib(sizes['raw']):>14}{gib(sizes['1m']):>14}{gib(sizes['1h']):>14}"
              f"{gib(sum(sizes.values())):>14}{raw_rows_s:>10,.0f}")
    ratio = per_value_narrow / per_value_wide
    result("storage", "narrow_over_wide", ratio, 2.0, ratio >= 2.0, bytes_per_gpu_row=f"{per_row:.0f}",
           bytes_per_value=f"{per_value_wide:.1f}", narrow_bytes_per_value=f"{per_value_narrow:.1f}")


if __name__ == "__main__":
    main()
