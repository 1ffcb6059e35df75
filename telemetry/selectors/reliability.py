"""This fleet's own failure history, from its GPU fault events: what failed, when, where, how often.

A failure is what the health model (`telemetry.health`) calls failed: an event of a failing kind
(fallen off the bus, double-bit ECC, row-remap failure) or an XID whose documented recovery is a
reset, a reboot or an RMA. One fault often arrives as several events (XID 79 as both an Xid line
and an off-the-bus line; a DBE with XID 48 and 63 after it), so a GPU's failure events less than
`SAME_FAILURE` after its previous one are counted as one failure.

Rates are per 1,000 GPU-days of observation: the days each GPU has been in the inventory
(`Gpu.first_seen` to now), summed, within the bucket being counted. MTBF is GPU-days per failure.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

from core.time import iso_utc
from telemetry.health import FAILING_EVENT_KINDS, RESET_OR_RMA_XIDS
from telemetry.models import Gpu, GpuEvent, GpuEventKind, Node, Rack
from telemetry.selectors.names import gpu_name
from telemetry.xid import describe

SAME_FAILURE = timedelta(hours=1)
BUCKETS = ("week", "month")
TOP_PLACES = 10
RECENT = 30

EV, GPU, NODE, RACK = (m._meta.db_table for m in (GpuEvent, Gpu, Node, Rack))
_IS_FAILURE = "(e.kind = ANY(%(kinds)s) OR (e.kind = 'xid' AND e.code = ANY(%(xids)s)))"
# One row per failure: the first event of each run of a GPU's failure events closer than SAME_FAILURE.
_FAILURES = f"""
    WITH f AS (SELECT e.gpu_id, e.first_seen, e.kind, e.code,
                      lag(e.first_seen) OVER (PARTITION BY e.gpu_id ORDER BY e.first_seen) AS prev
               FROM {EV} e WHERE {_IS_FAILURE} AND e.first_seen <= %(now)s)
    SELECT gpu_id, first_seen, kind, code FROM f WHERE prev IS NULL OR first_seen - prev >= %(same)s"""


def _params(now: datetime) -> dict:
    return {"now": now, "same": SAME_FAILURE, "kinds": list(FAILING_EVENT_KINDS), "xids": list(RESET_OR_RMA_XIDS)}


def _rate(failures: int, gpu_days: float) -> float | None:
    return round(1000 * failures / gpu_days, 3) if gpu_days > 0 else None


def _mtbf(failures: int, gpu_days: float) -> float | None:
    return round(gpu_days / failures, 1) if failures else None


def fleet_reliability(now: datetime | None = None) -> dict:
    """Totals, failures per week and per month, by cause, by node and rack, and the newest failures."""
    now = now or timezone.now()
    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*), min(first_seen), coalesce(sum(extract(epoch FROM %s - first_seen)), 0) "
                    f"FROM {GPU} WHERE first_seen <= %s", [now, now])
        gpus, since, seconds = cur.fetchone()
        cur.execute(f"SELECT count(*), count(DISTINCT gpu_id) FROM ({_FAILURES}) x", _params(now))
        failures, failed_gpus = cur.fetchone()
    gpu_days = float(seconds) / 86400
    return {"gpus": gpus, "since": iso_utc(since) if since else None, "gpu_days": round(gpu_days, 2),
            "failures": failures, "failed_gpus": failed_gpus, "per_1000_gpu_days": _rate(failures, gpu_days),
            "mtbf_gpu_days": _mtbf(failures, gpu_days),
            "by_week": by_period("week", now), "by_month": by_period("month", now), "causes": causes(now),
            "nodes": by_place("node", now), "racks": by_place("rack", now), "recent": recent_failures(now)}


def by_period(unit: str, now: datetime) -> list[dict]:
    """Failures and GPU-days observed in each calendar week (Monday) or month, oldest first."""
    if unit not in BUCKETS:
        raise ValueError(f"unit must be one of {BUCKETS}, got {unit!r}")
    sql = f"""
        WITH g AS (SELECT first_seen, count(*) AS n FROM {GPU} WHERE first_seen <= %(now)s GROUP BY first_seen),
             b AS (SELECT s AS start, s + interval '1 {unit}' AS stop FROM generate_series(
                       date_trunc('{unit}', (SELECT min(first_seen) FROM g), 'UTC'), %(now)s, interval '1 {unit}') s),
             x AS ({_FAILURES})
        SELECT b.start,
               (SELECT coalesce(sum(g.n * greatest(0, extract(epoch FROM least(b.stop, %(now)s)
                                                          - greatest(b.start, g.first_seen)))), 0) FROM g),
               (SELECT count(*) FROM x WHERE x.first_seen >= b.start AND x.first_seen < b.stop)
        FROM b ORDER BY b.start"""
    with connection.cursor() as cur:
        cur.execute(sql, _params(now))
        rows = cur.fetchall()
    return [{"start": iso_utc(start), "gpu_days": round(float(s) / 86400, 2), "failures": n,
             "per_1000_gpu_days": _rate(n, float(s) / 86400)} for start, s, n in rows]


def causes(now: datetime) -> list[dict]:
    """Every kind of fault event (XIDs by code) with its meaning, how many events and GPUs, and
    whether it counts as a failure; most events first."""
    with connection.cursor() as cur:
        cur.execute(f"""SELECT e.kind, CASE WHEN e.kind = 'xid' THEN e.code ELSE 0 END, count(*),
                               count(DISTINCT e.gpu_id), sum(e.count), bool_or({_IS_FAILURE})
                        FROM {EV} e WHERE e.first_seen <= %(now)s GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2""",
                    _params(now))
        rows = cur.fetchall()
    out = []
    for kind, code, events, gpus, sightings, failure in rows:
        if kind == GpuEventKind.XID:
            info = describe(code)
            label, meaning = f"XID {code}: {info.name}", info.meaning
        else:
            label, meaning = GpuEventKind(kind).label, ""
        out.append({"kind": kind, "code": code, "label": label, "meaning": meaning, "events": events, "gpus": gpus,
                    "sightings": int(sightings or 0), "failure": bool(failure)})
    return out


_PLACE = {
    "node": (f"JOIN {NODE} n ON n.id = gg.node_id", "n.hostname"),
    "rack": (f"JOIN {NODE} n ON n.id = gg.node_id JOIN {RACK} r ON r.id = n.rack_id", "r.name"),
}


def by_place(level: str, now: datetime, limit: int = TOP_PLACES) -> list[dict]:
    """The nodes or racks with the most failures: failures, GPUs, GPU-days and the rate."""
    join, name = _PLACE[level]
    sql = f"""
        WITH x AS ({_FAILURES}),
             obs AS (SELECT {name} AS place, count(*) AS gpus,
                            sum(extract(epoch FROM %(now)s - gg.first_seen)) AS seconds
                     FROM {GPU} gg {join} WHERE gg.first_seen <= %(now)s GROUP BY 1),
             hit AS (SELECT {name} AS place, count(*) AS failures
                     FROM x JOIN {GPU} gg ON gg.id = x.gpu_id {join} GROUP BY 1)
        SELECT hit.place, hit.failures, coalesce(obs.gpus, 0), coalesce(obs.seconds, 0)
        FROM hit LEFT JOIN obs ON obs.place = hit.place ORDER BY 2 DESC, 1 LIMIT %(limit)s"""
    with connection.cursor() as cur:
        cur.execute(sql, {**_params(now), "limit": limit})
        rows = cur.fetchall()
    return [{"name": place, "failures": n, "gpus": gpus, "gpu_days": round(float(s) / 86400, 2),
             "per_1000_gpu_days": _rate(n, float(s) / 86400),
             "url": f"/nodes/{place}/" if level == "node" else f"/search/?q={place}"} for place, n, gpus, s in rows]


def recent_failures(now: datetime, limit: int = RECENT) -> list[dict]:
    """The newest failures, each with its GPU by name and a link to its page."""
    sql = f"""SELECT x.first_seen, x.kind, x.code, gg.uuid, gg.index, n.hostname, e.cleared_at
              FROM ({_FAILURES}) x JOIN {GPU} gg ON gg.id = x.gpu_id JOIN {NODE} n ON n.id = gg.node_id
              LEFT JOIN LATERAL (SELECT max(cleared_at) AS cleared_at, bool_and(cleared_at IS NOT NULL) AS all_cleared
                                 FROM {EV} e WHERE e.gpu_id = x.gpu_id AND e.first_seen >= x.first_seen
                                   AND e.first_seen < x.first_seen + %(same)s AND {_IS_FAILURE}) e ON e.all_cleared
              ORDER BY x.first_seen DESC LIMIT %(limit)s"""
    with connection.cursor() as cur:
        cur.execute(sql, {**_params(now), "limit": limit})
        rows = cur.fetchall()
    return [{"at": iso_utc(at), "gpu": gpu_name(index, host, uuid), "uuid": uuid, "host": host,
             "url": f"/gpus/{uuid}/", "node_url": f"/nodes/{host}/", "what": _what(kind, code),
             "cleared_at": iso_utc(cleared) if cleared else None}
            for at, kind, code, uuid, index, host, cleared in rows]


def _what(kind: str, code: int) -> str:
    if kind == GpuEventKind.XID:
        return f"XID {code}: {describe(code).name}"
    return GpuEventKind(kind).label
