"""The one batch writer every source ends in (agent push, JSON/NDJSON, exposition push, scrape,
simulator).

For each frame (one entity kind, in columns), in ONE transaction:
  1. resolve entity ids (registering unseen GPUs and nodes, unplaced);
  2. binary COPY the rows, only the columns present, straight into the hypertable inside a
     savepoint — the common case costs exactly one COPY; the COPY payload is encoded once, a
     column at a time (copybin), and the same bytes fill the staging table below;
  3. if the frame overlaps rows already stored (a re-send, or two collectors reporting the same
     GPU at the same instant), the savepoint is rolled back, the rows are COPYed into a
     per-connection TEMP staging table instead and merged with ON CONFLICT, filling only the
     fields that were missing, so a re-sent batch is harmless;
  4. update the last-value table from the staged rows (UPDATE … FROM touches each entity's row
     in place, newest time winning, fields this frame did not carry keeping their last value),
     then insert rows for entities that had none yet — the rare case, detected by row count.
     Binding the columns as binary arrays to unnest() instead of staging them was measured on
     2026-12-02 at 16k GPUs and is slower: 10-12 ms for a 1,024-GPU UPDATE, against 9.2 ms for
     the staging COPY and UPDATE together, as unnest() materialises every column first;
then the narrow table for unmapped fields, one row in the ingest log, and one live publish
scheduled for after the commit. Nothing is acknowledged before the commit.
"""

from __future__ import annotations

import logging
import time
import uuid
import weakref
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache

import numpy as np
import psycopg
from django.db import connection, transaction

from telemetry import signals
from telemetry.actions import do_clear_gpu_resets, do_record_gpu_events
from telemetry.fields import KINDS
from telemetry.ingest import copybin
from telemetry.ingest.entities import Resolver, check_generation, resolve_events
from telemetry.ingest.faults import DERIVE_FIELDS, derive, open_event_gpus, suspects
from telemetry.ingest.schema import Batch, Frame, present
from telemetry.models import AgentStatus, IngestBatch

log = logging.getLogger(__name__)

COPY_TYPES = {"bigint": "int8", "real": "float4", "double precision": "float8"}
# Temp stages already created on each live psycopg connection (they vanish with it).
_STAGES_CREATED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Stages filled in the current transaction of each connection (see _stage).
_STAGES_USED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
NARROW_STAGE = "bw_stage_narrow"
DIRECT_SAVEPOINT = "bw_direct_copy"


@dataclass
class WriteResult:
    """What a batch wrote; returned to the client as the acknowledgement."""

    batch_id: str
    accepted: int
    rejected: int
    rejections: list[dict]
    rows: dict[str, int] = field(default_factory=dict)
    registered: dict[str, int] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    duration_ms: float = 0.0

    def as_json(self) -> dict:
        return {
            "batch_id": self.batch_id, "accepted": self.accepted, "rejected": self.rejected,
            "rejections": self.rejections, "rows": self.rows, "registered": self.registered, "events": self.events,
            "duration_ms": round(self.duration_ms, 1),
        }


@dataclass(frozen=True)
class _Sql:
    """SQL text for one kind and one set of present columns."""

    stage: str
    types: list[str]
    create_stage: str
    copy_direct: str
    copy: str
    merge: str
    latest_update: str
    latest_update_newest: str
    latest_insert: str


# The gap between an entity's previous and new sample is its source's collection interval (the
# right-hand side reads the row's old time); an out-of-order or repeated sample keeps the old one.
_INTERVAL_SET = (
    "interval_s = CASE WHEN {new}.time > l.time THEN extract(epoch FROM {new}.time - l.time) "
    "ELSE l.interval_s END"
)


def _latest_update(kind, names: tuple[str, ...], stage: str, source: str) -> str:
    ent = kind.entity_column
    sets = ", ".join(["time = s.time", _INTERVAL_SET.format(new="s"),
                      *(f"{n} = COALESCE(s.{n}, l.{n})" for n in names)])
    # The ANY(...) names the rows to touch up front. The staging table has no statistics, so
    # without it the planner hash-joins and reads the WHOLE last-value table for every batch:
    # at 16k GPUs, 9.5 ms instead of 2.7 ms for a 1,024-GPU batch, and worse for small ones.
    return (
        f"UPDATE {kind.latest_table} l SET {sets} FROM {source} s "
        f"WHERE l.{ent} = ANY(ARRAY(SELECT {ent} FROM {stage})) AND l.{ent} = s.{ent} AND l.time <= s.time"
    )


@lru_cache(maxsize=256)
def _sql(kind_name: str, names: tuple[str, ...]) -> _Sql:
    kind = KINDS[kind_name]
    spec = kind.by_name
    ent = kind.entity_column
    cols = ", ".join([ent, "time", *names])
    stage = f"bw_stage_{kind.name}"
    merge = ", ".join(f"{n} = COALESCE(EXCLUDED.{n}, t.{n})" for n in names) or "time = EXCLUDED.time"
    latest = ", ".join(["time = EXCLUDED.time", _INTERVAL_SET.format(new="EXCLUDED"),
                        *(f"{n} = COALESCE(EXCLUDED.{n}, l.{n})" for n in names)])
    return _Sql(
        stage=stage,
        types=["int4", "timestamptz"] + [COPY_TYPES[spec[n].sql_type] for n in names],
        create_stage=(
            f"CREATE TEMP TABLE IF NOT EXISTS {stage} (LIKE {kind.table} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
        ),
        copy_direct=f"COPY {kind.table} ({cols}) FROM STDIN (FORMAT BINARY)",
        copy=f"COPY {stage} ({cols}) FROM STDIN (FORMAT BINARY)",
        merge=(
            f"INSERT INTO {kind.table} AS t ({cols}) SELECT {cols} FROM {stage} "
            f"ON CONFLICT ({ent}, time) DO UPDATE SET {merge}"
        ),
        latest_update=_latest_update(kind, names, stage, stage),
        # A frame with several times per entity updates from its newest row per entity only.
        latest_update_newest=_latest_update(
            kind, names, stage, f"(SELECT DISTINCT ON ({ent}) * FROM {stage} ORDER BY {ent}, time DESC)"
        ),
        latest_insert=(
            f"INSERT INTO {kind.latest_table} AS l ({cols}) "
            f"SELECT DISTINCT ON ({ent}) {cols} FROM {stage} s "
            f"WHERE NOT EXISTS (SELECT 1 FROM {kind.latest_table} x WHERE x.{ent} = s.{ent}) "
            f"ORDER BY {ent}, time DESC "
            f"ON CONFLICT ({ent}) DO UPDATE SET {latest} WHERE l.time <= EXCLUDED.time"
        ),
    )


def _columns(frame: Frame, ids: list, names: tuple[str, ...]) -> list[list]:
    """The COPY columns (entity, time, *names); rows for the same entity and time are merged
    (later values win), since a COPY of both would break the primary key."""
    cols = [frame.values[n] for n in names]
    keys = list(zip(ids, frame.times, strict=True))
    if len(set(keys)) == len(keys):
        return [ids, frame.times, *cols]
    cols = [c.tolist() if isinstance(c, np.ndarray) else c for c in cols]  # masked -> None
    merged: dict[tuple, list] = {}
    for i, key in enumerate(keys):
        row = merged.setdefault(key, [None] * len(names))
        for j, col in enumerate(cols):
            if col[i] is not None:
                row[j] = col[i]
    return [list(c) for c in zip(*((eid, t, *vals) for (eid, t), vals in merged.items()), strict=True)]


def _copy(cur, sql_text: str, payload: bytes) -> None:
    with cur.copy(sql_text) as cp:
        cp.write(payload)


def _stage(cur, sql: _Sql, payload: bytes) -> None:
    created = _STAGES_CREATED.setdefault(cur.connection, set())
    used = _STAGES_USED.setdefault(cur.connection, set())
    if sql.stage not in created:  # once per physical connection, not per batch
        cur.execute(sql.create_stage)
        # Remembered only once committed: a rolled-back batch takes its CREATE with it.
        transaction.on_commit(lambda: created.add(sql.stage))
        cur.execute(f"DELETE FROM {sql.stage}")
    elif sql.stage in used:
        # ON COMMIT DELETE ROWS empties the stage at every commit, so only a transaction that
        # already filled it (tests, several frames of one kind in a batch) finds rows here.
        # DELETE rather than TRUNCATE, which would swap files.
        cur.execute(f"DELETE FROM {sql.stage}")
    _copy(cur, sql.copy, payload)
    # Marked used until a commit empties it; a rollback leaves the mark, which only costs one
    # needless DELETE (the rollback emptied the stage too). Skipping the DELETE on a stage that
    # is known empty saves a round trip per frame: 512 per tick at 16k GPUs.
    used.add(sql.stage)
    transaction.on_commit(lambda: used.discard(sql.stage))


def _write_frame(frame: Frame, ids: list, faults: list) -> int:
    spec = KINDS[frame.kind]
    names = tuple(f.name for f in spec.fields if f.name in frame.values)
    sql = _sql(frame.kind, names)
    columns = _columns(frame, ids, names)
    rows, entities = len(columns[0]), len(set(columns[0]))
    payload = copybin.encode(sql.types, columns)  # once, for both COPYs
    connection.ensure_connection()
    # A plain psycopg cursor on Django's connection (same transaction): Django's own cursors
    # bind parameters client-side and wrap every call, which adds up at 16k rows.
    with psycopg.Cursor(connection.connection) as cur:
        # The savepoint is plain SQL on this cursor and never released (the commit releases it): Django's
        # atomic() cost a second round trip (RELEASE) and ~0.2 ms of its own bookkeeping for every frame,
        # and a failed COPY on this bare cursor never reaches Django's error handling anyway.
        cur.execute(f"SAVEPOINT {DIRECT_SAVEPOINT}")
        try:
            _copy(cur, sql.copy_direct, payload)
        except psycopg.errors.UniqueViolation:
            cur.execute(f"ROLLBACK TO SAVEPOINT {DIRECT_SAVEPOINT}")
            _stage(cur, sql, payload)
            cur.execute(sql.merge)
        else:
            _stage(cur, sql, payload)
        if frame.kind == "gpu" and DERIVE_FIELDS & frame.values.keys():
            faults.append(derive(cur, sql.stage, suspects(frame.values, ids, open_event_gpus(cur))))
        cur.execute(sql.latest_update if entities == rows else sql.latest_update_newest)
        if cur.rowcount < entities:
            cur.execute(sql.latest_insert)
    return rows


def _narrow_rows(frame: Frame, ids: list) -> list[tuple]:
    out = []
    for name, col in frame.extra.items():
        out.extend(
            (frame.kind, eid, name, t, float(v))
            for eid, t, v in zip(ids, frame.times, col, strict=True) if v is not None
        )
    return out


def _write_narrow(entries: list[tuple]) -> int:
    """Unmapped fields: (entity_kind, entity_id, field, time, value)."""
    if not entries:
        return 0
    dedup = {e[:4]: e for e in entries}
    with connection.cursor() as cur:
        cur.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {NARROW_STAGE} (LIKE telemetry_narrow_sample) ON COMMIT DELETE ROWS"
        )
        cur.execute(f"TRUNCATE {NARROW_STAGE}")
        with cur.copy(
            f"COPY {NARROW_STAGE} (entity_kind, entity_id, field, time, value) FROM STDIN (FORMAT BINARY)"
        ) as cp:
            cp.set_types(["text", "int4", "text", "timestamptz", "float8"])
            for row in dedup.values():
                cp.write_row(row)
        cur.execute(
            f"INSERT INTO telemetry_narrow_sample SELECT * FROM {NARROW_STAGE} "
            "ON CONFLICT (entity_kind, entity_id, field, time) DO UPDATE SET value = EXCLUDED.value"
        )
    return len(dedup)


def _resolve(kind: str, frame: Frame, resolver: Resolver, batch: Batch) -> tuple[Frame, list]:
    if kind == "gpu":
        return frame, resolver.gpu_ids(frame)
    if kind == "mig":
        return frame, resolver.mig_ids(frame)
    if kind == "port":
        return resolver.port_ids(frame, batch)
    return resolver.power_ids(frame, batch)


def write_batch(batch: Batch, *, collector: str, fmt: str, body_bytes: int = 0) -> WriteResult:
    """Write a validated batch in one transaction and return the acknowledgement."""
    t0 = time.perf_counter()
    result = WriteResult(str(uuid.uuid4()), 0, 0, batch.rejections)
    # The COPYs run on a bare psycopg cursor, whose errors Django does not translate: a connection lost
    # mid-COPY (a database restart) must still reach callers as django.db.OperationalError, which the API
    # answers with 503, and mark the connection broken so it is replaced rather than reused.
    with connection.wrap_database_errors, transaction.atomic():
        check_generation()
        resolver = Resolver()
        narrow = []
        faults: list = []
        for kind, frames in batch.frames().items():
            for frame in frames:
                frame, ids = _resolve(kind, frame, resolver, batch)
                if frame.n:
                    result.rows[kind] = result.rows.get(kind, 0) + _write_frame(frame, ids, faults)
                    result.accepted += sum(map(present, frame.values.values()))
                    narrow.extend(_narrow_rows(frame, ids))
        result.rows["narrow"] = _write_narrow(narrow)
        result.events = _write_events(batch, resolver, faults)
        if batch.agent:
            AgentStatus.objects.update_or_create(
                hostname=batch.agent["host"][:253],
                defaults={"collector": collector[:128], "reported_at": datetime.now(UTC), "health": batch.agent},
            )
        result.accepted += len(narrow)
        result.rejected = batch.rejected
        result.registered = resolver.registered
        result.duration_ms = (time.perf_counter() - t0) * 1000
        _log_batch(result, collector, fmt, body_bytes)
        resolver.publish_on_commit()
        _schedule_publish(result.events.get("created", 0))
    return result


def _log_batch(result: WriteResult, collector: str, fmt: str, body_bytes: int) -> None:
    """One ingest-log row (IngestBatch), in the batch's transaction. Plain SQL on the writer's cursor: through
    the ORM this one row cost ~1 ms of the web process's Python, a tenth of a small batch's whole request."""
    with psycopg.Cursor(connection.connection) as cur:
        cur.execute(
            f"INSERT INTO {IngestBatch._meta.db_table} "
            "(time, batch_id, collector, format, samples, rejected, body_bytes, duration_ms) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            (datetime.now(UTC), result.batch_id, collector[:128], fmt, result.accepted, result.rejected,
             body_bytes, result.duration_ms),
        )


def _write_events(batch: Batch, resolver: Resolver, faults: list) -> dict[str, int]:
    """Explicit events plus those read off samples; resets clear first, then sightings merge."""
    sightings = [e for events, _ in faults for e in events]
    resets = [r for _, rs in faults for r in rs]
    sightings.extend(resolve_events(resolver, batch))
    # Both actions are atomic: called with nothing to do, each still costs a savepoint's two round trips.
    cleared = do_clear_gpu_resets(resets, reason="GPU reset: counters restarted") if resets else 0
    counts = do_record_gpu_events(sightings) if sightings else {"created": 0, "updated": 0}
    return {**counts, "cleared": cleared}


def _schedule_publish(new_faults: int) -> None:
    from telemetry import live  # late import: live pulls in the channel layer

    live.schedule_fleet_publish()
    # Alert rules are evaluated on ingest, not on a slow poll (alerts.apps connects the evaluation's debounced
    # scheduler to this signal); a commit that opened fault events asks for it at once.
    transaction.on_commit(lambda: signals.fleet_changed.send(sender=__name__, new_faults=new_faults))
