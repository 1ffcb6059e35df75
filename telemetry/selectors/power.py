"""Read-side queries for the power and cooling page.

A rack's draw comes from what feeds it, in this order, and every rack says which was used:

1. ``pdu``: the newest `watts` of every PDU feeding it (`PowerDevice.racks`). Only when all of
   them report: with A/B feeds, one silent feed would halve the rack. A PDU feeding several
   racks is split evenly between them (nothing measures the split).
2. ``power_shelf``: the same over rack power shelves (NVL72 racks), when it has no PDU reading.
3. ``gpus``: the sum of its GPUs' newest `power_w`. This misses CPUs, fans and switches (an HGX
   node draws ~1.5 kW besides its GPUs), so it reads low; it is a fallback, not a meter.

A reading counts only while it is fresh (`telemetry.health`: two of its intervals plus grace).
PUE is facility power over IT power: each device that reports `facility_watts` (a cooling loop or a
facility meter) covers the racks it is linked to, or the whole cluster when it is linked to none, and counts only when
every rack it covers has a draw. Devices are assumed to cover disjoint racks.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

from core.db import cursor_without_jit
from core.time import iso_utc
from telemetry import health
from telemetry.fields import KINDS
from telemetry.models import Gpu, Hall, Node, PowerDevice, Rack, Row, Site
from telemetry.rollups import INTERVALS, floor_bucket

# PUE is read from rollups only, chosen by span like `telemetry.series`, but switching to 1 h
# sooner: every point sums ~550 devices (PDUs and loops at 16k GPUs), so a week of 1-minute
# buckets is 5.5M rows where a week of hours is 90k and still draws a 168-point trend.
ONE_MINUTE_MAX_SPAN = timedelta(days=1)

_DEVICE, _FEEDS = PowerDevice._meta.db_table, PowerDevice.racks.through._meta.db_table
_POWER = KINDS["power"]
_PDU, _SHELF, _LOOP = (PowerDevice.Kind.PDU.value, PowerDevice.Kind.POWER_SHELF.value,
                       PowerDevice.Kind.COOLING_LOOP.value)

# One row per rack: its place, its cap, and its draw from each source.
# 1. `feed`: each PDU/shelf's fresh watts, split across the racks it feeds (the window counts
#    its racks before any grouping).
# 2. `by_rack`: per rack and source, feeds, feeds reporting and their watts.
# 3. `gpus`: per rack, GPUs, GPUs reporting power and their watts (float8: 4-byte reals summed
#    over a rack would drift).
_RACKS_SQL = f"""
WITH feed AS (
    SELECT f.rack_id, d.kind, l.watts::float8 / count(*) OVER (PARTITION BY d.id) AS watts
    FROM {_FEEDS} f
    JOIN {_DEVICE} d ON d.id = f.powerdevice_id AND d.kind IN ('{_PDU}', '{_SHELF}')
    LEFT JOIN {_POWER.latest_table} l ON l.device_id = d.id AND {health.FRESH_SQL}
),
by_rack AS (
    SELECT rack_id,
        count(*) FILTER (WHERE kind = '{_PDU}') AS pdus,
        count(watts) FILTER (WHERE kind = '{_PDU}') AS pdus_reporting,
        sum(watts) FILTER (WHERE kind = '{_PDU}') AS pdu_w,
        count(*) FILTER (WHERE kind = '{_SHELF}') AS shelves,
        count(watts) FILTER (WHERE kind = '{_SHELF}') AS shelves_reporting,
        sum(watts) FILTER (WHERE kind = '{_SHELF}') AS shelf_w
    FROM feed GROUP BY rack_id
),
gpus AS (
    SELECT n.rack_id, count(*) AS gpus, count(l.power_w) AS reporting, sum(l.power_w::float8) AS watts
    FROM {Gpu._meta.db_table} g
    JOIN {Node._meta.db_table} n ON n.id = g.node_id AND n.rack_id IS NOT NULL
    LEFT JOIN {KINDS["gpu"].latest_table} l ON l.gpu_id = g.id AND {health.FRESH_SQL}
    GROUP BY n.rack_id
)
SELECT r.id, r.name, ro.name, h.name, s.name, r.power_cap_w,
    coalesce(b.pdus, 0), coalesce(b.pdus_reporting, 0), b.pdu_w,
    coalesce(b.shelves, 0), coalesce(b.shelves_reporting, 0), b.shelf_w,
    coalesce(g.gpus, 0), coalesce(g.reporting, 0), g.watts
FROM {Rack._meta.db_table} r
JOIN {Row._meta.db_table} ro ON ro.id = r.row_id
JOIN {Hall._meta.db_table} h ON h.id = ro.hall_id
JOIN {Site._meta.db_table} s ON s.id = h.site_id
LEFT JOIN by_rack b ON b.rack_id = r.id
LEFT JOIN gpus g ON g.rack_id = r.id
ORDER BY s.name, h.name, ro.name, r.position, r.name
"""

_RACK_KEYS = ("id", "name", "row", "hall", "site", "cap_w", "pdus", "pdus_reporting", "pdu_w",
              "shelves", "shelves_reporting", "shelf_w", "gpus", "gpus_reporting", "gpu_w")

# Cooling loops and every device that reports facility power, with their newest readings and
# the racks they are linked to.
_DEVICES_SQL = f"""
SELECT d.id, d.name, d.kind, l.time, l.watts, l.coolant_supply_temp, l.coolant_return_temp, l.flow_lpm,
    l.facility_watts::float8, array_remove(array_agg(f.rack_id ORDER BY f.rack_id), NULL),
    coalesce({health.FRESH_SQL}, false)
FROM {_DEVICE} d
LEFT JOIN {_POWER.latest_table} l ON l.device_id = d.id
LEFT JOIN {_FEEDS} f ON f.powerdevice_id = d.id
WHERE d.kind = '{_LOOP}' OR l.facility_watts IS NOT NULL
GROUP BY d.id, l.device_id
ORDER BY d.name
"""

_DEVICE_KEYS = ("id", "name", "kind", "time", "watts", "supply_c", "return_c", "flow_lpm", "facility_w",
                "racks", "fresh")


def _pct(draw: float | None, cap: float | None) -> float | None:
    return 100.0 * draw / cap if draw is not None and cap else None


def _rack(row: tuple) -> dict:
    r = dict(zip(_RACK_KEYS, row, strict=True))
    if r["pdus"] and r["pdus_reporting"] == r["pdus"]:
        source, draw = "pdu", r["pdu_w"]
    elif r["shelves"] and r["shelves_reporting"] == r["shelves"]:
        source, draw = "power_shelf", r["shelf_w"]
    elif r["gpus_reporting"]:
        source, draw = "gpus", r["gpu_w"]
    else:
        source, draw = None, None
    return {
        "id": r["id"], "name": r["name"], "row": r["row"], "hall": r["hall"], "site": r["site"],
        "draw_w": draw, "source": source, "cap_w": r["cap_w"], "pct_of_cap": _pct(draw, r["cap_w"]),
        "pdus": r["pdus"], "pdus_reporting": r["pdus_reporting"],
        "gpus": r["gpus"], "gpus_reporting": r["gpus_reporting"],
    }


def _totals(racks: list[dict], keys: tuple[str, ...]) -> list[dict]:
    """Draw and cap summed per group. The share of cap counts only racks with both a draw and a
    cap, so a rack without a cap cannot push it past 100 %."""
    groups: dict[tuple, list[dict]] = {}
    for r in racks:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = []
    for group, members in groups.items():
        draws = [r["draw_w"] for r in members if r["draw_w"] is not None]
        caps = [r["cap_w"] for r in members if r["cap_w"] is not None]
        both = [r for r in members if r["draw_w"] is not None and r["cap_w"]]
        out.append({
            **dict(zip(keys, group, strict=True)), "racks": len(members), "racks_reporting": len(draws),
            "draw_w": sum(draws) if draws else None, "cap_w": sum(caps) if caps else None,
            "pct_of_cap": _pct(sum(r["draw_w"] for r in both), sum(r["cap_w"] for r in both)) if both else None,
        })
    return out


def _loop(d: dict, names: dict[int, str]) -> dict:
    live = d["fresh"]

    def value(key):
        return float(d[key]) if live and d[key] is not None else None

    supply, ret = value("supply_c"), value("return_c")
    return {
        "id": d["id"], "name": d["name"], "racks": [names[r] for r in d["racks"] if r in names],
        "time": iso_utc(d["time"]) if d["time"] else None, "stale": not live,
        "supply_c": supply, "return_c": ret,
        "delta_t_c": ret - supply if supply is not None and ret is not None else None,
        "flow_lpm": value("flow_lpm"), "pump_w": value("watts"), "facility_w": value("facility_w"),
    }


def _pue(devices: list[dict], racks: list[dict]) -> dict:
    """Facility over IT power, over the devices whose covered racks all have a draw."""
    draw = {r["id"]: r["draw_w"] for r in racks}
    facility, covered, used = 0.0, set(), 0
    reporting = [d for d in devices if d["facility_w"] is not None and d["fresh"]]
    for d in reporting:
        mine = set(d["racks"]) or set(draw)
        if mine and all(draw.get(r) is not None for r in mine):
            facility, covered, used = facility + d["facility_w"], covered | mine, used + 1
    it = sum(draw[r] for r in covered)
    return {
        "pue": facility / it if used and it > 0 else None,
        "facility_w": facility if used else None, "it_w": it if used else None,
        "pue_devices": used, "pue_devices_reporting": len(reporting),
    }


def power_overview(now: datetime | None = None) -> dict:
    """Rack draw against its cap, row/hall/site totals, cooling loops and PUE now.

    Returns ``{"generated_at", "racks": [{id, name, row, hall, site, draw_w, source ("pdu" |
    "power_shelf" | "gpus" | None), cap_w, pct_of_cap, pdus, pdus_reporting, gpus,
    gpus_reporting}], "rows": [{site, hall, row, racks, racks_reporting, draw_w, cap_w,
    pct_of_cap}], "halls": [same without row], "total": {same without place},
    "cooling_loops": [{id, name, racks, time, stale, supply_c, return_c, delta_t_c, flow_lpm,
    pump_w, facility_w}], "pue", "facility_w", "it_w", "pue_devices", "pue_devices_reporting"}``.
    """
    now = now or timezone.now()
    params = health.sql_params(now)
    with connection.cursor() as cur:
        cur.execute(_RACKS_SQL, params)
        racks = [_rack(row) for row in cur.fetchall()]
        cur.execute(_DEVICES_SQL, params)
        devices = [dict(zip(_DEVICE_KEYS, row, strict=True)) for row in cur.fetchall()]
    names = {r["id"]: r["name"] for r in racks}
    total = _totals(racks, ())
    return {
        "generated_at": iso_utc(now),
        "racks": racks,
        "rows": _totals(racks, ("site", "hall", "row")),
        "halls": _totals(racks, ("site", "hall")),
        "total": total[0] if total else {"racks": 0, "racks_reporting": 0, "draw_w": None, "cap_w": None,
                                          "pct_of_cap": None},
        "cooling_loops": [_loop(d, names) for d in devices if d["kind"] == _LOOP],
        **_pue(devices, racks),
    }


# --- PUE over time ----------------------------------------------------------------------------

# Who counts for PUE over time: every cooling loop and every device whose last-value row holds
# facility power (reading the whole range just to find them would cost a scan of it), and per
# such device the PDUs whose watts are its IT power, weighted by the share of the PDU's racks it
# covers (all PDUs when it is linked to no rack).
_COVER_SQL = f"""
WITH fac AS (
    SELECT d.id FROM {_DEVICE} d LEFT JOIN {_POWER.latest_table} l ON l.device_id = d.id
    WHERE d.kind = '{_LOOP}' OR l.facility_watts IS NOT NULL
),
pdu_racks AS (
    SELECT f.powerdevice_id AS pdu, f.rack_id, count(*) OVER (PARTITION BY f.powerdevice_id) AS n
    FROM {_FEEDS} f JOIN {_DEVICE} d ON d.id = f.powerdevice_id AND d.kind = '{_PDU}'
)
SELECT fac.id, pr.pdu, sum(1.0 / pr.n)::float8
FROM fac LEFT JOIN {_FEEDS} fr ON fr.powerdevice_id = fac.id
JOIN pdu_racks pr ON fr.rack_id IS NULL OR pr.rack_id = fr.rack_id
GROUP BY fac.id, pr.pdu
"""

# 1. `c`: (device, member, weight, PDUs it needs) from `_COVER_SQL`, the device itself as a
#    member with a NULL weight. Passed as arrays, and joined LATERAL (OFFSET 0 keeps it from being
#    flattened), so the rollup is read by one (device, bucket) key range per member, whatever
#    the planner estimates.
# 2. `nb`: per rollup bucket and device, its facility watts, its IT watts (weighted PDU watts)
#    and how many of its PDUs reported. Grouping by bucket first keeps the groups few (devices ×
#    buckets, not PDUs × buckets).
# 3. `pue`: per point, facility over IT power summed over the complete (device, bucket) pairs in
#    it: an energy-weighted PUE. A pair missing a PDU is left out rather than read high.
# 4. One row per point of the grid, NULL where nothing was complete.
_PUE_SQL = """
WITH c AS (
    SELECT * FROM unnest(%(fac)s::int[], %(member)s::int[], %(weight)s::float8[], %(needs)s::int[])
        AS c(fac, member, weight, needs)
),
nb AS (
    SELECT r.bucket, c.fac, max(c.needs) AS needs,
        sum(r.facility_watts_avg) FILTER (WHERE c.weight IS NULL) AS fw,
        sum(c.weight * r.watts_avg) FILTER (WHERE c.weight IS NOT NULL) AS it,
        count(r.watts_avg) FILTER (WHERE c.weight IS NOT NULL) AS pdus
    FROM c CROSS JOIN LATERAL (
        SELECT bucket, facility_watts_avg, watts_avg FROM {table}
        WHERE device_id = c.member AND bucket >= %(first)s AND bucket < %(end)s OFFSET 0
    ) r
    GROUP BY r.bucket, c.fac
),
pue AS (
    SELECT time_bucket(%(width)s, bucket) AS t, sum(fw) / NULLIF(sum(it), 0) AS v
    FROM nb WHERE fw IS NOT NULL AND pdus = needs
    GROUP BY 1
)
SELECT g.t, pue.v
FROM generate_series(time_bucket(%(width)s, %(first)s::timestamptz), %(end)s::timestamptz, %(width)s) AS g(t)
LEFT JOIN pue ON pue.t = g.t
WHERE g.t < %(end)s
ORDER BY g.t
"""


def _cover(cur) -> dict[str, list]:
    """Array parameters of `_PUE_SQL`: each facility device and the PDUs it covers."""
    cur.execute(_COVER_SQL)
    cover: dict[int, list[tuple[int, float]]] = {}
    for fac, pdu, weight in cur.fetchall():
        cover.setdefault(fac, []).append((pdu, weight))
    rows = [(fac, fac, None, len(pdus)) for fac, pdus in cover.items()]
    rows += [(fac, pdu, weight, len(pdus)) for fac, pdus in cover.items() for pdu, weight in pdus]
    keys = ("fac", "member", "weight", "needs")
    return {k: [r[i] for r in rows] for i, k in enumerate(keys)}


def _check_range(start: datetime, end: datetime, max_points: int) -> None:
    if start.tzinfo is None or end.tzinfo is None:
        raise ValueError("start and end must be timezone-aware (UTC)")
    if start >= end:
        raise ValueError(f"empty range: start {start.isoformat()} is not before end {end.isoformat()}")
    if max_points < 2:
        raise ValueError(f"max_points must be at least 2, got {max_points}")


def pue_series(start: datetime, end: datetime, *, max_points: int = 2000) -> dict:
    """PUE over [start, end) from the power rollups, one point per step, None where no data.

    The 1-minute rollup up to `ONE_MINUTE_MAX_SPAN`, the 1-hour rollup beyond; buckets are
    widened at read time to the smallest multiple that keeps under `max_points`, and a widened
    point is facility over IT energy across its complete buckets. IT power here
    is PDU power only (the GPU fallback would read 16k GPU rows per point). Returns
    ``{"resolution", "step_s", "unit": "ratio", "x": [ISO time], "y": [float | None]}``.
    Raises ValueError for a naive or empty range.
    """
    _check_range(start, end, max_points)
    res = "1m" if end - start <= ONE_MINUTE_MAX_SPAN else "1h"
    native = INTERVALS[res]
    first = floor_bucket(start, native)
    width = native * max(1, math.ceil((end - first) / (native * (max_points - 1))))
    with cursor_without_jit() as cur:
        params = {**_cover(cur), "first": first, "end": end, "width": width}
        cur.execute(_PUE_SQL.format(table=_POWER.rollup_table(res)), params)
        rows = cur.fetchall()
    return {
        "resolution": res, "step_s": width.total_seconds(), "unit": "ratio",
        "x": [iso_utc(t) for t, _ in rows], "y": [None if v is None else float(v) for _, v in rows],
    }
