"""Writes for the Kubernetes integration: GPU pods into Job rows and the allocation ledger, Node objects into
the inventory. Each action runs in one transaction and is idempotent: syncing the same pods twice, or
importing the same node list twice, changes nothing the second time.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from datetime import datetime

from django.db import connection, transaction

from telemetry import live
from telemetry.k8s.pods import JobIn, NodeFacts, job_from_pod, mark_deleted
from telemetry.models import Allocation, Gpu, Job, JobState, JobStateChange, Node

__all__ = ["do_import_k8s_nodes", "do_sync_k8s_pods"]

logger = logging.getLogger(__name__)

SOURCE = Job.Source.KUBERNETES
OPEN_STATES = [JobState.PENDING, JobState.RUNNING, JobState.UNKNOWN]
# pg_advisory_xact_lock key: one pod sync at a time, so two watchers (a rolling restart) never both insert
# the same allocation or state change.
SYNC_LOCK = 0x6277_6B38  # "bwk8"


@transaction.atomic
def do_sync_k8s_pods(pods: list[dict], now: datetime, *, gone: bool = False, complete: bool = False) -> Counter:
    """Upsert a Job per GPU pod (keyed by pod UID), its state history and its allocations.

    1. Each pod is mapped by `job_from_pod`; `gone` says the pods come from DELETED events.
    2. Jobs are created or updated; a state change adds a JobStateChange row.
    3. A scheduled, started pod gets one Allocation per GPU on its node (the node is registered, unplaced,
       if unknown); a pod that let go of its GPUs has its open allocations closed at its end time.
    4. `complete`: `pods` is a full list (a list or re-list), so open k8s jobs missing from it were deleted
       while nobody watched; they are closed as cancelled at `now`.

    Returns counts: created, updated, unchanged, state_changes, allocations_opened, allocations_closed,
    vanished.
    """
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", [SYNC_LOCK])
    counts: Counter = Counter()
    facts = [job_from_pod(mark_deleted(p, now) if gone else p, now, gone=gone) for p in pods]
    existing = {j.external_id: j for j in Job.objects.select_for_update().filter(
        source=SOURCE, external_id__in=[f.uid for f in facts])}
    for fact in facts:
        _sync_one(fact, existing.get(fact.uid), now, counts)
    if complete:
        counts["vanished"] = _close_vanished({f.uid for f in facts}, now, counts)
    logger.info("k8s pod sync: %s", dict(counts))
    live.schedule_fleet_publish()  # open job pages refresh once this commits
    return counts


def _job_fields(fact: JobIn) -> dict:
    return {
        "name": fact.name[:256], "account": fact.namespace[:128], "qos": fact.priority_class[:64],
        "priority": fact.priority, "state": fact.state, "submit_time": fact.submit, "start_time": fact.start,
        "end_time": fact.end, "node_count": 1 if fact.node else 0, "gpu_count": fact.gpu_count,
        "requeue_count": fact.restarts,
    }


def _sync_one(fact: JobIn, job: Job | None, now: datetime, counts: Counter) -> None:
    fields = _job_fields(fact)
    if job is None:
        job = Job.objects.create(source=SOURCE, external_id=fact.uid, preempt_count=_preempts(fact, None),
                                 **fields)
        counts["created"] += 1
        _record_history(job, fact, None, now, counts)
    else:
        before = job.state
        if job.end_time is not None:
            # The earliest end seen stays: a later sync of the same pod may only know a fallback (`now`).
            fields["end_time"] = min(job.end_time, fact.end or job.end_time)
        fields["preempt_count"] = job.preempt_count + _preempts(fact, before)
        changed = {k: v for k, v in fields.items() if getattr(job, k) != v}
        if changed:
            Job.objects.filter(pk=job.pk).update(**changed, updated=now)
            for k, v in changed.items():
                setattr(job, k, v)
        counts["updated" if changed else "unchanged"] += 1
        if before != fact.state:
            _record_history(job, fact, before, now, counts)
    _sync_allocations(job, fact, counts)


def _preempts(fact: JobIn, before: str | None) -> int:
    return int(fact.state == JobState.PREEMPTED and before != JobState.PREEMPTED)


def _state_time(fact: JobIn, now: datetime) -> datetime:
    """When the pod entered its current state, as far as the pod object records it."""
    if fact.finished:
        return fact.end or now
    if fact.state == JobState.RUNNING:
        return fact.start or now
    if fact.state == JobState.PENDING:
        return fact.submit or now
    return now


def _record_history(job: Job, fact: JobIn, before: str | None, now: datetime, counts: Counter) -> None:
    """State changes implied by what we see: a pod first seen already running (or done) also gets the earlier
    states it must have passed through, at the times the pod records for them."""
    points: list[tuple[datetime, str]] = []
    if before is None and fact.submit:
        points.append((fact.submit, JobState.PENDING))
    if fact.state != JobState.PENDING and fact.start and before in {None, JobState.PENDING}:
        points.append((fact.start, JobState.RUNNING))
    points.append((_state_time(fact, now), fact.state))
    seen = set(JobStateChange.objects.filter(job=job).values_list("time", "state"))
    rows = {(t, s): JobStateChange(job=job, time=t, state=s, reason=fact.reason if s == fact.state else "")
            for t, s in points if (t, s) not in seen}
    JobStateChange.objects.bulk_create(rows.values())
    counts["state_changes"] += len(rows)


def _node_id(hostname: str) -> int:
    # Unplaced (no rack) until a topology import places it, like a node first seen in telemetry.
    node, _ = Node.objects.get_or_create(hostname=hostname)
    return node.pk


def _sync_allocations(job: Job, fact: JobIn, counts: Counter) -> None:
    """Open the pod's ledger rows once, when the kubelet has admitted it (status.startTime) on its node: the
    device plugin hands out devices at container creation, so they are held from then. Close them once, at
    the job's end. Rows are never re-keyed: a scheduler's index annotation is written at bind time, before
    the pod starts, so the indexes are as good as they will get when the rows are made."""
    if not fact.node or not fact.gpus or fact.start is None:
        return
    end = max(job.end_time, fact.start) if job.end_time else None  # clock skew must not break the ledger
    held = list(Allocation.objects.filter(job=job))
    if held:
        if end is not None:
            counts["allocations_closed"] += _close(held, end)
        return
    node_id = _node_id(fact.node)
    gpus = dict(Gpu.objects.filter(node_id=node_id, index__in=[c.index for c in fact.gpus])
                .values_list("index", "pk"))
    Allocation.objects.bulk_create([
        Allocation(job=job, node_id=node_id, gpu_id=gpus.get(c.index), gpu_index=c.index, fraction=c.fraction,
                   start=fact.start, end=end)
        for c in fact.gpus
    ])
    counts["allocations_opened"] += len(fact.gpus)


def _close(rows: list[Allocation], end: datetime) -> int:
    open_rows = [r for r in rows if r.end is None]
    for row in open_rows:
        Allocation.objects.filter(pk=row.pk).update(end=max(end, row.start))
    return len(open_rows)


def _close_vanished(listed: set[str], now: datetime, counts: Counter) -> int:
    """Jobs still holding GPUs that a full list no longer shows were deleted between watches: end them at
    `now`, cancelling those that had not already ended otherwise (a preempted pod keeps its state)."""
    vanished = list(Job.objects.select_for_update().filter(source=SOURCE, end_time__isnull=True)
                    .exclude(external_id__in=listed))
    for job in vanished:
        state = JobState.CANCELLED if job.state in OPEN_STATES else job.state
        Job.objects.filter(pk=job.pk).update(state=state, end_time=now, updated=now)
        if state != job.state:
            JobStateChange.objects.get_or_create(job=job, time=now, state=state,
                                                 defaults={"reason": "Gone from the pod list"})
            counts["state_changes"] += 1
        counts["allocations_closed"] += _close(list(Allocation.objects.filter(job=job)), now)
    return len(vanished)


@transaction.atomic
def do_import_k8s_nodes(facts: Iterable[NodeFacts]) -> Counter:
    """Register every node (unplaced) and note its GPU model in `system_model` where that is still blank.

    The topology import is the authority on a node's system model; the GPU model from the Kubernetes label
    only fills the gap, so re-importing never overwrites an operator's value. GPU rows are not created: they
    are keyed by UUID, which a Node object does not carry. Returns created, updated, unchanged, gpus.
    """
    facts = list({f.hostname: f for f in facts}.values())
    counts: Counter = Counter(gpus=sum(f.gpu_count for f in facts))
    known = {n.hostname: n for n in Node.objects.filter(hostname__in=[f.hostname for f in facts])}
    new = [Node(hostname=f.hostname, system_model=f.gpu_model[:128]) for f in facts if f.hostname not in known]
    counts["created"] = len(Node.objects.bulk_create(new, ignore_conflicts=True))
    fill = [known[f.hostname] for f in facts if f.hostname in known and f.gpu_model
            and not known[f.hostname].system_model]
    for node in fill:
        node.system_model = next(f.gpu_model for f in facts if f.hostname == node.hostname)[:128]
    counts["updated"] = Node.objects.bulk_update(fill, ["system_model"]) if fill else 0
    counts["unchanged"] = len(known) - counts["updated"]
    return counts
