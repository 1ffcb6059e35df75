"""Database helpers every app shares."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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
