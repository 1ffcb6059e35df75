"""Scripted failure scenarios on the simulated cluster, with recorded ground truth.

``manage.py simulate --scenario NAME[@START_MINUTES][:ENTITY]`` arms NAME on ENTITY (seeded
when omitted) to start START_MINUTES after the first tick. On that first tick every scenario
picks its entity and its ground-truth line is written (JSON lines), before any of its
telemetry exists, so a detector can be scored against it later:

    {"scenario", "entity_kind", "entity", "host", "starts_at", "fails_at", "details"}

Entities: a GPU as its UUID or ``HOST/INDEX`` (a bare HOST lets the seed pick the GPU); a
node as its HOST; a port as ``OWNER:PORT``; a leaf, rack or cooling loop (or row) by name; a job scenario takes a
HOST as its first node. The same seed, specs and tick times give the same stories and the same
ground truth.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path

import orjson

from telemetry.simulator.scenarios.base import Scenario, ScenarioError, Spec
from telemetry.simulator.scenarios.gpu import FallenOffBus, GpuDegrading, GpuSilent, NvlinkCrc
from telemetry.simulator.scenarios.network import CongestedUplink, IbLinkFlap, PortDegraded
from telemetry.simulator.scenarios.node import NodeDown
from telemetry.simulator.scenarios.site import CoolingFailure, RackOverCap
from telemetry.simulator.scenarios.training import Divergence, Straggler, StragglerHardware

__all__ = ["SCENARIOS", "ScenarioError", "ScenarioSet", "Spec", "parse_spec"]

SCENARIOS: dict[str, type[Scenario]] = {cls.name: cls for cls in (
    GpuDegrading, CoolingFailure, NvlinkCrc, IbLinkFlap, CongestedUplink, Straggler, StragglerHardware,
    RackOverCap, Divergence, FallenOffBus, GpuSilent, NodeDown, PortDegraded,
)}
SPEC_RE = re.compile(r"(?P<name>[a-z0-9-]+)(?:@(?P<start>\d+(?:\.\d+)?))?(?::(?P<entity>.+))?")


def parse_spec(text: str) -> Spec:
    """``NAME[@START_MINUTES][:ENTITY]`` as a `Spec`; ValueError names the known scenarios."""
    m = SPEC_RE.fullmatch(text.strip())
    if m is None or m["name"] not in SCENARIOS:
        raise ValueError(f"unknown scenario {text!r}: expected NAME[@START_MINUTES][:ENTITY] with NAME one of "
                         + ", ".join(SCENARIOS))
    return Spec(m["name"], float(m["start"] or 0), m["entity"])


class ScenarioSet:
    """The scenarios of one run: armed on the cluster's first tick, applied on every tick.

    `truth` is the ground-truth file, or a function from the first tick's epoch time to it
    (the command's default names the file after that time), or None to keep it in memory.
    """

    def __init__(self, specs: list[Spec], *, seed: int = 1, speed: float = 1.0,
                 truth: Path | Callable[[float], Path] | None = None):
        if speed <= 0:
            raise ValueError("the scenario speed must be positive")
        self.specs, self.seed, self.speed, self.truth = list(specs), seed, speed, truth
        self.active: list[Scenario] = []
        self.records: list[dict] = []
        self.truth_path: Path | None = None

    def arm(self, cluster, t: float) -> list[str]:
        """Place every scenario and write the ground truth; returns one line per scenario."""
        taken: set[int] = set()
        for k, spec in enumerate(self.specs):
            # Its own generator: one scenario's draws never shift another's, nor the cluster's.
            rng = random.Random(f"breakwater-scenario:{self.seed}:{k}:{spec.name}")
            scenario = SCENARIOS[spec.name](cluster, spec, rng, self.speed, t)
            scenario.choose(taken)
            self.active.append(scenario)
        self.records = [s.truth() for s in self.active]
        self._write(t)
        lines = [f"scenario {r['scenario']} armed on {r['entity_kind']} {r['entity']}, starts {r['starts_at']}, "
                 f"fails {r['fails_at'] or 'never'}" for r in self.records]
        return ([f"scenario ground truth in {self.truth_path}"] if self.truth_path else []) + lines

    def _write(self, t: float) -> None:
        if self.truth is None:
            return
        path = self.truth(t) if callable(self.truth) else Path(self.truth)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as out:
            for record in self.records:
                out.write(orjson.dumps(record) + b"\n")
        self.truth_path = path

    def before(self, t: float, dt: float) -> list[str]:
        """Let every scenario change the state before this tick's records are built."""
        return [line for s in self.active for line in s.before(t, dt)]

    def after(self, tick) -> None:
        """Let every scenario add events (and training points) to the finished tick."""
        for s in self.active:
            s.after(tick)
