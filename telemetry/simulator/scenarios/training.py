"""Training-job stories: a straggling rank (reporting its compute time, or nothing) and a diverging run.

Each starts its own two-node pretraining job at arming (before the scheduler fills the
cluster), held for the whole story so no random fault ends it early. A rank is
``node position * 8 + GPU index`` within the job.

Divergence produces what a training-metrics endpoint would receive (per rank: step, loss,
NaN count). The whole series is drawn when the scenario is armed, so the ground truth holds
it exactly; each tick hands the points that fell due to `Tick.training` as bodies for
``POST /api/v1/training``, which the runner sends. The endpoint knows jobs by scheduler key,
so the job is ``slurm:sim-<simulator job id>`` there (``details.training_job``).
"""

from __future__ import annotations

import math

from telemetry.simulator.gpus import SLOW_CAUSES
from telemetry.simulator.scenarios.base import Scenario, iso

MINUTE = 60.0
JOB_NODES = 2
MARGIN_MIN = 120.0  # the job outlives its story by this much


class _JobScenario(Scenario):
    """A story on a job of its own."""

    entity_kind = "job"
    STORY_S = 30 * MINUTE

    def choose(self, taken: set[int]) -> None:
        minutes = self.spec.start_min + self.STORY_S / self.speed / MINUTE + MARGIN_MIN
        self.job = self.start_job(taken, JOB_NODES, minutes)
        self.ranks = [(i, g) for i in self.job.nodes for g in self.cluster.gpus[i]]
        self.details = {"kind": self.job.kind, "hosts": [self.cluster.layout.nodes[i].hostname
                                                         for i in self.job.nodes]}


class Straggler(_JobScenario):
    """One rank's GPU computes 1.15× slower (thermal or power throttling, or a fault no counter
    shows). The job is synchronous: every rank's step takes the slow rank's compute plus the
    all-reduce, so every rank reports the same, longer step time. What differs is the slow rank's
    compute time, which this job's trainer reports (CUDA events, docs/training.md), and its GPU's
    SM activity: busy while its peers idle in the collective."""

    name = "straggler"
    SLOWDOWN = 1.15

    def choose(self, taken: set[int]) -> None:
        super().choose(taken)
        self.job.reports_compute = True
        self.rank = self.rng.randrange(len(self.ranks))
        self.cause = self.rng.choice(SLOW_CAUSES)
        _, g = self.ranks[self.rank]
        self.gpu, self.host = g, g.host
        self.details.update({"rank": self.rank, "gpu_uuid": g.spec.uuid, "slowdown": self.SLOWDOWN,
                             "cause": self.cause, "reports": self.reports})

    @property
    def reports(self) -> str:
        return "step and compute time"

    def before(self, t: float, dt: float) -> list[str]:
        if self.elapsed(t) >= 0 and self.gpu.pace == 1.0:
            self.gpu.pace, self.gpu.slow_cause = 1 / self.SLOWDOWN, self.cause
            return [f"scenario {self.name}: rank {self.rank} of job {self.entity} computes "
                    f"{self.SLOWDOWN}x slower ({self.cause})"]
        return []


class StragglerHardware(Straggler):
    """The same slow rank in a job that reports nothing at all: only the GPUs' telemetry, joined
    to the job through the allocation ledger, can tell."""

    name = "straggler-hw"

    def choose(self, taken: set[int]) -> None:
        super().choose(taken)
        self.job.own_metrics = True  # and it sends none

    @property
    def reports(self) -> str:
        return "nothing"


class Divergence(_JobScenario):
    """The loss spikes (a bad batch, too high a learning rate) and a few minutes later the
    ranks start counting NaNs, one after another."""

    name = "divergence"
    SPIKE_S, REPORT_S, STEP_S = 10 * MINUTE, 30.0, 1.5
    fails_after_s = 13 * MINUTE  # the first NaN
    STORY_S = 20 * MINUTE

    def choose(self, taken: set[int]) -> None:
        super().choose(taken)
        self.host = self.ranks[0][1].host
        self.job.own_metrics = True  # its steps are the series below, not the job feed's
        self.series = self._series()
        self.next_point = 0
        self.key = f"slurm:sim-{self.entity}"
        self.details.update({
            "training_job": self.key,
            "ranks": [{"rank": k, "host": g.host, "gpu_uuid": g.spec.uuid} for k, (_, g) in enumerate(self.ranks)],
            "spike_at": iso(self.at(self.SPIKE_S)), "step_time_s": self.STEP_S, "series": self.series,
        })

    def _series(self) -> list[dict]:
        """Every report of the story: its time, step, and per rank the loss (None once NaN)."""
        rng, ranks = self.rng, len(self.ranks)
        step0 = rng.randrange(20_000, 80_000)
        nan_from = [self.fails_after_s + rng.uniform(0, 90) for _ in range(ranks)]
        nan_from[rng.randrange(ranks)] = self.fails_after_s  # one rank sees it first
        out = []
        for k in range(int(self.STORY_S // self.REPORT_S) + 1):
            s = k * self.REPORT_S
            step = step0 + int(s / self.STEP_S)
            base = 1.6 + 2.4 * math.exp(-step / 40_000)
            if s >= self.SPIKE_S:  # the loss doubles at once, then climbs faster and faster
                base *= 2 + math.expm1((s - self.SPIKE_S) / (1.5 * MINUTE))
            nans = [max(0, int((s - n) // self.REPORT_S) + 1) if s >= n else 0 for n in nan_from]
            loss = [None if nan else round(base * (1 + 0.01 * rng.gauss(0, 1)), 4) for nan in nans]
            out.append({"time": iso(self.at(s)), "step": step, "loss": loss, "nan_count": nans,
                        "_t": self.at(s)})
        return out

    def after(self, tick) -> None:
        t = tick.time.timestamp()
        while self.next_point < len(self.series) and self.series[self.next_point]["_t"] <= t:
            point = self.series[self.next_point]
            self.next_point += 1
            tick.training.append({"job": self.key, "records": [
                {"rank": k, "time": point["time"], "step": point["step"], "step_time_s": self.STEP_S,
                 "loss": point["loss"][k], "nan_count": point["nan_count"][k]}
                for k in range(len(self.ranks))
            ]})

    def truth(self) -> dict:
        record = super().truth()
        record["details"] = {**self.details, "series": [{k: v for k, v in p.items() if k != "_t"}
                                                        for p in self.series]}
        return record
