"""bench/latest: the newest value of every GPU for a 16,384-GPU fleet, read from the last-value
table, against DISTINCT ON over the raw hypertable holding one hour of 10 s samples (5.9M rows),
in the same run on the same data. Targets: ≥ 50× faster, and p95 ≤ 50 ms.

Both sides read one field for every GPU (what a heatmap or a fleet tile asks for) through
`telemetry.selectors.latest_values`' query shape; the all-fields read is printed for reference.
"""

from __future__ import annotations

import argparse
import random
import time
from datetime import UTC, datetime, timedelta

from _common import (
    drop_database,
    median,
    p95,
    recreate_database,
    result,
    say,
    scratch_database_url,
    setup_django,
)

FIELDS = ("gpu_util", "gpu_temp", "memory_temp", "power_w", "energy_mj", "sm_clock", "fb_used", "xid",
          "throttle_reasons", "ecc_sbe_vol", "ecc_dbe_vol", "gr_engine_active")

FIELD = "gpu_util"
DISTINCT_SQL = (f"SELECT DISTINCT ON (gpu_id) gpu_id, time, {FIELD} FROM telemetry_gpu_sample WHERE time > %s "
                "ORDER BY gpu_id, time DESC")


def load(conn, n_gpus: int, minutes: int, interval: int, now: datetime) -> None:
    """One hour of raw rows by binary COPY, then the last-value table from the newest rows."""
    from telemetry.fields import KINDS

    spec = KINDS["gpu"].by_name
    types = ["int4", "timestamptz"] + [
        {"bigint": "int8", "real": "float4"}.get(spec[f].sql_type, "float8") for f in FIELDS
    ]
    rnd = random.Random(3)
    steps = minutes * 60 // interval
    for step in range(steps):
        t = now - timedelta(seconds=interval * (steps - step))
        with conn.cursor() as cur, cur.copy(
            f"COPY telemetry_gpu_sample (gpu_id, time, {', '.join(FIELDS)}) FROM STDIN (FORMAT BINARY)"
        ) as cp:
            cp.set_types(types)
            for g in range(1, n_gpus + 1):
                cp.write_row((g, t, *(rnd.randint(0, 1000) if spec[f].is_int else rnd.random() * 100 for f in FIELDS)))
        conn.commit()
        if step % 30 == 0 or step == steps - 1:
            say(f"loaded {step + 1}/{steps} intervals ({(step + 1) * n_gpus:,} rows)")
    cols = ", ".join(FIELDS)
    conn.execute(f"INSERT INTO telemetry_gpu_sample_latest (gpu_id, time, {cols}) "
                 f"SELECT DISTINCT ON (gpu_id) gpu_id, time, {cols} FROM telemetry_gpu_sample "
                 "ORDER BY gpu_id, time DESC")
    conn.commit()
    conn.execute("ANALYZE")


def timed(fn, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        rows = fn()
        out.append(time.perf_counter() - t0)
    assert rows, "query returned nothing"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--minutes", type=int, default=60)
    ap.add_argument("--interval", type=int, default=10)
    ap.add_argument("--runs", type=int, default=50)
    args = ap.parse_args()
    url = scratch_database_url("latest")
    recreate_database(url)
    setup_django(url)
    import psycopg

    from telemetry.selectors import latest_values

    now = datetime.now(UTC)
    try:
        with psycopg.connect(url) as conn:
            load(conn, args.gpus, args.minutes, args.interval, now)
            n = len(latest_values("gpu", [FIELD]))
            assert n == args.gpus, f"last-value table holds {n} GPUs, expected {args.gpus}"
            since = now - timedelta(minutes=args.minutes + 1)
            base = timed(
                lambda: conn.cursor(binary=True).execute(DISTINCT_SQL, (since,)).fetchall(), max(3, args.runs // 10)
            )
            ours = timed(lambda: latest_values("gpu", [FIELD]), args.runs)
            every_field = timed(lambda: latest_values("gpu", list(FIELDS)), max(5, args.runs // 5))
    finally:
        from django.db import connections

        connections.close_all()
        drop_database(url)
    ratio = median(base) / median(ours)
    say(f"last-value table: median {median(ours) * 1000:.1f} ms, p95 {p95(ours) * 1000:.1f} ms ({args.gpus} rows)")
    say(f"DISTINCT ON over raw: median {median(base) * 1000:.0f} ms")
    say(f"for reference, all {len(FIELDS)} stored fields of every GPU from the last-value table: "
        f"median {median(every_field) * 1000:.1f} ms (Python row materialisation dominates)")
    ok = ratio >= 50 and p95(ours) <= 0.050
    result("latest", "ratio", ratio, 50, ok, p95_ms=f"{p95(ours) * 1000:.1f}", p95_target_ms=50,
           distinct_on_ms=f"{median(base) * 1000:.0f}")


if __name__ == "__main__":
    main()
