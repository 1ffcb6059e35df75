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


def _columns(kind: str, names: Iterable[str]) -> list[str]:
    known = KINDS[kind].by_name
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"{kind} has no fields {unknown}")
    return list(names)


def insert_samples(kind: str, rows: Iterable[tuple[int, datetime, dict]]) -> int:
    """Insert (entity_id, time, {field: value}) rows into a raw wide table; returns the count."""
    spec = KINDS[kind]
    n = 0
    with connection.cursor() as cur:
        for entity_id, time, values in rows:
            cols = _columns(kind, values)
            names = ", ".join([spec.entity_column, "time", *cols])
            marks = ", ".join(["%s"] * (len(cols) + 2))
            cur.execute(
                f"INSERT INTO {spec.table} ({names}) VALUES ({marks})",
                [entity_id, time, *values.values()],
            )
            n += 1
    return n


def insert_sample(kind: str, entity_id: int, time: datetime, **values) -> None:
    """Insert one raw wide sample."""
    insert_samples(kind, [(entity_id, time, values)])


def insert_series(kind: str, entity_id: int, field: str, points: Iterable[tuple[datetime, float]]):
    """Insert one field's readings for one entity, one row per reading."""
    insert_samples(kind, [(entity_id, t, {field: v}) for t, v in points])


def insert_narrow(entity_kind: str, entity_id: int, field: str, time: datetime, value: float) -> None:
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
    return next((r for r in rollup_rows(kind, resolution, entity_id) if r["bucket"] == bucket), None)


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
        "     generate_series(%(start)s::timestamptz, %(end)s::timestamptz - %(every)s, %(every)s) AS t"
    )
    params = {"gpus": gpus, "start": start, "end": start + duration, "every": every}
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.rowcount
