"""Failure-model history from the database: per-GPU aggregates at a cut time, events, labels.

What one GPU looks like at a cut time `t` (minute-aligned; see `anomaly.failure.HISTORY_FIELDS`):

- the last hour: the 1m GPU rollup buckets in ``[t - 1 h, t)`` (on an hour boundary, the 1h bucket
  ``[t - 1 h, t)``, which holds the same sums, maxima and last values);
- the last day: the 1h buckets of the 24 full hours before ``floor_hour(t)`` plus the 1m buckets of
  the current partial hour, so the day reads 24 to 25 hours and no minute is counted twice;
- peer excess: the GPU's last-hour average power, GPU and HBM temperature minus the median of its
  node's other reporting GPUs (`anomaly.failure.peer_excess`);
- idle power: the minimum power of the newest idle bucket in the day (no kernel ran: gpu_util below
  1 %), a GPU's leakage floor whatever its jobs draw;
- lifetime counters (aggregate SBE/DBE, remapped rows, retired pages): their newest value in the day;
- events: `telemetry.models.GpuEvent` rows by first sighting, XIDs by class over 7 days and
  failures over 30 days before t (a row's `count` is ignored: it grows after t);
- inventory: age since the GPU was first seen, and where it sits (row, rack position, U, index);
- the survival prior: log10 of the day's failure hazard for its age and height in the rack, from the
  active survival version (`anomaly.failure_prior`; NaN without one).

Only GPUs with a 1m bucket in the last hour are rows: a GPU that stopped reporting cannot be scored.
Scoring the whole fleet at one time is three set-based queries (inventory, rollups, events),
whatever its size; a training frame repeats the rollup query once per cut time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
from django.db import connection, transaction

from anomaly.failure import (
    HISTORY_FIELDS,
    HOT_GPU_C,
    HOT_MEMORY_C,
    IDLE_UTIL,
    Events,
    FailureFrame,
    event_history,
    failure_episodes,
    failure_labels,
    with_peer_excess,
)
from anomaly.failure_prior import SurvivalPrior
from anomaly.models import ModelKind
from anomaly.registry import load_active
from telemetry.rollups import floor_bucket

MINUTE, HOUR = timedelta(minutes=1), timedelta(hours=1)
EVENT_LOOKBACK = timedelta(days=30)
Progress = Callable[[str, int, int], None]  # (stage, done, total)


def _add(a: str, b: str) -> str:
    """a + b treating one NULL side as 0, but NULL when the GPU reports neither."""
    return f"CASE WHEN {a} IS NULL AND {b} IS NULL THEN NULL ELSE coalesce({a}, 0) + coalesce({b}, 0) END"


# Per rollup row: the counter deltas and last values a feature needs, under one set of names, so the
# 1m tail and the 1h buckets can be stacked (UNION ALL) and aggregated together.
_ROW_COLUMNS = f"""
    gpu_id, coalesce(ecc_sbe_agg_delta, ecc_sbe_vol_delta) AS sbe,
    {_add("remapped_rows_correctable_delta", "remapped_rows_uncorrectable_delta")} AS remaps,
    {_add("nvlink_crc_flit_errors_delta", "nvlink_crc_data_errors_delta")} AS crc,
    pcie_replay_delta AS pcie, gpu_temp_max, memory_temp_max,
    ecc_sbe_agg_last AS sbe_total, ecc_dbe_agg_last AS dbe_total,
    {_add("retired_sbe_last", "retired_dbe_last")} AS retired_pages,
    remapped_rows_correctable_last AS remapped_correctable,
    remapped_rows_uncorrectable_last AS remapped_uncorrectable, row_remap_pending_last AS remap_pending,
    power_w_min AS power_min, gpu_util_max AS util_max, power_w_avg AS power_avg, gpu_temp_avg AS temp_avg,
    memory_temp_avg AS mem_temp_avg"""


def _last(col: str) -> str:
    return f"last({col}, ts) FILTER (WHERE day AND {col} IS NOT NULL) AS {col}"


# On an hour boundary the last hour is the newest 1h bucket, and the 1m table is not read at all: a
# training frame with hourly cuts scans ~25 rows per GPU and cut instead of ~85.
HISTORY_SQL = f"""
WITH w AS (
    SELECT bucket AS ts, time_bucket('1 hour', bucket) AS hour, true AS recent, bucket >= %(h0)s AS day,
           {_ROW_COLUMNS}
    FROM telemetry_gpu_sample_1m WHERE bucket >= %(minutes_from)s AND bucket < %(t)s
    UNION ALL
    SELECT bucket, bucket, bucket >= %(hour_ago)s, true, {_ROW_COLUMNS}
    FROM telemetry_gpu_sample_1h WHERE bucket >= %(day_ago)s AND bucket < %(h0)s
)
SELECT gpu_id,
       sum(sbe) FILTER (WHERE recent) AS sbe_1h, sum(sbe) FILTER (WHERE day) AS sbe_24h,
       {_last("sbe_total")}, {_last("dbe_total")}, {_last("retired_pages")},
       {_last("remapped_correctable")}, {_last("remapped_uncorrectable")},
       sum(remaps) FILTER (WHERE day) AS remap_growth_24h, {_last("remap_pending")},
       max(gpu_temp_max) FILTER (WHERE day) AS gpu_temp_max_24h,
       max(memory_temp_max) FILTER (WHERE day) AS memory_temp_max_24h,
       count(DISTINCT hour) FILTER (WHERE day AND (gpu_temp_max >= %(hot_gpu)s OR memory_temp_max >= %(hot_mem)s))
           AS hot_hours_24h,
       sum(crc) FILTER (WHERE recent) AS nvlink_crc_1h, sum(crc) FILTER (WHERE day) AS nvlink_crc_24h,
       sum(pcie) FILTER (WHERE day) AS pcie_replay_24h,
       last(power_min, ts) FILTER (WHERE day AND util_max < %(idle_util)s AND power_min IS NOT NULL) AS idle_power_w,
       avg(power_avg) FILTER (WHERE recent) AS power_avg_1h, avg(temp_avg) FILTER (WHERE recent) AS gpu_temp_avg_1h,
       avg(mem_temp_avg) FILTER (WHERE recent) AS memory_temp_avg_1h
FROM w GROUP BY gpu_id HAVING bool_or(recent) ORDER BY gpu_id
"""

# Rows are numbered across the inventory by (site, hall, row name), so a row keeps its number whatever
# GPUs report; unplaced nodes get NULLs. A node's height is its rank among its rack's nodes by U position
# over their count, [0, 1) from the bottom (the survival prior's vertical third).
INVENTORY_SQL = """
WITH numbered AS (
    SELECT rw.id, row_number() OVER (ORDER BY h.site_id, h.name, rw.name) AS n
    FROM telemetry_row rw JOIN telemetry_hall h ON h.id = rw.hall_id
), stacked AS (
    SELECT id, (rank() OVER (PARTITION BY rack_id ORDER BY u_position) - 1)::float8
               / count(*) OVER (PARTITION BY rack_id) AS height
    FROM telemetry_node WHERE rack_id IS NOT NULL AND u_position IS NOT NULL
)
SELECT g.id, g.uuid, n.hostname, extract(epoch FROM g.first_seen), g.index, n.u_position, r.position, nb.n,
       st.height
FROM telemetry_gpu g JOIN telemetry_node n ON n.id = g.node_id
LEFT JOIN telemetry_rack r ON r.id = n.rack_id LEFT JOIN numbered nb ON nb.id = r.row_id
LEFT JOIN stacked st ON st.id = n.id
ORDER BY g.id
"""


@dataclass
class Inventory:
    """Every GPU's id, UUID, host, first sighting (epoch s) and location, ordered by id."""

    gpu_id: np.ndarray
    uuid: list[str]
    host: list[str]
    first_seen: np.ndarray
    location: dict[str, np.ndarray]  # gpu_index, u_position, rack_position, row_number
    height: np.ndarray  # the node's rank among its rack's nodes over their count (NaN unplaced)


def load_inventory() -> Inventory:
    with connection.cursor() as cur:
        cur.execute(INVENTORY_SQL)
        rows = cur.fetchall()
    cols = list(zip(*rows, strict=True)) if rows else [()] * 9

    def num(k: int) -> np.ndarray:
        return np.array([np.nan if v is None else float(v) for v in cols[k]], dtype=float)

    return Inventory(np.array(cols[0], dtype=np.int64), list(cols[1]), list(cols[2]), num(3),
                     {"gpu_index": num(4), "u_position": num(5), "rack_position": num(6), "row_number": num(7)},
                     num(8))


def load_events(start: datetime, end: datetime) -> Events:
    """GPU events first seen in [start, end], oldest first, keyed by GPU id."""
    with connection.cursor() as cur:
        cur.execute("SELECT gpu_id, extract(epoch FROM first_seen)::float8, kind, code FROM telemetry_gpu_event "
                    "WHERE first_seen >= %s AND first_seen <= %s", [start, end])
        return Events.from_rows(cur.fetchall())


def load_rollups(t: datetime) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(GPU ids, rollup aggregates) for the GPUs that reported in the hour before minute-aligned `t`."""
    h0 = floor_bucket(t, HOUR)
    params = {"t": t, "h0": h0, "hour_ago": t - HOUR, "minutes_from": t if t == h0 else t - HOUR,
              "day_ago": h0 - 24 * HOUR, "hot_gpu": HOT_GPU_C, "hot_mem": HOT_MEMORY_C,
              "idle_util": IDLE_UTIL}
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL jit = off")  # a fresh statement each cut: compiling costs more than it saves
        cur.execute(HISTORY_SQL, params)
        names = [d.name for d in cur.description]
        rows = cur.fetchall()
    if not rows:
        return np.zeros(0, np.int64), {n: np.zeros(0) for n in names[1:]}
    arr = np.array(rows, dtype=float)  # NULL -> nan
    return arr[:, 0].astype(np.int64), {n: arr[:, k] for k, n in enumerate(names) if k}


@dataclass
class GpuHistory:
    """The GPUs scoreable at one cut time and their HISTORY_FIELDS aggregates."""

    t: datetime
    gpu_id: np.ndarray
    uuid: list[str]
    host: list[str]
    values: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.gpu_id)


def _aligned(t: datetime) -> datetime:
    if t.tzinfo is None:
        raise ValueError(f"t={t.isoformat()} is naive; pass a timezone-aware UTC datetime")
    return floor_bucket(t, MINUTE)


def load_prior() -> SurvivalPrior | None:
    """The survival prior from the active survival version (`fit_survival`), None without one."""

    active = load_active(ModelKind.SURVIVAL)
    return None if active is None else SurvivalPrior.from_report(active[1])


def load_history(t: datetime, *, inventory: Inventory | None = None, events: Events | None = None,
                 prior: SurvivalPrior | None | bool = True) -> GpuHistory:
    """Every reporting GPU's history aggregates at `t` (floored to the minute).

    Pass `inventory` and `events` (covering the 30 days before t) to reuse them across cut times, and
    `prior` (a SurvivalPrior, or None for none) to skip looking up the active survival version.
    """
    t = _aligned(t)
    ids, values = load_rollups(t)
    inv = inventory if inventory is not None else load_inventory()
    pos = np.searchsorted(inv.gpu_id, ids)
    known = (pos < len(inv.gpu_id)) & (inv.gpu_id[np.minimum(pos, len(inv.gpu_id) - 1)] == ids)
    ids, pos = ids[known], pos[known]
    values = {k: v[known] for k, v in values.items()}
    ts = t.timestamp()
    ev = events if events is not None else load_events(t - EVENT_LOOKBACK, t)
    values.update(event_history(ids, ev, ts))
    values.update({k: v[pos] for k, v in inv.location.items()})
    values["age_days"] = np.maximum(0.0, (ts - inv.first_seen[pos]) / 86_400)
    prior = load_prior() if prior is True else prior
    values["survival_log_hazard"] = (prior.log_hazard_24h(values["age_days"], inv.height[pos]) if prior
                                     else np.full(len(ids), np.nan))
    hosts = [inv.host[k] for k in pos]
    values = with_peer_excess(values, np.array(hosts, dtype=object))
    return GpuHistory(t, ids, [inv.uuid[k] for k in pos], hosts, values)


def cut_times(start: datetime, end: datetime, step: timedelta) -> list[datetime]:
    """Minute-aligned cut times from `start` to `end` inclusive, every `step`."""
    if step < MINUTE:
        raise ValueError(f"the cut step must be at least a minute, got {step}")
    t, out = _aligned(start), []
    while t <= end:
        out.append(t)
        t += step
    return out


def build_training_frame(start: datetime, end: datetime, *, horizon: timedelta, step: timedelta = HOUR,
                         negative_keep: float = 1.0, seed: int = 0, progress: Progress | None = None) -> FailureFrame:
    """Rows for every reporting GPU at each cut in [start, end] (every `step`), labelled 1 when a failure
    is first seen in (t, t + horizon]. `end + horizon` should lie in the past, so every label is known.

    `negative_keep` < 1 keeps that share of the non-failure rows (seeded) and weights them by its
    inverse, so a large fleet's frame stays small while rates and PR-AUC stay unbiased.
    """
    if not 0 < negative_keep <= 1:
        raise ValueError(f"negative_keep must be in (0, 1], got {negative_keep}")
    cuts = cut_times(start, end, step)
    inventory, prior = load_inventory(), load_prior()
    events = load_events(start - EVENT_LOOKBACK, end + horizon)
    rng, h = np.random.default_rng(seed), horizon.total_seconds()
    frames = []
    for k, t in enumerate(cuts):
        hist = load_history(t, inventory=inventory, events=events, prior=prior)
        y = failure_labels(hist.gpu_id, events, t.timestamp(), h)
        keep = (y == 1) | (rng.random(len(y)) < negative_keep)
        weight = np.where(y == 1, 1.0, 1.0 / negative_keep)
        frames.append(FailureFrame({n: v[keep] for n, v in hist.values.items()}, hist.gpu_id[keep],
                                   np.full(int(keep.sum()), t.timestamp()), y[keep], weight[keep]))
        if progress:
            progress("history", k + 1, len(cuts))
    frame = FailureFrame.concat(frames) if frames else _empty_frame()
    frame.episodes = failure_episodes(events, h)
    return frame


def _empty_frame() -> FailureFrame:
    return FailureFrame({n: np.zeros(0) for n in HISTORY_FIELDS}, np.zeros(0, np.int64), np.zeros(0),
                        np.zeros(0, np.int8), np.zeros(0))
