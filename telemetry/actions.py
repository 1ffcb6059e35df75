"""Writes owned by telemetry. Each action runs in one transaction."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

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


# --- GPU fault events ---------------------------------------------------------------------------
EVENT_LOCK_NAMESPACE = 0x6277_0001  # pg_advisory_xact_lock(namespace, gpu_id): one writer per GPU's events


@dataclass(frozen=True, slots=True)
class EventIn:
    """One sighting of a fault, before deduplication."""

    gpu_id: int
    kind: str
    time: datetime
    code: int = 0
    message: str = ""
    source: str = "api"
    count: int = 1


def _lock_gpus(gpu_ids) -> None:
    from django.db import connection

    with connection.cursor() as cur:
        for gpu_id in sorted(set(gpu_ids)):  # sorted: two writers never wait on each other crosswise
            cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", [EVENT_LOCK_NAMESPACE, gpu_id])


@transaction.atomic
def do_record_gpu_events(events: list[EventIn]) -> dict[str, int]:
    """Merge sightings into open events: same GPU, kind and code raise count and last_seen."""
    from telemetry.models import GpuEvent

    if not events:
        return {"created": 0, "updated": 0}
    merged: dict[tuple, list[EventIn]] = {}
    for e in sorted(events, key=lambda e: e.time):
        merged.setdefault((e.gpu_id, e.kind, e.code), []).append(e)
    _lock_gpus(k[0] for k in merged)
    open_rows = {
        (ev.gpu_id, ev.kind, ev.code): ev
        for ev in GpuEvent.objects.filter(cleared_at__isnull=True, gpu_id__in={k[0] for k in merged})
    }
    created = updated = 0
    for key, sightings in merged.items():
        count, last = sum(s.count for s in sightings), sightings[-1]
        row = open_rows.get(key)
        if row is None:
            GpuEvent.objects.create(gpu_id=key[0], kind=key[1], code=key[2], first_seen=sightings[0].time,
                                    last_seen=last.time, count=count, message=last.message[:2000], source=last.source)
            created += 1
        else:
            GpuEvent.objects.filter(pk=row.pk).update(
                count=row.count + count, last_seen=max(row.last_seen, last.time),
                message=last.message[:2000] or row.message,
            )
            updated += 1
    return {"created": created, "updated": updated}


@transaction.atomic
def do_clear_gpu_events(gpu_ids, *, at: datetime, reason: str) -> int:
    """Close every open event of these GPUs (a GPU reset, or an operator's decision)."""
    from telemetry.models import GpuEvent

    gpu_ids = list(set(gpu_ids))
    _lock_gpus(gpu_ids)
    return GpuEvent.objects.filter(gpu_id__in=gpu_ids, cleared_at__isnull=True, first_seen__lte=at).update(
        cleared_at=at, cleared_reason=reason[:200]
    )
