"""GPU failure prediction end to end: train and register, score the fleet, bootstrap from simulation.

Entry points (plain functions, for `manage.py train_models`, `manage.py score` and Celery tasks):

- ``train_failure_model(now, *, window, horizon, step=1 h, progress=None) -> (ModelVersion, Promotion)``
  builds the frame from the database (`anomaly.failure_data`), trains, registers and promotes if no
  worse; raises `NotEnoughFailures` when the window holds too few failures to learn from.
- ``score_failure_risk(at) -> dict`` scores every reporting GPU with the active version, stores each
  GPU's risk and a `failure_risk` event for each GPU at or above the alert threshold. Without an
  active version it does nothing and says so (``{"scored": 0, "version": None, "skipped": ...}``).
- ``bootstrap_failure_model(now=None, *, progress=None) -> (ModelVersion, Promotion)`` trains on
  simulated fleets with failures from every degradation family when the site has no failures yet
  (`anomaly.failure_sim.simulate_fleet`, `anomaly.failure_families`).

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
from datetime import UTC, datetime, timedelta

import numpy as np
from django.utils import timezone
from sklearn.exceptions import NotFittedError

from anomaly.actions import do_record_findings, do_store_risks
from anomaly.failure import (
    FEATURE_NAMES,
    HOUR,
    FailureFrame,
    FailurePredictor,
    failure_episodes,
    failure_features,
    failure_metrics,
    fleet_typical,
    lead_times,
    time_split,
    top_precursors,
)
from anomaly.failure_data import (
    EVENT_LOOKBACK,
    Progress,
    build_training_frame,
    load_events,
    load_history,
    load_prior,
)
from anomaly.failure_eval import EVAL_PARAMS
from anomaly.failure_families import FAMILIES
from anomaly.failure_prior import SurvivalPrior, titan_csv, titan_prior
from anomaly.failure_sim import simulate_fleet
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
                     now: datetime | None = None, seed: int = 0, alert_rule: str = "f1",
                     model_params: dict | None = None,
                     progress: Progress | None = None) -> tuple[ModelVersion, Promotion]:
    """Steps 2-5 of the module docstring on a built frame (`alert_rule` and `model_params` go to
    `FailurePredictor`)."""
    h = horizon.total_seconds()
    model = FailurePredictor(calibration_gap=h, alert_rule=alert_rule, random_state=seed, **(model_params or {}))
    train, hold = _split(frame, model, h)
    X = frame.X
    _step(progress, "fit", 0, 1)
    model.fit(X[train], frame.y[train], times=frame.time[train], sample_weight=frame.weight[train],
              groups=frame.gpu[train])
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


# --- bootstrap from simulated fleets -------------------------------------------------------------------
def bootstrap_failure_model(now: datetime | None = None, *, gpus: int = 1024, runs: int = 3, failures: int = 32,
                            sudden_share: float = 0.2, horizon: timedelta = timedelta(hours=24),
                            tick_s: float = 300.0, step: timedelta = timedelta(minutes=15), seed: int = 1,
                            progress: Progress | None = None) -> tuple[ModelVersion, Promotion]:
    """Train, register and promote (if no worse) a failure model on `runs` simulated fleets of `gpus` GPUs,
    each with `failures` planted failures from every degradation family (`anomaly.failure_families`, a
    `sudden_share` of them without precursors) plus the simulator's random faults. The alert threshold
    opens at most one false alarm per 1,000 GPU-days on the calibration slice (see `failure_eval`)."""
    now = now or timezone.now()
    prior = site_prior()
    frames = []
    for r in range(runs):
        fleet = simulate_fleet(gpus=gpus, failures=failures, sudden_share=sudden_share, horizon=horizon,
                               tick_s=tick_s, step=step, seed=seed + r, offset=r, prior=prior, progress=progress)
        frames.append(fleet.frame)
        _step(progress, "simulate", r + 1, runs)
    frame = FailureFrame.concat(frames)
    params = {"trained_on": "simulation", "simulated_gpus": gpus, "simulated_runs": runs,
              "simulated_failures_per_run": failures, "sudden_share": sudden_share, "families": list(FAMILIES),
              "simulated_tick_s": tick_s, "step_min": step / timedelta(minutes=1), "seed": seed,
              "survival_prior": prior is not None,
              "note": "trained on the simulator's physics (the degradation families of anomaly.failure_families "
                      "and random faults), not on this site's failures; retrain once the site has failures"}
    return fit_and_register(frame, horizon=horizon, params=params, now=now, seed=seed, alert_rule="false_alarms",
                            model_params=EVAL_PARAMS, progress=progress)


def site_prior() -> SurvivalPrior | None:
    """The survival prior the site scores with: the active survival version's, else Titan's records if
    they are at hand (failure_prior.titan_csv), else none."""
    return load_prior() or titan_prior(titan_csv())
