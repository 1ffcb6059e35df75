"""Feature matrices from the 1-minute rollups and the fault events, as of a given time.

Per GPU (`GPU_FEATURES`, 20 columns): levels (utilisation, clocks, temperatures, power, memory,
activity), counter rates per minute (SBE, PCIe replays, NVLink CRC/replay/recovery), the time spent
throttled (share of the window's minutes with a clock-costing throttle reason), and the XID events
of the last hour. Per port (`PORT_FEATURES`): link utilisation and the PortXmitWait and error
rates. Everything is read with a few set-based queries (no query per entity): scoring all GPUs of
a 16k-GPU fleet reads ~32k rollup rows.

"As of `at`" means the rollup buckets that ended at least a minute before `at` (their grace for
late samples has passed) and no later, so the same call on the same data gives the same matrix
whatever the wall clock says: scenario replays and tests pass a fixed `at`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import psycopg
from django.db import connection

from telemetry.fields import KINDS
from telemetry.ingest import copybin
from telemetry.models import Allocation, Gpu, GpuEvent, Job, Link, Node, Port

SCORE_WINDOW = timedelta(minutes=2)  # the newest complete buckets a pass averages
SETTLE = timedelta(minutes=1)  # buckets younger than this may still be filling
XID_WINDOW = timedelta(hours=1)
# clocks_event_reasons that cost clocks: SW power cap, HW slowdown, SW/HW thermal, power brake.
THROTTLE_MASK = 0x04 | 0x08 | 0x20 | 0x40 | 0x80


@dataclass(frozen=True)
class Feature:
    """One column: the rollup column it comes from, how, and what an operator calls it."""

    name: str
    column: str  # rollup column
    how: str  # "avg" (mean of bucket averages), "rate" (delta per minute), "mask" (throttle bits), "xid"
    label: str
    unit: str = ""


def _f(name: str, how: str, label: str, unit: str = "") -> Feature:
    column = {"avg": f"{name}_avg", "rate": f"{name}_delta", "mask": f"{name}_or"}.get(how, "")
    return Feature(name, column, how, label, unit)


GPU_FEATURES: tuple[Feature, ...] = (
    _f("gpu_util", "avg", "GPU utilisation", "%"),
    _f("sm_clock", "avg", "SM clock", "MHz"),
    _f("mem_clock", "avg", "memory clock", "MHz"),
    _f("gpu_temp", "avg", "GPU temperature", "°C"),
    _f("memory_temp", "avg", "memory temperature", "°C"),
    _f("power_w", "avg", "power", "W"),
    _f("fb_used", "avg", "framebuffer used", "MiB"),
    _f("sm_active", "avg", "SM active", ""),
    _f("sm_occupancy", "avg", "SM occupancy", ""),
    _f("tensor_active", "avg", "tensor activity", ""),
    _f("dram_active", "avg", "DRAM activity", ""),
    _f("nvlink_tx_bps", "avg", "NVLink transmit", "B/s"),
    _f("pcie_tx_bps", "avg", "PCIe transmit", "B/s"),
    _f("ecc_sbe_vol", "rate", "single-bit ECC errors", "/min"),
    _f("pcie_replay", "rate", "PCIe replays", "/min"),
    _f("nvlink_crc_flit_errors", "rate", "NVLink CRC errors", "/min"),
    _f("nvlink_replay_errors", "rate", "NVLink replays", "/min"),
    _f("nvlink_recovery_errors", "rate", "NVLink recoveries", "/min"),
    _f("throttle_reasons", "mask", "time throttled", "share"),
    Feature("xid_events", "", "xid", "XID events in the last hour"),
)
PORT_FEATURES: tuple[Feature, ...] = (
    Feature("link_util", "xmit_data_bytes_delta", "util", "link utilisation", "%"),
    _f("xmit_wait", "rate", "PortXmitWait", "/min"),
    _f("symbol_errors", "rate", "symbol errors", "/min"),
    _f("link_error_recovery", "rate", "link error recoveries", "/min"),
    _f("link_downed", "rate", "link downs", "/min"),
    _f("rcv_errors", "rate", "receive errors", "/min"),
)


@dataclass
class Matrix:
    """Rows of one entity kind: ids, features (n, f) and each row's context for grouping."""

    ids: np.ndarray  # database ids
    X: np.ndarray
    features: tuple[Feature, ...]
    context: dict[str, np.ndarray]  # per-row arrays: uuid/name, host, node, group keys, cohort...

    def __len__(self) -> int:
        return len(self.ids)


def _expr(f: Feature) -> str:
    if f.how == "avg":
        return f"avg({f.column})"
    if f.how == "rate":
        return f"sum({f.column})::float8 / count(*)"
    if f.how == "mask":  # share of the window's minutes with a clock-costing throttle reason
        return f"avg(({f.column} & {THROTTLE_MASK} <> 0)::int)"
    if f.how == "util":  # bytes per minute over the link's bits per minute
        return f"sum({f.column})::float8 / count(*)"
    return "NULL"


def _rollup_sql(kind: str, features: tuple[Feature, ...], *, per_bucket: bool) -> str:
    sk = KINDS[kind]
    cols = ", ".join(_expr(f) for f in features if f.column)
    key = f"{sk.entity_column}, bucket" if per_bucket else sk.entity_column
    return (f"SELECT {key}, {cols} FROM {sk.rollup_table('1m')} "
            f"WHERE bucket >= %(start)s AND bucket < %(end)s GROUP BY {key} ORDER BY {key}")


# A GPU below this utilisation is idle: idle and busy GPUs of one model are separate cohorts, since
# an idle GPU's clocks, power and memory look nothing like a busy one's and both states are normal.
BUSY_UTIL = 10.0


def state_cohorts(X: np.ndarray, models: np.ndarray) -> np.ndarray:
    """Cohort of each row: its GPU model and whether it is busy or idle (from its own utilisation,
    so training and scoring split rows the same way without reading the job ledger)."""
    util = X[:, [f.name for f in GPU_FEATURES].index("gpu_util")]
    busy = np.where(np.nan_to_num(util, nan=0.0) >= BUSY_UTIL, "busy", "idle")
    return np.char.add(np.char.add(np.asarray(models).astype(str), " · "), busy).astype(object)


def score_window(at: datetime) -> tuple[datetime, datetime]:
    end = at.replace(second=0, microsecond=0) - SETTLE
    return end - SCORE_WINDOW, end


def gpu_matrix(at: datetime) -> Matrix:
    """One row per GPU that reported in the scoring window before `at`, with its context."""
    start, end = score_window(at)
    with connection.cursor() as cur:
        cur.execute(_rollup_sql("gpu", GPU_FEATURES, per_bucket=False), {"start": start, "end": end})
        rows = cur.fetchall()
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    X = np.array([[np.nan if v is None else float(v) for v in r[1:]] for r in rows], dtype=float).reshape(
        len(rows), len(GPU_FEATURES) - 1)
    xids = _xid_counts(at)
    X = np.column_stack([X, [xids.get(int(i), 0.0) for i in ids]]) if len(ids) else np.empty((0, len(GPU_FEATURES)))
    return Matrix(ids, X, GPU_FEATURES, gpu_context(ids, at))


def _xid_counts(at: datetime) -> dict[int, float]:
    with connection.cursor() as cur:
        cur.execute(f"""SELECT gpu_id, sum(count) FROM {GpuEvent._meta.db_table}
                        WHERE kind = 'xid' AND last_seen > %s AND first_seen <= %s GROUP BY gpu_id""",
                    [at - XID_WINDOW, at])
        return {g: float(n) for g, n in cur.fetchall()}


_MEMO: dict[str, tuple] = {}


def _inventory_version(*models) -> tuple:
    """Changes whenever rows of these inventory tables are added, removed or moved (count, max id
    and a sum over the columns that place them), in one cheap query per table."""
    out = []
    with connection.cursor() as cur:
        for model, cols in models:
            cur.execute(f"SELECT count(*), max(id), sum(hashtext({' || '.join(cols)})::bigint) "
                        f"FROM {model._meta.db_table}")
            out.append(cur.fetchone())
    return tuple(out)


def _memo(name: str, version: tuple, load):
    """The inventory context of a kind, reloaded only when its tables changed: a 16k-GPU fleet's
    static context (names, hosts, models, which ports are uplinks) costs seconds to read and
    almost never changes between two passes a minute apart."""
    hit = _MEMO.get(name)
    if hit and hit[0] == version:
        return hit[1]
    value = load()
    _MEMO[name] = (version, value)
    return value


def _gpu_info() -> dict[int, tuple]:
    return {g: (u, h, n, r, m or "unknown") for g, u, h, n, r, m in Gpu.objects.values_list(
        "pk", "uuid", "node__hostname", "node_id", "node__rack_id", "model")}


def gpu_context(ids: np.ndarray, at: datetime) -> dict[str, np.ndarray]:
    """uuid, host, node id, rack id, cohort (GPU model) and current job key of each GPU id."""
    version = _inventory_version((Gpu, ("uuid", "node_id::text", "coalesce(model, '')")),
                                 (Node, ("hostname", "coalesce(rack_id, 0)::text")))
    info = _memo("gpu", version, _gpu_info)
    jobs, moving = _jobs_at(ids, at)
    cols = list(zip(*[info.get(int(i), ("", "", 0, None, "unknown")) for i in ids], strict=True)) or [()] * 5
    return {"uuid": np.array(cols[0], dtype=object), "host": np.array(cols[1], dtype=object),
            "node": np.array(cols[2], dtype=np.int64), "rack": np.array(cols[3], dtype=object),
            "cohort": np.array(cols[4], dtype=object),
            "job": np.array([jobs.get(int(i), "") for i in ids], dtype=object),
            "settled": np.array([int(i) not in moving for i in ids], dtype=bool)}


# A job's first minutes (loading data, compiling, warming up) look nothing like its steady state,
# and not alike across its ranks either: its GPUs join their job's peer group after this long.
JOB_SETTLE = timedelta(minutes=2)


def _jobs_at(ids: np.ndarray, at: datetime) -> tuple[dict[int, str], set[int]]:
    """({GPU id: job key} for GPUs that held the same job through the whole scoring window and its
    settling time before, {GPU ids whose allocation changed in that span}). The features average
    the window, so a GPU that changed jobs inside it belongs to neither job nor to the idle GPUs."""
    start, end = score_window(at)
    with connection.cursor() as cur:
        cur.execute(f"""SELECT a.gpu_id, j.source || ':' || j.external_id,
                               a.start <= %(from)s AND (a."end" IS NULL OR a."end" >= %(to)s)
                        FROM {Allocation._meta.db_table} a JOIN {Job._meta.db_table} j ON j.id = a.job_id
                        WHERE a.gpu_id IS NOT NULL AND a.start < %(to)s AND (a."end" IS NULL OR a."end" > %(from)s)""",
                    {"from": start - JOB_SETTLE, "to": end})
        stable, moving = {}, set()
        for gpu, key, whole in cur.fetchall():
            if whole:
                stable[gpu] = key
            else:
                moving.add(gpu)
    return {g: k for g, k in stable.items() if g not in moving}, moving


def gpu_history(at: datetime, *, hours: float = 6.0, per_gpu: int = 12) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Training rows for the cohort model: per-bucket features of the last `hours` before the
    scoring window, at most `per_gpu` buckets per GPU (evenly spaced). Returns (X, gpu ids, cohorts
    as `state_cohorts` names them)."""
    start, end = score_window(at)
    params = {"start": end - timedelta(hours=hours), "end": start}
    with connection.cursor() as cur:
        cur.execute(_rollup_sql("gpu", GPU_FEATURES, per_bucket=True), params)
        rows = cur.fetchall()
    if not rows:
        return np.empty((0, len(GPU_FEATURES))), np.empty(0, dtype=np.int64), np.empty(0, dtype=object)
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    X = np.array([[np.nan if v is None else float(v) for v in r[2:]] for r in rows], dtype=float)
    X = np.column_stack([X, np.zeros(len(X))])  # XIDs are rare events, not a level to learn
    keep = _thin(ids, per_gpu)
    ids, X = ids[keep], X[keep]
    models = dict(Gpu.objects.filter(pk__in=np.unique(ids).tolist()).values_list("pk", "model"))
    return X, ids, state_cohorts(X, np.array([models.get(int(i)) or "unknown" for i in ids], dtype=object))


def _thin(ids: np.ndarray, per: int) -> np.ndarray:
    """Indices keeping at most `per` evenly spaced rows of each id (rows are sorted by id)."""
    keep = []
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    ends = np.r_[starts[1:], len(ids)]
    for s, e in zip(starts, ends, strict=True):
        n = e - s
        keep.extend(range(s, e) if n <= per else np.linspace(s, e - 1, per).astype(int).tolist())
    return np.array(keep, dtype=np.int64)


BASELINE_FEATURES = ("ecc_sbe_vol", "pcie_replay", "nvlink_crc_flit_errors", "nvlink_replay_errors",
                     "nvlink_recovery_errors")


def baseline_history(at: datetime, *, days: int = 7) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """History of the counter rates each GPU is compared with itself on: the same hour of day on
    each of the last `days` days (1h rollups) and the last hour in 10-minute chunks (1m rollups),
    excluding the scoring window. Returns (X, gpu ids, hour-of-day slot)."""
    start, _ = score_window(at)
    sk = KINDS["gpu"]
    # NaN, not NULL, for a GPU-hour with no deltas: every field keeps its width, so the result is read
    # as one numpy view (copybin.decode). This runs every 10 minutes in each worker child over up to
    # 16k × 13 rows, which as Python tuples are ~1.4M short-lived objects. The 16k soak's worker memory
    # stepped up after those refits; whether this read was the cause is not settled (README, soak).
    rate = ", ".join(f"COALESCE(sum({f}_delta)::float8 / (count(*) * {{m}}), 'NaN')" for f in BASELINE_FEATURES)
    hours = [at - timedelta(days=d) for d in range(1, days + 1)]
    sql = f"""
        SELECT gpu_id, extract(hour FROM bucket)::int4, {rate.format(m=60)} FROM {sk.rollup_table('1h')}
        WHERE bucket = ANY(%(hours)s) GROUP BY gpu_id, bucket
        UNION ALL
        SELECT gpu_id, %(hod)s::int4, {rate.format(m=1)} FROM {sk.rollup_table('1m')}
        WHERE bucket >= %(recent)s AND bucket < %(start)s GROUP BY gpu_id, time_bucket('10 minutes', bucket)"""
    params = {"hours": [h.replace(minute=0, second=0, microsecond=0) for h in hours],
              "hod": at.hour, "recent": start - timedelta(hours=1), "start": start}
    types = ["int4", "int4", *["float8"] * len(BASELINE_FEATURES)]
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cur, cur.copy(
            f"COPY ({sql}) TO STDOUT (FORMAT BINARY)", params) as cp:
        payload = b"".join(cp)
    ids, slots, *rates = copybin.decode(types, payload)
    X = np.column_stack(rates) if len(ids) else np.empty((0, len(BASELINE_FEATURES)))
    return X, ids, slots


def port_matrix(at: datetime) -> Matrix:
    """One row per switch port that reported in the scoring window, with its switch and whether it
    is an uplink (its link ends on another switch) or a downlink (it ends on a node's HCA)."""
    start, end = score_window(at)
    with connection.cursor() as cur:
        cur.execute(_rollup_sql("port", PORT_FEATURES, per_bucket=False), {"start": start, "end": end})
        rows = cur.fetchall()
    version = _inventory_version((Port, ("name", "coalesce(switch_id, 0)::text", "coalesce(speed_gbps, 0)::text")),
                                 (Link, ("a_id::text", "b_id::text")))
    info, uplinks = _memo("port", version, _port_info)
    rows = [r for r in rows if r[0] in info]
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    X = np.array([[np.nan if v is None else float(v) for v in r[1:]] for r in rows], dtype=float).reshape(
        len(rows), len(PORT_FEATURES))
    speed = np.array([info[int(i)][3] or np.nan for i in ids], dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        X[:, 0] = X[:, 0] * 8 / 60 / (speed * 1e9) * 100  # bytes per minute -> % of line rate
    return Matrix(ids, X, PORT_FEATURES, {
        "name": np.array([f"{info[int(i)][2]}:{info[int(i)][0]}" for i in ids], dtype=object),
        "switch": np.array([info[int(i)][1] for i in ids], dtype=np.int64),
        "uplink": np.array([int(i) in uplinks for i in ids], dtype=bool),
        "leaf": np.array([info[int(i)][4] == "leaf" for i in ids], dtype=bool)})


def _port_info() -> tuple[dict[int, tuple], set[int]]:
    """Every switch port's (name, switch id, switch name, speed, switch role), and the ports that are uplinks
    (their link ends on another switch's port)."""
    info = {p: (n, s, sw, sp, role) for p, n, s, sw, sp, role in Port.objects.filter(
        switch__isnull=False).values_list("pk", "name", "switch_id", "switch__name", "speed_gbps", "switch__role")}
    uplinks: set[int] = set()
    for a, b, a_sw, b_sw in Link.objects.values_list("a_id", "b_id", "a__switch_id", "b__switch_id"):
        if a_sw and b_sw:
            uplinks.update((a, b))
    return info, uplinks


__all__ = ["GPU_FEATURES", "PORT_FEATURES", "BASELINE_FEATURES", "Feature", "Matrix", "gpu_matrix", "port_matrix",
           "gpu_history", "baseline_history", "score_window"]
