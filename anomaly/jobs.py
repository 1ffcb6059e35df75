"""Job-level findings as of a moment: straggling ranks and diverging training runs.

`job_findings(at)` is what the per-minute scoring pass (`anomaly.scoring.score_fleet`) calls for the
kinds in `KINDS`; it reads and returns, and `anomaly.actions.do_record_findings` stores.

A job is "running" here when it reported training steps in the window: the steps are the evidence,
whatever the scheduler's state says (a replay of a past hour sees jobs that have since ended).

Cost, whatever the fleet size: four statements, each one set-based.

1. Per rank, the median and count of its step times over the last `recent` (one grouped aggregate
   over the newest chunk of the step hypertable, joined to the job for its start). Steps in the
   first `warmup` after the job started are left out (compilation and first batches are slow),
   and so are steps from before its start (a requeued job's previous run).
2. Per job and 10 s bucket of the whole `window`: mean loss and grad norm over its ranks, summed
   NaN and Inf counts, and whether the bucket is recent or history.
3. The keys of the jobs flagged (primary key lookups).
4. Their allocations at `at`, with node hostnames and GPU UUIDs (the job foreign key's index), to
   place each rank on its GPU the way the job page numbers them (`telemetry.selectors.jobs`).
   Only flagged jobs: placing all 16k ranks of a fleet would cost more than finding the few.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from datetime import datetime, timedelta
from typing import NamedTuple

import numpy as np
from django.db import connection
from django.db.models import Q

from anomaly.detectors.training import (
    DIVERGENCE_FIELDS,
    GRAD,
    INF,
    LOSS,
    NAN,
    Divergence,
    DivergenceDetector,
    StragglerDetector,
)
from anomaly.findings import Contribution, Finding
from anomaly.models import AnomalyKind
from telemetry.models import Allocation, Job, TrainingStep
from telemetry.selectors.inventory import job_key

logger = logging.getLogger(__name__)

KINDS = frozenset({AnomalyKind.STRAGGLER.value, AnomalyKind.DIVERGENCE.value})

WINDOW = timedelta(minutes=3)
# A straggler must be found within two minutes of slowing down and scoring runs every minute, so a
# rank's statistic is the median of its last minute of steps: past half of that minute slow, it flags.
RECENT = timedelta(minutes=1)
WARMUP = timedelta(minutes=1)
BUCKET = timedelta(seconds=10)

_STEPS = TrainingStep._meta.db_table
_JOBS = Job._meta.db_table

# The CTE is materialised so the planner always starts from the time range of the newest chunk (its
# time index); joined the other way round it may walk a job's whole history through the job_id index.
_RANK_MEDIANS_SQL = f"""
WITH s AS MATERIALIZED (
    SELECT job_id, rank, time, step_time_s FROM {_STEPS}
    WHERE time > %(since)s AND time <= %(at)s AND step_time_s IS NOT NULL
)
SELECT s.job_id, s.rank, percentile_cont(0.5) WITHIN GROUP (ORDER BY s.step_time_s), count(*)
FROM s LEFT JOIN {_JOBS} j ON j.id = s.job_id AND s.time < j.start_time + %(warmup)s
WHERE j.id IS NULL
GROUP BY s.job_id, s.rank
"""

# One row per job and 10 s bucket (aligned on `at`, so the recent minute is whole buckets; `is_recent`
# stays in the GROUP BY for a bucket that straddles it when `recent` is not a multiple of the bucket).
# Means over the ranks, not medians: plain aggregates hash instead of sorting 16k ranks' steps, and
# the detector takes medians over the buckets anyway. Steps that carry nothing the divergence
# detector reads (a trainer that reports only step times) are left out early.
_SERIES_SQL = f"""
SELECT job_id, time > %(recent)s AS is_recent, avg(loss), avg(grad_norm), sum(nan_count), sum(inf_count)
FROM {_STEPS}
WHERE time > %(since)s AND time <= %(at)s
  AND (loss IS NOT NULL OR grad_norm IS NOT NULL OR nan_count > 0 OR inf_count > 0)
GROUP BY job_id, time_bucket(%(bucket)s, time, %(at)s), is_recent
"""


def job_findings(at: datetime, *, window: timedelta = WINDOW, recent: timedelta = RECENT,
                 warmup: timedelta = WARMUP, straggler: StragglerDetector | None = None,
                 divergence: DivergenceDetector | None = None) -> list[Finding]:
    """Stragglers (entity `rank`, id "source:id#rank") and diverging jobs (entity `job`, id
    "source:id") among the jobs that reported steps in (at - window, at].

    The detectors run on every job; keys and places are looked up for the few jobs they flag.
    """
    started = time.perf_counter()
    recent = min(recent, window)
    ranks = _rank_medians(at, recent, warmup)
    slow = _straggling(ranks, straggler or StragglerDetector())
    diverging = _diverging(_loss_series(at, window, recent), divergence or DivergenceDetector())
    job_ids = sorted({h.job for h in slow} | {int(d.jobs[i]) for d, i in diverging})
    keys = dict((pk, job_key(src, ext)) for pk, src, ext in
                Job.objects.filter(pk__in=job_ids).values_list("pk", "source", "external_id"))
    places = _places(job_ids, at) if job_ids else {}
    found = [_straggler_finding(h, keys, places) for h in slow]
    found += [_divergence_finding(d, i, keys, places, recent) for d, i in diverging]
    logger.info("job findings at %s: %d ranks, %d found in %.0f ms", at.isoformat(), len(ranks), len(found),
                1000 * (time.perf_counter() - started))
    return found


# --- loading -------------------------------------------------------------------------------------

def _rank_medians(at: datetime, recent: timedelta, warmup: timedelta) -> list[tuple[int, int, float, int]]:
    """[(job id, rank, median step time, steps)] over the last `recent`, warm-up left out."""
    with connection.cursor() as cur:
        cur.execute(_RANK_MEDIANS_SQL, {"since": at - recent, "at": at, "warmup": warmup})
        return cur.fetchall()


def _loss_series(at: datetime, window: timedelta, recent: timedelta) -> list[tuple]:
    """[(job id, is recent, loss, grad norm, NaN count, Inf count)], one row per job and bucket."""
    with connection.cursor() as cur:
        cur.execute(_SERIES_SQL, {"since": at - window, "at": at, "recent": at - recent, "bucket": BUCKET})
        return cur.fetchall()


def _places(job_ids: list[int], at: datetime) -> dict[int, list[tuple[str, str | None]]]:
    """Per job, (hostname, GPU UUID or None) by rank, from its allocations at `at`.

    Ranks in launcher order, as on the job page: nodes in allocation order (start, then hostname),
    GPUs by index within a node.
    """
    rows = (Allocation.objects.filter(job_id__in=job_ids, start__lte=at)
            .filter(Q(end__isnull=True) | Q(end__gt=at))
            .values_list("job_id", "start", "node_id", "node__hostname", "gpu_index", "id", "gpu__uuid"))
    by_job: dict[int, dict[int, list[tuple]]] = defaultdict(dict)
    for row in sorted(rows, key=lambda r: (r[0], r[1], r[3], r[4], r[5])):
        by_job[row[0]].setdefault(row[2], []).append(row)
    return {job: [(r[3], r[6]) for node in nodes.values() for r in sorted(node, key=lambda r: (r[4], r[5]))]
            for job, nodes in by_job.items()}


def _place(places: dict, job_id: int, rank: int) -> tuple[str, str | None]:
    gang = places.get(job_id, ())
    return gang[rank] if 0 <= rank < len(gang) else ("", None)


# --- stragglers ----------------------------------------------------------------------------------

class _Slow(NamedTuple):
    """One straggling rank, before its job's key and place are known."""

    job: int
    rank: int
    value: float
    reference: float
    z: float
    slowdown: float
    score: float
    gang_ranks: int


def _straggling(ranks: list[tuple], detector: StragglerDetector) -> list[_Slow]:
    if not ranks:
        return []
    job, rank, value, n = (np.asarray(c) for c in zip(*ranks, strict=True))
    value = value.astype(float)
    result = detector.fit(value, gang=job, n_steps=n).evaluate(value, gang=job, n_steps=n)
    gang_ranks = detector.gang_ranks_[np.searchsorted(detector.gangs_, job)]
    return [_Slow(int(job[i]), int(rank[i]), float(value[i]), float(result.reference[i]), float(result.z[i]),
                  float(result.slowdown[i]), float(result.score[i]), int(gang_ranks[i]))
            for i in np.flatnonzero(result.flagged)]


def _straggler_finding(h: _Slow, keys: dict, places: dict) -> Finding:
    host, uuid = _place(places, h.job, h.rank)
    contribution = Contribution("step_time_s", "step time", h.value, h.reference, h.z, "gang median")
    return Finding(
        kind=AnomalyKind.STRAGGLER.value, entity_kind="rank", entity_id=f"{keys.get(h.job, h.job)}#{h.rank}",
        score=round(h.score, 4), contributions=(contribution,), host=host,
        summary=f"{contribution.phrase()} ({1 + h.slowdown:.2f}× over {h.gang_ranks} ranks)",
        extra={"gpu_uuid": uuid} if uuid else {},
    )


# --- divergence ----------------------------------------------------------------------------------

_LABELS = {LOSS: "loss", GRAD: "grad norm", NAN: "NaN count", INF: "Inf count"}


def _diverging(series: list[tuple], detector: DivergenceDetector) -> list[tuple[Divergence, int]]:
    """(result, row) for every job that diverges: history rows fit, recent rows are scored."""
    if not series:
        return []
    job = np.array([row[0] for row in series])
    is_recent = np.array([row[1] for row in series], dtype=bool)
    X = np.array([row[2:] for row in series], dtype=float)  # None -> NaN
    if not is_recent.any():
        return []
    result = detector.fit(X[~is_recent], job=job[~is_recent]).evaluate(X[is_recent], job=job[is_recent])
    return [(result, i) for i in np.flatnonzero(result.flagged.any(axis=1))]


def _divergence_finding(result: Divergence, i: int, keys: dict, places: dict, recent: timedelta) -> Finding:
    j = int(result.jobs[i])
    cols = sorted(np.flatnonzero(result.flagged[i]), key=lambda c: -abs(result.z[i, c]))
    contributions = tuple(
        Contribution(DIVERGENCE_FIELDS[c], _LABELS[c], float(result.value[i, c]), _finite(result.expected[i, c]),
                     float(result.z[i, c]), "own history")
        for c in cols)
    return Finding(
        kind=AnomalyKind.DIVERGENCE.value, entity_kind="job", entity_id=keys.get(j, str(j)),
        score=round(float(result.score[i]), 4), contributions=contributions,
        host=_place(places, j, 0)[0], summary=_divergence_summary(result, i, recent),
    )


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def _divergence_summary(result, i: int, recent: timedelta) -> str:
    """NaN / Inf first (they are the verdict), then the spikes by their size."""
    parts = []
    nan, inf = int(result.value[i, NAN]), int(result.value[i, INF])
    if nan or inf:
        minutes = recent.total_seconds() / 60
        parts.append(f"loss not finite: {nan} NaN, {inf} Inf in the last {minutes:g} min")
    for c in (LOSS, GRAD):
        if result.flagged[i, c]:
            ratio = result.value[i, c] / result.expected[i, c] if result.expected[i, c] else float("nan")
            parts.append(f"{_LABELS[c]} {result.z[i, c]:+.1f}σ vs own history ({ratio:.2f}×)")
    return "; ".join(parts)[:300]
