"""Read-side queries for telemetry.

`fleet_summary()` is the operator's first page and the payload of every live push, so it must
stay cheap at 16k GPUs: it reads only the last-value tables (one row per entity), never the raw
hypertables, and every count, mean and sum is computed by PostgreSQL. Three small queries:

1. health of every GPU and node, utilization and power (one pass over the GPU inventory);
2. ingest rate from the per-batch log over the last minute;
3. the newest sample time over all last-value tables.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

from core.db import fetch_binary
from core.time import iso_utc
from telemetry import health
from telemetry.fields import KINDS
from telemetry.models import GpuEvent, IngestBatch
from telemetry.selectors.power import power_overview
from telemetry.xid import SEVERITIES, describe, effective_action

INGEST_WINDOW = timedelta(seconds=60)

_GPU_LATEST = KINDS["gpu"].latest_table

# Utilization and power over the GPUs whose newest values are current (`telemetry.health`'s
# freshness rule). Power columns are 4-byte reals; they are summed as float8 so 16k of them stay
# exact to the watt. The share of caps only counts GPUs that report both draw and limit, so one
# missing limit cannot push it past 100 %.
_LOAD_SQL = f"""
SELECT count(*), avg(gpu_util), avg(gr_engine_active) * 100, sum(power_w::float8), sum(power_limit_w::float8),
       sum(power_w::float8) FILTER (WHERE power_limit_w > 0),
       sum(power_limit_w::float8) FILTER (WHERE power_w IS NOT NULL AND power_limit_w > 0)
FROM {_GPU_LATEST} l
WHERE {health.FRESH_SQL}
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
        fleet = _fleet_health_and_load(cursor, now)
        ingest = _ingest_rate(cursor, now)
        newest = _newest_sample(cursor, now)
        faults = _open_faults(cursor)
    facility = power_overview(now)
    fleet["power"]["pue"] = facility["pue"]
    failed = fleet.pop("failed_gpu_ids")
    return {
        "generated_at": iso_utc(now),
        "stale_after_s": settings.STALE_AFTER.total_seconds(),
        **fleet,
        "ingest": ingest,
        "newest_sample": newest,
        "faults": {**faults, "newest": gpu_events(limit=NEWEST_EVENTS)},
        **{name: section(now, failed) for name, section in _SECTIONS.items()},
    }


NEWEST_EVENTS = 8
# Parts of the summary that apps above telemetry compute (anomaly's "anomalies"), added from their ready():
# name -> section(now, ids of the GPUs the health model calls failed).
_SECTIONS: dict[str, Callable[[datetime, tuple[int, ...]], dict]] = {}


def register_fleet_section(name: str, section: Callable[[datetime, tuple[int, ...]], dict]) -> None:
    _SECTIONS[name] = section

# Open fault events per (kind, code): few distinct pairs however many events, and the partial
# index gpu_event_open_idx (WHERE cleared_at IS NULL) holds exactly these rows.
_OPEN_FAULTS_SQL = f"""
SELECT kind, code, count(*), count(DISTINCT gpu_id) FROM {GpuEvent._meta.db_table}
WHERE cleared_at IS NULL GROUP BY kind, code
"""


def _open_faults(cursor) -> dict:
    """Open fault events by the XID catalogue's severity, and how many GPUs have one."""
    cursor.execute(_OPEN_FAULTS_SQL)
    by_severity = dict.fromkeys(reversed(SEVERITIES), 0)
    total = 0
    for kind, code, n, _gpus in cursor.fetchall():
        by_severity[describe(code if kind == "xid" else _KIND_XID.get(kind, 0)).severity] += n
        total += n
    cursor.execute(f"SELECT count(DISTINCT gpu_id) FROM {GpuEvent._meta.db_table} WHERE cleared_at IS NULL")
    return {"open": total, "gpus": cursor.fetchone()[0], "by_severity": by_severity}


def _fleet_health_and_load(cursor, now: datetime) -> dict:
    counts = health.fleet_counts(now=now)
    cursor.execute(_LOAD_SQL, health.sql_params(now))
    reporting, util, busy, draw_w, cap_w, capped_draw_w, capped_cap_w = cursor.fetchone()
    gpus = health.states_display(counts["gpus"])
    return {
        "failed_gpu_ids": counts["failed_gpu_ids"],
        "gpus": gpus,
        "nodes": health.states_display(counts["nodes"]),
        "racks": health.states_display(counts["racks"]),
        "utilization": {
            "reporting": reporting, "total": gpus["total"], "gpu_util_pct": util, "busy_pct": busy,
        },
        "power": {
            "draw_kw": draw_w / 1000 if draw_w is not None else None,
            "cap_kw": cap_w / 1000 if cap_w is not None else None,
            "used_pct": 100 * capped_draw_w / capped_cap_w if capped_cap_w else None,
        },
    }


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
    return fetch_binary(f"SELECT {cols} FROM {spec.latest_table}")  # names checked above


def gpu_events(*, gpu_uuid: str | None = None, kind: str | None = None, open_only: bool = False,
               limit: int = 100) -> list[dict]:
    """Fault events newest first, each with the XID catalogue's meaning and recommended action."""
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
