"""Gang-scheduled jobs on whole nodes, and a scheduler that follows a diurnal load curve.

A job's *character* (how hard it drives the tensor cores, how much memory it holds, how much it
talks over NVLink and InfiniBand) is drawn once from its kind, so every GPU of a job looks
alike and different jobs look different. Jobs pause periodically (checkpoints, evaluation)
and warm up after they start, which is what real training utilisation looks like.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

# name: (weight, node counts, minutes, util %, sm, tensor, dram, fp64, power, memory,
#        NVLink B/s per GPU, InfiniBand B/s per HCA, PCIe B/s)
KINDS: dict[str, tuple] = {
    "pretrain": (2, (8, 16, 32, 64), (60, 720), (95, 100), (0.70, 0.90), (0.55, 0.75), (0.35, 0.55),
                 (0.0, 0.0), (0.88, 1.0), (0.85, 0.97), (150e9, 350e9), (20e9, 42e9), (1e9, 4e9)),
    "finetune": (4, (1, 2, 4, 8), (20, 240), (88, 99), (0.55, 0.80), (0.40, 0.65), (0.30, 0.50),
                 (0.0, 0.0), (0.75, 0.95), (0.60, 0.90), (80e9, 250e9), (8e9, 30e9), (1e9, 6e9)),
    "inference": (3, (1, 2), (30, 480), (35, 75), (0.25, 0.50), (0.15, 0.35), (0.40, 0.70),
                  (0.0, 0.0), (0.35, 0.60), (0.50, 0.90), (5e9, 30e9), (1e9, 3e9), (2e9, 8e9)),
    "hpc": (1, (2, 4, 8, 16), (30, 240), (95, 100), (0.80, 0.95), (0.02, 0.10), (0.50, 0.80),
            (0.45, 0.80), (0.80, 0.95), (0.30, 0.70), (50e9, 150e9), (15e9, 35e9), (1e9, 3e9)),
    "debug": (3, (1,), (5, 40), (10, 60), (0.10, 0.40), (0.00, 0.30), (0.10, 0.30),
              (0.0, 0.0), (0.20, 0.50), (0.10, 0.50), (1e9, 20e9), (0.0, 0.0), (0.5e9, 2e9)),
}
KIND_NAMES = tuple(KINDS)
KIND_WEIGHTS = tuple(KINDS[k][0] for k in KIND_NAMES)
PAUSE_ACTIVITY = 0.12  # utilisation during a checkpoint pause, as a share of full speed
WARMUP_ACTIVITY = 0.35  # loading data and compiling before the first step


def diurnal(t: float) -> float:
    """0 at 03:00 UTC, 1 at 15:00 UTC: the shape of a working day."""
    hour = (t % 86400) / 3600
    return 0.5 + 0.5 * math.cos(2 * math.pi * (hour - 15) / 24)


@dataclass(slots=True, eq=False)
class Job:
    """One running job: its nodes, lifetime and character."""

    id: int
    kind: str
    nodes: list[int]
    start: float
    end: float
    util: float
    sm: float
    tensor: float
    dram: float
    fp64: float
    power: float  # share of the headroom between idle and the power limit it uses
    mem: float  # share of the framebuffer it holds
    nvlink_bps: float
    ib_bps: float  # per HCA and direction; zero for a single-node job
    pcie_bps: float
    warmup: float
    period: float  # seconds between checkpoint pauses
    pause: float
    cross: dict[int, float] = field(default_factory=dict)  # group -> share of IB traffic leaving it
    act: float = 0.0  # activity this tick, set by `activity`

    @property
    def gpus(self) -> int:
        return len(self.nodes) * 8

    def activity(self, t: float) -> float:
        """1 while computing; lower while warming up or in a checkpoint pause."""
        age = t - self.start
        if age < self.warmup:
            a = WARMUP_ACTIVITY
        elif (age - self.warmup) % self.period >= self.period - self.pause:  # checkpoint at the end
            a = PAUSE_ACTIVITY
        else:
            a = 1.0
        if self.kind == "inference":
            a *= 0.55 + 0.45 * diurnal(t)  # serving load follows the users
        self.act = a
        return a


def make_job(rng: random.Random, job_id: int, kind: str, nodes: list[int], start: float,
             minutes: float | None = None) -> Job:
    """A job of `kind` on `nodes`, its character drawn from the kind's ranges."""
    (_, _, mins, util, sm, tensor, dram, fp64, power, mem, nvl, ib, pcie) = KINDS[kind]
    u = rng.uniform
    if minutes is None:
        # Log-uniform: many short jobs, a few long ones.
        minutes = math.exp(u(math.log(mins[0]), math.log(mins[1])))
    return Job(
        job_id, kind, nodes, start, start + minutes * 60, u(*util), u(*sm), u(*tensor), u(*dram),
        u(*fp64), u(*power), u(*mem), u(*nvl), u(*ib) if len(nodes) > 1 else 0.0, u(*pcie),
        warmup=u(30, 120), period=u(15, 60) * 60, pause=u(20, 90),
    )


class Scheduler:
    """Starts and ends jobs so that the share of busy nodes follows the diurnal curve.

    1. Jobs past their end time finish and free their nodes.
    2. While the busy share is under target, a few submissions per tick may start (each with a
       probability, so there are queue gaps). A job takes whole nodes, preferring a contiguous
       run from a random start, as a topology-aware scheduler would.
    """

    def __init__(self, rng: random.Random, groups: list[int], *, low: float = 0.40,
                 high: float = 0.90):
        self.rng = rng
        self.groups = groups  # fabric group of each node
        self.node_job: list[Job | None] = [None] * len(groups)
        self.unavailable: set[int] = set()  # rebooting nodes
        self.jobs: dict[int, Job] = {}
        self.busy = 0  # nodes held by jobs
        self.low, self.high = low, high
        self.enabled = True
        self._next_id = 1

    def target(self, t: float) -> float:
        return self.low + (self.high - self.low) * diurnal(t)

    def step(self, t: float, *, warm: bool = False) -> list[str]:
        """Advance to `t`; with `warm`, fill to the target at once with jobs already under way."""
        events = [self.finish(j, t, "finished") for j in list(self.jobs.values()) if j.end <= t]
        if not self.enabled:
            return events
        want = int(self.target(t) * len(self.groups))
        attempts = 1 + min(5, (want - self.busy) // 16)
        misses = 0
        while self.busy < want and (attempts > 0 or (warm and misses < 50)):
            attempts -= 1
            if not warm and self.rng.random() < 0.4:
                continue
            job = self._submit(t, warm, want)
            misses = 0 if job else misses + 1
            if job and not warm:
                events.append(f"job {job.id} ({job.kind}, {job.gpus} GPUs) started")
        return events

    def _submit(self, t: float, warm: bool, want: int) -> Job | None:
        kind = self.rng.choices(KIND_NAMES, KIND_WEIGHTS)[0]
        free = len(self.groups) - self.busy - len(self.unavailable)
        if warm:  # a cluster found mid-day is near its target, not packed by one last big job
            free = min(free, max(1, want - self.busy))
        sizes = [n for n in KINDS[kind][1] if n <= free]
        if not sizes:
            return None
        nodes = self._allocate(self.rng.choice(sizes))
        if nodes is None:
            return None
        job = make_job(self.rng, self._next_id, kind, nodes, t)
        if warm:
            # Already under way: shift its lifetime back by a random share.
            shift = self.rng.uniform(0, job.end - job.start)
            job.start -= shift
            job.end -= shift
        return self.place(job)

    def _allocate(self, size: int) -> list[int] | None:
        n = len(self.groups)
        first = self.rng.randrange(n)
        nodes = []
        for k in range(n):
            i = (first + k) % n
            if self.node_job[i] is None and i not in self.unavailable:
                nodes.append(i)
                if len(nodes) == size:
                    return sorted(nodes)
        return None

    def place(self, job: Job) -> Job:
        """Record `job` on its nodes and work out how much of its traffic leaves each group."""
        self._next_id = max(self._next_id, job.id + 1)
        per_group: dict[int, int] = {}
        for i in job.nodes:
            self.node_job[i] = job
            per_group[self.groups[i]] = per_group.get(self.groups[i], 0) + 1
        # All-to-all-ish collectives: a node's traffic to peers outside its group crosses the spine.
        job.cross = {g: 1 - c / len(job.nodes) for g, c in per_group.items()}
        self.jobs[job.id] = job
        self.busy += len(job.nodes)
        return job

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def finish(self, job: Job, t: float, why: str) -> str:
        for i in job.nodes:
            self.node_job[i] = None
        if self.jobs.pop(job.id, None) is not None:
            self.busy -= len(job.nodes)
        job.end = min(job.end, t)
        return f"job {job.id} ({job.kind}, {job.gpus} GPUs) {why}"
