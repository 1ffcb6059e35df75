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
    job.name, job.user, job.account, job.partition, job.qos = j.name, j.user, j.account, j.partition, j.qos
    job.priority, job.state, job.node_count = j.priority, state, j.node_count
    job.submit_time, job.start_time, job.end_time = j.submit, j.start, j.end
    job.gpu_count = j.gpu_count or job.gpu_count  # keep what it held once it stops reporting GPUs
    if changed and state == JobState.PREEMPTED:
        job.preempt_count += 1
    if j.restart_count is not None:
        job.requeue_count = max(job.requeue_count, j.restart_count)
    job.save()
    if changed:
        at = {JobState.RUNNING: j.start}.get(state) or (j.end if state in ENDED else None) or j.submit or now
        JobStateChange.objects.get_or_create(job=job, time=at, state=state,
                                             defaults={"reason": " ".join(j.state_flags)[:256]})
    return job, created


def _node(hostname: str) -> Node:
    node, _ = Node.objects.get_or_create(hostname=hostname)
    return node


def _record_allocations(jobs: dict[str, Job], allocations: list[parse.Allocation]) -> int:
    made = 0
    for a in allocations:
        job = jobs.get(a.job_id)
        if job is None or a.start is None:
            continue  # a job this sync did not list (finished in between): the next sync has it
        node = _node(a.node)
        gpus = {g.index: g for g in Gpu.objects.filter(node=node, index__in=a.gpu_indexes)}
        for idx in a.gpu_indexes:
            _, created = Allocation.objects.get_or_create(
                job=job, node=node, gpu_index=idx, start=a.start, defaults={"gpu": gpus.get(idx), "end": a.end}
            )
            made += created
    return made


@transaction.atomic
def do_sync_slurm(jobs: list[parse.Job], allocations: list[parse.Allocation], *, now: datetime) -> dict[str, int]:
    """Upsert jobs, add allocations, close the allocations of jobs that ended."""
    by_id, created = {}, 0
    for j in jobs:
        by_id[j.job_id], new = _upsert_job(j, now)
        created += new
    made = _record_allocations(by_id, allocations)
    closed = 0
    for job in by_id.values():
        if job.state in ENDED and job.end_time:
            closed += job.allocations.filter(end__isnull=True).update(end=job.end_time)
    live.schedule_fleet_publish()  # open job pages refresh once this commits
    return {"jobs": len(by_id), "created": created, "allocations": made, "closed": closed}
