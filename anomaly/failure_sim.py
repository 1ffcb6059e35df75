"""Simulated fleets for the failure model: the simulator runs, its GPU records become training rows.

`simulate_fleet` runs one simulated fleet (`telemetry.simulator.dynamics.Cluster`, its random faults
included) with failures planted from the degradation families (`anomaly.failure_families`), records
every GPU's readings tick by tick (`_SimRecorder`), reduces them the way the rollups and the ingest
fault deriver would (counter deltas with resets, max, last, XID changes, DBE growth, kernel-log events),
then to `HISTORY_FIELDS` at each cut time, through the same `failure_features` as the database's rows.
A test ingests a simulated fleet through the real writer and rollups and checks that the database
loader and these windows give the same aggregates.

A fleet runs `warmup_h` hours before its first cut (so the day windows are full) and `span_h` hours of
cuts; every planted failure falls among the cuts. Fleet `offset` shifts the clock and the GPU keys, so
fleets stack into one history whose time splits never mix two fleets' rows at one cut.

Raw age and location are NaN: every fleet reuses the same slots, so a model shown them would learn
"the slot that failed in run 1" (it did: a healthy GPU scored 0.30 for its slot alone). What the
rows carry instead is `survival_log_hazard`, the Titan prior's hazard for the node's drawn age and its
height in the rack (`anomaly.failure_prior`), which also weights where the planted failures strike.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np

from anomaly.failure import (
    HISTORY_FIELDS,
    HOT_GPU_C,
    HOT_MEMORY_C,
    HOUR,
    IDLE_UTIL,
    Events,
    FailureFrame,
    event_history,
    failure_episodes,
    failure_labels,
    with_peer_excess,
)
from anomaly.failure_data import Progress
from anomaly.failure_families import BACKGROUND, FAMILIES, FamilySet, plan_failures
from anomaly.failure_prior import SurvivalPrior
from telemetry.simulator.dynamics import Cluster

SIM_FIELDS = ("ecc_sbe_agg", "ecc_sbe_vol", "ecc_dbe_vol", "ecc_dbe_agg", "remapped_rows_correctable",
              "remapped_rows_uncorrectable", "row_remap_pending", "row_remap_failure", "gpu_temp", "memory_temp",
              "nvlink_crc_flit_errors", "nvlink_crc_data_errors", "pcie_replay", "energy_mj", "xid", "power_w",
              "gpu_util")
SIM_EPOCH = datetime(2026, 1, 5, tzinfo=UTC)  # the simulated clock; any hour-aligned time would do
UNKNOWN_IN_SIMULATION = ("age_days", "row_number", "rack_position", "u_position", "gpu_index")
MAX_AGE_DAYS = 3 * 365.0  # simulated nodes are up to three years old


@dataclass
class SimFleet:
    """One simulated fleet's rows and ground truth.

    `truth` holds a line per failing GPU: the planted failures (as `FamilyStory.truth` writes them) and
    the ones the simulator's random faults caused (family "background"), each with the GPU's frame
    `key` and `observed_at`, the first failure event the telemetry shows. A random failure that struck a
    planted GPU before its own failure makes that GPU's line "background" (the planted story is kept
    under "preempted").
    """

    frame: FailureFrame
    truth: list[dict]
    step_s: float
    fleet: int

    @property
    def family_of(self) -> dict[int, str]:
        return {int(r["key"]): r["family"] for r in self.truth}


def simulate_fleet(*, gpus: int = 1024, failures: int = 32, sudden_share: float = 0.2,
                   families: Sequence[str] = FAMILIES, warmup_h: float = 24.0, span_h: float = 48.0,
                   horizon: timedelta = timedelta(hours=24), tick_s: float = 300.0,
                   step: timedelta = timedelta(minutes=15), seed: int = 1, offset: int = 0,
                   prior: SurvivalPrior | None = None, progress: Progress | None = None) -> SimFleet:
    """Run one fleet of `gpus` GPUs with `failures` planted failures (a `sudden_share` of them without
    precursors, the rest spread over `families`) and return its rows and ground truth.

    With a `prior`, every node gets an age (uniform over `MAX_AGE_DAYS`), the planted failures strike
    nodes drawn with the prior's daily hazard for their age and height as weights (without
    replacement), and the rows carry `survival_log_hazard`; without one they strike at random and the
    feature is NaN."""
    hours = warmup_h + span_h
    t0 = SIM_EPOCH + offset * timedelta(hours=hours)
    first = (t0 + timedelta(hours=warmup_h)).timestamp()
    rng = random.Random(f"breakwater-failure-fleet:{seed}")
    planted = plan_failures(rng, failures, first_cut=first, span_s=span_h * HOUR, step_s=step.total_seconds(),
                            sudden_share=sudden_share, families=families, rotate=offset)
    cluster = Cluster.build(gpus, seed=seed, interval=tick_s)
    age, vertical = node_ages(cluster.layout, rng), node_heights(cluster.layout)
    hosts = _place(rng, cluster.layout, len(planted), prior.daily_hazard_at(age, vertical) if prior else None)
    stories = FamilySet(planted, seed=seed, hosts=hosts)
    cluster.scenarios = stories
    # Only GPU records are read: skip the fabric's rates and port records (a third of a tick's time).
    # Neither draws random numbers, so the fleet's faults and stories are the same as with them.
    cluster.fabric.step = cluster.fabric.records = lambda *args: None
    ticks = int(hours * HOUR / tick_s) + 1
    record = _SimRecorder(cluster, ticks, key_base=offset * 1_000_000)
    for k in range(ticks):
        record.tick(k, cluster.step(t0 + timedelta(seconds=k * tick_s)))
        if progress and k % 50 == 0:
            progress(f"fleet {offset + 1}", k, ticks)
    cuts = np.arange(first, first + span_h * HOUR + 1, step.total_seconds())
    hazard = None
    if prior is not None:
        def hazard(t: float) -> np.ndarray:
            return prior.log_hazard_24h(age[record.node] + (t - t0.timestamp()) / 86_400, vertical[record.node])
    frame = record.frame(cuts, horizon.total_seconds(), hazard)
    truth = _truth(record, stories, frame, tick_s)
    for line in truth:  # where the prior put it: the node's age at the first tick and its height in the rack
        node = int(record.node[line["key"] - int(record.keys[0])])
        line.update(node_age_days=round(float(age[node]), 1), node_height=round(float(vertical[node]), 3))
    return SimFleet(frame, truth, step.total_seconds(), offset)


def node_ages(layout, rng: random.Random) -> np.ndarray:
    """Each node's age in days at the fleet's first tick (its GPUs were installed with it)."""
    return np.array([rng.uniform(0, MAX_AGE_DAYS) for _ in layout.nodes])


def node_heights(layout) -> np.ndarray:
    """Each node's rank among its rack's nodes by U position, over their count: [0, 1), bottom first."""
    by_rack: dict[int, list[tuple[int, int]]] = {}
    for i, n in enumerate(layout.nodes):
        by_rack.setdefault(n.rack, []).append((n.u, i))
    out = np.zeros(len(layout.nodes))
    for members in by_rack.values():
        for rank, (_, i) in enumerate(sorted(members)):
            out[i] = rank / len(members)
    return out


def _place(rng: random.Random, layout, count: int, weights: np.ndarray | None) -> list[str]:
    """`count` distinct hosts, drawn with `weights` (uniform when None), without replacement."""
    nodes = list(range(len(layout.nodes)))
    if count > len(nodes):
        raise ValueError(f"{count} planted failures need as many nodes; the fleet has {len(nodes)}")
    w = [1.0] * len(nodes) if weights is None else [float(x) for x in weights]
    picked = []
    for _ in range(count):
        k = rng.choices(range(len(nodes)), weights=w)[0]
        picked.append(layout.nodes[nodes.pop(k)].hostname)
        w.pop(k)
    return picked


def _truth(record: _SimRecorder, stories: FamilySet, frame: FailureFrame, tick_s: float) -> list[dict]:
    """A line per failing GPU: its planted failure, or the random fault that failed it first."""
    first: dict[int, float] = {}
    for g, t in zip(*frame.episodes, strict=True):
        first.setdefault(int(g), float(t))
    lines = []
    for r in stories.records:
        key = int(record.keys[record.col[r["gpu"]]])
        seen = first.pop(key, None)
        planned = datetime.fromisoformat(r["fails_at"]).timestamp()
        line = {**r, "key": key, "observed_at": None if seen is None else _iso(seen)}
        if seen is not None and seen < planned - tick_s:
            line = {"family": BACKGROUND, "gpu": r["gpu"], "key": key, "precursor_start": None,
                    "fails_at": _iso(seen), "observed_at": _iso(seen), "failure": "simulator random fault",
                    "preempted": r}
        lines.append(line)
    base = int(record.keys[0])
    lines += [{"family": BACKGROUND, "gpu": record.uuid[g - base], "key": g, "precursor_start": None,
               "fails_at": _iso(t), "observed_at": _iso(t), "failure": "simulator random fault"}
              for g, t in sorted(first.items(), key=lambda kv: kv[1])]
    return lines


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(float(ts), UTC).isoformat().replace("+00:00", "Z")


class _SimRecorder:
    """The simulated fleet's GPU records as (tick, GPU) arrays, and the events ingest would derive."""

    def __init__(self, cluster, ticks: int, key_base: int):
        flat = [(i, g) for i, gs in enumerate(cluster.gpus) for g in gs]
        self.col = {g.spec.uuid: c for c, (_, g) in enumerate(flat)}
        self.uuid = [g.spec.uuid for _, g in flat]
        self.node = np.array([i for i, _ in flat], dtype=np.int64)
        self.keys = key_base + np.arange(len(flat), dtype=np.int64)
        self.values = np.full((len(SIM_FIELDS), ticks, len(flat)), np.nan)
        self.times = np.zeros(ticks)
        self.kmsg: list[tuple[int, float, str, int]] = []

    def tick(self, k: int, tick) -> None:
        self.times[k] = tick.time.timestamp()
        records = tick.records("gpus")
        cols = [self.col[r["uuid"]] for r in records]
        rows = [[r["fields"][n] for n in SIM_FIELDS] for r in records]
        if rows:
            self.values[:, k, cols] = np.array(rows, dtype=float).T
        for b in tick.batches:
            self.kmsg += [(self.col[e["gpu_uuid"]], self.times[k], e["kind"], int(e.get("code") or 0))
                          for e in b["events"]]

    def field(self, name: str) -> np.ndarray:
        return self.values[SIM_FIELDS.index(name)]

    def frame(self, cuts: np.ndarray, horizon_s: float, hazard=None) -> FailureFrame:
        """Rows at each cut; `hazard(t)` gives every column's survival_log_hazard at t (NaN without)."""
        events = _sim_events(self)
        windows = _SimWindows(self)
        frames = []
        for t in cuts:
            rows, values = windows.at(t)
            values.update(event_history(rows, events, t))
            values.update({k: np.full(len(rows), np.nan) for k in UNKNOWN_IN_SIMULATION})
            values["survival_log_hazard"] = hazard(t)[rows] if hazard else np.full(len(rows), np.nan)
            y = failure_labels(rows, events, t, horizon_s)
            frames.append(FailureFrame({n: values[n] for n in HISTORY_FIELDS}, self.keys[rows],
                                       np.full(len(rows), t), y, np.ones(len(rows))))
        frame = FailureFrame.concat(frames)
        events.gpu = self.keys[events.gpu]
        frame.episodes = failure_episodes(events, horizon_s)
        return frame


def _ffill_index(v: np.ndarray) -> np.ndarray:
    """Per (tick, GPU), the tick of the newest reading at or before it (0 before the first)."""
    idx = np.where(np.isnan(v), 0, np.arange(len(v))[:, None])
    return np.maximum.accumulate(idx, axis=0)


def _previous(v: np.ndarray) -> np.ndarray:
    """Per (tick, GPU), the GPU's previous reading (NaN when it has none): the ingest's last value."""
    filled = np.take_along_axis(v, _ffill_index(v), axis=0)
    return np.vstack([np.full((1, v.shape[1]), np.nan), filled[:-1]])


def _delta(v: np.ndarray) -> np.ndarray:
    """Counter steps as the rollups take them: a drop is a reset and the new reading counts from zero."""
    prev = _previous(v)
    with np.errstate(invalid="ignore"):
        return np.where(v >= prev, v - prev, np.where(v < prev, v, np.nan))


def _sum2(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(a) & np.isnan(b), np.nan, np.nan_to_num(a) + np.nan_to_num(b))


def _sim_events(rec: _SimRecorder) -> Events:
    """GPU events as ingest records them: derived from each record against the GPU's previous one
    (a new XID code, DBE growth, a remap failure), plus kernel-log events; a repeat of an open event
    merges into it, and a reset (energy or volatile ECC counter dropping) closes the GPU's events."""
    f = rec.field
    xid, dbe, rf = f("xid"), f("ecc_dbe_vol"), f("row_remap_failure")
    p_xid, p_dbe, p_rf = _previous(xid), _previous(dbe), _previous(rf)
    with np.errstate(invalid="ignore"):
        reset = (f("energy_mj") < _previous(f("energy_mj"))) | (f("ecc_sbe_vol") < _previous(f("ecc_sbe_vol"))) \
            | (dbe < p_dbe)
        sightings = [(k, g, "xid", int(xid[k, g])) for k, g in zip(*np.nonzero((xid > 0) & (xid != p_xid)),
                                                                     strict=True)]
        sightings += [(k, g, "ecc_dbe", 0) for k, g in zip(*np.nonzero((dbe > np.nan_to_num(p_dbe)) & ~reset),
                                                            strict=True)]
        sightings += [(k, g, "row_remap_failure", 0) for k, g in zip(*np.nonzero((rf == 1) & (p_rf != 1)),
                                                                      strict=True)]
    tick_of = {t: k for k, t in enumerate(rec.times)}
    sightings += [(tick_of[t], g, kind, code) for g, t, kind, code in rec.kmsg]
    # Per tick, resets first (they close what was open by then), then sightings merge or open.
    steps = sorted([(k, 0, g, "", 0) for k, g in zip(*np.nonzero(reset), strict=True)]
                   + [(k, 1, g, kind, code) for k, g, kind, code in sightings])
    rows, open_now = [], set()
    for k, sighting, g, kind, code in steps:
        if not sighting:
            open_now = {key for key in open_now if key[0] != g}
        elif (g, kind, code) not in open_now:
            open_now.add((g, kind, code))
            rows.append((g, rec.times[k], kind, code))
    return Events.from_rows(rows)


class _SimWindows:
    """The rollup aggregates of HISTORY_FIELDS at any cut time, from the recorder's arrays."""

    def __init__(self, rec: _SimRecorder):
        f, self.times, self.node = rec.field, rec.times, rec.node
        d = {name: _delta(f(name)) for name in ("ecc_sbe_agg", "ecc_sbe_vol", "remapped_rows_correctable",
                                                 "remapped_rows_uncorrectable", "nvlink_crc_flit_errors",
                                                 "nvlink_crc_data_errors", "pcie_replay")}
        steps = {"sbe": np.where(np.isnan(d["ecc_sbe_agg"]), d["ecc_sbe_vol"], d["ecc_sbe_agg"]),
                 "remaps": _sum2(d["remapped_rows_correctable"], d["remapped_rows_uncorrectable"]),
                 "crc": _sum2(d["nvlink_crc_flit_errors"], d["nvlink_crc_data_errors"]), "pcie": d["pcie_replay"]}
        # Running sums (and counts of non-NULL steps, for SQL's NULL sum) with a leading zero row.
        self.sums = {k: _cumsum0(np.nan_to_num(v)) for k, v in steps.items()}
        self.counts = {k: _cumsum0(~np.isnan(v)) for k, v in steps.items()}
        self.reported = _cumsum0(~np.isnan(f("energy_mj")))
        self.temps = f("gpu_temp"), f("memory_temp")
        with np.errstate(invalid="ignore"):
            self.hot = (self.temps[0] >= HOT_GPU_C) | (self.temps[1] >= HOT_MEMORY_C)
        lasts = {"sbe_total": "ecc_sbe_agg", "dbe_total": "ecc_dbe_agg", "remapped_correctable":
                 "remapped_rows_correctable", "remapped_uncorrectable": "remapped_rows_uncorrectable",
                 "remap_pending": "row_remap_pending"}
        self.lasts = {k: (f(v), _ffill_index(f(v))) for k, v in lasts.items()}
        self.util, self.power = f("gpu_util"), f("power_w")

    def _sum(self, name: str, a: int, b: int) -> np.ndarray:
        n = self.counts[name][b] - self.counts[name][a]
        return np.where(n > 0, self.sums[name][b] - self.sums[name][a], np.nan)

    def at(self, t: float) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(GPU columns that reported in the hour before t, their aggregates)."""
        h0 = t // HOUR * HOUR
        a1, a24, b = np.searchsorted(self.times, [t - HOUR, h0 - 24 * HOUR, t])
        rows = np.flatnonzero(self.reported[b] - self.reported[a1] > 0)
        v = {"sbe_1h": self._sum("sbe", a1, b), "sbe_24h": self._sum("sbe", a24, b),
             "remap_growth_24h": self._sum("remaps", a24, b), "nvlink_crc_1h": self._sum("crc", a1, b),
             "nvlink_crc_24h": self._sum("crc", a24, b), "pcie_replay_24h": self._sum("pcie", a24, b)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: a GPU silent all day
            v["gpu_temp_max_24h"] = np.nanmax(self.temps[0][a24:b], axis=0) if b > a24 else np.nan
            v["memory_temp_max_24h"] = np.nanmax(self.temps[1][a24:b], axis=0) if b > a24 else np.nan
            for name, x in (("power_avg_1h", self.power), ("gpu_temp_avg_1h", self.temps[0]),
                            ("memory_temp_avg_1h", self.temps[1])):
                v[name] = np.nanmean(x[a1:b], axis=0) if b > a1 else np.nan
        hours = (self.times[a24:b] // HOUR).astype(np.int64)
        starts = np.flatnonzero(np.r_[True, hours[1:] != hours[:-1]]) if b > a24 else np.zeros(0, np.int64)
        gpus = self.hot.shape[1]
        v["hot_hours_24h"] = (np.logical_or.reduceat(self.hot[a24:b], starts, axis=0).sum(axis=0)
                              if len(starts) else np.zeros(gpus)).astype(float)
        for name, (values, index) in self.lasts.items():
            k = index[b - 1] if b else np.zeros(gpus, np.int64)
            v[name] = np.where(k >= a24, values[k, np.arange(gpus)], np.nan)
        v["retired_pages"] = np.full(gpus, np.nan)  # the simulated H100s remap rows; they retire no pages
        v["idle_power_w"] = self._idle_power(a24, int(np.searchsorted(self.times, h0)), b)
        values = {k: np.broadcast_to(np.asarray(x, float), (gpus,))[rows] for k, x in v.items()}
        return rows, with_peer_excess(values, self.node[rows])

    def _idle_power(self, a24: int, bh0: int, b: int) -> np.ndarray:
        """The minimum power of the newest idle bucket in the day: the 1h buckets before the current hour
        (idle when every reading in the hour was), then the 1m buckets of the current hour."""
        out = np.full(self.power.shape[1], np.nan)
        with np.errstate(invalid="ignore"):
            if bh0 > a24:
                hours = (self.times[a24:bh0] // HOUR).astype(np.int64)
                starts = np.flatnonzero(np.r_[True, hours[1:] != hours[:-1]])
                _newest_idle(out, np.fmax.reduceat(self.util[a24:bh0], starts, axis=0),
                             np.fmin.reduceat(self.power[a24:bh0], starts, axis=0))
            if b > bh0:
                _newest_idle(out, self.util[bh0:b], self.power[bh0:b])
        return out


def _newest_idle(out: np.ndarray, util: np.ndarray, power: np.ndarray) -> None:
    """Overwrite `out` with the power of each column's newest idle row, where it has one."""
    idle = (util < IDLE_UTIL) & ~np.isnan(power)
    newest = np.where(idle, np.arange(len(idle))[:, None], -1).max(axis=0)
    found = newest >= 0
    out[found] = power[newest[found], np.flatnonzero(found)]


def _cumsum0(x: np.ndarray) -> np.ndarray:
    return np.vstack([np.zeros((1, x.shape[1])), np.cumsum(x, axis=0)])
