"""Feature matrices from the 1-minute rollups and the fault events, as of a given time.

Per GPU (`GPU_FEATURES`, 20 columns): levels (utilisation, clocks, temperatures, power, memory,
activity), counter rates per minute (SBE, PCIe replays, NVLink CRC/replay/recovery), the time spent
throttled (share of the window's minutes with a clock-costing throttle reason), and the XID events
of the last hour. Per port (`PORT_FEATURES`): link utilisation and the PortXmitWait and error
rates. Per rack (`RACK_FEATURES`): the draw of its power feeds and their inlet air temperature.
Everything is read with a few set-based queries (no query per entity): scoring all GPUs of
a 16k-GPU fleet reads ~32k rollup rows.

Own history (`own_history`, `job_history`, `rack_history`): the same rows, one every 15 minutes
over the day before, for each entity's own-history model (refitted every 10 minutes, not every pass).

"As of `at`" means the rollup buckets that ended at least a minute before `at` (their grace for
late samples has passed) and no later, so the same call on the same data gives the same matrix
whatever the wall clock says: scenario replays and tests pass a fixed `at`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
from django.db import connection

from telemetry.fields import KINDS
from telemetry.ingest import copybin
from telemetry.models import Allocation, Gpu, GpuEvent, Job, Link, Node, Port, PowerDevice, Rack

SCORE_WINDOW = timedelta(minutes=2)
HISTORY_CHUNK = 4096  # entities per history query (see _scatter)  # the newest complete buckets a pass averages
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


def _window_read(kind: str, features: tuple[Feature, ...], params: dict, *,
                 per_bucket: bool) -> tuple[np.ndarray, np.ndarray]:
    """(entity ids, X) of the features that have a column, from the 1-minute rollups in
    [%(start)s, %(end)s): one row per entity (its window average), or per entity and bucket; sorted by
    entity (then bucket); NaN where a value is missing. Read as one binary array per column
    (`_read_columns`): a comprehension per row of Python objects cost ~0.2 s of every pass at 16k GPUs
    and 49k ports."""
    sk = KINDS[kind]
    exprs = [f"COALESCE(({_expr(f)})::float8, 'NaN')" for f in features if f.column]
    key = f"{sk.entity_column}, bucket" if per_bucket else sk.entity_column
    bucket = "extract(epoch FROM bucket)::int8" if per_bucket else "0::int8"
    sql = (f"SELECT {sk.entity_column}::int8, {bucket}, {', '.join(exprs)} FROM {sk.rollup_table('1m')} "
           f"WHERE bucket >= %(start)s AND bucket < %(end)s GROUP BY {key}")
    ids, buckets, *columns = _read_columns(sql, params, ["int8", "int8", *["float8"] * len(exprs)])
    if not len(ids):
        return ids, np.empty((0, len(exprs)))
    order = np.lexsort((buckets, ids))
    return ids[order], np.column_stack(columns)[order]


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
    ids, X = _window_read("gpu", GPU_FEATURES, {"start": start, "end": end}, per_bucket=False)
    xids = _xid_counts(at)
    X = np.column_stack([X, [xids.get(i, 0.0) for i in ids.tolist()]]) if len(ids) else np.empty((0, len(GPU_FEATURES)))
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


@dataclass(frozen=True)
class _Inventory:
    """An inventory's static context as sorted ids and one array per column: looking up a fleet is one
    searchsorted and a take per column, not a dict lookup per entity and column (0.1-0.2 s of every
    pass at 16k GPUs or 49k switch ports)."""

    ids: np.ndarray
    columns: dict[str, np.ndarray]

    @classmethod
    def of(cls, rows: list[tuple], names: tuple[str, ...], dtypes: tuple) -> _Inventory:
        rows = sorted(rows, key=lambda r: r[0])
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        columns = list(zip(*rows, strict=True))[1:] if rows else [()] * len(names)
        return cls(ids, {n: np.array(c, dtype=t) for n, c, t in zip(names, columns, dtypes, strict=True)})

    def take(self, ids: np.ndarray, defaults: dict) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """({column: values for `ids`, `defaults[column]` where an id is unknown}, which ids are known)."""
        if not len(self.ids):
            known = np.zeros(len(ids), dtype=bool)
            return {n: np.full(len(ids), defaults[n], dtype=c.dtype) for n, c in self.columns.items()}, known
        pos = np.minimum(np.searchsorted(self.ids, ids), len(self.ids) - 1)
        known = self.ids[pos] == ids
        out = {n: np.where(known, c[pos], np.array(defaults[n], dtype=c.dtype)) for n, c in self.columns.items()}
        return out, known


_GPU_COLUMNS = ("uuid", "host", "node", "rack", "cohort")
_GPU_DEFAULTS = {"uuid": "", "host": "", "node": 0, "rack": None, "cohort": "unknown"}


def _gpu_info() -> _Inventory:
    rows = [(g, u, h, n, r, m or "unknown") for g, u, h, n, r, m in Gpu.objects.values_list(
        "pk", "uuid", "node__hostname", "node_id", "node__rack_id", "model")]
    return _Inventory.of(rows, _GPU_COLUMNS, (object, object, np.int64, object, object))


def gpu_context(ids: np.ndarray, at: datetime) -> dict[str, np.ndarray]:
    """uuid, host, node id, rack id, cohort (GPU model) and current job key of each GPU id."""
    version = _inventory_version((Gpu, ("uuid", "node_id::text", "coalesce(model, '')")),
                                 (Node, ("hostname", "coalesce(rack_id, 0)::text")))
    context, _ = _memo("gpu", version, _gpu_info).take(ids, _GPU_DEFAULTS)
    jobs, moving = _jobs_at(ids, at)
    listed = ids.tolist()
    return {**context, "job": np.array([jobs.get(i, "") for i in listed], dtype=object),
            "settled": np.array([i not in moving for i in listed], dtype=bool)}


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
    ids, X = _window_read("gpu", GPU_FEATURES, params, per_bucket=True)
    if not len(ids):
        return np.empty((0, len(GPU_FEATURES))), np.empty(0, dtype=np.int64), np.empty(0, dtype=object)
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


def port_matrix(at: datetime) -> Matrix:
    """One row per switch port that reported in the scoring window, with its switch and whether it
    is an uplink (its link ends on another switch) or a downlink (it ends on a node's HCA)."""
    start, end = score_window(at)
    ids, X = _window_read("port", PORT_FEATURES, {"start": start, "end": end}, per_bucket=False)
    version = _inventory_version((Port, ("name", "coalesce(switch_id, 0)::text", "coalesce(speed_gbps, 0)::text")),
                                 (Link, ("a_id::text", "b_id::text")))
    context, known = _memo("port", version, _port_info).take(ids, _PORT_DEFAULTS)
    ids, X = ids[known], X[known]  # ports of nodes' HCAs have no switch: not in the switch-port inventory
    context = {k: v[known] for k, v in context.items()}
    speed = context.pop("speed")
    with np.errstate(invalid="ignore", divide="ignore"):
        X[:, 0] = X[:, 0] * 8 / 60 / (speed * 1e9) * 100  # bytes per minute -> % of line rate
    return Matrix(ids, X, PORT_FEATURES, context)


_PORT_COLUMNS = ("name", "switch", "speed", "uplink", "leaf")
_PORT_DEFAULTS = {"name": "", "switch": 0, "speed": np.nan, "uplink": False, "leaf": False}


def _port_info() -> _Inventory:
    """Every switch port's display name (switch:port), switch id, speed (NaN unknown), whether it is an
    uplink (its link ends on another switch's port) and whether its switch is a leaf."""
    uplinks: set[int] = set()
    for a, b, a_sw, b_sw in Link.objects.values_list("a_id", "b_id", "a__switch_id", "b__switch_id"):
        if a_sw and b_sw:
            uplinks.update((a, b))
    rows = [(p, f"{sw}:{n}", s, sp or np.nan, p in uplinks, role == "leaf") for p, n, s, sw, sp, role in
            Port.objects.filter(switch__isnull=False).values_list("pk", "name", "switch_id", "switch__name",
                                                                   "speed_gbps", "switch__role")]
    return _Inventory.of(rows, _PORT_COLUMNS, (object, np.int64, float, bool, bool))


# --- own history --------------------------------------------------------------------------------
# Each GPU, switch port and rack is also judged against itself (`anomaly.scoring`). Its history is
# HISTORY_ROWS windows shaped exactly like the pass's own (the SCORE_WINDOW average of 1-minute
# buckets, the same SQL), one every HISTORY_EVERY over the day before the scoring window: a history
# row and the row a pass scores are then the same statistic. (10-minute or hourly averages are
# smoother than a 2-minute one, and a model fitted on smoother rows takes ordinary noise for news.)
# A day spans the diurnal cycle of inlet air and batch queues; 96 rows keep the refit of a 16k-GPU
# fleet within seconds (the detector's nearest-neighbour pool costs rows² per entity) and read 2 of
# every 15 one-minute buckets.
HISTORY_ROWS = 96
HISTORY_EVERY = timedelta(minutes=15)
_MINUTE = timedelta(minutes=1)


def _pick(features: tuple[Feature, ...], *names: str) -> tuple[Feature, ...]:
    by_name = {f.name: f for f in features}
    return tuple(by_name[n] for n in names)


# A GPU's own health, not its workload's: temperatures, power and clocks for how it runs, counter
# rates for how it errs. Utilisation, framebuffer, SM/tensor/DRAM activity and NVLink/PCIe traffic
# are left out: they follow whatever job holds the GPU, so a healthy GPU that starts new work moves
# them by many σ of its own history. Utilisation still matters as a state (busy or idle: see
# `anomaly.scoring`), and temperatures and power, which follow the load too, are only compared
# with history rows from the same job and state. Throttling and XIDs have their own alerts.
OWN_GPU_FEATURES = _pick(GPU_FEATURES, "gpu_temp", "memory_temp", "power_w", "sm_clock", "mem_clock", "ecc_sbe_vol",
                         "pcie_replay", "nvlink_crc_flit_errors", "nvlink_replay_errors", "nvlink_recovery_errors")
GPU_STATE = _pick(GPU_FEATURES, "gpu_util")
# A port's own health is its error counters; its utilisation and PortXmitWait follow the traffic of
# the jobs behind it (and are compared with peer ports instead).
OWN_PORT_FEATURES = _pick(PORT_FEATURES, "symbol_errors", "link_error_recovery", "link_downed", "rcv_errors")
RACK_FEATURES: tuple[Feature, ...] = (
    Feature("rack_power", "watts_avg", "feeds", "rack power", "W"),
    Feature("inlet_temp", "inlet_temp_avg", "feeds", "inlet temperature", "°C"),
)


def history_buckets(at: datetime) -> list[datetime]:
    """The 1-minute buckets of the history windows before `at`'s scoring window, newest first."""
    _, end = score_window(at)
    width = SCORE_WINDOW // _MINUTE
    return [end - k * HISTORY_EVERY - SCORE_WINDOW + i * _MINUTE for k in range(1, HISTORY_ROWS + 1)
            for i in range(width)]


def _row_sql() -> str:
    """History row number of a bucket: 0 in the scoring window (ending at %(end)s), k in the window
    HISTORY_EVERY × k earlier (valid while a window is shorter than the step between windows)."""
    return (f"((extract(epoch FROM %(end)s::timestamptz - bucket)::int - 60)"
            f" / {int(HISTORY_EVERY.total_seconds())})::int4")


def own_history(kind: str, at: datetime, ids: np.ndarray, features: tuple[Feature, ...]) -> np.ndarray:
    """(len(ids), HISTORY_ROWS, len(features)) float32 history of each entity of `kind` ("gpu" or
    "port") in sorted `ids`, oldest row first, NaN where a window has no bucket or no value. One
    query for all of `ids`, streamed (16k GPUs are 1.6M rows: never held as one payload)."""
    sk = KINDS[kind]
    cols = ", ".join(f"COALESCE(({_expr(f)})::float4, 'NaN')" for f in features)
    sql = (f"SELECT {sk.entity_column}::int4, {_row_sql()}, {cols} FROM {sk.rollup_table('1m')} "
           f"WHERE bucket = ANY(%(buckets)s) AND {sk.entity_column} = ANY(%(ids)s) GROUP BY 1, 2")
    return _scatter(sql, {**_history_params(at), "ids": ids.tolist()}, ids, len(features))


def _history_params(at: datetime) -> dict:
    return {"buckets": history_buckets(at), "end": score_window(at)[1]}


def _scatter(sql: str, params: dict, ids: np.ndarray, width: int) -> np.ndarray:
    """Rows of (entity, history row, values...) from `sql` into an (ids, rows, values) array; a query
    that reads `%(ids)s` is run for HISTORY_CHUNK entities at a time (~400k rows: a few MB a column)."""
    _check_sorted(ids)
    H = np.full((len(ids), HISTORY_ROWS, width), np.nan, dtype=np.float32)
    if not len(ids):
        return H
    chunks = [ids[lo:lo + HISTORY_CHUNK] for lo in range(0, len(ids), HISTORY_CHUNK)] if "ids" in params else [ids]
    for part in chunks:
        query = {**params, "ids": part.tolist()} if "ids" in params else params
        entity, k, *values = _read_columns(sql, query, ["int4", "int4", *["float4"] * width])
        pos = np.minimum(np.searchsorted(ids, entity), len(ids) - 1)
        ok = (ids[pos] == entity) & (k >= 1) & (k <= HISTORY_ROWS)
        H[pos[ok], HISTORY_ROWS - k[ok]] = np.column_stack(values)[ok]
    return H


def _check_sorted(ids: np.ndarray) -> None:
    """History rows are matched to entities by binary search: the ids must be sorted and unique."""
    if len(ids) > 1 and (np.diff(ids) <= 0).any():
        raise ValueError("entity ids must be sorted and unique")


def _read_columns(sql: str, params: dict, types: list[str]) -> list[np.ndarray]:
    """The columns of `sql` (fixed-width `types`, never NULL) as numpy arrays, in no particular row order
    but the same in every column (one aggregate node feeds every array_agg the same rows in the same
    order): each comes back as one binary array (`copybin.decode_array`), so no Python object is made
    per value. Measured against the binary COPY it replaced: the same wall time for a refit group's
    315k history rows (2.9 s, nearly all of it PostgreSQL's aggregation), and one mechanism instead of
    a streamed COPY parser beside the window reads."""
    names = [f"c{k}" for k in range(len(types))]
    wrapped = (f"SELECT {', '.join(f'array_send(array_agg({n}))' for n in names)} "
               f"FROM ({sql}) AS rows_({', '.join(names)})")
    with connection.cursor() as cur:
        cur.execute(wrapped, params)
        raw = cur.fetchone()
    return [copybin.decode_array(r, t) for r, t in zip(raw, types, strict=True)]


# the rest ends with the trailer


def job_history(at: datetime, ids: np.ndarray) -> tuple[np.ndarray, dict[str, int]]:
    """(codes (len(ids), HISTORY_ROWS) int32, {job key: code}): the job each GPU held through each
    history window and the JOB_SETTLE before it, as `_jobs_at` decides for the pass's own window.
    0: no job; -1: an allocation started or ended in that span (the window mixes two workloads)."""
    _check_sorted(ids)
    buckets = history_buckets(at)[::-1]  # oldest first
    first = buckets[::SCORE_WINDOW // _MINUTE]
    starts = np.array([b.timestamp() for b in first])
    lo, hi = starts - JOB_SETTLE.total_seconds(), starts + SCORE_WINDOW.total_seconds()
    touched = np.zeros((len(ids), HISTORY_ROWS), dtype=np.int16)
    held = np.zeros((len(ids), HISTORY_ROWS), dtype=np.int32)
    codes: dict[str, int] = {}
    with connection.cursor() as cur:
        cur.execute(f"""SELECT a.gpu_id, j.source || ':' || j.external_id, a.start, a."end"
                        FROM {Allocation._meta.db_table} a JOIN {Job._meta.db_table} j ON j.id = a.job_id
                        WHERE a.gpu_id = ANY(%(ids)s) AND a.start < %(to)s
                          AND (a."end" IS NULL OR a."end" > %(from)s)""",
                    {"from": first[0] - JOB_SETTLE, "to": first[-1] + SCORE_WINDOW, "ids": ids.tolist()})
        rows = cur.fetchall()
    for gpu, key, start, end in rows:
        e = int(np.searchsorted(ids, gpu))
        if e >= len(ids) or ids[e] != gpu:
            continue
        s, t = start.timestamp(), end.timestamp() if end else np.inf
        touched[e, np.searchsorted(hi, s, "right"):np.searchsorted(lo, t, "left")] += 1
        held[e, np.searchsorted(lo, s, "left"):np.searchsorted(hi, t, "right")] = codes.setdefault(key, len(codes) + 1)
    return np.where(touched == 0, 0, np.where((touched == 1) & (held > 0), held, -1)).astype(np.int32), codes


# Rack power: the PDUs feeding a rack (power shelves where it has no PDU), each PDU's watts split
# evenly over the racks it feeds, and only when every feed reported in the window (one silent feed of
# an A/B pair would halve the rack); inlet air: the mean of what its feeds' sensors read. Racks fed
# only through their GPUs' power are left out: that sum follows the jobs, not the rack.
_FEEDS, _DEVICE = PowerDevice.racks.through._meta.db_table, PowerDevice._meta.db_table
_RACK_SQL = """
WITH feed AS (
    SELECT f.rack_id, f.powerdevice_id AS device_id, d.kind,
           count(*) OVER (PARTITION BY f.powerdevice_id) AS shared
    FROM {feeds} f JOIN {device} d ON d.id = f.powerdevice_id AND d.kind IN ('pdu', 'power_shelf')
),
src AS (
    SELECT * FROM feed WHERE kind = 'pdu' OR rack_id NOT IN (SELECT rack_id FROM feed WHERE kind = 'pdu')
),
per AS (
    SELECT s.rack_id, {row} AS k, s.device_id, avg(p.watts_avg)::float8 / s.shared AS watts,
           avg(p.inlet_temp_avg)::float8 AS inlet
    FROM src s JOIN {power} p ON p.device_id = s.device_id
    WHERE p.bucket = ANY(%(buckets)s)
    GROUP BY s.rack_id, 2, s.device_id, s.shared
)
SELECT per.rack_id::int4, per.k,
       COALESCE(CASE WHEN count(per.watts) = max(n.feeds) THEN sum(per.watts) END, 'NaN')::float4,
       COALESCE(avg(per.inlet), 'NaN')::float4
FROM per JOIN (SELECT rack_id, count(*) AS feeds FROM src GROUP BY rack_id) n USING (rack_id)
GROUP BY per.rack_id, per.k ORDER BY 1, 2"""


def _rack_sql() -> str:
    return _RACK_SQL.format(feeds=_FEEDS, device=_DEVICE, row=_row_sql().replace("bucket", "p.bucket"),
                            power=KINDS["power"].rollup_table("1m"))


def rack_matrix(at: datetime) -> Matrix:
    """One row per rack with a power feed that reported in the scoring window: its draw and inlet air."""
    start, end = score_window(at)
    buckets = [start + i * _MINUTE for i in range(SCORE_WINDOW // _MINUTE)]
    cols = _read_columns(_rack_sql(), {"buckets": buckets, "end": end}, ["int4", "int4", "float4", "float4"])
    order = np.argsort(cols[0], kind="stable")
    ids, X = cols[0][order].astype(np.int64), np.column_stack(cols[2:])[order]
    names = dict(Rack.objects.filter(pk__in=ids.tolist()).values_list("pk", "name"))
    return Matrix(ids, X, RACK_FEATURES, {"name": np.array([names.get(int(i), str(i)) for i in ids], dtype=object)})


def rack_history(at: datetime, ids: np.ndarray) -> np.ndarray:
    """(len(ids), HISTORY_ROWS, 2) float32 history of the racks in sorted `ids`, as `rack_matrix` reads them."""
    return _scatter(_rack_sql(), _history_params(at), ids, len(RACK_FEATURES))


__all__ = ["GPU_FEATURES", "PORT_FEATURES", "OWN_GPU_FEATURES", "OWN_PORT_FEATURES", "RACK_FEATURES", "Feature",
           "Matrix", "gpu_matrix", "port_matrix", "rack_matrix", "gpu_history", "own_history", "job_history",
           "rack_history", "history_buckets", "score_window"]
