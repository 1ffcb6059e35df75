"""Training and scoring schedules: what `train_models`, `score` and the Celery tasks run.

The cohort model is trained on the last hours of 1-minute features; its holdout is the newest
hour, which it has not seen, and its metric is the share of holdout GPU-minutes it would flag
(lower is better: the fleet is healthy most of the time, so a model that flags more of an
ordinary hour is noisier, not more sensitive). The failure model's training lives in
`anomaly.failure_pipeline`; this module only sequences them.

Scoring (`score_all`) runs the detectors and the failure model minute by minute from a watermark per kind,
under an advisory lock, so a pass lost to a killed worker is caught up by the next one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from time import perf_counter

import numpy as np
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from sklearn.exceptions import NotFittedError

from anomaly import failure_pipeline
from anomaly import features as F
from anomaly.detectors.cohort import CohortIsolationForest
from anomaly.models import ModelStatus, ModelVersion, ScoringKind, ScoringWatermark
from anomaly.registry import Promotion, do_promote_version, do_record_holdout, do_register_version, load_active
from anomaly.scoring import GPU_SCALE_FLOOR, score_fleet
from telemetry.live import schedule_fleet_publish

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


# --- The per-minute scoring pass -------------------------------------------------------------------
# First half of the scoring pass's advisory-lock key (second: SCORING_LOCK_KEY), apart from the rollups'
# ("BWKR"), metering's ("BWMT") and the 0x6277_00xx keys of telemetry and alerts.
LOCK_NAMESPACE = 0x42575343  # "BWSC"
SCORING_LOCK_KEY = 1
MINUTE = timedelta(minutes=1)


def score_all(now: datetime) -> dict:
    """Score every minute each kind (detectors, failure risk) has not scored, up to the minute holding `now`.

    What the beat task and `manage.py score` run. Per kind, oldest minute first:

    1. Each minute is its own transaction, which first takes the scoring advisory lock (transaction-scoped, so
       a killed worker's lock dies with its connection). If another process holds it, stop and report
       "skipped": that process is scoring the same minutes, and two passes at once would race on the open
       events (anomaly_one_open_per_group) and on the scores.
    2. Under the lock, re-read the kind's watermark (the last minute it committed; another process may have
       moved it since the last minute) and pick the minute after it. Further behind than the catch-up cap,
       jump to the oldest of the last `cap` minutes, logging and counting the minutes jumped over. With no
       watermark yet, score only the minute holding `now`.
    3. Score that minute and advance the watermark in the same transaction: events, scores and watermark
       commit together or not at all, so a pass killed mid-minute is redone whole by the next one, and no
       minute is scored twice or left out.
    4. A minute that raises rolls back alone and ends its kind for this pass (going on would leave a gap);
       the next pass retries it. The other kind goes on: a broken failure model must not stop the detectors.
    5. After the last commit, one fleet publish: the overview's anomaly card and score heatmaps change now.
    """
    if now.tzinfo is None:
        raise ValueError(f"now={now.isoformat()!r} has no time zone; scoring minutes are UTC instants")
    end, cap = now.replace(second=0, microsecond=0), _catchup_cap()
    out: dict = {}
    for kind in ScoringKind:
        out[kind.value] = done = _catch_up(kind, end, cap)
        if "skipped" in done:
            out["skipped"] = done.pop("skipped")
            break
    if any(k.get("passes") for k in out.values() if isinstance(k, dict)):
        schedule_fleet_publish()  # after commit when a caller's transaction wraps this; at once otherwise
    return out


def _catchup_cap() -> int:
    """SCORING_MAX_CATCHUP_MINUTES: the most minutes one pass scores per kind.

    Why a cap: each minute costs seconds at fleet scale, so after a long outage a full catch-up would keep the
    current minute, the one an operator acts on, waiting behind an hour of stale ones; an anomaly that old has
    been and gone on the dashboards; and an old minute is not scored as it would have been then (the active
    models, the inventory and the racks' power caps are read as they are now).
    """
    cap = getattr(settings, "SCORING_MAX_CATCHUP_MINUTES", 15)
    if not isinstance(cap, int) or cap < 1:
        raise ImproperlyConfigured(f"SCORING_MAX_CATCHUP_MINUTES must be a whole number of minutes >= 1, got {cap!r}")
    return cap


def _catch_up(kind: ScoringKind, end: datetime, cap: int) -> dict:
    """One kind's minutes up to `end`, each committed with its watermark; see `score_all`."""
    done: dict = {"passes": [], "done_until": None, "opened": 0, "extended": 0, "closed": 0}
    while True:
        at = None
        try:
            with transaction.atomic():
                if not _try_lock():
                    done["skipped"] = "another process holds the scoring lock and is scoring these minutes"
                    return done
                mark = ScoringWatermark.objects.select_for_update().filter(kind=kind).first()
                at, jumped = _next_minute(mark, end, cap)
                if at is None:
                    done["done_until"] = mark.done_until.isoformat()
                    return done
                if jumped:
                    _log_jump(kind, at, jumped, cap, done)
                counts = _score_minute(kind, at, mark, jumped)
        except Exception as exc:  # whatever it was, the minute rolled back whole and the next pass retries it
            logger.exception("scoring %s as of %s failed; the next pass retries it", kind.value, at)
            done["error"] = f"{at.isoformat() if at else 'before a minute was chosen'}: {exc}"
            return done
        done["passes"].append({"at": at.isoformat(), **counts})
        done["done_until"] = at.isoformat()
        for k in ("opened", "extended", "closed"):
            done[k] += counts.get(k, 0)


def _try_lock() -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [LOCK_NAMESPACE, SCORING_LOCK_KEY])
        return cur.fetchone()[0]


def _next_minute(mark: ScoringWatermark | None, end: datetime, cap: int) -> tuple[datetime | None, int]:
    """The next minute to score (None: up to date) and how many minutes before it go unscored (the cap)."""
    if mark is None:
        return end, 0
    nxt = mark.done_until + MINUTE
    if nxt > end:
        return None, 0
    oldest = end - (cap - 1) * MINUTE
    if nxt < oldest:
        return oldest, (oldest - nxt) // MINUTE
    return nxt, 0


def _log_jump(kind: ScoringKind, at: datetime, jumped: int, cap: int, done: dict) -> None:
    first, last = at - jumped * MINUTE, at - MINUTE
    logger.warning("scoring %s: %d minutes behind, more than the cap of %d; minutes %s to %s are not scored",
                   kind.value, jumped + cap, cap, first.isoformat(), last.isoformat())
    done["jumped"] = {"from": first.isoformat(), "to": last.isoformat(), "minutes": jumped}


def _score_minute(kind: ScoringKind, at: datetime, mark: ScoringWatermark | None, jumped: int) -> dict:
    """Score one minute and move the watermark to it (the caller's transaction holds both)."""

    scorer = score_fleet if kind == ScoringKind.DETECTORS else failure_pipeline.score_failure_risk
    t0 = perf_counter()
    counts = scorer(at)
    mark = mark or ScoringWatermark(kind=kind)
    mark.done_until, mark.last_result = at, counts
    mark.minutes_scored += 1
    mark.minutes_skipped += jumped
    mark.last_ms = round((perf_counter() - t0) * 1000, 1)
    mark.save()
    return counts
