"""Helpers that write raw samples and read rollup rows with plain SQL, for tests.

Production writes go through binary COPY in the ingest writer; tests only need a few rows, so a
plain INSERT keeps them readable. Column names are checked against the field registry before
they are put into SQL.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import connection

from telemetry.fields import KINDS
from telemetry.models import SAMPLE_MODELS


def _columns(kind: str, names: Iterable[str]) -> list[str]:
    known = KINDS[kind].by_name
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"{kind} has no fields {unknown}")
    return list(names)


def insert_samples(kind: str, rows: Iterable[tuple[int, datetime, dict]]) -> int:
    """Insert (entity_id, time, {field: value}) rows into a raw wide table; returns the count."""
    spec = KINDS[kind]
    return _insert_many(spec.table, spec.entity_column, rows, lambda names: _columns(kind, names))


def insert_rollup(kind: str, resolution: str, rows: Iterable[tuple[int, datetime, dict]]) -> int:
    """Insert (entity_id, bucket, {column: value}) rows straight into a rollup table.

    For read-side tests that need months of buckets without running the rollups over them;
    `samples` defaults to 1.
    """
    spec = KINDS[kind]
    allowed = {c.column for c in SAMPLE_MODELS[kind][resolution]._meta.local_fields}
    rows = [(e, b, {"samples": 1, **values}) for e, b, values in rows]

    def check(names):
        unknown = [n for n in names if n not in allowed]
        if unknown:
            raise ValueError(f"{spec.rollup_table(resolution)} has no columns {unknown}")
        return list(names)

    return _insert_many(spec.rollup_table(resolution), spec.entity_column, rows, check, "bucket")


def _insert_many(table, entity_column, rows, check, time_column="time") -> int:
    # Group rows by their column set so each group is one executemany (pipelined by psycopg).
    groups: dict[tuple[str, ...], list[list]] = {}
    for entity_id, time, values in rows:
        groups.setdefault(tuple(values), []).append([entity_id, time, *values.values()])
    with connection.cursor() as cur:
        for names, params in groups.items():
            cols = ", ".join([entity_column, time_column, *check(names)])
            marks = ", ".join(["%s"] * (len(names) + 2))
            cur.executemany(f"INSERT INTO {table} ({cols}) VALUES ({marks})", params)
    return sum(len(p) for p in groups.values())


def insert_sample(kind: str, entity_id: int, time: datetime, **values) -> None:
    """Insert one raw wide sample."""
    insert_samples(kind, [(entity_id, time, values)])


def insert_series(kind: str, entity_id: int, field: str, points: Iterable[tuple[datetime, float]]):
    """Insert one field's readings for one entity, one row per reading."""
    insert_samples(kind, [(entity_id, t, {field: v}) for t, v in points])


def insert_narrow(
    entity_kind: str, entity_id: int, field: str, time: datetime, value: float
) -> None:
    """Insert one narrow sample."""
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO telemetry_narrow_sample (entity_kind, entity_id, field, time, value)"
            " VALUES (%s, %s, %s, %s, %s)",
            [entity_kind, entity_id, field, time, value],
        )


def rollup_rows(kind: str, resolution: str, entity_id: int) -> list[dict]:
    """Every rollup row of one entity, oldest first, as dicts keyed by column."""
    spec = KINDS[kind]
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT * FROM {spec.rollup_table(resolution)} WHERE {spec.entity_column} = %s"
            " ORDER BY bucket",
            [entity_id],
        )
        names = [d.name for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def rollup_row(kind: str, resolution: str, entity_id: int, bucket: datetime) -> dict | None:
    """One rollup row, or None."""
    rows = rollup_rows(kind, resolution, entity_id)
    return next((r for r in rows if r["bucket"] == bucket), None)


def count_rows(table: str) -> int:
    """Row count of a table named by the caller (a constant in the test)."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {table}")
        return cur.fetchone()[0]


def fill_gpu_fleet(gpus: int, start: datetime, duration: timedelta, every: timedelta) -> int:
    """Write synthetic readings for `gpus` GPUs from `start` for `duration`, server-side.

    Every gauge gets a wobbling value, every counter a steadily rising one, every state 0, so
    each rollup aggregate has real work to do. Returns the number of rows written.
    """
    spec = KINDS["gpu"]
    exprs = []
    for f in spec.fields:
        if f.kind == "gauge":
            exprs.append("(50 + 40 * sin(g + extract(epoch FROM t) / 60))::real")
        elif f.kind == "counter":
            exprs.append("(g * 1000 + extract(epoch FROM t - %(start)s) * 7)::bigint")
        else:
            exprs.append("0")
    names = ", ".join(f.name for f in spec.fields)
    sql = (
        f"INSERT INTO {spec.table} (gpu_id, time, {names})\n"
        f"SELECT g, t, {', '.join(exprs)}\n"
        "FROM generate_series(1, %(gpus)s) AS g,\n"
        "     generate_series(%(start)s::timestamptz, %(end)s::timestamptz - %(every)s,"
        "                     %(every)s) AS t"
    )
    params = {"gpus": gpus, "start": start, "end": start + duration, "every": every}
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.rowcount
