"""Read one field of one entity as a plot-ready series, choosing raw / 1m / 1h by the range.

`series()` is the one read path for charts: it picks the table by the requested span (raw up to
`RAW_MAX_SPAN`, the 1m rollup up to `ONE_MINUTE_MAX_SPAN`, the 1h rollup beyond), keeps the
result under `max_points`, turns counters into per-second rates (resets handled), gives gauges a
min/max band at rollup resolutions, and inserts a None point wherever the data has a gap, so a
plot breaks its line instead of drawing across missing data.

Keeping under `max_points`: raw falls up to the 1m rollup when the range holds too many
samples; a rollup widens its buckets at read time to the smallest multiple of its width that
fits (2 days of 1m buckets are read as 2-minute points), which keeps more detail than jumping to
the next table would.

Safety: the kind and field are checked against the registry in `telemetry.fields` before either
is put into SQL; a narrow field's name only ever travels as a bound parameter.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection

from telemetry.fields import COUNTER, GAUGE, KINDS, STATE
from telemetry.models.samples import EntityKind
from telemetry.rollups import COUNTER_LOOKBACK, INTERVALS, floor_bucket

RAW_MAX_SPAN = timedelta(hours=6)
ONE_MINUTE_MAX_SPAN = timedelta(days=7)
RESOLUTIONS = ("raw", "1m", "1h")
# Points further apart than this many expected steps have a gap between them.
GAP_FACTOR = 2.5
# States whose every bit means "something happened": a bucket shows any bit raised during it.
# Other states (codes, enumerations) show their value at the bucket's end.
BITWISE_UNITS = frozenset({"bitmask", "flag"})
NARROW_TABLE = "telemetry_narrow_sample"

Point = tuple[datetime, float | None]


@dataclass(frozen=True)
class Series:
    """A plot-ready series: (time, value) points, None where the data has a gap.

    `kind` is the field's kind (gauge / counter / state); counters come back as per-second
    rates, so `unit` is then the field's unit per second. `band` runs parallel to `points` with
    the (min, max) of each point, for gauges at rollup resolutions only. `step` is the spacing
    of the points: the bucket width read, or for raw the median spacing of the samples.
    """

    resolution: str
    unit: str
    kind: str
    field: str
    step: timedelta | None
    points: list[Point]
    band: list[tuple[float | None, float | None]] | None = None


@dataclass(frozen=True)
class _Source:
    """Where one field of one entity lives, already checked against the registry."""

    kind: str  # field kind
    unit: str
    column: str  # raw column; rollup columns are column + "_min" etc.
    table: str  # raw table; rollup tables are table + "_1m" / "_1h"
    where: str  # entity filter, with bound parameters only
    params: dict


def series(
    kind: str,
    entity_id: int,
    field: str,
    start: datetime,
    end: datetime,
    *,
    resolution: str | None = None,
    max_points: int = 2000,
) -> Series:
    """Field `field` of entity `kind`/`entity_id` over [start, end), ready to plot.

    Raises ValueError for an unknown kind or field, a naive or empty range, an unknown
    resolution, or a forced raw read that would return more than `max_points` samples.
    """
    _check_range(start, end, resolution, max_points)
    src = _resolve(kind, entity_id, field)
    res = resolution or _by_span(end - start)
    if res == "raw":
        out = _read_raw(src, field, start, end, max_points)
        if out is not None:
            return out
        if resolution == "raw":
            raise ValueError(
                f"{kind} {entity_id} {field} has more than {max_points} raw samples in this range;"
                " ask for a shorter range or a rollup resolution"
            )
        res = "1m"
    return _read_rollup(src, field, res, start, end, max_points)


def _check_range(start: datetime, end: datetime, resolution: str | None, max_points: int) -> None:
    if start.tzinfo is None or end.tzinfo is None:
        raise ValueError("start and end must be timezone-aware (UTC)")
    if start >= end:
        raise ValueError(
            f"empty range: start {start.isoformat()} is not before end {end.isoformat()}"
        )
    if resolution is not None and resolution not in RESOLUTIONS:
        raise ValueError(f"unknown resolution {resolution!r}; expected one of {RESOLUTIONS}")
    if max_points < 2:
        raise ValueError(f"max_points must be at least 2, got {max_points}")


def _by_span(span: timedelta) -> str:
    if span <= RAW_MAX_SPAN:
        return "raw"
    return "1m" if span <= ONE_MINUTE_MAX_SPAN else "1h"


def _resolve(kind: str, entity_id: int, field: str) -> _Source:
    """The registry entry for (kind, field), or the narrow table if it holds that field."""
    spec = KINDS.get(kind)
    if spec is not None and field in spec.by_name:
        f = spec.by_name[field]
        where = f"{spec.entity_column} = %(entity)s"
        return _Source(f.kind, f.unit, f.name, spec.table, where, {"entity": int(entity_id)})
    if kind not in EntityKind.values:
        raise ValueError(f"unknown kind {kind!r}; expected one of {sorted(EntityKind.values)}")
    where = "entity_kind = %(ekind)s AND entity_id = %(entity)s AND field = %(field)s"
    params = {"ekind": kind, "entity": int(entity_id), "field": field}
    if not _narrow_exists(where, params):
        raise ValueError(
            f"unknown field {field!r} for {kind} {entity_id}: not in the {kind} registry"
            " and never reported as a narrow sample"
        )
    return _Source(GAUGE, "", "value", NARROW_TABLE, where, params)


def _narrow_exists(where: str, params: dict) -> bool:
    # Raw narrow samples expire first, so an old field may survive only in a rollup.
    tables = [NARROW_TABLE, *(f"{NARROW_TABLE}_{res}" for res in INTERVALS)]
    probes = " OR ".join(f"EXISTS (SELECT 1 FROM {t} WHERE {where})" for t in tables)
    with connection.cursor() as cur:
        cur.execute(f"SELECT {probes}", params)
        return cur.fetchone()[0]


# --- Raw ---------------------------------------------------------------------------------------

def _read_raw(
    src: _Source, field: str, start: datetime, end: datetime, max_points: int
) -> Series | None:
    """The raw series, or None when the range holds more than `max_points` samples."""
    col = src.column
    params = {**src.params, "start": start, "end": end, "limit": max_points + 1}
    sql = (
        f"SELECT time, {col} FROM {src.table} WHERE {src.where} AND {col} IS NOT NULL"
        " AND time >= %(start)s AND time < %(end)s ORDER BY time LIMIT %(limit)s"
    )
    with connection.cursor() as cur:
        cur.execute(sql, params)
        rows = [(t, float(v)) for t, v in cur.fetchall()]
        if len(rows) > max_points:
            return None
        if src.kind == COUNTER:
            rows = _rates(_previous(cur, src, start) + rows)
    step = _median_step(rows)
    points = _with_gaps(rows, step)
    if len(points) > max_points:  # gap markers count against the limit too
        return None
    unit = f"{src.unit}/s" if src.kind == COUNTER else src.unit
    return Series("raw", unit, src.kind, field, step, points)


def _previous(cur, src: _Source, start: datetime) -> list[Point]:
    """The last reading before `start`, so the first rate in the range has a predecessor."""
    col = src.column
    cur.execute(
        f"SELECT time, {col} FROM {src.table} WHERE {src.where} AND {col} IS NOT NULL"
        " AND time >= %(since)s AND time < %(start)s ORDER BY time DESC LIMIT 1",
        {**src.params, "since": start - COUNTER_LOOKBACK, "start": start},
    )
    return [(t, float(v)) for t, v in cur.fetchall()]


def _rates(readings: list[Point]) -> list[Point]:
    """Per-second rate between consecutive readings; a drop is a reset, counted from zero."""
    out = []
    for (t0, v0), (t1, v1) in zip(readings, readings[1:], strict=False):
        increase = v1 - v0 if v1 >= v0 else v1
        out.append((t1, increase / (t1 - t0).total_seconds()))
    return out


def _median_step(rows: list[Point]) -> timedelta | None:
    # The median ignores the gaps themselves, so a few outages do not stretch the step.
    if len(rows) < 2:
        return None
    return statistics.median(b[0] - a[0] for a, b in zip(rows, rows[1:], strict=False))


# --- Rollups -----------------------------------------------------------------------------------

def _read_rollup(
    src: _Source, field: str, res: str, start: datetime, end: datetime, max_points: int
) -> Series:
    native = INTERVALS[res]
    first = floor_bucket(start, native)
    # +1: the bucket holding `start` is partial, so the range can touch one more bucket.
    width = native * max(1, math.ceil((end - first) / (native * (max_points - 1))))
    value, low, high = _rollup_exprs(src)
    sql = (
        f"SELECT time_bucket(%(width)s, bucket) AS t, {value}, {low}, {high}"
        f" FROM {src.table}_{res} WHERE {src.where} AND bucket >= %(first)s AND bucket < %(end)s"
        " GROUP BY t ORDER BY t"
    )
    with connection.cursor() as cur:
        params = {"width": width, "seconds": width.total_seconds(), "first": first, "end": end}
        cur.execute(sql, {**src.params, **params})
        rows = cur.fetchall()
    # Gap markers need no room of their own: each stands for at least two empty buckets.
    points = _with_gaps([(t, _float(v)) for t, v, _, _ in rows], width)
    band = None
    if src.kind == GAUGE:
        by_time = {t: (_float(lo), _float(hi)) for t, _, lo, hi in rows}
        band = [by_time.get(t, (None, None)) for t, _ in points]
    unit = f"{src.unit}/s" if src.kind == COUNTER else src.unit
    return Series(res, unit, src.kind, field, width, points, band)


def _rollup_exprs(src: _Source) -> tuple[str, str, str]:
    """SQL for (value, band low, band high) over rollup rows grouped into `width` buckets."""
    c = src.column
    if src.kind == GAUGE:
        avg = f"sum({c}_avg * samples) / NULLIF(sum(samples) FILTER (WHERE {c}_avg IS NOT NULL), 0)"
        return avg, f"min({c}_min)", f"max({c}_max)"
    if src.kind == COUNTER:
        # A bucket's delta over its width; a partly missing bucket reads low rather than high.
        return f"sum({c}_delta) / %(seconds)s", "NULL", "NULL"
    assert src.kind == STATE
    if src.unit in BITWISE_UNITS:
        return f"bit_or({c}_or)", "NULL", "NULL"
    return f"last({c}_last, bucket) FILTER (WHERE {c}_last IS NOT NULL)", "NULL", "NULL"


def _float(v) -> float | None:
    return None if v is None else float(v)


def _with_gaps(points: list[Point], step: timedelta | None) -> list[Point]:
    """Insert (time, None) after any point followed by a gap wider than GAP_FACTOR steps."""
    if step is None or not points:
        return points
    out = [points[0]]
    for prev, cur in zip(points, points[1:], strict=False):
        if cur[0] - prev[0] > step * GAP_FACTOR:
            out.append((prev[0] + step, None))
        out.append(cur)
    return out
