"""Read-side queries for telemetry.

`fleet_summary()` is the operator's first page and the payload of every live push, so it must
stay cheap at 16k GPUs: it reads only the last-value tables (one row per entity), never the raw
hypertables, and every count, mean and sum is computed by PostgreSQL. Three small queries:

1. health of every GPU and node, utilization and power (one pass over the GPU inventory);
2. ingest rate from the per-batch log over the last minute;
3. the newest sample time over all last-value tables.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
from django.conf import settings
from django.db import connection
from django.utils import timezone

from telemetry.fields import KINDS
from telemetry.models import Gpu, GpuEvent, HealthState, IngestBatch, Node, NodeState

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

INGEST_WINDOW = timedelta(seconds=60)

# Health as small integers inside SQL (cheaper to compare and group than text), ordered so
# that a node's health is the highest code among its GPUs: failed > degraded > stale > healthy,
# and drained/unplaced, which every GPU of such a node inherits from the node itself.
SEVERITY: tuple[HealthState, ...] = (
    HealthState.HEALTHY, HealthState.STALE, HealthState.DEGRADED, HealthState.FAILED,
    HealthState.DRAINED, HealthState.UNPLACED,
)
_CODE = {state.value: code for code, state in enumerate(SEVERITY)}

_GPU_LATEST = KINDS["gpu"].latest_table

# One statement, one pass over the inventory joined to the last-value table:
# 1. `gpu`: each GPU's health code, first matching rule wins; a GPU with no last-value row
#    (never reported) is stale because `l.time` is NULL. "Reporting" means a row newer than
#    STALE_AFTER whatever the node's state: a drained GPU still draws power.
# 2. `node`: the node's own state first, else its worst GPU; a node with no GPUs has nothing
#    worse than healthy.
# 3. Counts per code for both, and utilization/power over reporting GPUs. Power columns are
#    4-byte reals; they are summed as float8 so 16k of them stay exact to the watt. The share
#    of caps only counts GPUs that report both draw and limit, so one missing limit cannot
#    push it past 100 %.
_FLEET_SQL = f"""
WITH gpu AS MATERIALIZED (
    SELECT g.node_id,
        CASE
            WHEN n.rack_id IS NULL THEN {_CODE["unplaced"]}
            WHEN n.state = ANY(%(drained_states)s) THEN {_CODE["drained"]}
            WHEN l.time IS NULL OR l.time < %(stale_before)s THEN {_CODE["stale"]}
            WHEN l.row_remap_failure = 1 OR l.ecc_dbe_vol > 0 OR l.xid = ANY(%(rma_xids)s)
                THEN {_CODE["failed"]}
            WHEN (l.throttle_reasons & %(throttle_mask)s) <> 0
                OR l.gpu_temp >= %(gpu_temp)s OR l.memory_temp >= %(memory_temp)s
                OR l.row_remap_pending = 1
                THEN {_CODE["degraded"]}
            ELSE {_CODE["healthy"]}
        END AS code,
        l.time >= %(stale_before)s AS reporting,
        l.gpu_util, l.gr_engine_active, l.power_w::float8 AS power_w,
        l.power_limit_w::float8 AS power_limit_w
    FROM {Gpu._meta.db_table} g
    JOIN {Node._meta.db_table} n ON n.id = g.node_id
    LEFT JOIN {_GPU_LATEST} l ON l.gpu_id = g.id
),
node AS (
    SELECT CASE
        WHEN n.rack_id IS NULL THEN {_CODE["unplaced"]}
        WHEN n.state = ANY(%(drained_states)s) THEN {_CODE["drained"]}
        ELSE coalesce(max(gpu.code), {_CODE["healthy"]})
    END AS code
    FROM {Node._meta.db_table} n
    LEFT JOIN gpu ON gpu.node_id = n.id
    GROUP BY n.id
)
SELECT
    (SELECT json_object_agg(code, n) FROM (SELECT code, count(*) n FROM gpu GROUP BY code) c),
    (SELECT json_object_agg(code, n) FROM (SELECT code, count(*) n FROM node GROUP BY code) c),
    count(*),
    avg(gpu_util),
    avg(gr_engine_active) * 100,
    sum(power_w),
    sum(power_limit_w),
    sum(power_w) FILTER (WHERE power_limit_w > 0),
    sum(power_limit_w) FILTER (WHERE power_w IS NOT NULL AND power_limit_w > 0)
FROM gpu
WHERE reporting
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
    with connection.cursor() as cursor:
        fleet = _fleet_health_and_load(cursor, now - settings.STALE_AFTER)
        ingest = _ingest_rate(cursor, now)
        newest = _newest_sample(cursor, now)
        faults = _open_faults(cursor)
    from anomaly.selectors import fleet_anomalies  # anomaly's selectors are its public reads
    from telemetry.selectors.power import power_overview  # power imports this module

    facility = power_overview(now)
    fleet["power"]["pue"] = facility["pue"]
    return {
        "generated_at": iso_utc(now),
        "stale_after_s": settings.STALE_AFTER.total_seconds(),
        **fleet,
        "ingest": ingest,
        "newest_sample": newest,
        "faults": {**faults, "newest": gpu_events(limit=NEWEST_EVENTS)},
        "anomalies": fleet_anomalies(limit=NEWEST_EVENTS),
    }


NEWEST_EVENTS = 8

# Open fault events per (kind, code): few distinct pairs however many events, and the partial
# index gpu_event_open_idx (WHERE cleared_at IS NULL) holds exactly these rows.
_OPEN_FAULTS_SQL = f"""
SELECT kind, code, count(*), count(DISTINCT gpu_id) FROM {GpuEvent._meta.db_table}
WHERE cleared_at IS NULL GROUP BY kind, code
"""


def _open_faults(cursor) -> dict:
    """Open fault events by the XID catalogue's severity, and how many GPUs have one."""
    from telemetry.xid import SEVERITIES, describe

    cursor.execute(_OPEN_FAULTS_SQL)
    by_severity = dict.fromkeys(reversed(SEVERITIES), 0)
    total = 0
    for kind, code, n, _gpus in cursor.fetchall():
        by_severity[describe(code if kind == "xid" else _KIND_XID.get(kind, 0)).severity] += n
        total += n
    cursor.execute(f"SELECT count(DISTINCT gpu_id) FROM {GpuEvent._meta.db_table} WHERE cleared_at IS NULL")
    return {"open": total, "gpus": cursor.fetchone()[0], "by_severity": by_severity}


def _fleet_health_and_load(cursor, stale_before: datetime) -> dict:
    cursor.execute(_FLEET_SQL, {
        "drained_states": [NodeState.DRAINED.value, NodeState.DOWN.value],
        "stale_before": stale_before,
        "rma_xids": list(RESET_OR_RMA_XIDS),
        "throttle_mask": DEGRADING_THROTTLE_MASK,
        "gpu_temp": GPU_TEMP_DEGRADED_C,
        "memory_temp": MEMORY_TEMP_DEGRADED_C,
    })
    (gpu_codes, node_codes, reporting, util, busy,
     draw_w, cap_w, capped_draw_w, capped_cap_w) = cursor.fetchone()
    gpus = _by_health(gpu_codes)
    return {
        "gpus": gpus,
        "nodes": _by_health(node_codes),
        "utilization": {
            "reporting": reporting, "total": gpus["total"], "gpu_util_pct": util, "busy_pct": busy,
        },
        "power": {
            "draw_kw": draw_w / 1000 if draw_w is not None else None,
            "cap_kw": cap_w / 1000 if cap_w is not None else None,
            "used_pct": 100 * capped_draw_w / capped_cap_w if capped_cap_w else None,
        },
    }


def _by_health(code_counts: dict[str, int] | None) -> dict:
    """Every health state in display order, with its label and colour, zeros included."""
    counts = {SEVERITY[int(code)].value: n for code, n in (code_counts or {}).items()}
    by_health = {
        state.value: {
            "label": state.label,
            "colour": HealthState.colour(state.value),
            "count": counts.get(state.value, 0),
        }
        for state in HealthState
    }
    return {"total": sum(counts.values()), "by_health": by_health}


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
    return {"time": iso_utc(newest), "age_s": (now - newest).total_seconds()}


def iso_utc(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


def latest_values(kind: str, fields: list[str] | tuple[str, ...]) -> list[tuple]:
    """`(entity_id, time, *fields)` for every entity of `kind`, from its last-value table.

    This answers "now" for a whole fleet without touching history. Rows come back through a
    binary cursor: at 16k GPUs, text decoding would cost more than the query itself.
    """
    spec = KINDS[kind]
    unknown = [f for f in fields if f not in spec.by_name]
    if unknown:
        raise ValueError(f"unknown {kind} field(s): {', '.join(unknown)}")
    cols = ", ".join([spec.entity_column, "time", *fields])
    connection.ensure_connection()
    # A plain (server-binding) psycopg cursor: Django's client-side cursors cannot return binary.
    with psycopg.Cursor(connection.connection) as cur:
        cur.execute(f"SELECT {cols} FROM {spec.latest_table}", binary=True)  # names checked above
        return cur.fetchall()


def gpu_events(*, gpu_uuid: str | None = None, kind: str | None = None, open_only: bool = False,
               limit: int = 100) -> list[dict]:
    """Fault events newest first, each with the XID catalogue's meaning and recommended action."""
    from telemetry.xid import describe, effective_action

    qs = GpuEvent.objects.select_related("gpu__node").order_by("-last_seen")
    if gpu_uuid:
        qs = qs.filter(gpu__uuid=gpu_uuid)
    if kind:
        qs = qs.filter(kind=kind)
    if open_only:
        qs = qs.filter(cleared_at__isnull=True)
    out = []
    for ev in qs[:limit]:
        info = describe(ev.code if ev.kind == "xid" else _KIND_XID.get(ev.kind, 0))
        out.append({
            "gpu_uuid": ev.gpu.uuid, "host": ev.gpu.node.hostname, "kind": ev.kind, "code": ev.code,
            "count": ev.count, "first_seen": iso_utc(ev.first_seen), "last_seen": iso_utc(ev.last_seen),
            "open": ev.cleared_at is None, "cleared_at": ev.cleared_at and iso_utc(ev.cleared_at),
            "cleared_reason": ev.cleared_reason, "message": ev.message, "source": ev.source,
            "meaning": info.meaning, "severity": info.severity,
            "action": effective_action(ev.code, ev.message) if ev.kind == "xid" else info.action,
        })
    return out


# Non-XID kinds share the catalogue entry of the XID that reports the same fault.
_KIND_XID = {"ecc_dbe": 48, "row_remap_failure": 64, "fallen_off_bus": 79, "nvlink_errors": 74}
