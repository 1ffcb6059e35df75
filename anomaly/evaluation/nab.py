"""NAB (Numenta Anomaly Benchmark) scoring of 0/1 detections against labelled anomaly windows.

Follows NAB v1.1's `nab/sweeper.py` and `Runner.normalize`:
  * the first `probation_length(n)` rows (15%, at most 750) are not scored;
  * a detection inside a window at index i scores scaled_sigmoid(-(right - i + 1) / width) * A_TP / S(-1),
    so the first row of a window earns A_TP and later detections earn less; a window counts once,
    with its best (earliest) detection, and a window without one costs -A_FN;
  * a detection outside every window costs A_FP * scaled_sigmoid(distance past the previous window's
    right edge / (width - 1)) -- close behind a window it costs little, far away (or before any
    window) the full -A_FP;
  * normalised score = 100 * (raw - null) / (perfect - null), where the null detector (no detections)
    loses A_FN per scorable window and the perfect one earns A_TP per labelled window.
One deviation: NAB divides by (width - 1) and fails on a one-row window; here that distance uses 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from anomaly.evaluation.metrics import event_precision


@dataclass(frozen=True)
class CostMatrix:
    """NAB application-profile weights."""

    tp: float
    fp: float
    fn: float


STANDARD_PROFILE = CostMatrix(tp=1.0, fp=0.11, fn=1.0)
PROBATION_PERCENT = 0.15


def probation_length(n_rows: int, percent: float = PROBATION_PERCENT) -> int:
    """Rows NAB leaves unscored at the start of a series (its `getProbationPeriod`)."""
    return int(min(math.floor(percent * n_rows), percent * 5000))


def scaled_sigmoid(position: float) -> float:
    """NAB's weighting of a detection's position relative to a window (see module docstring)."""
    if position >= 3.0:
        return -1.0
    return 2.0 / (1.0 + math.exp(5.0 * position)) - 1.0


def scaled_values(values: np.ndarray, probation: int) -> np.ndarray:
    """The series as a one-column matrix, min-max scaled by its probationary rows only (no peeking
    ahead), so a detector's absolute scale floor means the same on every series."""
    head = values[:max(probation, 1)]
    span = float(head.max() - head.min())
    return ((values - head.min()) / (span if span > 0 else 1.0)).reshape(-1, 1)


def alert_onsets(predictions) -> np.ndarray:
    """Keep only the first row of each run of consecutive 1s: one alert per episode, as an operator
    would be paged, instead of one per anomalous row (NAB charges every extra row as a false positive)."""
    flags = np.asarray(predictions).astype(bool)
    starts = flags & ~np.concatenate(([False], flags[:-1]))
    return starts.astype(np.int64)


def window_rows(timestamps: np.ndarray, windows: list[tuple]) -> list[tuple[int, int]]:
    """(first, last) row indices, inclusive, of each [start, end] window, walking rows in file order
    as NAB does: from the first row at or after `start` up to the row before the first one after
    `end`. Windows that hold no row are dropped."""
    rows = []
    for start, end in windows:
        reached = np.flatnonzero(timestamps >= start)
        if not reached.size or timestamps[reached[0]] > end:
            continue
        first = int(reached[0])
        beyond = np.flatnonzero(timestamps[first:] > end)
        last = first + int(beyond[0]) - 1 if beyond.size else timestamps.size - 1
        rows.append((first, last))
    return rows


@dataclass(frozen=True)
class NabScore:
    """One series' NAB result for one detector."""

    raw: float
    null: float
    perfect: float
    windows: int  # scorable windows (at least one row after probation)
    detected_windows: int
    false_positives: int  # detected rows outside every window (after probation)
    window_precision: float
    window_recall: float

    @property
    def normalized(self) -> float:
        return normalized_score(self.raw, self.null, self.perfect)


def normalized_score(raw: float, null: float, perfect: float) -> float:
    """100 = perfect detector, 0 = the null detector that never alarms."""
    return 100.0 * (raw - null) / (perfect - null) if perfect != null else float("nan")


def combine(scores: list[NabScore]) -> float:
    """Corpus score as NAB reports it: normalise the summed raw, null and perfect scores."""
    return normalized_score(sum(s.raw for s in scores), sum(s.null for s in scores),
                            sum(s.perfect for s in scores))


def score_series(detections, windows: list[tuple[int, int]], *, probation: int,
                 profile: CostMatrix = STANDARD_PROFILE) -> NabScore:
    """Score 0/1 `detections` (one per row) against inclusive (first, last) row windows."""
    detections = np.asarray(detections).astype(bool)
    weights = _row_weights(detections.size, windows, profile)
    scored = np.arange(detections.size) >= probation
    hits = detections & scored
    raw, found, n_windows = 0.0, 0, 0
    for first, last in windows:
        if last < probation:
            continue  # NAB drops windows that lie wholly in the probationary period
        n_windows += 1
        inside = np.flatnonzero(hits[first:last + 1])
        if inside.size:
            found += 1
            raw += weights[first + inside[0]]
        else:
            raw -= profile.fn
    in_window = _window_mask(detections.size, windows)
    false_hits = hits & ~in_window
    raw += float(weights[false_hits].sum())
    truth = (in_window & scored).astype(int)
    return NabScore(
        raw=raw, null=-profile.fn * n_windows, perfect=profile.tp * len(windows), windows=n_windows,
        detected_windows=found, false_positives=int(false_hits.sum()),
        window_precision=event_precision(truth, hits.astype(int)),
        window_recall=found / n_windows if n_windows else 0.0,
    )


def _row_weights(n_rows: int, windows: list[tuple[int, int]], profile: CostMatrix) -> np.ndarray:
    """What a detection at each row would earn (inside a window) or cost (outside), as NAB's sweeper."""
    max_tp = scaled_sigmoid(-1.0)
    weights = np.full(n_rows, -profile.fp)  # before any window: the full false-positive cost
    ordered = sorted(windows)
    for n, (first, last) in enumerate(ordered):
        width = last - first + 1
        inside = np.arange(first, last + 1)
        weights[inside] = _scaled_sigmoids(-(last - inside + 1) / width) * profile.tp / max_tp
        after = np.arange(last + 1, ordered[n + 1][0] if n + 1 < len(ordered) else n_rows)
        weights[after] = _scaled_sigmoids((after - last) / max(width - 1, 1)) * profile.fp
    return weights


def _scaled_sigmoids(positions: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        values = 2.0 / (1.0 + np.exp(5.0 * positions)) - 1.0
    return np.where(positions >= 3.0, -1.0, values)


def window_labels(n_rows: int, windows: list[tuple[int, int]]) -> np.ndarray:
    """0/1 per row: 1 inside any inclusive (first, last) row window, the labels of the point metrics."""
    return _window_mask(n_rows, windows).astype(np.int64)


def _window_mask(n_rows: int, windows: list[tuple[int, int]]) -> np.ndarray:
    mask = np.zeros(n_rows, dtype=bool)
    for first, last in windows:
        mask[first:last + 1] = True
    return mask


__all__ = [
    "STANDARD_PROFILE", "CostMatrix", "NabScore", "alert_onsets", "combine", "normalized_score",
    "probation_length", "scaled_sigmoid", "scaled_values", "score_series", "window_labels", "window_rows",
]
