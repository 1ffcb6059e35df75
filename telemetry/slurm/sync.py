"""Slurm → jobs and the allocation ledger (an action: one transaction per sync).

Jobs are keyed by their Slurm id (array and het suffixes kept). A state change adds a history row;
a transition into PREEMPTED or a requeue counts. Allocations come from `scontrol show job -d`
(per-node GPU indexes) while a job runs; a job that has ended closes its open allocations at its
end time. Nodes the scheduler names but the inventory lacks are registered unplaced, like nodes
first seen in telemetry; a GPU is linked when the node's GPU at that index is known.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import Value
from django.db.models.functions import Greatest

from telemetry import live
from telemetry.models import Allocation, Gpu, Job, JobState, JobStateChange, Node
from telemetry.slurm import parse

STATES = {
    "PENDING": JobState.PENDING, "REQUEUED": JobState.PENDING, "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING, "CONFIGURING": JobState.RUNNING, "SUSPENDED": JobState.RUNNING,
    "COMPLETED": JobState.COMPLETED, "FAILED": JobState.FAILED, "OUT_OF_MEMORY": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED, "CANCELLED": JobState.CANCELLED, "PREEMPTED": JobState.PREEMPTED,
    "TIMEOUT": JobState.TIMEOUT, "DEADLINE": JobState.TIMEOUT, "NODE_FAIL": JobState.NODE_FAIL,
}
ENDED = {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED, JobState.TIMEOUT,
         JobState.NODE_FAIL}


def _upsert_job(j: parse.Job, now: datetime) -> tuple[Job, bool]:
    state = STATES.get(j.state, JobState.UNKNOWN)
    job, created = Job.objects.get_or_create(source=Job.Source.SLURM, external_id=j.job_id)
    changed = created or job.state != state
    # Running -> pending is a requeue (scontrol requeue, a preemption with requeue, a node failure): the run
    # that held the GPUs is over now, whatever Slurm's restart counter says yet.
    requeued = not created and job.state == JobState.RUNNING and state == JobState.PENDING
    job.name, job.user, job.account, job.partition, job.qos = j.name, j.user, j.account, j.partition, j.qos
    job.priority, job.state, job.node_count = j.priority, state, j.node_count
    job.submit_time, job.start_time, job.end_time = j.submit, j.start, j.end
    job.gpu_count = j.gpu_count or job.gpu_count  # keep what it held once it stops reporting GPUs
    if changed and state == JobState.PREEMPTED:
        job.preempt_count += 1
    if requeued:
        job.requeue_count += 1
    if j.restart_count is not None:
        job.requeue_count = max(job.requeue_count, j.restart_count)
    job.save()
    if changed:
        at = now if requeued else (
            {JobState.RUNNING: j.start}.get(state) or (j.end if state in ENDED else None) or j.submit or now)
        JobStateChange.objects.get_or_create(job=job, time=at, state=state,
                                             defaults={"reason": ("requeued " if requeued else "")
                                                       + " ".join(j.state_flags)[:240]})
    if requeued:  # the first run's ledger rows end now, or its GPU time would run on until the job ends
        job.allocations.filter(end__isnull=True).update(end=Greatest("start", Value(now)))
    return job, created


def _nodes(hostnames: set[str]) -> dict[str, Node]:
    found = {n.hostname: n for n in Node.objects.filter(hostname__in=hostnames)}
    missing = hostnames - found.keys()
    if missing:
        Node.objects.bulk_create([Node(hostname=h) for h in sorted(missing)], ignore_conflicts=True)
        found |= {n.hostname: n for n in Node.objects.filter(hostname__in=missing)}
    return found


def _record_allocations(jobs: dict[str, Job], allocations: list[parse.Allocation]) -> int:
    """Add the ledger rows not there yet, in a few statements however many GPUs the sync lists
    (a first sync of a busy cluster names thousands)."""
    # A job this sync did not list (finished in between) or one without a start: the next sync has it.
    wanted = [(jobs[a.job_id], a) for a in allocations if a.job_id in jobs and a.start is not None]
    if not wanted:
        return 0
    nodes = _nodes({a.node for _, a in wanted})
    gpus = {(g.node_id, g.index): g for g in Gpu.objects.filter(node__in=list(nodes.values()), index__isnull=False)}
    have = set(Allocation.objects.filter(job__in=[j.id for j, _ in wanted])
               .values_list("job_id", "node_id", "gpu_index", "start"))
    new = []
    for job, a in wanted:
        node = nodes[a.node]
        for idx in a.gpu_indexes:
            if (job.id, node.id, idx, a.start) not in have:
                have.add((job.id, node.id, idx, a.start))
                new.append(Allocation(job=job, node=node, gpu_index=idx, start=a.start, end=a.end,
                                      gpu=gpus.get((node.id, idx))))
    Allocation.objects.bulk_create(new, ignore_conflicts=True)  # a concurrent sync may have added a row
    return len(new)


@transaction.atomic
def do_sync_slurm(jobs: list[parse.Job], allocations: list[parse.Allocation], *, now: datetime,
                  complete: bool = False) -> dict[str, int]:
    """Upsert jobs, add allocations, close the allocations of jobs that ended.

    `complete`: `jobs` lists every job the scheduler still knows (a full squeue, or a restarted
    simulator's first snapshot), so an open job missing from it ended while nobody watched; it is
    closed as cancelled at `now`, with its allocations.
    """
    by_id, created = {}, 0
    for j in jobs:
        by_id[j.job_id], new = _upsert_job(j, now)
        created += new
    made = _record_allocations(by_id, allocations)
    closed = 0
    for job in by_id.values():
        if job.state in ENDED and job.end_time:
            closed += job.allocations.filter(end__isnull=True).update(end=job.end_time)
    vanished = _close_vanished(set(by_id), now) if complete else 0
    live.schedule_fleet_publish()  # open job pages refresh once this commits
    return {"jobs": len(by_id), "created": created, "allocations": made, "closed": closed, "vanished": vanished}


OPEN = (JobState.PENDING, JobState.RUNNING, JobState.UNKNOWN)


def _close_vanished(listed: set[str], now: datetime) -> int:
    gone = list(Job.objects.select_for_update().filter(source=Job.Source.SLURM, state__in=OPEN)
                .exclude(external_id__in=listed))
    for job in gone:
        # A scheduler clock ahead of ours may have started it "later" than now: never end before the start.
        end = max(now, job.start_time) if job.start_time else now
        job.state, job.end_time = JobState.CANCELLED, end
        job.save(update_fields=["state", "end_time", "updated"])
        JobStateChange.objects.get_or_create(job=job, time=end, state=JobState.CANCELLED,
                                             defaults={"reason": "not in the scheduler's full listing"})
        job.allocations.filter(end__isnull=True).update(end=Greatest("start", Value(end)))
    return len(gone)
