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

With ``faults=True`` (what ``simulate`` does) the file declares everything else the simulator plants
too (`telemetry.simulator.truth`): the latent defects the cluster was built with, on the first tick,
then every fault it injects as it happens, one line each, appended tick by tick.
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
from telemetry.simulator.truth import FaultRecorder, latent_defects

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
    With `faults`, the latent defects and injected faults are declared as well (`declared`).
    """

    def __init__(self, specs: list[Spec], *, seed: int = 1, speed: float = 1.0,
                 truth: Path | Callable[[float], Path] | None = None, faults: bool = False):
        if speed <= 0:
            raise ValueError("the scenario speed must be positive")
        self.specs, self.seed, self.speed, self.truth = list(specs), seed, speed, truth
        self.active: list[Scenario] = []
        self.records: list[dict] = []  # the scenarios' lines
        self.declared: list[dict] = []  # latent defects and injected faults (with `faults`)
        self.faults = faults
        self.recorder: FaultRecorder | None = None
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
        if self.faults:
            self.declared = latent_defects(cluster, t)
            self.recorder = FaultRecorder(cluster)
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
            for record in [*self.records, *self.declared]:
                out.write(orjson.dumps(record) + b"\n")
        self.truth_path = path

    def _append(self, records: list[dict]) -> None:
        self.declared += records
        if self.truth_path is not None and records:
            with self.truth_path.open("ab") as out:
                out.write(b"".join(orjson.dumps(r) + b"\n" for r in records))

    def before(self, t: float, dt: float) -> list[str]:
        """Let every scenario change the state before this tick's records are built."""
        return [line for s in self.active for line in s.before(t, dt)]

    def after(self, tick) -> None:
        """Let every scenario add events (and training points) to the finished tick; then declare
        the faults the simulator injected in it (with `faults`)."""
        for s in self.active:
            s.after(tick)
        if self.recorder is not None:
            self._append(self.recorder.observe(tick))
