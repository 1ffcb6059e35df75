"""Writes owned by telemetry. Each action runs in one transaction."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction

from telemetry import live
from telemetry.fields import KINDS
from telemetry.models import CollectorToken, GpuEvent, Job, JobState, JobStateChange, Node, NodeState


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
    """One statement for all GPUs; ordered, so two writers never wait on each other crosswise."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(pg_advisory_xact_lock(%s, g)) "
            "FROM (SELECT DISTINCT g FROM unnest(%s::int[]) AS g ORDER BY g) s",
            [EVENT_LOCK_NAMESPACE, list(gpu_ids)],
        )


@transaction.atomic
def do_record_gpu_events(events: list[EventIn]) -> dict[str, int]:
    """Merge sightings into open events: same GPU, kind and code raise count and last_seen.

    Bulk statements throughout: a fleet-wide burst (a bad driver push, a power event) can bring
    thousands of sightings in one batch, and ingest must not slow down when it matters most.
    """
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
    new, updates = [], []
    for key, sightings in merged.items():
        count, last = min(sum(s.count for s in sightings), 2**31 - 1), sightings[-1]
        row = open_rows.get(key)
        if row is None:
            new.append(GpuEvent(gpu_id=key[0], kind=key[1], code=key[2], first_seen=sightings[0].time,
                                last_seen=last.time, count=count, message=last.message[:2000], source=last.source))
        else:
            updates.append((row.event_id, row.first_seen, count, max(row.last_seen, last.time), last.message[:2000]))
    GpuEvent.objects.bulk_create(new, batch_size=2000)
    _bulk_update_events(updates)
    return {"created": len(new), "updated": len(updates)}


def _bulk_update_events(updates: list[tuple]) -> None:
    if not updates:
        return

    ids, firsts, counts, lasts, messages = (list(c) for c in zip(*updates, strict=True))
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE telemetry_gpu_event e SET count = LEAST(e.count::bigint + u.c, 2147483647), "
            "last_seen = u.l, message = CASE WHEN u.m <> '' THEN u.m ELSE e.message END "
            "FROM unnest(%s::uuid[], %s::timestamptz[], %s::int[], %s::timestamptz[], %s::text[]) "
            "AS u(id, f, c, l, m) "
            "WHERE e.event_id = u.id AND e.first_seen = u.f",
            [ids, firsts, counts, lasts, messages],
        )


@transaction.atomic
def do_clear_gpu_resets(resets: list[tuple[int, datetime]], *, reason: str) -> int:
    """Close the open events of every GPU in `resets` [(gpu_id, reset time)], in one statement."""
    if not resets:
        return 0
    _lock_gpus(g for g, _ in resets)
    ids, times = (list(c) for c in zip(*resets, strict=True))
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE telemetry_gpu_event e SET cleared_at = r.t, cleared_reason = %s "
            "FROM (SELECT g, max(t) AS t FROM unnest(%s::int[], %s::timestamptz[]) AS x(g, t) GROUP BY g) r "
            "WHERE e.gpu_id = r.g AND e.cleared_at IS NULL AND e.first_seen <= r.t",
            [reason[:200], ids, times],
        )
        return cur.rowcount


# --- Scheduler-facing state set by remediation ----------------------------------------------------
@transaction.atomic
def do_set_node_state(hostname: str, state: str) -> bool:
    """Set a node's scheduler state (drained, active, down); False when the inventory has no such node.

    Remediation calls this after a drain or resume it verified, and the simulator backend uses it as its
    scheduler, so the fleet page and the guard rails see the same state the scheduler has.
    """

    if state not in NodeState.values:
        raise ValueError(f"unknown node state {state!r}; use one of {', '.join(NodeState.values)}")
    changed = Node.objects.filter(hostname=hostname).exclude(state=state).update(state=state)
    if changed:
        live.schedule_fleet_publish()
    return changed > 0 or Node.objects.filter(hostname=hostname).exists()


@transaction.atomic
def do_mark_job_requeued(source: str, external_id: str, *, at: datetime, reason: str) -> bool:
    """Record a requeue of a job (back to pending, one more requeue); False when the job is unknown.

    The simulated cluster has no scheduler to ask, so the simulator remediation backend writes this itself.
    """
    job = Job.objects.select_for_update().filter(source=source, external_id=external_id).first()
    if job is None:
        return False
    if job.state != JobState.PENDING:
        job.state, job.requeue_count = JobState.PENDING, job.requeue_count + 1
        job.save(update_fields=["state", "requeue_count", "updated"])
        JobStateChange.objects.get_or_create(job=job, time=at, state=JobState.PENDING,
                                             defaults={"reason": reason[:256]})
    return True
