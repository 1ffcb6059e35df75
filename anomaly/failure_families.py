"""Degradation families: GPU failures of many shapes planted in the simulated fleet, with their ground truth.

The failure model must not be judged on the template it was trained on, so the simulated fleets that
train and evaluate it carry failures drawn from families, each with randomised parameters:

=================  ==========================================================================  ============
family             precursor (drives the simulated GPU's own state)                            failure
=================  ==========================================================================  ============
``sbe-ramp``       single-bit ECC errors climb from a start to an end rate; 1 in 40 SBEs       DBE, XID 48
                   remaps a row (the simulator's own ratio for random SBEs)
``remap-burst``    bursts of correctable row remaps (and a few SBEs each), more bursts as it   row-remap
                   goes on                                                                     failure
``thermal-drift``  the cooling degrades: GPU and HBM thermal resistance grow, so the GPU runs  XID 79
                   hotter at the same power (and throttles once past 85 °C)
``power-drift``    a failing power stage: idle power (leakage) and power for the same work     XID 79
                   grow
``nvlink-growth``  NVLink CRC flit errors (5 % data, 2 % replay errors with them) grow         XID 79
``sudden``         nothing: no precursor at all                                                XID 79, 48
                                                                                               or 95
=================  ==========================================================================  ============

Every precursor family draws (`RANGES`): how long its precursors last (10 minutes to 24 hours,
log-uniform), a curve shape (`SHAPES`: linear, convex, exponential, concave or a step, each with its own
parameter) that takes the precursor's intensity from 0 at its onset to 1 at the failure, a noise level
(each tick's intensity is multiplied by a log-normal factor of that σ), and its own rates or factors.
The parameters are the simulator's assumptions, chosen to span slow and fast, faint and loud precursors;
none was tuned against the failure model.

A failed GPU's job dies and its node is drained; the GPU stops reporting at once after XID 79, and ten
minutes after the other failures (taken out of service). The stories do not hold their nodes: the
simulator's random faults (SBEs, replays, CRC errors, XIDs) strike there as anywhere, so a planted GPU's
precursors come with the fleet's usual noise, and its neighbours are healthy GPUs like any other. A
random failure that strikes a planted GPU before its own is declared as what it was (see
`anomaly.failure_sim`).

Ground truth (`FamilySet.records`, written when the stories are armed, before any telemetry exists):
one line per planted failure: family, GPU, host, precursor start (None for sudden failures), planned
failure time, failure mode and every drawn parameter.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from telemetry.simulator.faults import poisson
from telemetry.simulator.scenarios.base import Scenario, Spec, iso
from telemetry.simulator.scenarios.gpu import kmsg_xid79

HOUR = 3600.0
FAMILIES: tuple[str, ...] = ("sbe-ramp", "remap-burst", "thermal-drift", "power-drift", "nvlink-growth")
SUDDEN = "sudden"
BACKGROUND = "background"  # a failure the simulator's random faults caused: declared after the run
UNFORESEEABLE = frozenset({SUDDEN, BACKGROUND})
TAKEN_OUT_AFTER_S = 600.0  # a GPU that failed without falling off the bus stops reporting after this


@dataclass(frozen=True)
class Range:
    """A parameter's range: uniform, log-uniform (`log`) or a uniform integer (`integer`)."""

    lo: float
    hi: float
    log: bool = False
    integer: bool = False

    def draw(self, rng: random.Random) -> float:
        if self.integer:
            return float(rng.randint(int(self.lo), int(self.hi)))
        if self.log:
            return math.exp(rng.uniform(math.log(self.lo), math.log(self.hi)))
        return rng.uniform(self.lo, self.hi)

    def __contains__(self, value: float) -> bool:
        return self.lo <= value <= self.hi


DURATION = Range(600.0, 24 * HOUR, log=True)  # seconds of precursors before the failure
NOISE = Range(0.0, 0.8)  # σ of the per-tick log-normal factor on the intensity
# Intensity curves on u = share of the precursor elapsed (0 at onset, 1 at failure), each from 0 to 1.
SHAPES: dict[str, Range | None] = {
    "linear": None,
    "convex": Range(1.5, 4.0),  # u ** k: quiet for most of the precursor, then a climb
    "exponential": Range(2.0, 8.0),  # (e^(a u) - 1) / (e^a - 1)
    "concave": Range(2.0, 6.0),  # (1 - e^(-a u)) / (1 - e^-a): loud early, then a plateau
    "step": Range(0.1, 0.9),  # nothing until u = c, then full intensity within 5 % of the precursor
}
RANGES: dict[str, dict[str, Range]] = {
    "sbe-ramp": {"start_per_h": Range(0.5, 10.0, log=True), "end_per_h": Range(60.0, 3000.0, log=True)},
    "remap-burst": {"bursts_per_h": Range(0.5, 6.0, log=True), "remaps_per_burst": Range(1, 8, integer=True),
                    "sbe_per_burst": Range(0, 20, integer=True)},
    "thermal-drift": {"resistance_factor": Range(1.25, 2.0)},
    "power-drift": {"idle_extra_w": Range(15.0, 150.0, log=True), "work_power_factor": Range(1.0, 1.25)},
    "nvlink-growth": {"start_per_h": Range(0.0, 5.0), "end_per_h": Range(100.0, 20_000.0, log=True)},
    SUDDEN: {},
}
# Failure mode by family; a sudden failure draws one with these weights.
FAILURE_MODES: dict[str, tuple[tuple[str, float], ...]] = {
    "sbe-ramp": (("xid48", 1.0),), "remap-burst": (("remap_failure", 1.0),), "thermal-drift": (("xid79", 1.0),),
    "power-drift": (("xid79", 1.0),), "nvlink-growth": (("xid79", 1.0),),
    SUDDEN: (("xid79", 0.6), ("xid48", 0.25), ("xid95", 0.15)),
}
REMAP_PER_SBE = 1 / 40  # as the simulator's random SBEs (telemetry.simulator.dynamics)
NVLINK_DATA_PER_FLIT, NVLINK_REPLAY_PER_FLIT = 0.05, 0.02  # as the nvlink-crc scenario


def intensity(shape: str, k: float, u: float) -> float:
    """The precursor's intensity (0 to 1) at share `u` of its duration, for a shape and its parameter."""
    u = min(max(u, 0.0), 1.0)
    if shape == "linear":
        return u
    if shape == "convex":
        return u ** k
    if shape == "exponential":
        return math.expm1(k * u) / math.expm1(k)
    if shape == "concave":
        return -math.expm1(-k * u) / -math.expm1(-k)
    if shape == "step":
        return min(max((u - k) / 0.05, 0.0), 1.0)
    raise ValueError(f"unknown shape {shape!r}; one of {', '.join(SHAPES)}")


@dataclass(frozen=True)
class Planted:
    """One planted failure before it is placed: what, when, and its drawn parameters."""

    family: str
    fails_at: float  # epoch seconds
    duration_s: float  # 0 for a sudden failure
    mode: str
    shape: str = "none"
    shape_param: float = 0.0
    noise: float = 0.0
    params: dict[str, float] = field(default_factory=dict)

    @property
    def onset(self) -> float:
        return self.fails_at - self.duration_s


def draw_planted(rng: random.Random, family: str, *, first_cut: float, span_s: float, step_s: float) -> Planted:
    """A failure of `family` with parameters drawn from `RANGES`, failing within the cut span.

    A precursor starts at least one cut step after the first cut, so the evaluation sees the GPU
    before its trouble begins (an alert on its first row would hide when the risk crossed)."""
    if family not in RANGES:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(RANGES)}")
    modes, weights = zip(*FAILURE_MODES[family], strict=True)
    mode = rng.choices(modes, weights)[0]
    if family == SUDDEN:
        return Planted(family, rng.uniform(first_cut + step_s, first_cut + span_s), 0.0, mode)
    duration = DURATION.draw(rng)
    earliest = first_cut + step_s + duration
    if earliest > first_cut + span_s:
        raise ValueError(f"a cut span of {span_s / HOUR:g} h cannot hold a {duration / HOUR:.1f} h precursor")
    shape = rng.choice(list(SHAPES))
    k = SHAPES[shape].draw(rng) if SHAPES[shape] else 0.0
    params = {name: r.draw(rng) for name, r in RANGES[family].items()}
    return Planted(family, rng.uniform(earliest, first_cut + span_s), duration, mode, shape, k,
                   NOISE.draw(rng), params)


def plan_failures(rng: random.Random, count: int, *, first_cut: float, span_s: float, step_s: float,
                  sudden_share: float, families: Sequence[str] = FAMILIES, rotate: int = 0) -> list[Planted]:
    """`count` failures: round(count * sudden_share) sudden ones, the rest spread evenly over `families`
    (starting at family `rotate`, so fleets that rotate cover every family equally)."""
    if not 0 <= sudden_share <= 1:
        raise ValueError(f"sudden_share must be in [0, 1], got {sudden_share}")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    sudden = round(count * sudden_share)
    names = [SUDDEN] * sudden + [families[(rotate + k) % len(families)] for k in range(count - sudden)]
    return [draw_planted(rng, name, first_cut=first_cut, span_s=span_s, step_s=step_s) for name in names]


class FamilyStory(Scenario):
    """One planted failure acting on one simulated GPU's state, tick by tick."""

    entity_kind = "gpu"

    def __init__(self, cluster, planted: Planted, rng: random.Random, t0: float, host: str | None = None):
        super().__init__(cluster, Spec(planted.family, (planted.onset - t0) / 60, host), rng, 1.0, t0)
        self.planted, self.name = planted, planted.family
        self.fails_after_s = planted.duration_s
        self.failed_at: float | None = None
        self.pending: list[dict] = []

    def choose(self, taken: set[int]) -> None:
        # Not held: the simulator's random faults strike a planted GPU's node as any other, so its
        # neighbours are a fair sample of healthy GPUs and its own precursors come with the usual noise.
        self.node, self.gpu = self.pick_gpu(taken)
        g = self.gpu
        self.entity, self.host = g.spec.uuid, g.host
        self.base = {"rth": g.rth, "rth_mem": g.rth_mem, "idle_w": g.idle_w, "eff": g.eff}

    def truth(self) -> dict:
        p = self.planted
        return {"family": p.family, "gpu": self.entity, "host": self.host, "gpu_index": self.gpu.spec.index,
                "precursor_start": iso(p.onset) if p.duration_s else None, "fails_at": iso(p.fails_at),
                "failure": p.mode, "duration_s": round(p.duration_s, 1), "shape": p.shape,
                "shape_param": round(p.shape_param, 4), "noise": round(p.noise, 4),
                "params": {k: round(v, 4) for k, v in p.params.items()}}

    def before(self, t: float, dt: float) -> list[str]:
        g, p = self.gpu, self.planted
        if self.failed_at is not None:
            if not g.dead and t - self.failed_at >= TAKEN_OUT_AFTER_S:
                g.dead = True
            return []
        s = t - p.onset
        if s < 0 or g.dead:
            return []
        if t >= p.fails_at:
            return self._fail(t)
        level = intensity(p.shape, p.shape_param, s / p.duration_s)
        if p.noise:
            level *= math.exp(self.rng.gauss(0.0, p.noise) - p.noise ** 2 / 2)
        self._drive(level, min(dt, s) if dt else 0.0)
        return []

    def _drive(self, level: float, exposure_s: float) -> None:
        """Move the GPU's state to `level` of the family's precursor over `exposure_s` seconds."""
        g, q, family, rng = self.gpu, self.planted.params, self.planted.family, self.rng
        hours = exposure_s / HOUR
        if family == "sbe-ramp":
            n = poisson(rng, (q["start_per_h"] + (q["end_per_h"] - q["start_per_h"]) * level) * hours)
            g.ecc_sbe_vol += n
            g.ecc_sbe_agg += n
            g.remapped_rows_correctable += poisson(rng, n * REMAP_PER_SBE)
        elif family == "remap-burst":
            for _ in range(poisson(rng, q["bursts_per_h"] * level * hours)):
                g.remapped_rows_correctable += rng.randint(1, int(q["remaps_per_burst"]))
                sbe = rng.randint(0, int(q["sbe_per_burst"]))
                g.ecc_sbe_vol += sbe
                g.ecc_sbe_agg += sbe
        elif family == "thermal-drift":
            factor = 1 + (q["resistance_factor"] - 1) * level
            g.rth, g.rth_mem = self.base["rth"] * factor, self.base["rth_mem"] * factor
        elif family == "power-drift":
            g.idle_w = self.base["idle_w"] + q["idle_extra_w"] * level
            g.eff = self.base["eff"] * (1 + (q["work_power_factor"] - 1) * level)
        elif family == "nvlink-growth":
            flits = poisson(rng, (q["start_per_h"] + (q["end_per_h"] - q["start_per_h"]) * level) * hours)
            g.nvlink_crc_flit_errors += flits
            g.nvlink_crc_data_errors += poisson(rng, flits * NVLINK_DATA_PER_FLIT)
            g.nvlink_replay_errors += poisson(rng, flits * NVLINK_REPLAY_PER_FLIT)

    def _fail(self, t: float) -> list[str]:
        g, mode = self.gpu, self.planted.mode
        self.failed_at = t
        if mode == "xid79":
            g.dead = True
            self.pending.append(kmsg_xid79(g, t))
        elif mode == "xid48":
            g.ecc_dbe_vol += 1
            g.ecc_dbe_agg += 1
            g.remapped_rows_uncorrectable += 1
            g.remap_pending = 1
            g.xid = 48
        elif mode == "xid95":
            g.xid = 95
        elif mode == "remap_failure":
            g.remap_failure = 1
        else:
            raise ValueError(f"unknown failure mode {mode!r}")
        lines = [f"{self.planted.family}: {mode} on {self.host} GPU {g.spec.index}"]
        return lines + self.kill_job(self.node, t, f"killed by {mode} on {self.host}")

    def after(self, tick) -> None:
        if self.pending:
            tick.batches[self.rack_of(self.node)]["events"].extend(self.pending)
            self.pending = []


class FamilySet:
    """The planted failures of one simulated fleet, with the interface `Cluster` expects of its scenarios
    (`arm` on the first tick, `before` and `after` on every tick). Each story draws from its own seeded
    generator, so adding one never changes another's draws nor the cluster's."""

    def __init__(self, planted: Sequence[Planted], *, seed: int, hosts: Sequence[str] | None = None):
        """`hosts`: the node of each planted failure (drawn by the fleet); seeded free nodes without."""
        if hosts is not None and len(hosts) != len(planted):
            raise ValueError(f"{len(planted)} planted failures but {len(hosts)} hosts")
        self.planted, self.seed, self.hosts = list(planted), seed, hosts
        self.active: list[FamilyStory] = []
        self.records: list[dict] = []

    def arm(self, cluster, t: float) -> list[str]:
        taken: set[int] = set()
        for k, p in enumerate(self.planted):
            story = FamilyStory(cluster, p, random.Random(f"breakwater-failure-family:{self.seed}:{k}"), t,
                                self.hosts[k] if self.hosts else None)
            story.choose(taken)
            self.active.append(story)
        self.records = [s.truth() for s in self.active]
        return [f"{r['family']} planted on {r['host']} GPU {r['gpu_index']}, fails {r['fails_at']}"
                for r in self.records]

    def before(self, t: float, dt: float) -> list[str]:
        return [line for s in self.active for line in s.before(t, dt)]

    def after(self, tick) -> None:
        for s in self.active:
            s.after(tick)
