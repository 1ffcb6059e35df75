"""Job-level findings as of a moment: straggling ranks and diverging training runs.

A synchronous job's ranks all report the same wall-clock step time (every step ends in an
all-reduce that waits for the slowest), so a slow rank is found by what really differs:
- its own compute time (`compute_time_s`, measured by the trainer without the collectives'
  wait: docs/training.md), compared with the gang's; for a trainer that sends only step times
  (an asynchronous job, or a client that times each rank itself), those are compared instead;
- for jobs that report nothing, its GPU's SM activity over the last minute against its job's
  other GPUs, joined through the allocation ledger: a slow rank computes for more of every step
  while its peers idle in the collective, and in lock-step the ratio of its activity to theirs is
  the ratio of their compute times. The same StragglerDetector judges both, so "8 % slower and
  4σ" means the same thing either way. A rank both ways flagged is one finding.
The likely cause is named from the slow GPU's own telemetry against its peers': clocks held down
with a thermal or power throttle bit, NVLink or PCIe errors rising, another busy job on its node.

`job_findings(at)` is what the per-minute scoring pass (`anomaly.scoring.score_fleet`) calls for the
kinds in `KINDS`; it reads and returns, and `anomaly.actions.do_record_findings` stores.

A job is "running" here when it reported training steps in the window: the steps are the evidence,
whatever the scheduler's state says (a replay of a past hour sees jobs that have since ended).

Cost, whatever the fleet size: five statements, each one set-based.

1. Per rank, the median and count of its step times and of its compute times over the last
   `recent` (one grouped aggregate over the newest chunk of the step hypertable, joined to the job
   for its start). Steps in the first `warmup` after the job started are left out (compilation and
   first batches are slow), and so are steps from before its start (a requeued job's previous run).
1b. Per GPU allocated to a job for the whole of the last `recent`, its mean SM activity, clock,
   power and throttle bits and its NVLink / PCIe error increase over that minute, with its rank
   (one aggregate over the newest GPU samples, joined to the open allocations).
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
from sklearn.base import clone

from anomaly.detectors.training import (
    DIVERGENCE_FIELDS,
    GRAD,
    INF,
    LOSS,
    MAD_TO_SIGMA,
    NAN,
    Divergence,
    DivergenceDetector,
    StragglerDetector,
)
from anomaly.findings import Contribution, Finding
from anomaly.models import AnomalyKind
from telemetry.fields import KINDS as SAMPLE_KINDS
from telemetry.models import Allocation, Gpu, Job, Node, TrainingStep
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
_SAMPLES = SAMPLE_KINDS["gpu"].table

# The CTE is materialised so the planner always starts from the time range of the newest chunk (its
# time index); joined the other way round it may walk a job's whole history through the job_id index.
_RANK_MEDIANS_SQL = f"""
WITH s AS MATERIALIZED (
    SELECT job_id, rank, time, step_time_s, compute_time_s FROM {_STEPS}
    WHERE time > %(since)s AND time <= %(at)s AND (step_time_s IS NOT NULL OR compute_time_s IS NOT NULL)
)
SELECT s.job_id, s.rank, percentile_cont(0.5) WITHIN GROUP (ORDER BY s.step_time_s), count(s.step_time_s),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY s.compute_time_s), count(s.compute_time_s)
FROM s LEFT JOIN {_JOBS} j ON j.id = s.job_id AND s.time < j.start_time + %(warmup)s
WHERE j.id IS NULL
GROUP BY s.job_id, s.rank
"""

# Ranks numbered as `_places` numbers them (nodes by allocation start and hostname, GPUs by index).
# Only GPUs allocated for the whole window: a GPU's first minute in a job averages in its last job.
# Error counters are cumulative: their rise over the window is max - min (a reset reads as none).
_GPU_ACTIVITY_SQL = f"""
WITH a AS (
    SELECT al.job_id, al.gpu_id, n.hostname,
           row_number() OVER (PARTITION BY al.job_id ORDER BY al.start, n.hostname, al.gpu_index, al.id) - 1 AS rank
    FROM {Allocation._meta.db_table} al JOIN {Node._meta.db_table} n ON n.id = al.node_id
    WHERE al.start <= %(since)s AND (al."end" IS NULL OR al."end" > %(at)s) AND al.mig_instance_id IS NULL
), s AS MATERIALIZED (
    SELECT gpu_id, avg(sm_active) AS sm, count(sm_active) AS n, avg(sm_clock) AS clock, avg(power_w) AS power,
           avg(gpu_temp) AS temp, bit_or(throttle_reasons) AS reasons,
           max(nvlink_crc_flit_errors) - min(nvlink_crc_flit_errors) + max(nvlink_replay_errors)
             - min(nvlink_replay_errors) AS nvlink, max(pcie_replay) - min(pcie_replay) AS pcie
    FROM {_SAMPLES} WHERE time > %(since)s AND time <= %(at)s GROUP BY gpu_id
)
SELECT a.job_id, a.rank, a.hostname, g.uuid, s.sm, s.n, s.clock, s.power, s.temp, s.reasons, s.nvlink, s.pcie
FROM a JOIN s ON s.gpu_id = a.gpu_id JOIN {Gpu._meta.db_table} g ON g.id = a.gpu_id
WHERE s.n > 0
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
    detector = straggler or StragglerDetector()
    gpus = _gpu_activity(at, recent)
    slow = _merge(_straggling(ranks, detector), _hw_straggling(gpus, detector))
    diverging = _diverging(_loss_series(at, window, recent), divergence or DivergenceDetector())
    job_ids = sorted({h.job for h in slow} | {int(d.jobs[i]) for d, i in diverging})
    keys = dict((pk, job_key(src, ext)) for pk, src, ext in
                Job.objects.filter(pk__in=job_ids).values_list("pk", "source", "external_id"))
    places = _places(job_ids, at) if job_ids else {}
    found = [_straggler_finding(h, keys, places, gpus) for h in slow]
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


def _gpu_activity(at: datetime, recent: timedelta) -> list[tuple]:
    """[(job id, rank, host, GPU UUID, SM active, samples, SM clock, power, GPU temperature, throttle
    bits, NVLink error rise, PCIe replay rise)] per GPU allocated for the whole of (at - recent, at]."""
    with connection.cursor() as cur:
        cur.execute(_GPU_ACTIVITY_SQL, {"since": at - recent, "at": at})
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

# A gang whose median SM activity is below this is not computing (warming up, checkpointing, an idle
# job): a ratio of small activities says nothing about who is slow.
HW_MIN_ACTIVE = 0.2
# Throttle bits (nvmlClocksEventReasons) that name a cause, and the cause.
THERMAL_BITS = 0x08 | 0x20 | 0x40  # HW slowdown, SW thermal, HW thermal
POWER_BITS = 0x04 | 0x80  # SW power cap, HW power brake
CLOCK_MARGIN = 0.05  # a clock this much below its peers' median is held down


class _Slow(NamedTuple):
    """One straggling rank, before its job's key and place are known: what it was judged on (compute
    time, step time, or SM activity), its value against the gang's median, and the verdict."""

    job: int
    rank: int
    field: str
    value: float
    reference: float
    z: float
    slowdown: float
    score: float
    gang_ranks: int


_FIELDS = {"compute_time_s": "compute time", "step_time_s": "step time", "sm_active": "SM active"}


def _judge(gang, job, rank, value, n, detector: StragglerDetector, field: np.ndarray) -> tuple[list[_Slow], np.ndarray]:
    """The flagged ranks, and every rank's gang median."""
    value = np.asarray(value, dtype=float)
    result = detector.fit(value, gang=gang, n_steps=n).evaluate(value, gang=gang, n_steps=n)
    gang_ranks = detector.gang_ranks_[np.searchsorted(detector.gangs_, gang)]
    return [_Slow(int(job[i]), int(rank[i]), str(field[i]), float(value[i]), float(result.reference[i]),
                  float(result.z[i]), float(result.slowdown[i]), float(result.score[i]), int(gang_ranks[i]))
            for i in np.flatnonzero(result.flagged)], result.reference


def _straggling(ranks: list[tuple], detector: StragglerDetector) -> list[_Slow]:
    """Ranks slow against their gang by compute time where they report it, else by step time."""
    if not ranks:
        return []
    job, rank, step, step_n, compute, compute_n = (np.asarray(c) for c in zip(*ranks, strict=True))
    by_compute = compute_n >= detector.min_steps
    value = np.where(by_compute, compute, step).astype(float)
    n = np.where(by_compute, compute_n, step_n).astype(int)
    field = np.where(by_compute, "compute_time_s", "step_time_s")
    # Compute and step times are not comparable: a gang is the job and what its ranks report.
    gang = np.char.add(job.astype(str), np.where(by_compute, "|c", "|s"))
    return _judge(gang, job, rank, value, n, detector, field)[0]


def _hw_straggling(gpus: list[tuple], detector: StragglerDetector) -> list[_Slow]:
    """Ranks whose GPU is busier than its job's others: in a synchronous job, the one they wait for."""
    if not gpus:
        return []
    job = np.array([g[0] for g in gpus])
    rank = np.array([g[1] for g in gpus])
    sm = np.array([np.nan if g[4] is None else g[4] for g in gpus], dtype=float)
    hw = clone(detector).set_params(min_steps=1)  # each sample is already the exporter's average
    found, reference = _judge(job, job, rank, sm, np.array([g[5] for g in gpus]), hw, np.full(len(gpus), "sm_active"))
    busy = {(int(job[i]), int(rank[i])) for i in np.flatnonzero(reference >= HW_MIN_ACTIVE)}
    return [h for h in found if (h.job, h.rank) in busy]


def _merge(reported: list[_Slow], hardware: list[_Slow]) -> list[_Slow]:
    """One finding per rank: what its job reports first, its GPU's activity where that is all there is."""
    seen = {(h.job, h.rank) for h in reported}
    return reported + [h for h in hardware if (h.job, h.rank) not in seen]


def _straggler_finding(h: _Slow, keys: dict, places: dict, gpus: list[tuple]) -> Finding:
    host, uuid = _place(places, h.job, h.rank)
    primary = Contribution(h.field, _FIELDS[h.field], h.value, h.reference, h.z, "gang median")
    causes, evidence = _causes(h, gpus)
    if h.field == "sm_active":
        what = (f"{primary.phrase()}: computes {1 + h.slowdown:.2f}× as long as the median of its "
                f"{h.gang_ranks} ranks, which wait for it in the collective")
    else:
        what = f"{primary.phrase()} ({1 + h.slowdown:.2f}× over {h.gang_ranks} ranks)"
    cause = "; likely cause: " + ", ".join(causes) if causes else "; no cause visible in its GPU's telemetry"
    return Finding(
        kind=AnomalyKind.STRAGGLER.value, entity_kind="rank", entity_id=f"{keys.get(h.job, h.job)}#{h.rank}",
        score=round(h.score, 4), contributions=(primary, *evidence), host=host, summary=(what + cause)[:300],
        extra={"gpu_uuid": uuid} if uuid else {},
    )


def _causes(h: _Slow, gpus: list[tuple]) -> tuple[list[str], tuple[Contribution, ...]]:
    """What the slow rank's GPU shows that its job's other GPUs do not: clocks held down with a
    thermal or power throttle bit, NVLink errors or PCIe replays rising. (names, evidence)"""
    gang = [g for g in gpus if g[0] == h.job]
    mine = next((g for g in gang if g[1] == h.rank), None)
    if mine is None:
        return [], ()
    peers = [g for g in gang if g[1] != h.rank]

    def typical(col: int) -> float | None:
        values = [g[col] for g in peers if g[col] is not None]
        return float(np.median(values)) if values else None

    causes, evidence = [], []
    clock, peer_clock = mine[6], typical(6)
    bits = mine[9] or 0
    peer_bits = [g[9] or 0 for g in peers]
    held = clock is not None and peer_clock and clock < (1 - CLOCK_MARGIN) * peer_clock

    def only_mine(mask: int) -> bool:  # a bit of `mask` set on this GPU and on fewer than half of its peers
        return any(bits & bit and sum(bool(b & bit) for b in peer_bits) < len(peer_bits) / 2
                   for bit in (1 << k for k in range(mask.bit_length())) if mask & bit)

    if held:
        evidence.append(Contribution("sm_clock", "SM clock", clock, peer_clock,
                                     _sigma(clock, [g[6] for g in peers]), "gang median"))
        if only_mine(THERMAL_BITS):
            causes.append("thermal throttling")
        if only_mine(POWER_BITS):
            causes.append("power throttling")
        if not causes:
            causes.append("clocks held down with no throttle reason reported")
        if bits:
            evidence.append(Contribution("throttle_reasons", "throttle reasons", float(bits), None, float("nan"),
                                         "its GPU"))
    # A neighbour: another job busy on the same node, sharing its CPUs, host memory and PCIe switches.
    neighbours = sorted({g[0] for g in gpus if g[2] == mine[2] and g[0] != h.job and (g[4] or 0) >= HW_MIN_ACTIVE})
    if neighbours and not causes:
        causes.append(f"shares its node with {len(neighbours)} other busy job{'s' if len(neighbours) > 1 else ''}")
    for col, field, label, name in ((10, "nvlink_crc_flit_errors", "NVLink errors", "NVLink errors rising"),
                                    (11, "pcie_replay", "PCIe replays", "PCIe replays rising")):
        if (mine[col] or 0) > 0 and (typical(col) or 0) == 0:
            causes.append(name)
            evidence.append(Contribution(field, label, float(mine[col]), 0.0,
                                         _sigma(mine[col], [g[col] for g in peers]), "gang median"))
    return causes, tuple(evidence)


def _sigma(value: float, peers: list) -> float:
    """Robust z of `value` against its peers' values (MAD, floored at 1 % of the median and at 1)."""
    values = np.array([v for v in peers if v is not None], dtype=float)
    if not len(values):
        return float("nan")
    median = float(np.median(values))
    scale = max(MAD_TO_SIGMA * float(np.median(np.abs(values - median))), 0.01 * abs(median), 1.0)
    return (float(value) - median) / scale


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
