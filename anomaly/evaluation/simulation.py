"""Play the cluster simulator through the real pipeline on a simulated clock, and score what was found.

`Simulation` is the in-process harness behind ``manage.py scenario_eval``. One run:

1. builds a `Cluster` of N GPUs (with a `ScenarioSet` when given specs) and imports its topology
   with the same action ``manage.py simulate`` uses;
2. steps it from a fixed start time, every `interval_s` simulated seconds; each tick goes where
   the HTTP endpoints would send it, minus only the HTTP: every rack's body is serialised and
   parsed by the ingest API's parser and stored by `write_batch` (one transaction per rack, as
   one request each); the job snapshot by `parse_snapshot` + `do_sync_slurm` (/api/v1/jobs); the
   training bodies by the training endpoint's parser and `do_record_training_steps`. Every
   parser gets the *simulated* time as "now", so its skew and age checks hold as they would live;
3. after each tick, once per simulated minute, rolls up as of the simulated time
   (`run_rollups(now=t)`), then runs each `Every` callback that fell due (the scorers), so a
   detector reading "the state as of t" sees what it would have seen at t;
4. meanwhile `FaultWatch` (`anomaly.evaluation.groundtruth`) collects what the simulator declares it planted
   (`telemetry.simulator.truth`): the latent defects it was built with (weak and hot GPUs, hot
   leaves, marginal cables) and every fault it injects, each with its entity, time and signal
   families. That is the ground truth a scenario-free run's anomalies are held against.

The second half matches the members of recorded `Anomaly` events to the scenarios' ground-truth
lines (`match_scenario`) and to the fault log (`anomaly.evaluation.groundtruth.quiet_precision`). Entities are
compared in the simulator's terms: GPU UUID, ``owner:port``, rack name, job ``sim-<id>`` and
``(job, rank)``; `canonical_entities` maps whatever ids the detectors recorded onto those.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import orjson
from django.conf import settings
from django.db import transaction
from tqdm import tqdm

from anomaly.evaluation.groundtruth import FaultLog, FaultWatch, Precision, Seen, canonical_entities, quiet_precision
from telemetry.api.jobs import parse_snapshot
from telemetry.api.training import do_record_training_steps, parse_training
from telemetry.ingest.documents import parse_json
from telemetry.ingest.schema import TimeParser
from telemetry.ingest.writer import write_batch
from telemetry.rollups import run_rollups
from telemetry.simulator.dynamics import Cluster, Tick
from telemetry.simulator.scenarios import ScenarioSet, Spec
from telemetry.simulator.topology import build_layout, topology_document
from telemetry.slurm.sync import do_sync_slurm
from telemetry.topology import do_import_topology

logger = logging.getLogger(__name__)

COLLECTOR = "scenario-eval"
MINUTE = timedelta(minutes=1)
# The fault log and the quiet run's matching rule live in anomaly.evaluation.groundtruth; named here too, as the
# harness's results carry them.
__all__ = ["Every", "FaultLog", "FaultWatch", "Outcome", "Precision", "RunResult", "Seen", "Simulation",
           "canonical_entities", "match_scenario", "quiet_precision", "truth_targets"]


@dataclass(frozen=True)
class Every:
    """A callback on the simulated clock: `fn(t)` every `seconds`, after that minute's rollup."""

    seconds: float
    fn: Callable[[datetime], object]
    name: str = ""


@dataclass
class RunResult:
    """What one simulated run did: its time range, ground truth, faults and where the time went."""

    start: datetime
    end: datetime  # the last tick
    ticks: int
    truth: list[dict]
    faults: FaultLog
    accepted: int = 0
    rejected: int = 0
    rejections: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # wall seconds per phase
    outputs: dict[str, list] = field(default_factory=dict)  # callback name -> its return values
    errors: dict[str, list[str]] = field(default_factory=dict)  # callback name -> its failures (when tolerated)


# --- the harness ------------------------------------------------------------------------------------
class Simulation:
    """A simulated cluster whose ticks go through the real write paths on a simulated clock (one `run` each)."""

    def __init__(self, *, gpus: int, start: datetime, interval_s: float = 30.0, seed: int = 1,
                 specs: Iterable[Spec] = (), speed: float = 1.0, faults: bool = True,
                 callbacks: Iterable[Every] = (), progress: bool = False, label: str = "simulate",
                 per_request: str = "rack", tolerate_errors: bool = False):
        if start.tzinfo is None:
            raise ValueError("the start time must be timezone-aware (UTC)")
        if interval_s <= 0:
            raise ValueError("the interval must be positive")
        if per_request not in ("rack", "tick"):
            raise ValueError("per_request is 'rack' (one request per rack, as the simulator sends) or 'tick'")
        self.per_request, self.tolerate_errors = per_request, tolerate_errors
        self.errors: dict[str, list[str]] = defaultdict(list)  # callback name -> its failures' messages
        self.start, self.interval = start, timedelta(seconds=interval_s)
        self.callbacks, self.progress, self.label = list(callbacks), progress, label
        specs = list(specs)
        self.scenarios = ScenarioSet(specs, seed=seed, speed=speed) if specs else None
        self.layout = build_layout(gpus, seed)
        self.cluster = Cluster(self.layout, seed=seed, interval=interval_s, faults=faults, scenarios=self.scenarios)
        self.watch = FaultWatch(self.cluster)
        self.seconds: dict[str, float] = defaultdict(float)
        self.outputs: dict[str, list] = defaultdict(list)
        self.counts = {"accepted": 0, "rejected": 0}
        self.rejections: list[str] = []

    def run(self, minutes: float, *, score_after: datetime | None = None) -> RunResult:
        """Step `minutes` simulated minutes; callbacks run only at or after `score_after` (default: start).

        Ticks before `score_after` still write telemetry and roll up: history for the detectors.
        """
        with self._timed("topology"):
            do_import_topology(topology_document(self.layout))
        ticks = int(minutes * 60 // self.interval.total_seconds()) + 1
        score_after = score_after or self.start
        next_minute = self.start
        due = {cb.name or cb.fn.__name__: self.start for cb in self.callbacks}
        t = self.start
        for k in tqdm(range(ticks), desc=self.label, unit="tick", disable=not self.progress, leave=False):
            t = self.start + k * self.interval
            self._tick(t)
            if t >= next_minute:
                with self._timed("rollups"):
                    runs = run_rollups(now=t)
                for r in runs:  # which rollups the time goes to, for the report
                    self.seconds[f"rollup {r.name}"] += r.ms / 1000
                next_minute = _next_boundary(t, MINUTE)
                if t >= score_after:
                    self._callbacks(t, due)
        logger.info("simulated %d ticks of %d GPUs from %s: %s", ticks, self.layout.gpu_count, self.start.isoformat(),
                    {k: round(v, 1) for k, v in self.seconds.items()})
        return RunResult(self.start, t, ticks, self.scenarios.records if self.scenarios else [], self.watch.log,
                         self.counts["accepted"], self.counts["rejected"], self.rejections,
                         dict(self.seconds), dict(self.outputs), dict(self.errors))

    def _callbacks(self, t: datetime, due: dict[str, datetime]) -> None:
        """Run the callbacks that fell due; with `tolerate_errors`, a failing scorer is recorded and the
        run goes on (an evaluation reports a detector that crashes at one minute; it does not die of it)."""
        for cb in self.callbacks:
            name = cb.name or cb.fn.__name__
            if t < due[name]:
                continue
            due[name] = _next_boundary(t, timedelta(seconds=cb.seconds))
            try:
                with self._timed(name), transaction.atomic():  # a failed pass leaves nothing half-written
                    self.outputs[name].append(cb.fn(t))
            except Exception as exc:
                if not self.tolerate_errors:
                    raise
                message = f"{t:%Y-%m-%d %H:%M} {type(exc).__name__}: {exc}"
                if not self.errors[name]:
                    logger.exception("%s failed at %s (later failures are counted, not logged)", name, t)
                self.errors[name].append(message)

    def _tick(self, t: datetime) -> None:
        with self._timed("simulator"):
            tick = self.cluster.step(t)
            self.watch.observe(tick)
        times = TimeParser(t, settings.INGEST_MAX_FUTURE_SKEW, settings.RETENTION["raw"])
        with self._timed("ingest"):
            self._ingest(tick, times)
        if tick.jobs:
            with self._timed("jobs"):  # through JSON, as the endpoint receives it (times as strings)
                jobs, allocations = parse_snapshot(orjson.loads(orjson.dumps(tick.jobs)))
                do_sync_slurm(jobs, allocations, now=t, complete=tick.jobs.get("complete") is True)
        with self._timed("training"):
            for body in tick.training + tick.steps:
                source, external, rows = parse_training(body, times)
                do_record_training_steps(source, external, rows)

    def _ingest(self, tick: Tick, times: TimeParser) -> None:
        """Each request's body serialised, then parsed, validated and written as the ingest API does.

        Per rack, one request each, as the simulator sends them; or (`per_request="tick"`) the whole
        tick in one request, which the API takes as long as it fits its body limit: one transaction
        instead of one per rack, a big cluster's cheaper way through the same writer.
        """
        bodies = [tick.body(b) for b in tick.batches if b["gpus"] or b["ports"] or b["power"] or b.get("events")]
        if self.per_request == "tick" and bodies:
            events = [e for b in tick.batches for e in b["events"]]
            bodies = [{"time": tick.iso, "gpus": tick.records("gpus"), "migs": [], "ports": tick.records("ports"),
                       "power": tick.records("power"), **({"events": events} if events else {})}]
        for body in bodies:
            raw = orjson.dumps(body)
            if len(raw) > settings.INGEST_MAX_BODY_BYTES:
                raise ValueError(f"a {len(raw)}-byte request is over the API's body limit; send one per rack")
            result = write_batch(parse_json(raw, times), collector=COLLECTOR, fmt="json", body_bytes=len(raw))
            self.counts["accepted"] += result.accepted
            self.counts["rejected"] += result.rejected
            for r in result.rejections[:1]:  # the first reason of each request is enough to debug with
                reason = str(r.get("reason", r) if isinstance(r, dict) else r)
                if len(self.rejections) < 20 and reason not in self.rejections:
                    self.rejections.append(reason)

    @property
    def population(self) -> dict[str, int]:
        """How many entities of each kind the cluster has: the denominators of `Outcome.noise`."""
        return {"gpu": self.layout.gpu_count, "port": len(self.cluster.fabric.ports), "rack": len(self.layout.racks)}

    @contextmanager
    def _timed(self, phase: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - t0


def _next_boundary(t: datetime, step: timedelta) -> datetime:
    """The first multiple of `step` since the epoch after `t` (the rollups' buckets are aligned the same way)."""
    s = max(1, int(step.total_seconds()))
    return datetime.fromtimestamp((int(t.timestamp()) // s + 1) * s, UTC)


# --- matching anomalies to a scenario's ground-truth line ----------------------------------------------
def truth_targets(truth: dict, layout) -> set[tuple[str, object]]:
    """Every (entity kind, canonical id) whose anomaly detects this scenario."""
    kind, entity, details = truth["entity_kind"], truth["entity"], truth.get("details") or {}
    if kind == "gpu":
        return {("gpu", entity)}
    if kind == "port":  # a flap shows on both ends; a congested leaf on any of its ports
        ports = [entity, details.get("peer"), *details.get("uplinks", []), *details.get("downlinks", [])]
        return {("port", p) for p in ports if p}
    if kind == "rack":
        return {("rack", entity)}
    if kind == "cooling_loop":  # the loop has no telemetry entity: its racks and their GPUs carry it
        racks = set(details.get("racks", []))
        gpus = {g.uuid for n in layout.nodes if layout.racks[n.rack].name in racks for g in n.gpus}
        return {("rack", r) for r in racks} | {("gpu", u) for u in gpus}
    job = f"sim-{entity}"
    if truth["scenario"] in ("straggler", "straggler-hw"):  # the slow rank, by rank or by its GPU; not just "the job"
        return {("rank", (job, details["rank"])), ("gpu", details["gpu_uuid"])}
    ranks = [r["rank"] for r in details.get("ranks", [])]
    return {("job", job)} | {("rank", (job, r)) for r in ranks}


@dataclass(frozen=True)
class Outcome:
    """How one scenario was detected: when, by which detector, and the failure-risk lead time."""

    scenario: str
    entity: str
    starts_at: datetime
    fails_at: datetime | None
    detected: bool
    ttd_s: float | None  # first matching anomaly's start - the scenario's start
    first_kind: str = ""
    lead_s: float | None = None  # fails_at - first failure_risk event on the GPU (GPU scenarios)
    matching: int = 0
    elsewhere: int = 0  # anomalies on other entities in the same run
    noise: float | None = None  # share of the other entities of the truth's kind flagged after the start
    first_summary: str = ""
    risk_elsewhere: int = 0  # other GPUs that got a failure_risk event after the start


# A cooling loop's row holds many GPUs, some flagged for unrelated reasons: only heat counts there,
# as a temperature above, clocks below (thermal slowdown) or throttle reasons set. Field -> sign.
HEAT = {"gpu_temp": 1, "memory_temp": 1, "sm_clock": -1, "throttle_reasons": 0}


def match_scenario(truth: dict, seen: list[Seen], layout, *, until: datetime | None = None,
                   population: dict[str, int] | None = None) -> Outcome:
    """Match one ground-truth line against the anomalies of its run.

    Only anomalies that start at or after the scenario's start count (one open before it was not
    caused by it); `until` cuts off anomalies after the run's end. With `population` (entities per
    kind in the run), `noise` says how often the detectors flagged *other* entities of the truth's
    kind in the same time: a hit means little where they flag half the fleet.
    """
    starts = datetime.fromisoformat(truth["starts_at"])
    fails = datetime.fromisoformat(truth["fails_at"]) if truth.get("fails_at") else None
    targets = truth_targets(truth, layout)
    window = [s for s in seen if s.started_at >= starts and (until is None or s.started_at <= until)]
    hits = sorted((s for s in window if _hit(truth, targets, s)), key=lambda s: s.started_at)
    lead = None
    if fails is not None and truth["entity_kind"] == "gpu":
        risks = [s.started_at for s in hits if s.kind == "failure_risk"]
        lead = (fails - risks[0]).total_seconds() if risks else None
    first = hits[0] if hits else None
    return Outcome(truth["scenario"], _label(truth), starts, fails, first is not None,
                   (first.started_at - starts).total_seconds() if first else None,
                   first.kind if first else "", lead, len(hits), len(window) - len(hits),
                   _noise(truth, targets, window, population), first.summary if first else "",
                   len({s.entity for s in window if s.kind == "failure_risk" and ("gpu", s.entity) not in targets}))


def _hit(truth: dict, targets: set, s: Seen) -> bool:
    if (s.entity_kind, s.entity) not in targets:
        return False
    return truth["entity_kind"] != "cooling_loop" or s.entity_kind == "rack" or _heat(s)


def _heat(s: Seen) -> bool:
    return any(f in HEAT and (HEAT[f] == 0 or HEAT[f] * d > 0) for f, d in s.signals)


def _noise(truth: dict, targets: set, window: list[Seen], population: dict[str, int] | None) -> float | None:
    """Distinct other entities of the truth's kind flagged in the window, over how many there are."""
    kind = {"gpu": "gpu", "port": "port", "rack": "rack", "cooling_loop": "gpu"}.get(truth["entity_kind"], "")
    others = (population or {}).get(kind, 0) - sum(k == kind for k, _ in targets)
    if others <= 0:
        return None
    flagged = {s.entity for s in window if s.entity_kind == kind and (kind, s.entity) not in targets}
    return len(flagged) / others


def _label(truth: dict) -> str:
    """The scenario's entity as an operator finds it: jobs by their scheduler id, a straggler by rank."""
    if truth["entity_kind"] != "job":
        return truth["entity"]
    rank = (truth.get("details") or {}).get("rank")
    return f"sim-{truth['entity']}" + (f" rank {rank}" if rank is not None else "")
