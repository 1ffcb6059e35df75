"""Database helpers every app shares."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from django.db import connection, transaction


@contextmanager
def cursor_without_jit() -> Iterator:
    """A cursor whose statements are not JIT-compiled.

    Statements that join ~16k entities to their rollup rows cross PostgreSQL's JIT cost
    thresholds, and compiling them takes longer (~0.8 s) than running them; as in
    `telemetry.rollups`, each is a fresh query, so the compiled code is never reused. Inside a
    caller's transaction the setting lasts until that transaction ends.
    """
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL jit = off")
        yield cur


def fetch_binary(sql: str, params=None) -> list[tuple]:
    """Every row of `sql`, fetched in binary: at 16k rows of numbers, text decoding costs more than the query.

    A plain (server-binding) psycopg cursor on Django's connection, since Django's client-side cursors cannot
    return binary; parameters use psycopg's placeholders (`%s`, `%(name)s`).
    """
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cur:
        cur.execute(sql, params, binary=True)
        return cur.fetchall()
