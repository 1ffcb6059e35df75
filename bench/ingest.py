"""bench/ingest: one interval of samples for 16,384 GPUs through the HTTP API, end to end
(request sent → rows committed and acknowledged), against a raw binary COPY of the same rows
into the same hypertable in the same run. Target: ours ≥ 0.8× the raw COPY's throughput.

The interval is pushed as the fleet would push it: one request per group of racks (1,024 GPUs,
~25 fields each), several in flight at once, to one daphne process. Each timed round uses fresh
timestamps so nothing conflicts; GPUs are registered in an untimed warm-up round first.

Each round also times the store floor (store_floor): the SQL the API must run to commit the rows together with
the last-value table, with nothing else. The RESULT line carries it as floor_ms and floor_ratio (raw COPY
against the floor), so a reader sees how much of the gap is the design's database work and how much is ours.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

from _common import (
    daphne_server,
    drop_database,
    median,
    recreate_database,
    result,
    say,
    scratch_database_url,
    setup_django,
)

FIELDS = ("gpu_util", "mem_copy_util", "sm_clock", "mem_clock", "fb_used", "fb_free", "gpu_temp", "memory_temp",
          "power_w", "power_limit_w", "energy_mj", "ecc_sbe_vol", "ecc_dbe_vol", "ecc_sbe_agg", "ecc_dbe_agg", "xid",
          "nvlink_crc_flit_errors", "nvlink_replay_errors", "nvlink_bandwidth", "pcie_replay", "pcie_tx_bps",
          "pcie_rx_bps", "throttle_reasons", "gr_engine_active", "sm_active", "sm_occupancy", "tensor_active",
          "dram_active", "remapped_rows_correctable", "row_remap_failure")


# A healthy fleet: fault fields stay at zero and counters only grow (random ones would raise a
# fault storm of thousands of events per interval, which is a different benchmark).
QUIET = {"xid", "ecc_sbe_vol", "ecc_dbe_vol", "ecc_sbe_agg", "ecc_dbe_agg", "row_remap_failure", "throttle_reasons",
         "nvlink_crc_flit_errors", "nvlink_replay_errors", "pcie_replay", "remapped_rows_correctable"}


def make_interval(n_gpus: int, t: datetime, rnd: random.Random) -> list[dict]:
    from telemetry.fields import COUNTER, KINDS

    spec = KINDS["gpu"].by_name
    tick = int(t.timestamp() // 10)
    gpus = []
    for i in range(n_gpus):
        vals = {
            f: 0 if f in QUIET else (tick * 1000 + i if spec[f].kind == COUNTER else
                                     (rnd.randint(0, 100) if spec[f].is_int else round(rnd.uniform(0, 100), 3)))
            for f in FIELDS
        }
        gpus.append({"host": f"node-{i // 8:05d}", "uuid": f"GPU-bench-{i:06d}", "index": i % 8,
                     "model": "NVIDIA H100 80GB HBM3", "time": t.isoformat(), "fields": vals})
    return gpus


def post_all(base: str, token: str, bodies: list[bytes], concurrency: int) -> float:
    host, port = base.split("//")[1].split(":")

    def send(body: bytes) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        conn.request("POST", "/api/v1/ingest", body=body,
                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"ingest answered {resp.status}: {data[:300]!r}")
        conn.close()

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(send, bodies))
    return time.perf_counter() - t0


def columnar(gpus: list[dict]) -> dict:
    """The same records in the API's columnar form (docs/ingest.md)."""
    return {
        "host": [g["host"] for g in gpus], "uuid": [g["uuid"] for g in gpus],
        "index": [g["index"] for g in gpus], "model": [g["model"] for g in gpus],
        "time": gpus[0]["time"], "fields": {f: [g["fields"][f] for g in gpus] for f in FIELDS},
    }


def bodies_for(gpus: list[dict], per_request: int, fmt: str = "columnar") -> list[bytes]:
    chunks = [gpus[i:i + per_request] for i in range(0, len(gpus), per_request)]
    if fmt == "columnar":
        return [json.dumps({"gpus": columnar(c)}).encode() for c in chunks]
    return [json.dumps({"gpus": c}).encode() for c in chunks]


def copy_baseline(database_url: str, gpus: list[dict]) -> float:
    """Raw binary COPY of exactly the rows the API would write (ids resolved beforehand)."""
    import psycopg

    from telemetry.fields import KINDS

    kind = KINDS["gpu"]
    names = [f.name for f in kind.fields]
    with psycopg.connect(database_url) as conn:
        ids = dict(conn.execute("SELECT uuid, id FROM telemetry_gpu").fetchall())
        rows = [(ids[g["uuid"]], datetime.fromisoformat(g["time"]), *map(g["fields"].get, names)) for g in gpus]
        types = ["int4", "timestamptz"] + [
            {"bigint": "int8", "real": "float4"}.get(f.sql_type, "float8") for f in kind.fields
        ]
        t0 = time.perf_counter()
        with conn.cursor() as cur, cur.copy(
            f"COPY {kind.table} (gpu_id, time, {', '.join(names)}) FROM STDIN (FORMAT BINARY)"
        ) as cp:
            cp.set_types(types)
            for row in rows:
                cp.write_row(row)
        conn.commit()
        return time.perf_counter() - t0


def store_floor(database_url: str, gpus: list[dict], per_request: int, concurrency: int) -> float:
    """The database work the API cannot skip, done as cheaply as this machine allows and with no HTTP, JSON or
    validation at all: per request, in one transaction, the binary COPY into the hypertable, the same payload into
    the staging table and the last-value UPDATE from it (telemetry.ingest.writer's SQL), with payloads encoded
    before the clock starts and requests spread over `concurrency` connections as the API's are.

    It bounds what any implementation of the issue's design (rows and last-value table committed together) can
    reach against the raw COPY; the gap between it and the API is what HTTP, decoding and validation cost."""
    import psycopg

    from telemetry.fields import KINDS
    from telemetry.ingest import copybin
    from telemetry.ingest.writer import _sql

    names = tuple(f.name for f in KINDS["gpu"].fields if f.name in FIELDS)
    sql = _sql("gpu", names)
    conns = [psycopg.connect(database_url) for _ in range(concurrency)]
    try:
        ids = dict(conns[0].execute("SELECT uuid, id FROM telemetry_gpu").fetchall())
        t = datetime.fromisoformat(gpus[0]["time"])
        payloads = []
        for i in range(0, len(gpus), per_request):
            chunk = gpus[i:i + per_request]
            cols = [[ids[g["uuid"]] for g in chunk], [t] * len(chunk),
                    *([g["fields"][n] for g in chunk] for n in names)]
            payloads.append(copybin.encode(sql.types, cols))
        for conn in conns:
            conn.execute(sql.create_stage)
            conn.commit()
        free = list(conns)

        def write(payload: bytes) -> None:
            conn = free.pop()
            try:
                with conn.cursor() as cur:
                    for statement in (sql.copy_direct, sql.copy):
                        with cur.copy(statement) as cp:
                            cp.write(payload)
                    cur.execute(sql.latest_update)
                conn.commit()
            finally:
                free.append(conn)

        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(write, payloads))
        return time.perf_counter() - t0
    finally:
        for conn in conns:
            conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--per-request", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--format", choices=("columnar", "rows"), default="columnar")
    ap.add_argument("--keep", action="store_true", help="keep the scratch database for inspection")
    args = ap.parse_args()
    url = scratch_database_url("ingest")
    recreate_database(url)
    setup_django(url)
    from telemetry.actions import do_create_collector_token

    token = do_create_collector_token("bench", replace=True)
    rnd = random.Random(7)
    base_t = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=2)
    ours, copies, floors = [], [], []
    try:
        with daphne_server(url) as base:
            say(f"warm-up: registering {args.gpus} GPUs through the API")
            post_all(base, token, bodies_for(make_interval(args.gpus, base_t, rnd), args.per_request), args.concurrency)
            for r in range(args.rounds):
                t_api = base_t + timedelta(seconds=10 * (2 * r + 1))
                gpus = make_interval(args.gpus, t_api, rnd)
                bodies = bodies_for(gpus, args.per_request, args.format)
                ours.append(post_all(base, token, bodies, args.concurrency))
                same_rows = [{**g, "time": (t_api + timedelta(seconds=10)).isoformat()} for g in gpus]
                copies.append(copy_baseline(url, same_rows))
                floor_rows = [{**g, "time": (t_api + timedelta(seconds=5)).isoformat()} for g in gpus]
                floors.append(store_floor(url, floor_rows, args.per_request, args.concurrency))
                say(f"round {r + 1}/{args.rounds}: API ({args.format}) {ours[-1] * 1000:.0f} ms "
                    f"({len(bodies)} requests, {sum(map(len, bodies)) / 1e6:.1f} MB)  "
                    f"raw COPY {copies[-1] * 1000:.0f} ms  store floor {floors[-1] * 1000:.0f} ms")
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            drop_database(url)
    api_ms, copy_ms, floor_ms = median(ours) * 1000, median(copies) * 1000, median(floors) * 1000
    ratio = copy_ms / api_ms
    say(f"median: API {api_ms:.0f} ms = {args.gpus / (api_ms / 1000):,.0f} GPU rows/s; "
        f"raw COPY {copy_ms:.0f} ms = {args.gpus / (copy_ms / 1000):,.0f} rows/s; "
        f"store floor (rows + last-value table, no HTTP/JSON) {floor_ms:.0f} ms")
    say(f"the floor against the raw COPY: {copy_ms / floor_ms:.2f}x (the most any implementation that commits rows "
        f"and last values together can reach here); the API against the floor: {floor_ms / api_ms:.2f}x")
    result("ingest", "ratio", ratio, 0.8, ratio >= 0.8, api_ms=f"{api_ms:.0f}", copy_ms=f"{copy_ms:.0f}",
           floor_ms=f"{floor_ms:.0f}", floor_ratio=f"{copy_ms / floor_ms:.2f}", format=args.format)


if __name__ == "__main__":
    main()
