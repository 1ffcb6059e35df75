"""Writes owned by telemetry. Each action runs in one transaction."""

from __future__ import annotations

from django.db import transaction

from telemetry.models import CollectorToken


@transaction.atomic
def do_create_collector_token(name: str, *, replace: bool = False) -> str:
    """Create a token for collector `name` and return the raw value (never stored)."""
    existing = CollectorToken.objects.filter(name=name).first()
    if existing and not replace:
        raise ValueError(f"a collector token named {name!r} exists; pass --replace to rotate it")
    if existing:
        existing.delete()
    raw = CollectorToken.generate()
    CollectorToken.objects.create(name=name, prefix=raw[:10], token_hash=CollectorToken.hash(raw))
    return raw


@transaction.atomic
def do_rebuild_latest(window) -> dict[str, int]:
    """Refill each last-value table with the newest raw row per entity within `window`."""
    from django.db import connection

    from telemetry.fields import KINDS

    counts = {}
    with connection.cursor() as cur:
        for name, kind in KINDS.items():
            cols = ", ".join([kind.entity_column, "time", *(f.name for f in kind.fields)])
            sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in cols.split(", ")[1:])
            cur.execute(
                f"INSERT INTO {kind.latest_table} AS l ({cols}) "
                f"SELECT DISTINCT ON ({kind.entity_column}) {cols} FROM {kind.table} "
                f"WHERE time > now() - %s ORDER BY {kind.entity_column}, time DESC "
                f"ON CONFLICT ({kind.entity_column}) DO UPDATE SET {sets} WHERE l.time <= EXCLUDED.time",
                [window],
            )
            counts[name] = cur.rowcount
    return counts
