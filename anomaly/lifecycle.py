"""Training and scoring schedules: what `train_models`, `score` and the Celery tasks run.

The cohort model is trained on the last hours of 1-minute features; its holdout is the newest
hour, which it has not seen, and its metric is the share of holdout GPU-minutes it would flag
(lower is better: the fleet is healthy most of the time, so a model that flags more of an
ordinary hour is noisier, not more sensitive). The failure model's training lives in
`anomaly.failure_pipeline`; this module only sequences them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

import numpy as np

from anomaly import features as F
from anomaly.detectors.cohort import CohortIsolationForest
from anomaly.registry import Promotion, do_promote_version, do_register_version

logger = logging.getLogger(__name__)

COHORT_HOURS = 6.0
MIN_COHORT_ROWS = 200


class NotEnoughData(Exception):
    """The store holds too little history to train a model; the message says how much."""


def train_cohort_model(now: datetime, *, hours: float = COHORT_HOURS, force: bool = False) -> Promotion:
    """Fit the cohort IsolationForest on the last `hours` (the newest sixth held out) and promote it
    if its holdout flag rate is no worse than the active version's on the same holdout."""
    X, ids, cohorts = F.gpu_history(now, hours=hours, per_gpu=24)
    if len(X) < MIN_COHORT_ROWS:
        raise NotEnoughData(f"cohort model needs at least {MIN_COHORT_ROWS} GPU-minutes of 1-minute rollups in the "
                            f"last {hours:g} h; found {len(X)}")
    order = np.arange(len(X))
    holdout = _newest_share(ids, 1 / 6)
    train = np.setdiff1d(order, holdout)
    from anomaly.scoring import GPU_SCALE_FLOOR

    params = {"n_estimators": 100, "max_samples": 256, "quantile": 0.001, "margin": 0.02, "random_state": 0,
              "scale_floor": [GPU_SCALE_FLOOR[f.name] for f in F.GPU_FEATURES]}
    det = CohortIsolationForest(**params).fit(X[train], cohorts[train])
    rate = float(det.predict(X[holdout], cohorts[holdout]).mean()) if len(holdout) else None
    metrics = {"primary": "holdout_flag_rate", "higher_is_better": False, "holdout_flag_rate": rate,
               "train_rows": int(len(train)), "holdout_rows": int(len(holdout)),
               "cohorts": sorted(det.forests_)}
    _judge_active_cohort(X[holdout], cohorts[holdout], metrics)
    version = do_register_version("cohort", det, params=params, features=[f.name for f in F.GPU_FEATURES],
                                  metrics=metrics, train_start=now - timedelta(hours=hours), train_end=now, now=now)
    return do_promote_version(version, force=force, now=now)


def _newest_share(ids: np.ndarray, share: float) -> np.ndarray:
    """Row indices of the newest `share` of each GPU's rows (rows come sorted by GPU, then time)."""
    out = []
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    for s, e in zip(starts, np.r_[starts[1:], len(ids)], strict=True):
        k = max(1, int(round((e - s) * share))) if e - s > 1 else 0
        out.extend(range(e - k, e))
    return np.array(out, dtype=np.int64)


def _judge_active_cohort(X: np.ndarray, cohorts: np.ndarray, metrics: dict) -> None:
    """Measure the active cohort model on the candidate's holdout and record it on both, so
    promotion compares the two on the same rows."""
    from sklearn.exceptions import NotFittedError

    from anomaly.registry import do_record_holdout, load_active

    active = load_active("cohort")
    if active is None or not len(X):
        return
    version, model = active
    try:
        rate = float(model.predict(X, cohorts).mean())
    except (AttributeError, NotFittedError, ValueError) as exc:  # saved by older code: not comparable
        do_record_holdout(version, None, why=f"cannot score the new holdout: {exc}")
        metrics["versus"] = {"version": version.version, "error": str(exc)}
        return
    do_record_holdout(version, {"holdout_flag_rate": rate, "holdout_rows": int(len(X))})
    metrics["versus"] = {"version": version.version, "holdout_flag_rate": rate}


def train_all(now: datetime, *, progress: Callable[[str], None] = logger.info, force: bool = False,
              missing_only: bool = False, bootstrap: bool = True) -> dict:
    """Train every model kind that has data; a kind without enough data is reported, not fatal.

    `missing_only` trains only kinds with no active version (the ten-minute beat entry, so a new
    site gets models as soon as it has history). With `bootstrap`, a site with too few failures
    to learn from gets a failure model trained on the simulator instead, when it has none at all.
    """
    from anomaly import failure_pipeline
    from anomaly.models import ModelStatus, ModelVersion

    active = set(ModelVersion.objects.filter(status=ModelStatus.ACTIVE).values_list("kind", flat=True))
    out = {}
    for name, train in (("cohort", lambda: train_cohort_model(now, force=force)),
                        ("failure", lambda: failure_pipeline.train_failure_model(now)[1])):
        if missing_only and name in active:
            out[name] = "active version kept"
            continue
        progress(f"training the {name} model")
        try:
            p = train()
        except (NotEnoughData, failure_pipeline.NotEnoughFailures) as exc:
            out[name] = f"skipped: {exc}"
            if name == "failure" and bootstrap and name not in active:
                progress("no failure model yet: training one on a simulated fleet")
                p = failure_pipeline.bootstrap_failure_model(now, progress=_ticks(progress))[1]
                out[name] = _said(p, "bootstrap on simulation")
        else:
            out[name] = _said(p)
        progress(f"{name}: {out[name]}")
    return out


def _said(p: Promotion, how: str = "") -> str:
    state = "promoted" if p.promoted else "not promoted"
    return f"v{p.version.version}{' (' + how + ')' if how else ''} {state}: {p.reason}"


def _ticks(progress: Callable[[str], None]):
    """Adapt the failure pipeline's (stage, done, total) progress to one line per stage step."""
    def report(stage: str, done: int, total: int) -> None:
        if done == total or done % max(1, total // 4) == 0:
            progress(f"  {stage}: {done}/{total}")
    return report


def score_all(at: datetime) -> dict:
    """One scoring pass: the detectors, then failure risk (when a failure model is active)."""
    from anomaly.scoring import score_fleet

    out = {"detectors": score_fleet(at)}
    from anomaly import failure_pipeline
    from telemetry.live import schedule_fleet_publish

    out["failure_risk"] = failure_pipeline.score_failure_risk(at)
    schedule_fleet_publish()  # the overview's anomaly card and the score heatmaps change now, not at the next ingest
    return out
