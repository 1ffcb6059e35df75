"""What the simulated cluster reports about its jobs, besides telemetry.

- `JobFeed.snapshot`: a scheduler snapshot for ``POST /api/v1/jobs`` holding the jobs whose Slurm
  record changed since the previous snapshot (all live jobs the first time): submissions
  (pending ones too, with their submit time), starts with their allocations (every GPU of their
  nodes), requeues, and ends with their end state and time.
- `JobFeed.steps`: per running training job, one ``POST /api/v1/training`` body with a record per
  rank (``node position * 8 + GPU index``, as the training scenarios number ranks): the step the
  gang has reached and the rank's step time, the job's step time divided by its GPU's `pace`
  (a straggler scenario lowers one GPU's), with a little jitter. Jobs warming up or writing a
  checkpoint make no steps, and a job a scenario reports itself (`Job.own_metrics`) is left out.

Job ids are ``sim-<simulator job id>``, the key the training scenarios use (``slurm:sim-<id>``).
The jitter comes from a generator of the feed's own, so the same seed and tick times give the
same bodies, and the telemetry's draws do not depend on whether anything reads the feed.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from telemetry.simulator.jobs import PENDING, RUNNING, TRAINING_KINDS, Job

if TYPE_CHECKING:
    from telemetry.simulator.dynamics import Cluster

STEP_JITTER = 0.015  # relative standard deviation of one rank's step time


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def job_key(job: Job) -> str:
    """The job's id at the jobs endpoint (the training endpoint prefixes ``slurm:``)."""
    return f"sim-{job.id}"


class JobFeed:
    """Builds the job snapshots and training steps of one simulated cluster, tick by tick."""

    def __init__(self, seed: int):
        self.rng = random.Random(f"breakwater-steps:{seed}")
        self.sent: dict[int, tuple] = {}  # job id -> the record last put in a snapshot
        self.first = True

    def snapshot(self, cluster: Cluster) -> dict | None:
        """The jobs that changed since the last call, or None when none did."""
        s = cluster.scheduler
        ended = s.drain_ended()
        changed = []
        for job in (*s.jobs.values(), *s.queue, *s.preempted, *ended):
            record = self._record(cluster, job)
            key = tuple(v for k, v in record.items() if k != "allocations")
            if self.sent.get(job.id) != key:
                self.sent[job.id] = key
                changed.append(record)
        for job in ended:
            self.sent.pop(job.id, None)  # it will not change again
        # The first snapshot lists every live job: jobs a previous run left open are closed.
        first, self.first = self.first, False
        if first:
            return {"source": "slurm", "jobs": changed, "complete": True}
        return {"source": "slurm", "jobs": changed} if changed else None

    def _record(self, cluster: Cluster, job: Job) -> dict:
        hosts = [cluster.layout.nodes[i].hostname for i in job.nodes]
        start = None if job.state == PENDING else iso(job.start)
        end = None if job.state in (PENDING, RUNNING) else iso(job.end)
        allocations = [] if start is None else [
            {"node": h, "gpu_indexes": [g.spec.index for g in cluster.gpus[i]], "start": start, "end": end}
            for i, h in zip(job.nodes, hosts, strict=True)
        ]
        return {
            "job_id": job_key(job), "name": job.name, "user": job.user, "account": job.account,
            "partition": job.partition, "qos": job.qos, "priority": job.priority, "state": job.state,
            "submit": iso(job.submit), "start": start, "end": end, "nodes": hosts, "node_count": job.size,
            "gpus": job.gpus, "restart_count": job.restarts, "allocations": allocations,
        }

    def steps(self, cluster: Cluster, t: float, dt: float) -> list[dict]:
        """One training body per running training job that is computing at `t`."""
        bodies, when, gauss = [], iso(t), self.rng.gauss
        for job in cluster.scheduler.jobs.values():
            if job.kind not in TRAINING_KINDS or job.own_metrics or not job.step_s or job.act < 1.0:
                continue
            ranks = [(pos * 8 + g.spec.index, g) for pos, i in enumerate(job.nodes) for g in cluster.gpus[i]]
            # The gang moves at its slowest rank's pace: a synchronous step waits for everyone.
            job.steps += dt * min(g.pace for _, g in ranks) / job.step_s
            step = int(job.steps)
            bodies.append({"job": f"slurm:{job_key(job)}", "records": [
                {"rank": rank, "step": step, "time": when,
                 "step_time_s": round(job.step_s / g.pace * (1 + STEP_JITTER * gauss(0.0, 1.0)), 4)}
                for rank, g in ranks
            ]})
        return bodies
