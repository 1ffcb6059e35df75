"""What the simulated cluster reports about its jobs, besides telemetry.

- `JobFeed.snapshot`: a scheduler snapshot for ``POST /api/v1/jobs`` holding the jobs whose Slurm
  record changed since the previous snapshot (all live jobs the first time): submissions
  (pending ones too, with their submit time), starts with their allocations (every GPU of their
  nodes), requeues, and ends with their end state and time.
- `lock_step`: a training job is data-parallel and synchronous. Each step every rank computes
  (forward and backward: `compute_share` of the step at full speed, divided by its GPU's speed,
  which its clocks and a straggler scenario's `pace` set), then all of them all-reduce the
  gradients, which ends when the slowest rank joins. So every rank's step takes the same wall time,
  the slowest compute plus the all-reduce; the slow rank's SMs are busy for more of it, and its
  peers' SMs idle in the collective (a waiting NCCL kernel keeps a few SMs active and utilisation
  high). It sets each GPU's `share` of its job's nominal activity and the job's `wall`.
- `JobFeed.steps`: per running training job, one ``POST /api/v1/training`` body with a record per
  rank (``node position * 8 + GPU index``, as the training scenarios number ranks): the step the
  gang has reached and its step time, the same on every rank (each times it on its own clock, so
  they differ by a hair), with step-to-step jitter and the occasional data-loader stall that every
  rank waits out; and, for jobs whose trainer measures it (`Job.reports_compute`, as
  docs/training.md shows with CUDA events), each rank's own compute time. Jobs warming up or writing
  a checkpoint make no steps, and a job a scenario reports itself (`Job.own_metrics`) is left out.

Job ids are ``sim-<simulator job id>``, the key the training scenarios use (``slurm:sim-<id>``).
The jitter comes from a generator of the feed's own, so the same seed and tick times give the
same bodies, and the telemetry's draws do not depend on whether anything reads the feed.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Protocol

from telemetry.simulator.jobs import PENDING, RUNNING, TRAINING_KINDS, Job


class Cluster(Protocol):
    """The simulated cluster (telemetry.simulator.dynamics.Cluster), named for type hints only:
    dynamics imports this module, so importing it back, even under TYPE_CHECKING, would make
    the two a circle."""

STEP_JITTER = 0.015  # relative standard deviation of the gang's step time, step to step
COMPUTE_JITTER = 0.015  # relative standard deviation of one rank's compute time
CLOCK_SKEW = 0.001  # ranks time the same step on their own clocks
NCCL_SM = 0.1  # share of the SMs a collective keeps active while it waits for the other ranks
STALL_P = 0.01  # share of steps that wait for the data loader
STALL_STEPS = (0.5, 5.0)  # how long such a wait is, in steps
MIN_SPEED = 0.05  # a GPU this slow is all but stopped; the gang's step is capped there


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
        bodies, when, gauss, rnd = [], iso(t), self.rng.gauss, self.rng.random
        for job in cluster.scheduler.jobs.values():
            if job.kind not in TRAINING_KINDS or job.own_metrics or not job.step_s or job.act < 1.0:
                continue
            ranks = [(pos * 8 + g.spec.index, g) for pos, i in enumerate(job.nodes) for g in cluster.gpus[i]]
            job.steps += dt / (job.step_s * job.wall)
            # The step this report describes: the gang's, plus a data-loader stall now and then.
            wall = job.step_s * job.wall * (1 + STEP_JITTER * gauss(0.0, 1.0))
            if rnd() < STALL_P:
                wall += job.step_s * (STALL_STEPS[0] + (STALL_STEPS[1] - STALL_STEPS[0]) * rnd())
            step = int(job.steps)
            records = []
            for rank, g in ranks:
                rec = {"rank": rank, "step": step, "time": when,
                       "step_time_s": round(wall * (1 + CLOCK_SKEW * gauss(0.0, 1.0)), 4)}
                if job.reports_compute:
                    compute = job.step_s * job.compute_share / max(g.speed, MIN_SPEED)
                    rec["compute_time_s"] = round(compute * (1 + COMPUTE_JITTER * gauss(0.0, 1.0)), 4)
                records.append(rec)
            bodies.append({"job": f"slurm:{job_key(job)}", "records": records})
        return bodies


def lock_step(cluster: Cluster) -> None:
    """Set every running job's step time (`Job.wall`) and its GPUs' activity shares for this tick,
    from each GPU's speed at the last tick (see the module docstring). A job that is not a
    synchronous training job keeps its GPUs at their job's nominal activity."""
    for job in cluster.scheduler.jobs.values():
        gpus = [g for i in job.nodes for g in cluster.gpus[i] if not g.dead]
        if job.kind not in TRAINING_KINDS or not job.step_s or not gpus:
            for g in gpus:
                g.share = 1.0
            continue
        s = job.compute_share
        compute = [s / max(g.speed, MIN_SPEED) for g in gpus]
        wall = max(compute) + (1 - s)
        nominal = s + NCCL_SM * (1 - s)  # every rank at full speed: wall 1
        for g, c in zip(gpus, compute, strict=True):
            g.share = (c + NCCL_SM * (wall - c)) / wall / nominal
        job.wall = wall
