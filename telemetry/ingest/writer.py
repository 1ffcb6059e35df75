"""The one batch writer every source ends in (agent push, JSON/NDJSON, exposition push, scrape,
simulator).

For each entity kind in a batch, in ONE transaction:
  1. resolve entity ids (registering unseen GPUs and nodes, unplaced);
  2. binary COPY the rows once into a per-connection TEMP staging table (no WAL, no indexes);
  3. INSERT the staged rows into the hypertable — plain INSERT first; if the batch overlaps rows
     already stored (a re-send, or two collectors reporting the same GPU at the same instant),
     the savepoint is rolled back and the rows are merged with ON CONFLICT, filling only the
     fields that were missing, so a re-sent batch is harmless;
  4. upsert the last-value table from the same staging rows, newest time per entity winning;
then the narrow table for unmapped fields, one row in the ingest log, and one live publish
scheduled for after the commit. Nothing is acknowledged before the commit.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

import psycopg
from django.db import IntegrityError, connection, transaction

from telemetry.fields import KINDS, SampleKind
from telemetry.ingest.entities import Resolver
from telemetry.ingest.schema import Batch, Record
from telemetry.models import IngestBatch

log = logging.getLogger(__name__)

COPY_TYPES = {"bigint": "int8", "real": "float4", "double precision": "float8"}


@dataclass
class WriteResult:
    """What a batch wrote; returned to the client as the acknowledgement."""

    batch_id: str
    accepted: int
    rejected: int
    rejections: list[dict]
    rows: dict[str, int] = field(default_factory=dict)
    registered: dict[str, int] = field(default_factory=dict)
    duration_ms: float = 0.0

    def as_json(self) -> dict:
        return {
            "batch_id": self.batch_id, "accepted": self.accepted, "rejected": self.rejected,
            "rejections": self.rejections, "rows": self.rows, "registered": self.registered,
            "duration_ms": round(self.duration_ms, 1),
        }


class _Sql:
    """SQL text for one kind, built once from the field registry."""

    def __init__(self, kind: SampleKind):
        names = [f.name for f in kind.fields]
        ent = kind.entity_column
        cols = ", ".join([ent, "time", *names])
        self.stage = f"bw_stage_{kind.name}"
        self.types = ["int4", "timestamptz"] + [COPY_TYPES[f.sql_type] for f in kind.fields]
        self.create_stage = (
            f"CREATE TEMP TABLE IF NOT EXISTS {self.stage} (LIKE {kind.table} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
        )
        self.copy = f"COPY {self.stage} ({cols}) FROM STDIN (FORMAT BINARY)"
        self.insert = f"INSERT INTO {kind.table} ({cols}) SELECT {cols} FROM {self.stage}"
        merge = ", ".join(f"{n} = COALESCE(EXCLUDED.{n}, t.{n})" for n in names)
        self.merge = (
            f"INSERT INTO {kind.table} AS t ({cols}) SELECT {cols} FROM {self.stage} "
            f"ON CONFLICT ({ent}, time) DO UPDATE SET {merge}"
        )
        latest_merge = ", ".join(f"{n} = COALESCE(EXCLUDED.{n}, l.{n})" for n in names)
        self.latest = (
            f"INSERT INTO {kind.latest_table} AS l ({cols}) "
            f"SELECT DISTINCT ON ({ent}) {cols} FROM {self.stage} ORDER BY {ent}, time DESC "
            f"ON CONFLICT ({ent}) DO UPDATE SET time = EXCLUDED.time, {latest_merge} "
            f"WHERE l.time <= EXCLUDED.time"
        )
        self.names = names


SQL = {name: _Sql(kind) for name, kind in KINDS.items()}
NARROW_STAGE = "bw_stage_narrow"


def _rows(records: list[Record], ids: list, names: list[str]) -> list[tuple]:
    """Wide rows, merging records for the same entity and time (later values win)."""
    merged: dict[tuple, dict] = {}
    for r, entity_id in zip(records, ids, strict=True):
        key = (entity_id, r.time)
        if key in merged:
            merged[key].update(r.values)
        else:
            merged[key] = dict(r.values)
    return [(eid, t, *map(vals.get, names)) for (eid, t), vals in merged.items()]


def _copy_rows(cur, sql: _Sql, rows: list[tuple]) -> None:
    cur.execute(sql.create_stage)
    # The stage is emptied at commit; inside one long transaction (tests, retries) it is
    # emptied here too, so a stage never leaks rows into the next batch.
    cur.execute(f"TRUNCATE {sql.stage}")
    with cur.copy(sql.copy) as cp:
        cp.set_types(sql.types)
        for row in rows:
            cp.write_row(row)


def _insert_staged(cur, sql: _Sql) -> None:
    try:
        with transaction.atomic():
            cur.execute(sql.insert)
    except (IntegrityError, psycopg.errors.UniqueViolation):
        cur.execute(sql.merge)
    cur.execute(sql.latest)


def _write_kind(kind: str, records: list[Record], ids: list) -> int:
    sql = SQL[kind]
    rows = _rows(records, ids, sql.names)
    with connection.cursor() as cur:
        _copy_rows(cur, sql, rows)
        _insert_staged(cur, sql)
    return len(rows)


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
            "INSERT INTO telemetry_narrow_sample SELECT * FROM bw_stage_narrow "
            "ON CONFLICT (entity_kind, entity_id, field, time) DO UPDATE SET value = EXCLUDED.value"
        )
    return len(dedup)


def _resolve(batch: Batch, resolver: Resolver) -> dict[str, tuple[list[Record], list]]:
    out = {}
    recs = batch.records
    if recs["gpu"]:
        resolver.gpus(recs["gpu"])
        out["gpu"] = (recs["gpu"], [resolver.get("gpu", r.ident["uuid"]) for r in recs["gpu"]])
    if recs["mig"]:
        resolver.migs(recs["mig"])
        out["mig"] = (recs["mig"], [resolver.get("mig", resolver.mig_key(r)) for r in recs["mig"]])
    if recs["port"]:
        kept = resolver.ports(recs["port"], batch)
        out["port"] = (kept, [resolver.get("port", resolver.port_owner(r) + (r.ident["port"],)) for r in kept])
    if recs["power"]:
        kept = resolver.power(recs["power"], batch)
        out["power"] = (kept, [resolver.get("power", r.ident["device"]) for r in kept])
    return out


def write_batch(batch: Batch, *, collector: str, fmt: str, body_bytes: int = 0) -> WriteResult:
    """Write a validated batch in one transaction and return the acknowledgement."""
    t0 = time.perf_counter()
    result = WriteResult(str(uuid.uuid4()), 0, batch.rejected, batch.rejections)
    with transaction.atomic():
        resolver = Resolver()
        resolved = _resolve(batch, resolver)
        narrow = []
        for kind, (records, ids) in resolved.items():
            if records:
                result.rows[kind] = _write_kind(kind, records, ids)
            result.accepted += sum(len(r.values) for r in records)
            narrow.extend((kind, eid, k, r.time, float(v)) for r, eid in zip(records, ids, strict=True) for k, v in r.extra.items())
        result.rows["narrow"] = _write_narrow(narrow)
        result.accepted += len(narrow)
        result.rejected = batch.rejected
        result.registered = resolver.registered
        result.duration_ms = (time.perf_counter() - t0) * 1000
        IngestBatch.objects.create(
            time=datetime.now(UTC), batch_id=result.batch_id, collector=collector[:128], format=fmt,
            samples=result.accepted, rejected=result.rejected, body_bytes=body_bytes,
            duration_ms=result.duration_ms,
        )
        resolver.publish_on_commit()
        _schedule_publish()
    return result


def _schedule_publish() -> None:
    from telemetry import live  # late import: live pulls in the channel layer

    live.schedule_fleet_publish()
