"""GPU failure prediction end to end: train and register, score the fleet, bootstrap from simulation.

Entry points (plain functions, for `manage.py train_models`, `manage.py score` and Celery tasks):

- ``train_failure_model(now, *, window, horizon, step=1 h, progress=None) -> (ModelVersion, Promotion)``
  builds the frame from the database (`anomaly.failure_data`), trains, registers and promotes if no
  worse; raises `NotEnoughFailures` when the window holds too few failures to learn from.
- ``score_failure_risk(at) -> dict`` scores every reporting GPU with the active version, stores each
  GPU's risk and a `failure_risk` event for each GPU at or above the alert threshold. Without an
  active version it does nothing and says so (``{"scored": 0, "version": None, "skipped": ...}``).
- ``bootstrap_failure_model(now=None, *, progress=None) -> (ModelVersion, Promotion)`` trains on a
  simulated fleet when the site has no failures yet (see `simulate_history`).

Training, in order:
1. rows = (GPU, cut time) with history aggregates, labelled by failures in (t, t + horizon];
2. the latest quarter of the cut times is the holdout; training rows end one horizon before it;
3. `FailurePredictor` fits its trees on the earlier training rows and its calibration on the later
   ones (again one horizon apart), and picks the alert threshold there;
4. the candidate and the active version are both scored on the same holdout; both figures are
   stored (the active version's `metrics` are refreshed with its figures on this holdout);
5. the candidate is registered and promoted only if its holdout PR-AUC is no worse.
"""

from __future__ import annotations

import logging
import random
import warnings
from datetime import UTC, datetime, timedelta

import numpy as np
from django.utils import timezone
from sklearn.exceptions import NotFittedError

from anomaly.actions import do_record_findings, do_store_risks
from anomaly.failure import (
    FEATURE_NAMES,
    HISTORY_FIELDS,
    HOT_GPU_C,
    HOT_MEMORY_C,
    HOUR,
    Events,
    FailureFrame,
    FailurePredictor,
    event_history,
    failure_episodes,
    failure_features,
    failure_labels,
    failure_metrics,
    fleet_typical,
    lead_times,
    time_split,
    top_precursors,
)
from anomaly.failure_data import EVENT_LOOKBACK, Progress, build_training_frame, load_events, load_history
from anomaly.findings import Contribution, Finding
from anomaly.models import AnomalyKind, ModelKind, ModelVersion
from anomaly.registry import Promotion, do_promote_version, do_record_holdout, do_register_version, load_active
from telemetry.models import Gpu

logger = logging.getLogger(__name__)

HOLDOUT_FRACTION = 0.25
MIN_FAILURES = 20  # failure episodes in the window; fewer cannot fill training, calibration and holdout
MIN_SLICE_FAILURES = 3  # in each of the trees' slice, the calibration slice and the holdout
MAX_ROWS = 2_000_000  # beyond this, non-failure rows are sampled (and weighted) to keep the frame in memory


class NotEnoughFailures(Exception):
    """The history holds too few labelled failures to train (or fairly judge) a failure model."""

    def __init__(self, found: int, needed: int, where: str):
        self.found, self.needed = found, needed
        super().__init__(f"found {found} failure{'s' * (found != 1)} {where}; need at least {needed} to train "
                         f"a failure model (bootstrap_failure_model trains one on a simulated fleet meanwhile)")


# --- training ------------------------------------------------------------------------------------------
def train_failure_model(now: datetime, *, window: timedelta = timedelta(days=30),
                        horizon: timedelta = timedelta(hours=24), step: timedelta = timedelta(hours=1),
                        min_failures: int = MIN_FAILURES,
                        progress: Progress | None = None) -> tuple[ModelVersion, Promotion]:
    """Train on the database's history in [now - window, now - horizon] (cut every `step`), register the
    version and promote it if its holdout PR-AUC is no worse than the active version's on that holdout."""
    start, end = now - window, now - horizon
    if end <= start:
        raise ValueError(f"the window ({window}) must be longer than the horizon ({horizon})")
    h = horizon.total_seconds()
    # Count the failures first (one query): a site without enough of them is told so at once.
    ep_gpu, ep_time = failure_episodes(load_events(start - EVENT_LOOKBACK, end + horizon), h)
    inside = (ep_time > start.timestamp()) & (ep_time <= (end + horizon).timestamp())
    if inside.sum() < min_failures:
        where = f"between {start:%Y-%m-%d %H:%M} and {end + horizon:%Y-%m-%d %H:%M} UTC"
        raise NotEnoughFailures(int(inside.sum()), min_failures, where)
    cuts = max(1, int((end - start) / step) + 1)
    keep = min(1.0, MAX_ROWS / max(1, Gpu.objects.count() * cuts))
    frame = build_training_frame(start, end, horizon=horizon, step=step, negative_keep=keep, progress=progress)
    frame.episodes = (ep_gpu[inside], ep_time[inside])
    params = {"trained_on": "site", "window_days": window / timedelta(days=1), "step_min": step / timedelta(minutes=1),
              "negative_keep": round(keep, 6)}
    return fit_and_register(frame, horizon=horizon, params=params, train_start=start, train_end=end, now=now,
                            progress=progress)


def fit_and_register(frame: FailureFrame, *, horizon: timedelta, params: dict, train_start=None, train_end=None,
                     now: datetime | None = None, seed: int = 0,
                     progress: Progress | None = None) -> tuple[ModelVersion, Promotion]:
    """Steps 2-5 of the module docstring on a built frame."""
    h = horizon.total_seconds()
    model = FailurePredictor(calibration_gap=h, random_state=seed)
    train, hold = _split(frame, model, h)
    X = frame.X
    _step(progress, "fit", 0, 1)
    model.fit(X[train], frame.y[train], times=frame.time[train], sample_weight=frame.weight[train])
    _step(progress, "fit", 1, 1)
    holdout = frame.take(hold)
    metrics = {"primary": "pr_auc", "higher_is_better": True,
               **_evaluate(model, FEATURE_NAMES, holdout, X[hold], h),
               "holdout_start": _iso(holdout.time.min()), "holdout_end": _iso(holdout.time.max())}
    active = load_active(ModelKind.FAILURE)
    if active is not None:
        metrics["versus"] = _judge_active(active, holdout, X[hold], h, metrics)
    params = {**model.get_params(), **params, "horizon_h": h / HOUR, "features": "anomaly.failure.FEATURES"}
    version = do_register_version(ModelKind.FAILURE, model, params=params, features=list(FEATURE_NAMES),
                                  metrics=metrics, train_start=train_start, train_end=train_end, now=now)
    promotion = do_promote_version(version, now=now)
    logger.info("failure model v%s: holdout %s; %s", version.version, metrics, promotion.reason)
    return version, promotion


def _split(frame: FailureFrame, model: FailurePredictor, horizon_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(train, holdout) rows, refused when a slice (holdout, calibration, trees) sees too few failures."""
    try:
        train, hold = time_split(frame.time, test_fraction=HOLDOUT_FRACTION, gap=horizon_s)
        fit, cal = time_split(frame.time[train], test_fraction=model.calibration_fraction, gap=horizon_s)
    except ValueError as exc:
        raise ValueError(f"the history is too short to split by time with a {horizon_s / HOUR:g} h gap between "
                         f"trees, calibration and holdout: {exc}") from exc

    def seen(rows: np.ndarray) -> int:  # failure episodes with at least one row in their horizon
        return len(lead_times(frame.gpu[rows], frame.time[rows], np.ones(len(rows)), 0.5, frame.episodes, horizon_s))

    for rows, name in ((hold, "holdout"), (train[cal], "calibration"), (train[fit], "training")):
        if (found := seen(rows)) < MIN_SLICE_FAILURES:
            raise NotEnoughFailures(found, MIN_SLICE_FAILURES, f"within a horizon of the {name} slice's cut times")
    return train, hold


def _evaluate(model, features, holdout: FailureFrame, X_full: np.ndarray, horizon_s: float) -> dict:
    p = model.predict_proba(_columns(X_full, features))[:, 1]
    return failure_metrics(holdout, p, model.threshold_, horizon_s)


def _judge_active(active, holdout: FailureFrame, X_full: np.ndarray, horizon_s: float, candidate: dict) -> dict:
    """Score the active version on the candidate's holdout and store that figure on it too."""
    version, model = active
    try:
        figures = _evaluate(model, version.features, holdout, X_full, horizon_s)
    except (KeyError, ValueError, AttributeError, NotFittedError) as exc:
        # Features this code no longer computes, or an artefact saved by older code: not comparable.
        logger.warning("failure v%s cannot be scored on the new holdout: %s", version.version, exc)
        do_record_holdout(version, None, why=str(exc))
        return {"version": version.version, "error": str(exc)}
    do_record_holdout(version, {**figures, "holdout_start": candidate["holdout_start"],
                                "holdout_end": candidate["holdout_end"]})
    return {"version": version.version, **figures}


def _columns(X_full: np.ndarray, features) -> np.ndarray:
    index = {name: k for k, name in enumerate(FEATURE_NAMES)}
    unknown = [f for f in features if f not in index]
    if unknown:
        raise KeyError(f"the model wants features this code does not compute: {', '.join(unknown)}")
    return X_full[:, [index[f] for f in features]]


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(float(ts), UTC).isoformat()


def _step(progress: Progress | None, stage: str, done: int, total: int) -> None:
    if progress:
        progress(stage, done, total)


# --- scoring -------------------------------------------------------------------------------------------
def score_failure_risk(at: datetime) -> dict:
    """Score every GPU that reported in the hour before `at` with the active failure model.

    Stores each GPU's probability (`do_store_risks`) and a `failure_risk` event for each GPU at or
    above the model's alert threshold, explained by its precursors that stand out most from the
    fleet (robust σ). Returns {"scored", "at_risk", "version", "threshold"} (+ event counts), or
    {"scored": 0, "version": None, "skipped": why} when no version is active.
    """
    active = load_active(ModelKind.FAILURE)
    if active is None:
        return {"scored": 0, "at_risk": 0, "version": None,
                "skipped": "no active failure model: run train_models, or bootstrap_failure_model on a new site"}
    version, model = active
    hist = load_history(at)
    if not len(hist):
        return {"scored": 0, "at_risk": 0, "version": version.version, "skipped": "no GPU reported in the last hour"}
    X = failure_features(hist.values)
    p = model.predict_proba(_columns(X, version.features))[:, 1]
    do_store_risks(dict(zip(hist.uuid, p.tolist(), strict=True)), at=at, version=version.version)
    horizon_h = version.params.get("horizon_h", 24)
    median, sigma = fleet_typical(X)
    findings = [_finding(hist, k, p[k], X[k], median, sigma, horizon_h) for k in np.flatnonzero(p >= model.threshold_)]
    counts = do_record_findings(findings, kinds={AnomalyKind.FAILURE_RISK.value}, at=at, model_version=version)
    return {"scored": len(p), "at_risk": len(findings), "version": version.version,
            "threshold": round(float(model.threshold_), 4), **counts}


def _finding(hist, k: int, p: float, x: np.ndarray, median, sigma, horizon_h: float) -> Finding:
    contributions = tuple(Contribution(f.name, f.label, value, typical, dev, "fleet")
                          for f, value, typical, dev in top_precursors(x, median, sigma))
    why = "; ".join(c.phrase() for c in contributions)
    return Finding(kind=AnomalyKind.FAILURE_RISK.value, entity_kind="gpu", entity_id=hist.uuid[k], host=hist.host[k],
                   score=float(p), contributions=contributions,
                   summary=f"{p:.0%} risk of failure within {horizon_h:g} h: {why}"[:300])


# --- bootstrap from a simulated fleet ------------------------------------------------------------------
SIM_FIELDS = ("ecc_sbe_agg", "ecc_sbe_vol", "ecc_dbe_vol", "ecc_dbe_agg", "remapped_rows_correctable",
              "remapped_rows_uncorrectable", "row_remap_pending", "row_remap_failure", "gpu_temp", "memory_temp",
              "nvlink_crc_flit_errors", "nvlink_crc_data_errors", "pcie_replay", "energy_mj", "xid")
SIM_EPOCH = datetime(2026, 1, 5, tzinfo=UTC)  # the simulated clock; any hour-aligned time would do
SIM_WARMUP_H, SIM_CUT_H = 12, 24  # history before the first cut; span of cut times per run
UNKNOWN_IN_SIMULATION = ("age_days", "row_number", "rack_position", "u_position", "gpu_index")


def bootstrap_failure_model(now: datetime | None = None, *, gpus: int = 512, runs: int = 3, stories: int = 24,
                            horizon: timedelta = timedelta(hours=24), tick_s: float = 300.0,
                            step: timedelta = timedelta(minutes=15), seed: int = 1,
                            progress: Progress | None = None) -> tuple[ModelVersion, Promotion]:
    """Train, register and promote (if no worse) a failure model on `runs` simulated fleets of `gpus`
    GPUs, each running `stories` gpu-degrading scenarios plus the simulator's random faults."""
    now = now or timezone.now()
    frames = []
    for r in range(runs):
        frames.append(simulate_history(gpus=gpus, stories=stories, horizon=horizon, tick_s=tick_s, step=step,
                                       seed=seed + r, offset=r, progress=progress))
        _step(progress, "simulate", r + 1, runs)
    frame = FailureFrame.concat(frames)
    params = {"trained_on": "simulation", "simulated_gpus": gpus, "simulated_runs": runs,
              "simulated_stories_per_run": stories, "simulated_tick_s": tick_s, "step_min": step / timedelta(minutes=1),
              "seed": seed, "note": "trained on the simulator's physics (gpu-degrading stories and random faults), "
                                    "not on this site's failures; retrain once the site has failures"}
    return fit_and_register(frame, horizon=horizon, params=params, now=now, seed=seed, progress=progress)


def simulate_history(*, gpus: int = 512, stories: int = 24, horizon: timedelta = timedelta(hours=24),
                     tick_s: float = 300.0, step: timedelta = timedelta(minutes=15), seed: int = 1, offset: int = 0,
                     progress: Progress | None = None) -> FailureFrame:
    """One simulated fleet's training rows, through the same `failure_features` as the database's.

    The fleet (`telemetry.simulator.dynamics.Cluster`, its random faults included) runs for
    warm-up + cut span + horizon hours at `tick_s` with `stories` gpu-degrading scenarios whose
    precursors fall inside the cut span. Its GPU records are reduced the way the rollups and the
    ingest fault deriver reduce them (counter deltas with resets, max, last, XID changes, DBE
    growth, kernel-log events), then to HISTORY_FIELDS at each cut. Run `offset` shifts the clock
    and the GPU keys so runs can be stacked as one history.

    Age and location are NaN: the simulator has no GPU age and strikes slots at random, and every run
    reuses the same slots, so a model shown them would learn "the slot that failed in run 1" (it did:
    a healthy GPU scored 0.30 for its slot alone). With them unknown the trees never split on them.
    """
    from telemetry.simulator.dynamics import Cluster
    from telemetry.simulator.scenarios import ScenarioSet, Spec

    h = horizon.total_seconds()
    hours = SIM_WARMUP_H + SIM_CUT_H + h / HOUR
    t0 = SIM_EPOCH + offset * timedelta(hours=hours)
    rng = random.Random(f"breakwater-failure-bootstrap:{seed}")
    # Stories start from an hour before the first cut to an hour before the last, so each one's
    # precursors and failure fall among the cuts and their labels.
    starts = sorted(rng.uniform(SIM_WARMUP_H - 1, SIM_WARMUP_H + SIM_CUT_H - 1) * 60 for _ in range(stories))
    scenarios = ScenarioSet([Spec("gpu-degrading", m) for m in starts], seed=seed)
    cluster = Cluster.build(gpus, seed=seed, scenarios=scenarios, interval=tick_s)
    # Only GPU records are read: skip the fabric's rates and port records (a third of a tick's time).
    # Neither draws random numbers, so the fleet's faults and stories are the same as with them.
    cluster.fabric.step = cluster.fabric.records = lambda *args: None
    ticks = int(hours * HOUR / tick_s)
    record = _SimRecorder(cluster, ticks, key_base=offset * 1_000_000)
    for k in range(ticks):
        record.tick(k, cluster.step(t0 + timedelta(seconds=k * tick_s)))
        if progress and k % 50 == 0:
            progress(f"simulate run {offset + 1}", k, ticks)
    first = (t0 + timedelta(hours=SIM_WARMUP_H)).timestamp()
    cuts = np.arange(first, first + SIM_CUT_H * HOUR + 1, step.total_seconds())
    return record.frame(cuts, h)


class _SimRecorder:
    """The simulated fleet's GPU records as (tick, GPU) arrays, and the events ingest would derive."""

    def __init__(self, cluster, ticks: int, key_base: int):
        flat = [(i, g) for i, gs in enumerate(cluster.gpus) for g in gs]
        self.col = {g.spec.uuid: c for c, (_, g) in enumerate(flat)}
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

    def frame(self, cuts: np.ndarray, horizon_s: float) -> FailureFrame:
        events = _sim_events(self)
        windows = _SimWindows(self)
        frames = []
        for t in cuts:
            rows, values = windows.at(t)
            values.update(event_history(rows, events, t))
            values.update({k: np.full(len(rows), np.nan) for k in UNKNOWN_IN_SIMULATION})
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
        f, self.times = rec.field, rec.times
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
        hours = (self.times[a24:b] // HOUR).astype(np.int64)
        starts = np.flatnonzero(np.r_[True, hours[1:] != hours[:-1]]) if b > a24 else np.zeros(0, np.int64)
        gpus = self.hot.shape[1]
        v["hot_hours_24h"] = (np.logical_or.reduceat(self.hot[a24:b], starts, axis=0).sum(axis=0)
                              if len(starts) else np.zeros(gpus)).astype(float)
        for name, (values, index) in self.lasts.items():
            k = index[b - 1] if b else np.zeros(gpus, np.int64)
            v[name] = np.where(k >= a24, values[k, np.arange(gpus)], np.nan)
        v["retired_pages"] = np.full(gpus, np.nan)  # the simulated H100s remap rows; they retire no pages
        return rows, {k: np.broadcast_to(np.asarray(x, float), (gpus,))[rows] for k, x in v.items()}


def _cumsum0(x: np.ndarray) -> np.ndarray:
    return np.vstack([np.zeros((1, x.shape[1])), np.cumsum(x, axis=0)])
