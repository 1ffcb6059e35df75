"""Gang-scheduled jobs on whole nodes, and a scheduler that follows a diurnal load curve.

A job's *character* (how hard it drives the tensor cores, how much memory it holds, how much it
talks over NVLink and InfiniBand) is drawn once from its kind, so every GPU of a job looks
alike and different jobs look different. Jobs pause periodically (checkpoints, evaluation)
and warm up after they start, which is what real training utilisation looks like.

Who submitted a job, its QoS and priority, its end state and its training step time are drawn
from the scheduler's second generator (`meta`), so this bookkeeping never shifts the draws that
shape the telemetry. A job's Slurm-style life: PENDING in the queue, RUNNING on its nodes, then
COMPLETED / FAILED / CANCELLED / TIMEOUT, NODE_FAIL or PREEMPTED (requeued on the next tick).
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

PENDING, RUNNING, PREEMPTED = "PENDING", "RUNNING", "PREEMPTED"
# A data-parallel step computes for 70-90 % of its time and spends the rest in the all-reduce that
# overlap did not hide (typical of large dense models on NVLink + InfiniBand).
COMPUTE_SHARE = (0.70, 0.90)
REPORTS_COMPUTE = 0.5  # share of training jobs whose trainer measures compute time per rank
TRAINING_KINDS = frozenset({"pretrain", "finetune"})  # kinds that report per-rank training steps
# kind: (job names, accounts, seconds per training step or None)
KIND_META: dict[str, tuple] = {
    "pretrain": (("llm-70b-pretrain", "llm-8b-pretrain", "moe-pretrain"), ("llm-core",), (0.9, 2.8)),
    "finetune": (("sft-chat", "rlhf-ppo", "lora-code"), ("applied-ml", "llm-core"), (0.25, 0.9)),
    "inference": (("serve-chat", "batch-embed"), ("serving",), None),
    "hpc": (("cfd-les", "md-gromacs", "climate-ens"), ("hpc-science",), None),
    "debug": (("jupyter", "nccl-test", "smoke"), ("applied-ml", "llm-core", "research"), None),
}
USERS = ("alee", "bkumar", "cnguyen", "dmuller", "eokafor", "fsato", "gromero", "hzhang", "isilva", "jpark")
QOS = {"high": (1, 30_000), "normal": (6, 10_000), "low": (3, 1_000)}  # weight, base priority
OUTCOMES = {"COMPLETED": 86, "FAILED": 6, "CANCELLED": 5, "TIMEOUT": 3}  # how jobs end, in %
ENDINGS = {"COMPLETED": "finished", "FAILED": "failed", "CANCELLED": "was cancelled", "TIMEOUT": "timed out"}
PREEMPT_AFTER_S = 300.0  # a high-QoS job waits this long before it preempts low-QoS work
BACKLOG = 0.30  # demand beyond the target at the peak of the day, as a share of the nodes


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
    size: int = 0  # nodes asked for (its nodes are [] while it waits)
    state: str = RUNNING  # the Slurm state name
    submit: float = 0.0
    name: str = ""
    user: str = ""
    account: str = ""
    partition: str = "gpu"
    qos: str = "normal"
    priority: int = 0
    outcome: str = "COMPLETED"  # how it ends when its time is up
    restarts: int = 0  # requeues after preemption
    left: float = 0.0  # run time still owed when it was preempted
    step_s: float = 0.0  # seconds per training step at full pace (training kinds only)
    steps: float = 0.0  # training steps done
    # Share of a step spent computing (forward and backward) when every rank keeps full pace; the
    # rest is the gradients' all-reduce, which no rank can finish before the slowest one joins it.
    compute_share: float = 0.8
    reports_compute: bool = False  # its ranks report compute time (CUDA events), not only step time
    wall: float = 1.0  # this tick's step time as a multiple of step_s (`feed.lock_step`)
    own_metrics: bool = False  # a scenario reports this job's training metrics itself

    @property
    def gpus(self) -> int:
        return self.size * 8

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
             minutes: float | None = None, *, size: int | None = None) -> Job:
    """A job of `kind` on `nodes` (or, still queued, of `size` nodes), its character drawn from the
    kind's ranges."""
    (_, _, mins, util, sm, tensor, dram, fp64, power, mem, nvl, ib, pcie) = KINDS[kind]
    u = rng.uniform
    size = len(nodes) if size is None else size
    if minutes is None:
        # Log-uniform: many short jobs, a few long ones.
        minutes = math.exp(u(math.log(mins[0]), math.log(mins[1])))
    return Job(
        job_id, kind, nodes, start, start + minutes * 60, u(*util), u(*sm), u(*tensor), u(*dram),
        u(*fp64), u(*power), u(*mem), u(*nvl), u(*ib) if size > 1 else 0.0, u(*pcie),
        warmup=u(30, 120), period=u(15, 60) * 60, pause=u(20, 90), size=size,
    )


class Scheduler:
    """Runs a queue of gang jobs on whole nodes so that the share of busy nodes follows the
    diurnal curve.

    1. Jobs past their end time finish and free their nodes; jobs preempted on the previous
       tick are requeued (PENDING again, submitted now, owing the rest of their run time).
    2. The queue starts in priority order as long as its head fits. A high-QoS head that has
       waited PREEMPT_AFTER_S preempts the youngest low-QoS jobs when that makes room; otherwise
       a later job starts only if it fits and ends before the head could start (backfill
       scheduling).
    3. While busy plus queued nodes are under the target (plus a backlog that grows towards the
       peak of the day), a few submissions per tick arrive (each with a probability, so there
       are gaps) and join the queue. Around the peak demand exceeds the cluster and jobs wait;
       at night only a job too big for the free nodes does. A job takes whole nodes, preferring
       a contiguous run from a random start, as a topology-aware scheduler would.
    On the first tick (`warm`) the cluster fills to the target at once with jobs already under
    way, and a few submissions are left waiting.
    """

    def __init__(self, rng: random.Random, groups: list[int], *, low: float = 0.40,
                 high: float = 0.90, meta: random.Random | None = None, held: set[int] | None = None):
        self.rng = rng
        self.meta = meta if meta is not None else random.Random("breakwater-jobs")
        self.held = held if held is not None else set()  # scenario nodes: their jobs are never preempted
        self.groups = groups  # fabric group of each node
        self.node_job: list[Job | None] = [None] * len(groups)
        self.unavailable: set[int] = set()  # rebooting nodes
        self.jobs: dict[int, Job] = {}  # running
        self.queue: list[Job] = []  # pending, highest priority first
        self.preempted: list[Job] = []  # preempted this tick, requeued on the next
        self.ended: list[Job] = []  # ended for good, until `drain_ended`
        self.busy = 0  # nodes held by jobs
        self.low, self.high = low, high
        self.enabled = True
        self.max_size = max(1, len(groups) // 2)  # the largest job the partition accepts
        self._next_id = 1

    def target(self, t: float) -> float:
        return self.low + (self.high - self.low) * diurnal(t)

    @property
    def queued(self) -> int:
        """Nodes the queue asks for."""
        return sum(j.size for j in self.queue)

    def free(self) -> int:
        return len(self.groups) - self.busy - len(self.unavailable)

    def number_from(self, t: float) -> None:
        """Number jobs from a base taken from the clock (seconds), as Slurm keeps counting across
        restarts: a restarted simulator never reuses the ids of the jobs it reported before."""
        self._next_id = max(self._next_id, int(t) % 100_000_000)

    def step(self, t: float, *, warm: bool = False) -> list[str]:
        """Advance to `t`; with `warm`, fill to the target at once with jobs already under way."""
        events = [self.finish(j, t, ENDINGS[j.outcome], j.outcome) for j in list(self.jobs.values()) if j.end <= t]
        self._requeue(t)
        if not self.enabled:
            return events
        want = int(self.target(t) * len(self.groups))
        events += self.run_queue(t)
        demand = want if warm else want + int(BACKLOG * len(self.groups) * diurnal(t))
        queued = self.queued
        attempts = 1 + min(5, (demand - self.busy - queued) // 16)
        misses = 0
        while self.busy + queued < demand and (attempts > 0 or (warm and misses < 50)):
            attempts -= 1
            if not warm and self.rng.random() < 0.4:
                continue
            job = self._warm_job(t, want) if warm else self._arrive(t)
            misses = 0 if job else misses + 1
            if job and not warm:
                events += self.run_queue(t)
            queued = self.queued
        if warm:
            self._leave_waiting(t)
        return events

    def _arrive(self, t: float) -> Job | None:
        """A new submission joins the queue (it starts at once if it is first and fits)."""
        kind = self.rng.choices(KIND_NAMES, KIND_WEIGHTS)[0]
        sizes = [n for n in KINDS[kind][1] if n <= self.max_size]
        if not sizes:
            return None
        job = make_job(self.rng, self.new_id(), kind, [], t, size=self.rng.choice(sizes))
        self.describe(job, submit=math.floor(t - self.meta.uniform(0.5, 5.0)))
        self.submit(job)
        return job

    def _warm_job(self, t: float, want: int) -> Job | None:
        kind = self.rng.choices(KIND_NAMES, KIND_WEIGHTS)[0]
        # A cluster found mid-day is near its target, not packed by one last big job.
        free = min(self.free(), max(1, want - self.busy))
        sizes = [n for n in KINDS[kind][1] if n <= free]
        if not sizes:
            return None
        nodes = self._allocate(self.rng.choice(sizes))
        if nodes is None:
            return None
        job = make_job(self.rng, self._next_id, kind, nodes, t)
        # Already under way: shift its lifetime back by a random share.
        shift = self.rng.uniform(0, job.end - job.start)
        job.start -= shift
        job.end -= shift
        waited = min(7200.0, self.meta.expovariate(1 / 600))
        self.describe(job, submit=math.floor(job.start - waited))
        if job.step_s:  # the steps it made so far
            job.steps = max(0.0, shift - job.warmup) / job.step_s
        return self.place(job)

    def _leave_waiting(self, t: float) -> None:
        """A cluster found mid-day has a queue: one to three jobs submitted a while ago."""
        for _ in range(self.meta.randint(1, 3)):
            kind = self.meta.choices(KIND_NAMES, KIND_WEIGHTS)[0]
            sizes = [n for n in KINDS[kind][1] if n <= self.max_size]
            if sizes:
                job = make_job(self.meta, self.new_id(), kind, [], t, size=self.meta.choice(sizes))
                self.describe(job, submit=math.floor(t - self.meta.uniform(60, 1800)))
                self.submit(job)

    def describe(self, job: Job, *, submit: float) -> Job:
        """Who submitted `job` and how it will end, drawn from `meta`."""
        m = self.meta
        names, accounts, step_s = KIND_META[job.kind]
        job.submit, job.name, job.user = submit, m.choice(names), m.choice(USERS)
        job.account = m.choice(accounts)
        job.qos = m.choices(tuple(QOS), [w for w, _ in QOS.values()])[0]
        job.priority = QOS[job.qos][1] + m.randrange(2000)
        job.partition = "debug" if job.kind == "debug" else "gpu"
        job.outcome = m.choices(tuple(OUTCOMES), tuple(OUTCOMES.values()))[0]
        job.step_s = round(m.uniform(*step_s), 3) if step_s else 0.0
        job.compute_share = round(m.uniform(*COMPUTE_SHARE), 3)
        job.reports_compute = m.random() < REPORTS_COMPUTE
        return job

    # --- the queue ----------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Put `job` in the queue (in priority order); it starts when the scheduler next runs the queue."""
        job.state, job.nodes = PENDING, []
        self.queue.append(job)
        self.queue.sort(key=lambda j: (-j.priority, j.submit, j.id))

    def run_queue(self, t: float) -> list[str]:
        """Start what the queue allows at `t`: its head when it fits (after preempting for it, if it
        may), else what can be backfilled. Returns an event line per start and preemption."""
        events: list[str] = []
        while self.queue:
            head = self.queue[0]
            if head.size <= self.free():
                events.append(self._start(head, t))
                continue
            preempted = self._preempt_for(head, t)
            if preempted:
                events += [*preempted, self._start(head, t)]
                continue
            return events + self._backfill(t, head)
        return events

    def _start(self, job: Job, t: float) -> str:
        """Take `job` (which fits) off the queue and run it from `t`."""
        run = job.end - job.start
        self.queue.remove(job)
        job.nodes = self._allocate(job.size) or []
        job.start, job.end = t, t + run
        self.place(job)
        waited = f" after {(t - job.submit) / 60:.0f} min in the queue" if t - job.submit >= 60 else ""
        return f"job {job.id} ({job.kind}, {job.gpus} GPUs) started{waited}"

    def _backfill(self, t: float, head: Job) -> list[str]:
        """Start later jobs that fit now and end before the head's earliest start."""
        free, shadow = self.free(), t
        for j in sorted(self.jobs.values(), key=lambda j: j.end):
            if free >= head.size:
                break
            free, shadow = free + len(j.nodes), j.end
        events = []
        for job in list(self.queue[1:]):
            if job.size <= self.free() and t + (job.end - job.start) <= shadow:
                events.append(self._start(job, t))
        return events

    def _preempt_for(self, head: Job, t: float) -> list[str]:
        """QoS preemption: the youngest low-QoS jobs make room for a high-QoS job that has waited."""
        if head.qos != "high" or t - head.submit < PREEMPT_AFTER_S:
            return []
        victims, room = [], self.free()
        for job in sorted(self.jobs.values(), key=lambda j: -j.start):
            if room >= head.size:
                break
            if job.qos == "low" and not self.held.intersection(job.nodes):
                victims.append(job)
                room += len(job.nodes)
        if room < head.size:
            return []
        return [self.finish(v, t, f"preempted by job {head.id}", PREEMPTED) for v in victims]

    def _requeue(self, t: float) -> None:
        for job in self.preempted:
            job.restarts += 1
            job.submit, job.start, job.end = t, t, t + job.left
            self.submit(job)
        self.preempted = []

    def drain_ended(self) -> list[Job]:
        """Jobs that ended for good since the last call."""
        ended, self.ended = self.ended, []
        return ended

    # --- nodes --------------------------------------------------------------------------------
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
        if not job.user:  # started directly (a scenario's job): it was submitted just now
            self.describe(job, submit=math.floor(job.start))
        job.size, job.state = len(job.nodes), RUNNING
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

    def finish(self, job: Job, t: float, why: str, state: str = "COMPLETED") -> str:
        """End `job` at `t` in Slurm `state`; a PREEMPTED job is requeued on the next tick."""
        for i in job.nodes:
            self.node_job[i] = None
        if self.jobs.pop(job.id, None) is not None:
            self.busy -= len(job.nodes)
            job.left = max(0.0, job.end - t)
            job.state = state
            (self.preempted if state == PREEMPTED else self.ended).append(job)
        job.end = min(job.end, t)
        return f"job {job.id} ({job.kind}, {job.gpus} GPUs) {why}"
