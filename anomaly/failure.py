"""GPU failure prediction, the pure part: precursor features, the estimator, time splits, metrics.

Arrays in, arrays out; no Django. The loaders (`anomaly.failure_data` for the database, the
simulated fleets in `anomaly.failure_sim`) both reduce a GPU's history at a cut time `t` to
the same named aggregates (`HISTORY_FIELDS`, one value per GPU and cut), and `failure_features`
turns those into the feature matrix. Training and scoring therefore see the same features
whichever history they came from.

A *failure* is a GPU event of a failure kind (`is_failure`): a double-bit ECC error, a row-remap
failure, the GPU falling off the bus, or XID 48/79/94/95. A row (one GPU at one cut time) is
labelled 1 when a failure's first sighting falls in ``(t, t + horizon]``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from scipy.stats import chi2
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.calibration import CalibratedClassifierCV
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.frozen import FrozenEstimator
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score, brier_score_loss, precision_recall_curve
from sklearn.utils.validation import check_array, check_is_fitted
from threadpoolctl import threadpool_limits

from anomaly.failure_channels import TailReference, cross_channel, fit_channel_tails

HOUR = 3600.0

# What the loaders must provide per GPU at a cut time t (NaN where unknown). Windows end at t;
# "24h" is the last 24 full hours plus the current partial hour (1h rollups + 1m tail).
HISTORY_FIELDS: tuple[str, ...] = (
    "sbe_1h", "sbe_24h", "sbe_total", "dbe_total", "retired_pages",
    "remapped_correctable", "remapped_uncorrectable", "remap_growth_24h", "remap_pending",
    "gpu_temp_max_24h", "memory_temp_max_24h", "hot_hours_24h",
    "nvlink_crc_1h", "nvlink_crc_24h", "pcie_replay_24h", "idle_power_w",
    "power_excess_1h", "gpu_temp_excess_1h", "memory_temp_excess_1h",
    "xid_memory_7d", "xid_bus_7d", "xid_nvlink_7d", "xid_app_7d", "xid_other_7d", "failures_30d",
    "age_days", "row_number", "rack_position", "u_position", "gpu_index", "survival_log_hazard",
)
# A 1h bucket counts as a temperature excursion when its max reaches the simulator's (and H100's)
# software slowdown temperatures.
HOT_GPU_C, HOT_MEMORY_C = 85.0, 95.0
# A reading (or a whole bucket) is idle when utilisation stayed below this percentage: no kernel ran.
IDLE_UTIL = 1.0


@dataclass(frozen=True)
class Feature:
    """One column of the feature matrix; `precursor` features may explain a risk to an operator.

    Precursors are monotone: more errors, remaps, XIDs or heat never lower the risk. The trees are
    held to it, which keeps them from learning accidents of a short history ("idle all day, so it
    will fail": a simulated fleet taught that before the constraint).
    """

    name: str
    label: str
    precursor: bool = True
    floor: float = 1.0  # the smallest robust σ used in explanations (one error, one degree, one hour)
    increasing: bool = False  # held non-decreasing though not a precursor (a prior)

    @property
    def monotone(self) -> int:
        return 1 if self.precursor or self.increasing else 0


FEATURES: tuple[Feature, ...] = (
    Feature("sbe_1h", "SBE errors in the last hour"),
    Feature("sbe_per_h_24h", "SBE errors per hour over the day"),
    Feature("sbe_trend", "SBE trend (last hour vs day, log ratio)", floor=0.5),
    Feature("sbe_total", "SBE errors, lifetime"),
    Feature("dbe_total", "DBE errors, lifetime"),
    Feature("retired_pages", "retired pages"),
    Feature("remapped_correctable", "rows remapped (correctable)"),
    Feature("remapped_uncorrectable", "rows remapped (uncorrectable)"),
    Feature("remap_growth_24h", "rows remapped in the last day"),
    Feature("remap_pending", "row remap pending a reset"),
    Feature("gpu_temp_max_24h", "GPU temperature max, last day"),
    Feature("memory_temp_max_24h", "HBM temperature max, last day"),
    Feature("hot_hours_24h", "hours over the slowdown temperature, last day"),
    Feature("nvlink_crc_1h", "NVLink CRC errors in the last hour"),
    Feature("nvlink_crc_trend", "NVLink CRC trend (last hour vs day, log ratio)", floor=0.5),
    Feature("pcie_replay_24h", "PCIe replays in the last day"),
    Feature("idle_power_w", "idle power (W), newest idle reading in the day", floor=5.0),
    Feature("power_excess_1h", "power above its node's other GPUs (W), last hour", floor=5.0),
    Feature("gpu_temp_excess_1h", "GPU temperature above its node's other GPUs, last hour"),
    Feature("memory_temp_excess_1h", "HBM temperature above its node's other GPUs, last hour"),
    Feature("xid_memory_7d", "memory XIDs/DBEs in 7 days"),
    Feature("xid_bus_7d", "bus XIDs in 7 days"),
    Feature("xid_nvlink_7d", "NVLink XIDs in 7 days"),
    Feature("xid_app_7d", "application XIDs in 7 days"),
    Feature("xid_other_7d", "other XIDs in 7 days"),
    Feature("failures_30d", "failures in 30 days"),
    Feature("age_days", "age (days)", precursor=False),
    Feature("row_number", "row", precursor=False),
    Feature("rack_position", "rack position in row", precursor=False),
    Feature("u_position", "U position", precursor=False),
    Feature("gpu_index", "GPU index", precursor=False),
    Feature("survival_log_hazard", "hazard by age and height in the rack (Titan), log10 per day", precursor=False,
            increasing=True),
)
FEATURE_NAMES: tuple[str, ...] = tuple(f.name for f in FEATURES)
_COPIED = {f.name for f in FEATURES} & set(HISTORY_FIELDS)


def _log_ratio(recent: np.ndarray, day: np.ndarray) -> np.ndarray:
    """log(1 + last hour) - log(1 + hourly mean over the day): > 0 when errors accelerate."""
    return np.log1p(recent) - np.log1p(day / 24.0)


# Peer excess: a GPU against the other GPUs of its node, which run the same job on the same coolant,
# so workload and inlet temperature cancel and what is left is the GPU's own (a hotter die at the same
# power, more power for the same work). Loaders provide the last-hour averages as PEER_SOURCES.
PEER_SOURCES = {"power_excess_1h": "power_avg_1h", "gpu_temp_excess_1h": "gpu_temp_avg_1h",
                "memory_temp_excess_1h": "memory_temp_avg_1h"}


def peer_excess(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Each row's value minus the median of the other rows of its group (NaN without a peer)."""
    values, group = np.asarray(values, float), np.asarray(group)
    out = np.full(len(values), np.nan)
    if not len(values):
        return out
    _, inverse = np.unique(group, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    g = inverse[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    slot = np.arange(len(g)) - np.repeat(starts, np.diff(np.r_[starts, len(g)]))
    table = np.full((len(starts), slot.max() + 1), np.nan)
    table[g, slot] = values[order]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a GPU alone on its node: no peer
        for j in range(table.shape[1]):
            others = table.copy()
            others[:, j] = np.nan
            here = slot == j
            out[order[here]] = values[order[here]] - np.nanmedian(others, axis=1)[g[here]]
    return out


def with_peer_excess(values: dict[str, np.ndarray], group: np.ndarray) -> dict[str, np.ndarray]:
    """`values` with the PEER_SOURCES averages replaced by their peer excess."""
    out = {k: v for k, v in values.items() if k not in PEER_SOURCES.values()}
    out.update({name: peer_excess(values[src], group) for name, src in PEER_SOURCES.items()})
    return out


def failure_features(history: Mapping[str, np.ndarray]) -> np.ndarray:
    """The (rows, len(FEATURES)) matrix from per-row history aggregates (see HISTORY_FIELDS)."""
    missing = [name for name in HISTORY_FIELDS if name not in history]
    if missing:
        raise KeyError(f"history lacks {', '.join(missing)}")
    h = {name: np.asarray(history[name], dtype=float).ravel() for name in HISTORY_FIELDS}
    lengths = {len(v) for v in h.values()}
    if len(lengths) != 1:
        raise ValueError(f"history fields differ in length: {sorted(lengths)}")
    derived = {
        "sbe_per_h_24h": h["sbe_24h"] / 24.0,
        "sbe_trend": _log_ratio(h["sbe_1h"], h["sbe_24h"]),
        "nvlink_crc_trend": _log_ratio(h["nvlink_crc_1h"], h["nvlink_crc_24h"]),
    }
    return np.column_stack([h[name] if name in _COPIED else derived[name] for name in FEATURE_NAMES])


# --- events: what counts as a failure, and the XID classes ---------------------------------------
FAILURE_KINDS = frozenset({"ecc_dbe", "row_remap_failure", "fallen_off_bus"})
FAILURE_XIDS = frozenset({48, 79, 94, 95})
EVENT_CLASSES: tuple[str, ...] = ("memory", "bus", "nvlink", "app", "other")
_XID_CLASS = {
    **dict.fromkeys((48, 63, 64, 92, 94, 95), "memory"),
    **dict.fromkeys((32, 79), "bus"),
    **dict.fromkeys((74, 136, 137, 144, 145, 146, 147, 148, 149, 150), "nvlink"),
    **dict.fromkeys((8, 11, 13, 31, 43, 45, 68, 69), "app"),
}
_KIND_CLASS = {"ecc_dbe": "memory", "row_remap_failure": "memory", "fallen_off_bus": "bus"}


def is_failure(kind: str, code: int) -> bool:
    """Whether a GPU event (telemetry.models.GpuEvent kind and code) is a failure."""
    return kind in FAILURE_KINDS or (kind == "xid" and code in FAILURE_XIDS)


def event_class(kind: str, code: int) -> str | None:
    """The XID class an event counts in; None for NVLink error-count events (a feature of their own)."""
    if kind == "xid":
        return _XID_CLASS.get(code, "other")
    return _KIND_CLASS.get(kind)


@dataclass
class Events:
    """GPU events as arrays, oldest first: GPU key, first sighting (epoch s), class index, failure."""

    gpu: np.ndarray
    time: np.ndarray
    cls: np.ndarray  # index into EVENT_CLASSES, -1 for none
    failure: np.ndarray

    @classmethod
    def from_rows(cls, rows) -> Events:
        """From (gpu key, epoch seconds, kind, code) tuples."""
        rows = sorted(rows, key=lambda r: r[1])
        classes = [event_class(k, c) for _, _, k, c in rows]
        return cls(np.array([r[0] for r in rows], dtype=np.int64), np.array([r[1] for r in rows], dtype=float),
                   np.array([EVENT_CLASSES.index(c) if c else -1 for c in classes], dtype=np.int64),
                   np.array([is_failure(k, c) for _, _, k, c in rows], dtype=bool))

    def between(self, lo: float, hi: float, *, closed_right: bool = False) -> np.ndarray:
        """Indices of events in [lo, hi), or in (lo, hi] with closed_right."""
        a, b = np.searchsorted(self.time, [lo, hi], side="right" if closed_right else "left")
        return np.arange(a, b)


def _count_by_gpu(row_gpu: np.ndarray, ev_gpu: np.ndarray) -> np.ndarray:
    """How many of `ev_gpu` fall on each row's GPU."""
    if not len(ev_gpu):
        return np.zeros(len(row_gpu))
    keys, counts = np.unique(ev_gpu, return_counts=True)
    pos = np.minimum(np.searchsorted(keys, row_gpu), len(keys) - 1)
    return np.where(keys[pos] == row_gpu, counts[pos], 0).astype(float)


def event_history(row_gpu: np.ndarray, events: Events, t: float) -> dict[str, np.ndarray]:
    """The event aggregates of HISTORY_FIELDS for rows at cut `t` (events before t only)."""
    week = events.between(t - 7 * 24 * HOUR, t)
    out = {f"xid_{name}_7d": _count_by_gpu(row_gpu, events.gpu[week[events.cls[week] == k]])
           for k, name in enumerate(EVENT_CLASSES)}
    month = events.between(t - 30 * 24 * HOUR, t)
    out["failures_30d"] = _count_by_gpu(row_gpu, events.gpu[month[events.failure[month]]])
    return out


def failure_labels(row_gpu: np.ndarray, events: Events, t: float, horizon_s: float) -> np.ndarray:
    """1 for rows whose GPU has a failure first seen in (t, t + horizon]."""
    ahead = events.between(t, t + horizon_s, closed_right=True)
    return (_count_by_gpu(row_gpu, events.gpu[ahead[events.failure[ahead]]]) > 0).astype(np.int8)


def failure_episodes(events: Events, horizon_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(gpu, time) of each failure episode: a failure starts one unless the same GPU failed less
    than `horizon_s` before (an XID 79 after the DBE that began the trouble is the same episode)."""
    gpus, times, last = [], [], {}
    for g, t in zip(events.gpu[events.failure], events.time[events.failure], strict=True):
        if g not in last or t - last[g] >= horizon_s:
            gpus.append(g)
            times.append(t)
        last[g] = t
    return np.array(gpus, dtype=np.int64), np.array(times, dtype=float)


# --- the frame both loaders build ------------------------------------------------------------------
@dataclass
class FailureFrame:
    """Training or evaluation rows: one GPU at one cut time, its history, label and weight."""

    history: dict[str, np.ndarray]
    gpu: np.ndarray  # a GPU key per row (database id, or a simulated index)
    time: np.ndarray  # the cut time per row, epoch seconds
    y: np.ndarray
    weight: np.ndarray
    episodes: tuple[np.ndarray, np.ndarray] = field(
        default_factory=lambda: (np.zeros(0, np.int64), np.zeros(0)))  # (gpu, time) of failure episodes

    def __len__(self) -> int:
        return len(self.y)

    @property
    def X(self) -> np.ndarray:
        return failure_features(self.history)

    def take(self, rows: np.ndarray) -> FailureFrame:
        return FailureFrame({k: v[rows] for k, v in self.history.items()}, self.gpu[rows], self.time[rows],
                            self.y[rows], self.weight[rows], self.episodes)

    @classmethod
    def concat(cls, frames: list[FailureFrame]) -> FailureFrame:
        """Frames whose GPU keys do not overlap (another fleet, or the same keys throughout)."""
        cat = np.concatenate
        return cls({k: cat([f.history[k] for f in frames]) for k in HISTORY_FIELDS}, cat([f.gpu for f in frames]),
                   cat([f.time for f in frames]), cat([f.y for f in frames]), cat([f.weight for f in frames]),
                   (cat([f.episodes[0] for f in frames]), cat([f.episodes[1] for f in frames])))


# --- splitting by time -----------------------------------------------------------------------------
def time_split(times, *, test_fraction: float = 0.25, gap: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) row indices split by time, never at random.

    Test holds the latest `test_fraction` of the distinct cut times (all rows of a cut on the same
    side); train ends `gap` before test begins, so a training label, which looks `gap` ahead, never
    sees the test period.
    """
    times = np.asarray(times, dtype=float)
    distinct = np.unique(times)
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if len(distinct) < 2:
        raise ValueError(f"a time split needs at least two distinct times, got {len(distinct)}")
    k = min(max(1, round(len(distinct) * test_fraction)), len(distinct) - 1)
    start = distinct[-k]
    train, test = np.flatnonzero(times < start - gap), np.flatnonzero(times >= start)
    if not len(train):
        raise ValueError(f"nothing left to train on: the gap ({gap:g} s) swallows every time before the split")
    return train, test


# --- metrics ---------------------------------------------------------------------------------------
def precision_recall_at(y, p, threshold: float, sample_weight=None) -> tuple[float, float]:
    """Precision and recall of the alert `p >= threshold` (0.0 when nothing was alerted / nothing failed)."""
    y, alert = np.asarray(y) == 1, np.asarray(p) >= threshold
    w = np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight, dtype=float)
    tp, alerted, actual = w[y & alert].sum(), w[alert].sum(), w[y].sum()
    return (float(tp / alerted) if alerted else 0.0), (float(tp / actual) if actual else 0.0)


def lead_times(row_gpu, row_time, p, threshold: float, episodes, horizon_s: float) -> np.ndarray:
    """Per failure episode, seconds from the first row at or above `threshold` to the failure.

    Only rows of the failing GPU in [failure - horizon, failure) count; episodes without such a row
    are dropped (nothing to judge). NaN: never alerted (missed). +inf: alerted from the GPU's very
    first row, so the crossing itself was not seen (censored: caught, lead time unknown).
    """
    row_gpu, row_time, p = np.asarray(row_gpu), np.asarray(row_time, float), np.asarray(p, float)
    out = []
    for g, f in zip(*episodes, strict=True):
        gpu = row_gpu == g
        mine = gpu & (row_time >= f - horizon_s) & (row_time < f)
        if not mine.any():
            continue
        alerted = row_time[mine & (p >= threshold)]
        if not len(alerted):
            out.append(np.nan)
        elif alerted.min() <= row_time[gpu].min():
            out.append(np.inf)
        else:
            out.append(f - alerted.min())
    return np.array(out, dtype=float)


def failure_metrics(frame: FailureFrame, p, threshold: float, horizon_s: float) -> dict:
    """Precision and recall at the threshold, PR-AUC, Brier score and lead times on `frame`."""
    y, w = frame.y, frame.weight
    if not y.any():
        raise ValueError("no failures in these rows: PR-AUC and recall are undefined")
    precision, recall = precision_recall_at(y, p, threshold, w)
    leads = lead_times(frame.gpu, frame.time, p, threshold, frame.episodes, horizon_s)
    caught, seen = leads[~np.isnan(leads)], leads[np.isfinite(leads)]
    return {
        "pr_auc": round(float(average_precision_score(y, p, sample_weight=w)), 4),
        "precision": round(precision, 4), "recall": round(recall, 4), "threshold": round(float(threshold), 4),
        "brier": round(float(brier_score_loss(y, p, sample_weight=w)), 5),
        "base_rate": round(float(np.average(y, weights=w)), 5),
        "lead_time_median_h": round(float(np.median(seen)) / HOUR, 3) if len(seen) else None,
        "failures": len(leads), "caught": len(caught), "lead_times_seen": len(seen),
        "rows": len(y), "positive_rows": int(y.sum()),
    }


def _by_gpu_then_time(gpu, time) -> np.ndarray:
    return np.lexsort((np.asarray(time, float), np.asarray(gpu)))


def alarm_onsets(gpu, time, p, threshold: float) -> np.ndarray:
    """Per row, True where an alarm opens: the row is at or above `threshold` and the GPU's previous row
    (by time) was not, or it has none. An alarm stays one alarm while the GPU stays at risk, as a
    `failure_risk` event is opened once and extended."""
    gpu, p = np.asarray(gpu), np.asarray(p, float)
    order = _by_gpu_then_time(gpu, time)
    alert = p[order] >= threshold
    first = np.r_[True, gpu[order][1:] != gpu[order][:-1]]
    out = np.zeros(len(p), dtype=bool)
    out[order] = alert & (first | ~np.r_[False, alert[:-1]])
    return out


def cut_step(times) -> float:
    """The spacing of the cut times (seconds): the median gap between distinct times."""
    distinct = np.unique(np.asarray(times, float))
    if len(distinct) < 2:
        raise ValueError("one cut time has no spacing: GPU-days cannot be counted")
    return float(np.median(np.diff(distinct)))


def false_alarm_rate(gpu, time, p, threshold: float, step_s: float) -> tuple[int, float]:
    """(alarms opened, GPU-days observed) over rows of GPUs that did not fail; each row stands for one
    cut step of its GPU's time."""
    return int(alarm_onsets(gpu, time, p, threshold).sum()), len(p) * step_s / 86_400


def alarms_allowed(gpu_days: float, per_1k_gpu_days: float, confidence: float | None) -> float:
    """How many alarms opened over `gpu_days` still support a rate of at most `per_1k_gpu_days`.

    With `confidence` None, the point estimate: the budget itself. Else the largest count k whose
    one-sided Poisson upper bound at `confidence` (chi²(confidence, 2k+2) / 2) is within the budget; -1
    when not even zero alarms is (the slice is too short to show the rate with that confidence).
    """
    budget = per_1k_gpu_days * gpu_days / 1000
    if confidence is None:
        return budget
    k = -1
    while chi2.ppf(confidence, 2 * (k + 2)) / 2 <= budget:
        k += 1
    return float(k)


def min_calibration_gpu_days(per_1k_gpu_days: float, confidence: float | None) -> float:
    """The GPU-days a calibration slice needs before even zero alarms show a rate of `per_1k_gpu_days`
    at `confidence` (chi²(confidence, 2) / 2 expected alarms: 3.0 at 95 %); 0 for the point estimate."""
    if confidence is None:
        return 0.0
    return float(chi2.ppf(confidence, 2) / 2 * 1000 / per_1k_gpu_days)


def false_alarm_threshold(gpu, time, p, *, per_1k_gpu_days: float, step_s: float,
                          confidence: float | None = None) -> float:
    """The lowest threshold at which the rows of healthy GPUs open at most `alarms_allowed` alarms (a rate
    of `per_1k_gpu_days` per 1,000 GPU-days, as a point estimate or, with `confidence`, as an upper
    bound), and at which every higher candidate does too.

    Candidates are the healthy rows' own scores, from the highest down; the scan stops at the first
    that opens too many alarms. When even the highest does, the threshold lies just above it (no
    healthy row alarms)."""
    p = np.asarray(p, float)
    if not len(p):
        raise ValueError("no healthy rows to count false alarms on")
    budget = alarms_allowed(len(p) * step_s / 86_400, per_1k_gpu_days, confidence)
    chosen = float(min(1.0, np.nextafter(p.max(), np.inf)))
    for candidate in np.unique(p)[::-1]:
        if alarm_onsets(gpu, time, p, candidate).sum() > budget:
            break
        chosen = float(candidate)
    return chosen


# --- explanations ----------------------------------------------------------------------------------
def fleet_typical(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per feature, the fleet median and robust σ (1.4826 MAD, at least the feature's floor)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column: a field this fleet never reports
        med = np.nanmedian(X, axis=0) if len(X) else np.full(X.shape[1], np.nan)
        mad = np.nanmedian(np.abs(X - med), axis=0) if len(X) else np.full(X.shape[1], np.nan)
    floors = np.array([f.floor for f in FEATURES])
    return med, np.fmax(np.nan_to_num(1.4826 * mad), floors)


def top_precursors(x: np.ndarray, median: np.ndarray, sigma: np.ndarray, top: int = 3) -> list[tuple]:
    """(feature, value, typical, deviation in σ) of the precursors most above the fleet, largest first."""
    dev = (x - median) / sigma
    ranked = [(dev[k], k) for k, f in enumerate(FEATURES) if f.precursor and np.isfinite(dev[k])]
    ranked.sort(reverse=True)
    picked = [(d, k) for d, k in ranked[:top] if d > 0] or ranked[:1]
    return [(FEATURES[k], float(x[k]), float(median[k]), float(d)) for d, k in picked]


# --- the estimator ---------------------------------------------------------------------------------
class FailurePredictor(ClassifierMixin, BaseEstimator):
    """Gradient-boosted trees on precursor features, calibrated on the latest slice of its rows.

    `fit(X, y, times=...)` trains a HistGradientBoostingClassifier on the earlier rows and fits
    the calibration (isotonic or sigmoid, `CalibratedClassifierCV` around the frozen trees) on the
    latest `calibration_fraction` of the cut times, `calibration_gap` after them. Without
    `times` the row order is taken as time order. `monotonic_cst="precursors"` holds the risk
    non-decreasing in every precursor of `FEATURES` (X must then have exactly those columns);
    None leaves the trees free, a sequence is passed to the trees as is. With `alert_threshold=None` the alert threshold
    is chosen on the calibration slice by `alert_rule`: "f1" maximises F1 there (within [0.05, 0.95]);
    "false_alarms" is the lowest threshold at which the GPUs with no failure ahead open at most
    `false_alarms_per_1k_gpu_days` alarms per 1,000 GPU-days (`false_alarm_threshold`; `fit` then needs
    `groups`, the GPU of each row), by default as a one-sided 95 % Poisson upper bound
    (`false_alarm_confidence`; None for the point estimate). A threshold whose point estimate just meets
    the rate on the slice it was chosen on misses it on other fleets: the alarms are few (a few per
    thousand GPU-days) and the threshold sits on the largest healthy scores, the least stable ones.
    With `cross_channel` (the default; X must have the FEATURES columns) the probability is not the
    trees' alone: the trees' score and the largest channel surprise
    (`cross_channel`, how rare a GPU's most unusual precursor is among the trees' rows with no failure
    ahead) are each turned into their own rarity among the calibration slice's rows with no failure
    ahead, and the larger of the two is calibrated. A fault shape the trees never saw still alarms when
    its channel is rarer than anything healthy. `n_threads` caps
    the trees' OpenMP threads: workers share their host, and an oversubscribed OpenMP team spins
    (the same fit took 0.5 s on one thread and 17 s on two busy cores).

    Score sign: `predict_proba(X)[:, 1]` is the calibrated probability of a failure within the
    labels' horizon; higher is riskier. `predict` is 1 where it reaches `threshold_`.
    """

    def __init__(self, *, learning_rate: float = 0.1, max_iter: int = 100, max_leaf_nodes: int = 15,
                 min_samples_leaf: int = 40, l2_regularization: float = 1.0, class_weight=None,
                 calibration: str = "isotonic", calibration_fraction: float = 0.25, calibration_gap: float = 0.0,
                 monotonic_cst="precursors", alert_threshold: float | None = None, alert_rule: str = "f1",
                 false_alarms_per_1k_gpu_days: float = 1.0, false_alarm_confidence: float | None = 0.95,
                 cross_channel: bool = True, n_threads: int | None = 1, random_state: int = 0):
        self.learning_rate = learning_rate
        self.max_iter = max_iter
        self.max_leaf_nodes = max_leaf_nodes
        self.min_samples_leaf = min_samples_leaf
        self.l2_regularization = l2_regularization
        self.class_weight = class_weight
        self.calibration = calibration
        self.calibration_fraction = calibration_fraction
        self.calibration_gap = calibration_gap
        self.monotonic_cst = monotonic_cst
        self.alert_threshold = alert_threshold
        self.alert_rule = alert_rule
        self.false_alarms_per_1k_gpu_days = false_alarms_per_1k_gpu_days
        self.false_alarm_confidence = false_alarm_confidence
        self.cross_channel = cross_channel
        self.n_threads = n_threads
        self.random_state = random_state

    def _constraints(self, n_features: int):
        if not isinstance(self.monotonic_cst, str):
            return self.monotonic_cst
        if self.monotonic_cst != "precursors":
            raise ValueError(f"monotonic_cst must be 'precursors', None or a sequence, got {self.monotonic_cst!r}")
        if n_features != len(FEATURES):
            raise ValueError(f"monotonic_cst='precursors' needs the {len(FEATURES)} FEATURES columns, "
                             f"X has {n_features}")
        return [f.monotone for f in FEATURES]

    def _validate(self) -> None:
        if self.calibration not in ("isotonic", "sigmoid"):
            raise ValueError(f"calibration must be 'isotonic' or 'sigmoid', got {self.calibration!r}")
        if self.alert_threshold is not None and not 0 < self.alert_threshold < 1:
            raise ValueError(f"alert_threshold must be in (0, 1) or None, got {self.alert_threshold}")
        if self.alert_rule not in ("f1", "false_alarms"):
            raise ValueError(f"alert_rule must be 'f1' or 'false_alarms', got {self.alert_rule!r}")
        if not self.false_alarms_per_1k_gpu_days > 0:
            raise ValueError(f"false_alarms_per_1k_gpu_days must be > 0, got {self.false_alarms_per_1k_gpu_days}")
        c = self.false_alarm_confidence
        if c is not None and not 0 < c < 1:
            raise ValueError(f"false_alarm_confidence must be in (0, 1) or None, got {c}")

    def fit(self, X, y, times=None, sample_weight=None, groups=None):
        """`groups`: the GPU of each row, needed by alert_rule="false_alarms" to count alarms per GPU."""
        self._validate()
        if self.alert_rule == "false_alarms" and self.alert_threshold is None and groups is None:
            raise ValueError("alert_rule='false_alarms' needs groups (the GPU of each row) to count alarms")
        with threadpool_limits(limits=self.n_threads, user_api="openmp"):
            return self._fit(X, y, times, sample_weight, groups)

    def _fit(self, X, y, times, sample_weight, groups):
        X = check_array(X, ensure_all_finite="allow-nan", dtype=float)
        y = np.asarray(y).astype(int).ravel()
        if len(y) != len(X) or not set(np.unique(y)) <= {0, 1}:
            raise ValueError("y must be one 0/1 label per row of X")
        times = np.arange(len(X), dtype=float) if times is None else np.asarray(times, dtype=float)
        w = np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight, dtype=float)
        fit, cal = time_split(times, test_fraction=self.calibration_fraction, gap=self.calibration_gap)
        for name, rows in (("training", fit), ("calibration", cal)):
            if len(np.unique(y[rows])) < 2:
                raise ValueError(f"the {name} slice needs failures and non-failures; it has {int(y[rows].sum())} "
                                 f"failure rows of {len(rows)}")
        if self.cross_channel and X.shape[1] != len(FEATURES):
            raise ValueError(f"cross_channel needs the {len(FEATURES)} FEATURES columns, X has {X.shape[1]}")
        self.trees_ = self._trees(X[fit], y[fit], w[fit], self._constraints(X.shape[1]))
        if not self.cross_channel:
            self.calibrated_ = CalibratedClassifierCV(FrozenEstimator(self.trees_), method=self.calibration)
            with warnings.catch_warnings():
                # "weights will only be used for the calibration itself": the intent, the trees are frozen.
                warnings.filterwarnings("ignore", message=".*FrozenEstimator does not appear to accept sample_weight")
                self.calibrated_.fit(X[cal], y[cal], sample_weight=w[cal])
        else:
            self._fit_cross_channel(X, y, w, fit, cal)
        self.classes_ = np.array([0, 1])
        self.n_features_in_ = X.shape[1]
        self.threshold_ = self._threshold(X[cal], y[cal], w[cal], None if groups is None else
                                          (np.asarray(groups)[cal], times[cal], cut_step(times)))
        return self

    def _trees(self, X, y, w, constraints) -> HistGradientBoostingClassifier:
        return HistGradientBoostingClassifier(
            learning_rate=self.learning_rate, max_iter=self.max_iter, max_leaf_nodes=self.max_leaf_nodes,
            min_samples_leaf=self.min_samples_leaf, l2_regularization=self.l2_regularization,
            class_weight=self.class_weight, monotonic_cst=constraints, early_stopping=False,
            random_state=self.random_state).fit(X, y, sample_weight=w)

    def _fit_cross_channel(self, X, y, w, fit, cal) -> None:
        """1. channel tails on the trees' rows with no failure ahead; 2. on the calibration slice, the
        trees' score and the largest channel surprise each become their own surprise among the rows
        with no failure ahead there; 3. the larger of the two is the combined score, and its isotonic
        (or sigmoid) map is the probability. No trees are fitted on the surprise: a fault shape never
        seen in training has no rows to learn from, and trees learned "which channel" instead."""
        self.channel_tails_ = fit_channel_tails(X[fit][y[fit] == 0], FEATURE_NAMES)
        raw = self._raw_scores(X[cal])
        healthy = y[cal] == 0
        self.score_tails_ = tuple(TailReference.fit(r[healthy]) for r in raw)
        z = self._combined(raw)
        if self.calibration == "isotonic":
            self.calibrated_ = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip")
            self.calibrated_.fit(z, y[cal], sample_weight=w[cal])
        else:  # Platt's sigmoid on the combined score
            self.calibrated_ = LogisticRegression(C=1e6).fit(z[:, None], y[cal], sample_weight=w[cal])

    def _raw_scores(self, X) -> tuple[np.ndarray, np.ndarray]:
        return self.trees_.predict_proba(X)[:, 1], cross_channel(X, self.channel_tails_, FEATURE_NAMES)

    def _combined(self, raw) -> np.ndarray:
        return np.max([tail.surprise(r) for tail, r in zip(self.score_tails_, raw, strict=True)], axis=0)

    def _threshold(self, X, y, w, rows) -> float:
        if self.alert_threshold is not None:
            return float(self.alert_threshold)
        if self.alert_rule == "false_alarms":
            gpu, time, step = rows
            healthy = ~np.isin(gpu, gpu[y == 1])  # GPUs with no failure ahead in the calibration slice
            p = self.predict_proba(X[healthy])[:, 1]
            threshold = false_alarm_threshold(gpu[healthy], time[healthy], p,
                                              per_1k_gpu_days=self.false_alarms_per_1k_gpu_days, step_s=step,
                                              confidence=self.false_alarm_confidence)
            alarms, days = false_alarm_rate(gpu[healthy], time[healthy], p, threshold, step)
            self.calibration_false_alarms_ = {"alarms": alarms, "gpu_days": round(days, 1)}
            return threshold
        precision, recall, thresholds = precision_recall_curve(y, self.predict_proba(X)[:, 1], sample_weight=w)
        with np.errstate(invalid="ignore", divide="ignore"):
            f1 = np.nan_to_num(2 * precision * recall / (precision + recall))[:-1]
        return float(np.clip(thresholds[int(np.argmax(f1))], 0.05, 0.95))

    def predict_proba(self, X) -> np.ndarray:
        check_is_fitted(self, "calibrated_")
        X = check_array(X, ensure_all_finite="allow-nan", dtype=float)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features; the model was fitted with {self.n_features_in_}")
        with threadpool_limits(limits=self.n_threads, user_api="openmp"):
            if not self.cross_channel:
                return np.clip(self.calibrated_.predict_proba(X), 0.0, 1.0)
            z = self._combined(self._raw_scores(X))
            if isinstance(self.calibrated_, IsotonicRegression):
                p = np.clip(self.calibrated_.predict(z), 0.0, 1.0)
                return np.column_stack([1 - p, p])
            return self.calibrated_.predict_proba(z[:, None])

    def predict(self, X) -> np.ndarray:
        return (self.predict_proba(X)[:, 1] >= self.threshold_).astype(int)
