"""Rollups: raw samples into 1-minute buckets, 1-minute buckets into 1-hour buckets.

Every rollup is declared once in `ROLLUPS` (name, source table, target table, resolution) and its
SQL is generated from the field registry in `telemetry.fields`, so a new field rolls up the day
its migration lands. One idempotent function, `run_rollups()`, fills them all; the Celery beat
task `telemetry.tasks.run_rollups` calls it every 30 seconds. (The shape follows Zulip's
`analytics/lib/counts.py`: a registry, a watermark per rollup, and buckets that are safe to redo.)

What a bucket holds, per field kind (`telemetry.models.samples` names the columns):

- gauge: ``<f>_min``, ``<f>_avg``, ``<f>_max``, ``<f>_last``. The 1h average is the average of
  the 1m averages weighted by their ``samples``.
- counter: ``<f>_delta`` and ``<f>_last``. The delta sums each step between consecutive
  non-NULL readings; a drop is a reset, and the new reading counts from zero. The first reading
  of a bucket steps from the last reading before it (looked up within `COUNTER_LOOKBACK`, in the
  closed minutes' ``<f>_last``), so the 1m deltas of an hour add up to the counter's true increase
  over that hour.
- state: ``<f>_or`` (bit_or) and ``<f>_last``.

``last`` is the newest non-NULL value in the bucket (TimescaleDB's ``last()``, which the Apache
edition ships). NULL readings mean "not reported" and are skipped everywhere.

Late samples: a 1m bucket is final once it ended more than `LATE_SAMPLE_GRACE` ago; before that it
is computed once it has settled (`OPEN_SETTLE`), and the final pass counts samples up to that
late. A sample that arrives for a bucket the watermark has already passed is stored in the raw
table but NOT rolled up again: redoing closed buckets on every pass would cost a scan of
everything, and a collector that lags more than the grace is a collector problem that ingest logs
show. A 1h bucket is final once the
1m watermark has passed its end.
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from time import monotonic, perf_counter, sleep

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from telemetry.fields import COUNTER, GAUGE, KINDS, STATE, Field
from telemetry.models import RollupWatermark

logger = logging.getLogger(__name__)

INTERVALS: dict[str, timedelta] = {"1m": timedelta(minutes=1), "1h": timedelta(hours=1)}
# How late a raw sample may arrive and still be counted: buckets younger than this stay open.
LATE_SAMPLE_GRACE = timedelta(minutes=1)
# How far before a bucket to look for the previous counter reading. Collectors report every
# 10-60 s; a counter silent for longer than this starts a new baseline (its increase across the
# silence is not attributed to any bucket).
COUNTER_LOOKBACK = timedelta(minutes=5)
# Buckets per transaction: a long backlog commits progress every slice instead of holding one
# huge transaction (an hour of 1m buckets for 16k GPUs is ~6M raw rows).
SLICE_BUCKETS: dict[str, int] = {"1m": 60, "1h": 24}
# How often the open hour is recomputed for fresh reads. It is read only by charts spanning days,
# where a last point 5 minutes behind does not show; recomputing it on every 30 s pass cost a third
# of all rollup time at 16,384 GPUs (16k GPU + 65k port rows each pass). A new open hour is always
# computed at once, and a closing one is finalised by the watermark.
OPEN_REFRESH: dict[str, timedelta] = {"1h": timedelta(minutes=5)}
# The 1m rollup refreshes differently: once a minute, OPEN_SETTLE into it (a tick's samples have
# committed by then), it recomputes the minutes that ended and are not final yet, and never the
# minute in progress. Those are what is read before the watermark gets there: fabric rates read
# the minute that ended 45 s ago (selectors.fabric.RATE_SETTLE; with a pass every 30 s, one lands
# between 15 and 45 s after the minute ends), the heatmap's ECC hour and multi-hour charts can
# wait a minute. Recomputing on every pass did each minute about four times (half-full, nearly
# full, twice ended) before the final pass: at 16,384 GPUs the rollups then took 25-35 s of every
# minute, the largest single load on the database.
OPEN_SETTLE = timedelta(seconds=15)
# Stop catching up after this long so a beat tick never runs into the next; the rest of a
# backlog is picked up by the next pass.
RUN_BUDGET_SECONDS = 20.0
# How often a pass that must wait for another process's rollup lock looks again (see run_rollups).
LOCK_POLL_SECONDS = 0.05
# First half of the advisory-lock key, so rollup locks never collide with other users' locks.
LOCK_NAMESPACE = 0x42574B52  # "BWKR"

# The narrow tables roll up one float column, `value`, as a gauge.
NARROW_VALUE = Field("value", "double precision", GAUGE, "", "Narrow sample value")
NARROW_KEYS = ("entity_kind", "entity_id", "field")


@dataclass(frozen=True)
class Rollup:
    """One rollup: a source table aggregated into a target table at one resolution."""

    name: str
    resolution: str
    source: str
    target: str
    keys: tuple[str, ...]  # the entity columns; the target's primary key is keys + bucket
    fields: tuple[Field, ...]
    depends_on: str | None = None  # the rollup that fills `source`; None when source is raw

    @property
    def interval(self) -> timedelta:
        return INTERVALS[self.resolution]

    @property
    def time_column(self) -> str:
        return "bucket" if self.depends_on else "time"

    @property
    def has_counters(self) -> bool:
        return not self.depends_on and any(f.kind == COUNTER for f in self.fields)

    @property
    def lock_key(self) -> int:
        # crc32 is stable across processes (unlike hash()); folded into a signed int4.
        key = zlib.crc32(self.name.encode())
        return key - 2**32 if key >= 2**31 else key

    @cached_property
    def sql(self) -> str:
        return _rollup_sql(self) if self.depends_on else _raw_sql(self)


@dataclass(frozen=True)
class RollupRun:
    """What one pass did for one rollup."""

    name: str
    rows: int = 0
    ms: float = 0.0
    slices: int = 0
    done_until: datetime | None = None
    skipped: bool = False  # another process held the rollup's lock


def _registry() -> tuple[Rollup, ...]:
    out: list[Rollup] = []
    for res in INTERVALS:  # 1m first: each 1h rollup reads what the 1m pass just wrote
        for kind in KINDS.values():
            keys = (kind.entity_column,)
            out.append(_make(f"{kind.name}_{res}", res, kind.table, keys, kind.fields))
        narrow = "telemetry_narrow_sample"
        out.append(_make(f"narrow_{res}", res, narrow, NARROW_KEYS, (NARROW_VALUE,)))
    return tuple(out)


def _make(
    name: str, res: str, raw: str, keys: tuple[str, ...], fields: tuple[Field, ...]
) -> Rollup:
    """A 1m rollup reads the raw table; a 1h rollup reads the 1m table of the same prefix."""
    if res == "1m":
        return Rollup(name, res, raw, f"{raw}_1m", keys, fields)
    prefix = name.rsplit("_", 1)[0]
    return Rollup(name, res, f"{raw}_1m", f"{raw}_{res}", keys, fields, depends_on=f"{prefix}_1m")


ROLLUPS: tuple[Rollup, ...] = _registry()
BY_NAME: dict[str, Rollup] = {r.name: r for r in ROLLUPS}


# --- SQL generation ------------------------------------------------------------------------

def _from_raw(f: Field) -> list[tuple[str, str]]:
    """(target column, aggregate over raw rows) for one field."""
    n = f.name
    last = f"last({n}, time) FILTER (WHERE {n} IS NOT NULL)"
    if f.kind == GAUGE:
        return [(f"{n}_min", f"min({n})"), (f"{n}_avg", f"avg({n})"),
                (f"{n}_max", f"max({n})"), (f"{n}_last", last)]
    if f.kind == COUNTER:
        # A drop means the counter restarted from zero, so the new reading is the increase.
        # NULL on either side makes the step NULL, which sum() skips.
        step = f"CASE WHEN {n} >= {n}__prev THEN {n} - {n}__prev WHEN {n} < {n}__prev THEN {n} END"
        return [(f"{n}_delta", f"sum({step})::float8"), (f"{n}_last", last)]
    assert f.kind == STATE
    return [(f"{n}_or", f"bit_or({n})"), (f"{n}_last", last)]


def _from_rollup(f: Field) -> list[tuple[str, str]]:
    """(target column, aggregate over finer rollup rows) for one field."""
    n = f.name
    last = f"last({n}_last, bucket) FILTER (WHERE {n}_last IS NOT NULL)"
    if f.kind == GAUGE:
        weighted = (
            f"sum({n}_avg * samples) / NULLIF(sum(samples) FILTER (WHERE {n}_avg IS NOT NULL), 0)"
        )
        return [(f"{n}_min", f"min({n}_min)"), (f"{n}_avg", weighted),
                (f"{n}_max", f"max({n}_max)"), (f"{n}_last", last)]
    if f.kind == COUNTER:
        return [(f"{n}_delta", f"sum({n}_delta)"), (f"{n}_last", last)]
    assert f.kind == STATE
    return [(f"{n}_or", f"bit_or({n}_or)"), (f"{n}_last", last)]


def _insert(r: Rollup, source: str, aggs: list[tuple[str, str]], samples: str, bucket: str) -> str:
    keys = ", ".join(r.keys)
    targets = ", ".join(col for col, _ in aggs)
    exprs = ",\n       ".join(expr for _, expr in aggs)
    # Every column is overwritten on conflict, so redoing a bucket replaces it, never adds to it.
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in ["samples", *(col for col, _ in aggs)])
    return (
        f"INSERT INTO {r.target} ({keys}, bucket, samples, {targets})\n"
        f"SELECT {keys}, {bucket}, {samples},\n       {exprs}\n"
        f"FROM {source}\nWHERE {r.time_column} >= %(start)s AND {r.time_column} < %(end)s\n"
        f"GROUP BY {keys}, {bucket}\n"
        f"ON CONFLICT ({keys}, bucket) DO UPDATE SET {updates}"
    )


def _raw_sql(r: Rollup) -> str:
    aggs = [pair for f in r.fields for pair in _from_raw(f)]
    counters = [f.name for f in r.fields if f.kind == COUNTER]
    keys = ", ".join(r.keys)
    if not counters:
        src = (
            f"WITH src AS (\n    SELECT *, time_bucket(%(width)s, time) AS bucket__\n    FROM {r.source}\n"
            f"    WHERE time >= %(start)s AND time < %(end)s\n)\n"
        )
        return src + _insert(r, "src", aggs, "count(*)", "bucket__")
    # The previous non-NULL reading comes from a running last() (PostgreSQL's lag() cannot skip
    # NULLs). Ordering the window by (bucket, time), the same order as by time, hands the GROUP BY
    # its rows already sorted, which saves a second sort of the whole slice. last()'s final
    # function is read-only, so the window is computed incrementally.
    prev = "".join(
        f",\n           last({n}, time) FILTER (WHERE {n} IS NOT NULL) OVER w AS {n}__prev" for n in counters
    )
    cte = (
        f"{_seeded_rows(r, counters)},\n"
        f"src AS (\n    SELECT *, time_bucket(%(width)s, time) AS bucket__{prev}\n    FROM seeded\n"
        f"    WINDOW w AS (PARTITION BY {keys} ORDER BY time_bucket(%(width)s, time), time "
        f"ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)\n)\n"
    )
    # _insert's time filter keeps the slice's rows and drops the seed rows (timed at the lookback,
    # before the slice). It cannot move below the window: it is not on the window's partition keys.
    return cte + _insert(r, "src", aggs, "count(*)", "bucket__")


def _seeded_rows(r: Rollup, counters: list[str]) -> str:
    """CTEs `seed` and `seeded`: the slice's raw rows, and before them one seed row per entity.

    A counter's first reading in the slice steps from the last reading before the slice, within
    COUNTER_LOOKBACK. Those readings are already rolled up (the slice starts at the watermark), and
    each closed bucket keeps its newest reading as <f>_last: the seed reads at most 5 buckets per
    entity there instead of running the window over 5 minutes of raw rows, which at 65k fabric ports
    was five times the rows of the minute being rolled up.

    The seed enters as a row of its own, so the running last() in the window reaches it when the
    slice has no earlier reading, rather than through a join. A join depends on row estimates, and
    the newest minutes are always past the statistics of the last ANALYZE: the planner then expects
    one row on each side and picks a nested loop that aggregates the seed again for every raw row,
    quadratic in the entities. A union has no such plan.
    """
    keys = ", ".join(r.keys)
    seed = ",\n           ".join(
        f"last({n}_last, bucket) FILTER (WHERE {n}_last IS NOT NULL) AS {n}__seed" for n in counters
    )
    cols = ", ".join(f.name for f in r.fields)
    seeded = ", ".join(f"{f.name}__seed" if f.kind == COUNTER else f"NULL::{f.sql_type}" for f in r.fields)
    return (
        f"WITH seed AS (\n    SELECT {keys},\n           {seed}\n    FROM {r.target}\n"
        f"    WHERE bucket >= %(lookback)s AND bucket < %(start)s\n    GROUP BY {keys}\n),\n"
        f"seeded AS (\n    SELECT {keys}, time, {cols}\n    FROM {r.source}\n"
        f"    WHERE time >= %(start)s AND time < %(end)s\n"
        f"    UNION ALL\n    SELECT {keys}, CAST(%(lookback)s AS timestamptz), {seeded}\n    FROM seed\n)"
    )


def _rollup_sql(r: Rollup) -> str:
    aggs = [pair for f in r.fields for pair in _from_rollup(f)]
    return _insert(r, r.source, aggs, "sum(samples)::int", "time_bucket(%(width)s, bucket)")


# --- Running ---------------------------------------------------------------------------------

def floor_bucket(t: datetime, interval: timedelta) -> datetime:
    """Start of the bucket holding `t` (buckets are aligned to the Unix epoch, like time_bucket)."""
    step = int(interval.total_seconds())
    return datetime.fromtimestamp(int(t.timestamp()) // step * step, tz=UTC)


def _aware(now: datetime | None) -> datetime:
    if now is None:
        return timezone.now()
    if now.tzinfo is None:
        raise ValueError(f"now={now.isoformat()} is naive; pass a timezone-aware UTC datetime")
    return now


def run_rollups(now: datetime | None = None) -> list[RollupRun]:
    """Bring every rollup up to date; safe to call again or from two processes at once."""
    now = _aware(now)
    deadline = monotonic() + RUN_BUDGET_SECONDS
    runs: list[RollupRun] = []
    for r in ROLLUPS:
        source = next((run for run in runs if run.name == r.depends_on), None)
        # When this pass worked on a 1h rollup's 1m source (caught it up or refreshed it), another
        # process holding the 1h lock may have read the source before that, so skipping would leave
        # the hour just finished open until the next pass: wait for that process instead (two workers
        # running one pass did).
        runs.append(_run_one(r, now, deadline, wait=source is not None and source.slices > 0 and not source.skipped))
    for run in runs:
        if run.skipped:
            logger.info("rollup %s skipped: another process holds its lock", run.name)
        else:
            logger.info("rollup %s: %d rows in %.1f ms over %d slices, final until %s",
                        run.name, run.rows, run.ms, run.slices, run.done_until)
    return runs


def _run_one(r: Rollup, now: datetime, deadline: float, wait: bool = False) -> RollupRun:
    """Catch one rollup up to its final edge, then redo its open buckets.

    1. Each slice runs in its own transaction, which first takes the rollup's advisory lock
       (transaction-scoped, so a crash can never leave it held). If another process holds it,
       this pass skips the rollup: that process is doing the same work.
    2. Under the lock, re-read the watermark (another process may have moved it since the last
       slice), create it on the first run, and compute the final edge: the start of the bucket
       holding ``now - LATE_SAMPLE_GRACE``, and for a 1h rollup no later than its 1m source's
       watermark.
    3. Roll up at most `SLICE_BUCKETS` buckets from the watermark and advance the watermark in
       the same transaction, so rows and watermark commit together or not at all.
    4. Once caught up, recompute the open buckets so recent reads are fresh, without moving the
       watermark: those buckets may still grow. A 1h rollup recomputes up to the hour holding
       `now`, at most every `OPEN_REFRESH` within one open hour; a 1m rollup the minutes that
       ended, once a minute (`OPEN_SETTLE`).
    5. If the run budget is spent first, stop; the next pass continues from the watermark.

    With `wait`, a lock held by another process is waited for (until the deadline) before step 1.
    """
    if wait:
        _wait_for_lock(r, deadline)
    rows = slices = 0
    ms = 0.0
    while True:
        with transaction.atomic():
            if not _try_lock(r):
                return RollupRun(r.name, rows, ms, slices, skipped=True)
            mark = _watermark(r, now)
            edge = _final_edge(r, now, mark)
            caught_up = mark.done_until >= edge
            if not caught_up:
                end = min(edge, mark.done_until + r.interval * SLICE_BUCKETS[r.resolution])
                if _unchanged_since_refresh(r, mark, end):
                    end = mark.done_until + r.interval  # that bucket as the refresh left it: final as it is
                    mark.done_until, mark.last_rows, mark.last_ms = end, 0, 0.0
                    mark.save(update_fields=["done_until", "last_rows", "last_ms", "updated"])
                    slices += 1
                    continue
            else:
                end = _open_end(r, mark, now)
                if end is None:
                    return RollupRun(r.name, rows, ms, slices, done_until=mark.done_until)
                mark.open_refreshed_at = now
                if r.resolution == "1m":
                    mark.refreshed_until, mark.refresh_xmin = end, _snapshot_xmin()
            n, took = _execute(r, mark.done_until, end)
            rows, ms, slices = rows + n, ms + took, slices + 1
            if not caught_up:
                mark.done_until = end
            mark.last_rows, mark.last_ms = rows, ms
            mark.save(update_fields=["done_until", "last_rows", "last_ms", "open_refreshed_at", "refreshed_until",
                                     "refresh_xmin", "updated"])
        if caught_up or monotonic() > deadline:
            return RollupRun(r.name, rows, ms, slices, done_until=mark.done_until)


def _snapshot_xmin() -> int:
    """The oldest transaction that this transaction's next statement might not see (64-bit, never wraps)."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::int8")
        return cur.fetchone()[0]


def _unchanged_since_refresh(r: Rollup, mark: RollupWatermark, end: datetime) -> bool:
    """Whether the next final bucket of a 1m rollup is exactly what its settled refresh computed.

    The refresh (OPEN_SETTLE after the minute) computes every ended minute that is not final; the final pass a
    minute later used to compute it again, in case samples arrived late. At 16,384 GPUs that second pass was
    4-11 s of the database per minute for the 65k fabric ports alone. Now it first looks for raw rows of that
    minute written (inserted, or merged by a re-send) by a transaction the refresh might not have seen: the
    refresh's snapshot xmin or later. If there are none, the stored bucket is what a recompute would produce:
    its counter seed, the previous minute's `_last`, was final before the refresh ran (the catch-up runs before
    the refresh in the same pass). The check reads the minute's rows once, without sorting or aggregating.
    """
    start = mark.done_until
    if (r.resolution != "1m" or mark.refresh_xmin is None or mark.refreshed_until is None
            or end - start < r.interval or mark.refreshed_until < start + r.interval):
        return False
    xid = mark.refresh_xmin % (1 << 32)  # rows carry 32-bit xids; age() compares them modulo wraparound
    with connection.cursor() as cur:
        cur.execute(f"SELECT EXISTS (SELECT 1 FROM {r.source} WHERE {r.time_column} >= %s AND {r.time_column} < %s "
                    f"AND age(xmin) <= age(%s::text::xid))", [start, start + r.interval, str(xid)])
        return not cur.fetchone()[0]


def _open_end(r: Rollup, mark: RollupWatermark, now: datetime) -> datetime | None:
    """The end of the open buckets this pass recomputes (from the watermark), or None for none."""
    current = floor_bucket(now, r.interval)
    if r.resolution in OPEN_REFRESH:  # the open hour, bucket in progress included
        return None if _open_is_fresh(r, mark, now) else current + r.interval
    settled = current + OPEN_SETTLE
    last = mark.open_refreshed_at
    if current <= mark.done_until or now < settled or (last is not None and settled <= last <= now):
        return None
    return current


def _open_is_fresh(r: Rollup, mark: RollupWatermark, now: datetime) -> bool:
    """Whether the open buckets were recomputed recently enough (`OPEN_REFRESH`) to skip this pass."""
    last = mark.open_refreshed_at
    if last is None:
        return False
    same_bucket = floor_bucket(last, r.interval) == floor_bucket(now, r.interval)
    return same_bucket and timedelta(0) <= now - last < OPEN_REFRESH[r.resolution]


def _wait_for_lock(r: Rollup, deadline: float) -> None:
    """Return once nobody holds the rollup's lock (taken and released at once), or at the deadline."""
    while monotonic() < deadline:
        with transaction.atomic():
            if _try_lock(r):
                return
        sleep(LOCK_POLL_SECONDS)


def _try_lock(r: Rollup) -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [LOCK_NAMESPACE, r.lock_key])
        return cur.fetchone()[0]


def _watermark(r: Rollup, now: datetime) -> RollupWatermark:
    """The rollup's watermark, created at its source's earliest bucket (or now) on first use."""
    mark = RollupWatermark.objects.select_for_update().filter(name=r.name).first()
    if mark is not None:
        return mark
    with connection.cursor() as cur:
        cur.execute(f"SELECT min({r.time_column}) FROM {r.source}")
        earliest = cur.fetchone()[0] or now
    start = floor_bucket(earliest, r.interval)
    return RollupWatermark.objects.create(name=r.name, done_until=start)


def _final_edge(r: Rollup, now: datetime, mark: RollupWatermark) -> datetime:
    """Every bucket before this is complete and may be closed."""
    edge = floor_bucket(now - LATE_SAMPLE_GRACE, r.interval)
    if r.depends_on:
        source = RollupWatermark.objects.filter(name=r.depends_on).first()
        source_done = source.done_until if source else mark.done_until
        edge = min(edge, floor_bucket(source_done, r.interval))
    return edge


def sql_params(r: Rollup, start: datetime, end: datetime) -> dict:
    """The parameters of `r.sql` for the buckets in [start, end)."""
    lookback = start - COUNTER_LOOKBACK if r.has_counters else start
    return {"start": start, "end": end, "width": r.interval, "lookback": lookback}


def _execute(r: Rollup, start: datetime, end: datetime) -> tuple[int, float]:
    """Roll up the buckets in [start, end); returns (rows written, milliseconds)."""
    t0 = perf_counter()
    with connection.cursor() as cur:
        # The generated statements carry ~200 aggregates; JIT-compiling them costs seconds per
        # pass (more than it saves), and each pass is a fresh query.
        cur.execute("SET LOCAL jit = off")
        cur.execute(r.sql, sql_params(r, start, end))
        rows = max(cur.rowcount, 0)
    return rows, (perf_counter() - t0) * 1000


# --- Retention -------------------------------------------------------------------------------

def _retention_tables() -> tuple[tuple[str, str], ...]:
    """(hypertable, RETENTION key) for every table whose old chunks are dropped."""
    raw = [k.table for k in KINDS.values()] + ["telemetry_narrow_sample"]
    # Per-rank training steps (one row per rank per step report: ~13M a day at 2k GPUs) keep the
    # raw samples' retention; nothing rolls them up.
    out = [(t, "raw") for t in [*raw, "telemetry_ingest_batch", "telemetry_training_step"]]
    out += [(f"{t}_{res}", res) for res in INTERVALS for t in raw]
    return tuple(out)


RETENTION_TABLES = _retention_tables()


def apply_retention(now: datetime | None = None) -> dict[str, int]:
    """Drop every chunk older than its resolution's retention; returns chunks dropped per table.

    drop_chunks removes whole chunks, so rows survive up to one chunk interval past their
    retention. Each table is its own transaction: one failure does not undo the others.
    """
    now = _aware(now)
    dropped: dict[str, int] = {}
    for table, res in RETENTION_TABLES:
        cutoff = _retention_cutoff(table, now - settings.RETENTION[res])
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SELECT drop_chunks(%s::regclass, older_than => %s)", [table, cutoff])
            dropped[table] = len(cur.fetchall())
        if dropped[table]:
            logger.info("retention %s: dropped %d chunks older than %s",
                        table, dropped[table], cutoff)
    return dropped


def _retention_cutoff(table: str, cutoff: datetime) -> datetime:
    """Hold back the cutoff so no chunk is dropped before its rollups have read it.

    A rollup stuck for longer than the raw retention would otherwise lose data for good; keeping
    the chunks a little longer costs disk, which is the cheaper failure.
    """
    for r in ROLLUPS:
        if r.source != table:
            continue
        mark = RollupWatermark.objects.filter(name=r.name).first()
        if mark is None:
            continue
        needed = mark.done_until  # counters seed from the rollup table, not from raw rows before this
        if needed < cutoff:
            logger.warning("retention %s held back to %s: rollup %s has not read past it",
                           table, needed, r.name)
            cutoff = needed
    return cutoff
