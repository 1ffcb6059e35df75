"""What every scenario shares: its spec, its clock, entity lookup and the ground-truth record.

Two clocks. A scenario starts `start_min` minutes after the cluster's first tick, on the
simulation's own clock. From there its story runs on *scenario seconds*: real seconds times
`speed`, so ``--scenario-speed 60`` plays an hour of degradation in a minute. Discrete events
that make up the story (single-bit errors, CRC errors, remaps) are drawn per scenario second,
so a compressed story holds the same events; physical rates (PortXmitWait ticks per second,
thermal lags, power) stay in real seconds, because a counter cannot wait longer than the time
that passed.

Each scenario draws from its own `random.Random`, seeded from the run's seed and its position
on the command line, so adding a scenario never changes what another one does, and a run with
none draws exactly what it drew before scenarios existed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from telemetry.simulator.dynamics import Cluster, Tick
    from telemetry.simulator.gpus import SimGpu
    from telemetry.simulator.jobs import Job

ENTITY_KINDS = ("gpu", "node", "port", "rack", "job", "cooling_loop")


@dataclass(frozen=True, slots=True)
class Spec:
    """One ``--scenario NAME[@START_MINUTES][:ENTITY]`` argument."""

    name: str
    start_min: float = 0.0
    entity: str | None = None


def iso(t: float) -> str:
    """Epoch seconds as RFC 3339 UTC with a Z, the way the ingest API writes times."""
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


class Scenario:
    """A scripted story on one entity. Subclasses set the class attributes and override
    `choose` (pick the entity, at arming), `before` (change state before the records are built)
    and `after` (add to the finished tick)."""

    name: ClassVar[str] = ""
    entity_kind: ClassVar[str] = ""
    fails_after_s: ClassVar[float | None] = None  # scenario seconds from the start to the failure

    def __init__(self, cluster: Cluster, spec: Spec, rng: random.Random, speed: float, t0: float):
        self.cluster, self.spec, self.rng, self.speed = cluster, spec, rng, speed
        self.start = t0 + spec.start_min * 60
        self.entity, self.host = "", None
        self.details: dict = {}

    # --- the clock ------------------------------------------------------------------------
    def elapsed(self, t: float) -> float:
        """Scenario seconds since the start at epoch `t` (negative before it)."""
        return (t - self.start) * self.speed

    def at(self, s: float) -> float:
        """Epoch time of scenario second `s`."""
        return self.start + s / self.speed

    @property
    def fails_at(self) -> float | None:
        return None if self.fails_after_s is None else self.at(self.fails_after_s)

    # --- the hooks --------------------------------------------------------------------------
    def choose(self, taken: set[int]) -> None:
        """Pick the entity (the spec's, else a seeded one not in `taken`) and set up state."""
        raise NotImplementedError

    def before(self, t: float, dt: float) -> list[str]:
        return []

    def after(self, tick: Tick) -> None:
        return None

    def truth(self) -> dict:
        """The ground-truth line for this scenario."""
        fails = self.fails_at
        return {"scenario": self.name, "entity_kind": self.entity_kind, "entity": self.entity,
                "host": self.host, "starts_at": iso(self.start),
                "fails_at": None if fails is None else iso(fails), "details": self.details}

    # --- entity helpers ---------------------------------------------------------------------
    def pick_nodes(self, taken: set[int], count: int = 1) -> list[int]:
        """`count` consecutive nodes (the spec's host first, else seeded) that no scenario holds."""
        nodes = self.cluster.layout.nodes
        if self.spec.entity and self.spec.entity.split("/")[0] in self.cluster.node_index:
            first = self.cluster.node_index[self.spec.entity.split("/")[0]]
            starts = [first]
        else:
            starts = [i for i in range(len(nodes) - count + 1)
                      if not taken.intersection(range(i, i + count))]
            starts = [self.rng.choice(starts)] if starts else []
        if not starts or starts[0] + count > len(nodes):
            raise ScenarioError(f"{self.name}: no room for {count} free node(s)")
        picked = list(range(starts[0], starts[0] + count))
        taken.update(picked)
        return picked

    def pick_gpu(self, taken: set[int]) -> tuple[int, SimGpu]:
        """(node index, GPU) named by the spec (a UUID or HOST/INDEX), else seeded."""
        entity = self.spec.entity
        if entity and entity.startswith("GPU-"):
            for i, gpus in enumerate(self.cluster.gpus):
                for g in gpus:
                    if g.spec.uuid == entity:
                        taken.add(i)
                        return i, g
            raise ScenarioError(f"{self.name}: no GPU {entity}")
        i = self.pick_nodes(taken)[0]
        index = int(entity.split("/")[1]) if entity and "/" in entity else self.rng.randrange(8)
        if not 0 <= index < len(self.cluster.gpus[i]):
            raise ScenarioError(f"{self.name}: no GPU {index} on {self.cluster.layout.nodes[i].hostname}")
        return i, self.cluster.gpus[i][index]

    def hold_gpu(self, taken: set[int]) -> tuple[int, SimGpu]:
        """Pick a GPU, hold its node (no random faults there) and record it as the entity."""
        i, g = self.pick_gpu(taken)
        self.cluster.held.add(i)
        self.entity, self.host = g.spec.uuid, g.host
        self.details = {"gpu_index": g.spec.index, "pci_bus_id": g.spec.pci_bus_id}
        return i, g

    def start_job(self, taken: set[int], nodes: int, minutes: float) -> Job:
        """Start a pretraining job on `nodes` held nodes, running through the whole scenario."""
        picked = self.pick_nodes(taken, nodes)
        cluster = self.cluster
        hosts = [cluster.layout.nodes[i].hostname for i in picked]
        for i in picked:
            cluster.held.add(i)
            if (busy := cluster.scheduler.node_job[i]) is not None:  # armed late: preempt
                cluster.scheduler.finish(busy, self.start, "preempted for a scenario", "PREEMPTED")
        t0 = datetime.fromtimestamp(self.start - self.spec.start_min * 60, UTC)
        job_id = cluster.start_job(hosts, "pretrain", t0, minutes=minutes)
        job = cluster.scheduler.jobs[job_id]
        self.entity, self.host = str(job_id), hosts[0]
        return job

    def occupy(self, i: int, minutes: float = 60.0) -> None:
        """Run a single-node job on node `i` from the first tick through the fault and `minutes` past it,
        so the fault strikes a node at work, as faults do; its id goes into the details."""
        cluster = self.cluster
        if (busy := cluster.scheduler.node_job[i]) is not None:
            self.details["job"] = busy.id
            return
        t0 = self.start - self.spec.start_min * 60
        until = (self.fails_at or self.start) - t0 + minutes * 60
        host = cluster.layout.nodes[i].hostname
        self.details["job"] = cluster.start_job([host], "finetune", datetime.fromtimestamp(t0, UTC),
                                                minutes=until / 60)

    def kill_job(self, i: int, t: float, why: str) -> list[str]:
        """The job on node `i`, if any, dies; the node is drained (no new work lands on it)."""
        scheduler = self.cluster.scheduler
        scheduler.unavailable.add(i)
        job = scheduler.node_job[i]
        return [] if job is None else [scheduler.finish(job, t, why, "FAILED")]

    def rack_of(self, i: int) -> int:
        return self.cluster.layout.nodes[i].rack


class ScenarioError(ValueError):
    """A scenario cannot be placed (an unknown entity, no free nodes)."""
