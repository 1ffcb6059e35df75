"""Read-side queries for telemetry.

`fleet_summary()` is the operator's first page and the payload of every live push, so it must
stay cheap at 16k GPUs: it reads only the last-value tables (one row per entity), never the raw
hypertables, and every count, mean and sum is computed by PostgreSQL. Four small queries:

1. health of every GPU and node (one statement, the GPU rule written once as a CTE);
2. utilization and power over the GPUs that are reporting;
3. ingest rate from the per-batch log over the last minute;
4. the newest sample time over all last-value tables.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

from telemetry.fields import KINDS
from telemetry.models import Gpu, HealthState, IngestBatch, Node, NodeState

# XIDs whose documented recovery is a GPU reset, a node reboot or an RMA (NVIDIA "XID Errors"
# catalogue): 48 DBE, 63/64 row-remap (page retirement) event/failure, 74 NVLink error,
# 79 fallen off the bus, 94/95 contained/uncontained ECC, 119 GSP timeout. Other XIDs are
# usually application faults and say nothing about the hardware.
RESET_OR_RMA_XIDS: tuple[int, ...] = (48, 63, 64, 74, 79, 94, 95, 119)

# clocks_event_reasons bits that mean the hardware is protecting itself, not that the GPU is
# idle or capped by policy (nvml.h nvmlClocksEventReason*): HW slowdown, SW thermal, HW thermal
# and HW power brake. Idle (0x1), app clocks (0x2) and SW power cap (0x4) are normal operation.
HW_SLOWDOWN = 0x8
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
DEGRADING_THROTTLE_MASK = (
    HW_SLOWDOWN | SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN | HW_POWER_BRAKE_SLOWDOWN
)

# Temperatures (°C) at which a datacenter GPU is already slowing down or close to it.
GPU_TEMP_DEGRADED_C = 87
MEMORY_TEMP_DEGRADED_C = 95

# A node is as bad as its worst GPU; drained and unplaced come from the node itself.
NODE_SEVERITY: tuple[str, ...] = (
    HealthState.HEALTHY, HealthState.STALE, HealthState.DEGRADED, HealthState.FAILED,
)

INGEST_WINDOW = timedelta(seconds=60)

_GPU_LATEST = KINDS["gpu"].latest_table

# One row per GPU with its health; first matching rule wins. A GPU with no last-value row
# (never reported) falls into "stale" because `l.time` is NULL there.
_GPU_HEALTH_CTE = f"""
gpu AS (
    SELECT g.node_id,
        CASE
            WHEN n.rack_id IS NULL THEN %(unplaced)s
            WHEN n.state = ANY(%(drained_states)s) THEN %(drained)s
            WHEN l.time IS NULL OR l.time < %(stale_before)s THEN %(stale)s
            WHEN l.row_remap_failure = 1 OR l.ecc_dbe_vol > 0 OR l.xid = ANY(%(rma_xids)s)
                THEN %(failed)s
            WHEN (l.throttle_reasons & %(throttle_mask)s) <> 0
                OR l.gpu_temp >= %(gpu_temp)s OR l.memory_temp >= %(memory_temp)s
                OR l.row_remap_pending = 1
                THEN %(degraded)s
            ELSE %(healthy)s
        END AS health
    FROM {Gpu._meta.db_table} g
    JOIN {Node._meta.db_table} n ON n.id = g.node_id
    LEFT JOIN {_GPU_LATEST} l ON l.gpu_id = g.id
)"""


def _severity_case(expr: str, *, to_rank: bool) -> str:
    """SQL CASE mapping a health value to its NODE_SEVERITY rank, or a rank back to a value."""
    pairs = [(f"'{state}'", str(rank)) for rank, state in enumerate(NODE_SEVERITY)]
    whens = " ".join(f"WHEN {a} THEN {b}" if to_rank else f"WHEN {b} THEN {a}" for a, b in pairs)
    # A node with no GPUs has nothing to be worse than: it counts as healthy when active.
    return f"CASE {expr} {whens} ELSE {'0' if to_rank else repr(str(HealthState.HEALTHY))} END"


_HEALTH_SQL = f"""
WITH {_GPU_HEALTH_CTE},
node AS (
    SELECT CASE
        WHEN n.rack_id IS NULL THEN %(unplaced)s
        WHEN n.state = ANY(%(drained_states)s) THEN %(drained)s
        ELSE {_severity_case(f"max({_severity_case('gpu.health', to_rank=True)})", to_rank=False)}
    END AS health
    FROM {Node._meta.db_table} n
    LEFT JOIN gpu ON gpu.node_id = n.id
    GROUP BY n.id
)
SELECT 'gpu', health, count(*) FROM gpu GROUP BY health
UNION ALL
SELECT 'node', health, count(*) FROM node GROUP BY health
"""

# "Reporting" means a last-value row newer than STALE_AFTER, whatever the node's state:
# a drained GPU still draws power and may still be busy finishing work. Power columns are
# 4-byte reals; summing 16k of them in float8 keeps the total exact to the watt.
_UTILIZATION_SQL = f"""
SELECT count(*),
    avg(l.gpu_util),
    avg(l.gr_engine_active) * 100,
    sum(l.power_w::float8),
    sum(l.power_limit_w::float8),
    sum(l.power_w::float8) FILTER (WHERE l.power_limit_w > 0),
    sum(l.power_limit_w::float8) FILTER (WHERE l.power_w IS NOT NULL AND l.power_limit_w > 0)
FROM {_GPU_LATEST} l
JOIN {Gpu._meta.db_table} g ON g.id = l.gpu_id
WHERE l.time >= %(stale_before)s
"""

_INGEST_SQL = f"""
SELECT coalesce(sum(samples), 0), count(*), coalesce(sum(rejected), 0)
FROM {IngestBatch._meta.db_table}
WHERE time > %(since)s AND time <= %(now)s
"""

_NEWEST_SQL = "SELECT max(t) FROM ({}) AS newest".format(
    " UNION ALL ".join(f"SELECT max(time) AS t FROM {k.latest_table}" for k in KINDS.values())
)


def fleet_summary(now: datetime | None = None) -> dict:
    """Health counts, utilization, power, ingest rate and data freshness for the whole fleet.

    Returns only JSON-able values (ISO 8601 strings for times) so the same dict renders the
    page and travels over the websocket unchanged.
    """
    now = now or timezone.now()
    stale_before = now - settings.STALE_AFTER
    with connection.cursor() as cursor:
        gpus, nodes = _health_counts(cursor, stale_before)
        utilization, power = _utilization_and_power(cursor, stale_before)
        ingest = _ingest_rate(cursor, now)
        newest = _newest_sample(cursor, now)
    utilization["total"] = gpus["total"]
    return {
        "generated_at": _iso(now),
        "stale_after_s": settings.STALE_AFTER.total_seconds(),
        "gpus": gpus,
        "nodes": nodes,
        "utilization": utilization,
        "power": power,
        "ingest": ingest,
        "newest_sample": newest,
    }


def _health_counts(cursor, stale_before: datetime) -> tuple[dict, dict]:
    params = {state.value: state.value for state in HealthState}
    params.update(
        drained_states=[NodeState.DRAINED.value, NodeState.DOWN.value],
        stale_before=stale_before,
        rma_xids=list(RESET_OR_RMA_XIDS),
        throttle_mask=DEGRADING_THROTTLE_MASK,
        gpu_temp=GPU_TEMP_DEGRADED_C,
        memory_temp=MEMORY_TEMP_DEGRADED_C,
    )
    cursor.execute(_HEALTH_SQL, params)
    counts: dict[str, dict[str, int]] = {"gpu": {}, "node": {}}
    for entity, health, count in cursor.fetchall():
        counts[entity][health] = count
    return _by_health(counts["gpu"]), _by_health(counts["node"])


def _by_health(counts: dict[str, int]) -> dict:
    """Every health state in display order, with its label and colour, zeros included."""
    by_health = {
        state.value: {
            "label": state.label,
            "colour": HealthState.colour(state.value),
            "count": counts.get(state.value, 0),
        }
        for state in HealthState
    }
    return {"total": sum(counts.values()), "by_health": by_health}


def _utilization_and_power(cursor, stale_before: datetime) -> tuple[dict, dict]:
    cursor.execute(_UTILIZATION_SQL, {"stale_before": stale_before})
    reporting, util, busy, draw_w, cap_w, capped_draw_w, capped_cap_w = cursor.fetchone()
    utilization = {"reporting": reporting, "gpu_util_pct": util, "busy_pct": busy}
    power = {
        "draw_kw": draw_w / 1000 if draw_w is not None else None,
        "cap_kw": cap_w / 1000 if cap_w is not None else None,
        # Draw over caps only where a GPU reports both, so a GPU missing its limit cannot push
        # the ratio past 100 %.
        "used_pct": 100 * capped_draw_w / capped_cap_w if capped_cap_w else None,
    }
    return utilization, power


def _ingest_rate(cursor, now: datetime) -> dict:
    cursor.execute(_INGEST_SQL, {"since": now - INGEST_WINDOW, "now": now})
    samples, batches, rejected = cursor.fetchone()
    window_s = INGEST_WINDOW.total_seconds()
    return {
        "window_s": window_s,
        "samples_per_s": samples / window_s,
        "batches_per_min": batches * 60 / window_s,
        "rejected": rejected,
    }


def _newest_sample(cursor, now: datetime) -> dict:
    cursor.execute(_NEWEST_SQL)
    (newest,) = cursor.fetchone()
    if newest is None:
        return {"time": None, "age_s": None}
    # Negative when a collector's clock runs ahead of ours (ingest accepts some future skew);
    # the page says so instead of pretending the data is fresh.
    return {"time": _iso(newest), "age_s": (now - newest).total_seconds()}


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()
