"""Scores for a detector's 0/1 output against 0/1 ground truth, both indexed by time step.

Every function takes two equal-length 1-D arrays (`y_true`, `y_pred`) of 0/1 and is pure.
A ratio with an empty denominator (no predicted positives, no true positives) is 0.0, as
scikit-learn's `zero_division=0`; the median delay with no detected event is NaN.

Point adjustment credits a whole true segment for one flagged row, so a detector that flags rows at
random scores well under it; PA%K (Kim et al., "Towards a Rigorous Evaluation of Time-Series Anomaly
Detection", AAAI 2022) credits a segment only when at least K % of its rows are flagged, and its area
over K = 0..100 does not depend on choosing K. `best_f1` reads the threshold off the labels: an upper
bound to show next to the label-free figures, never a result.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np

PA_K_REPORTED = 20  # the K of SeriesScores.pa_k20, the value Kim et al. tabulate
PA_K_GRID = np.arange(101)  # K = 0, 1, ..., 100 for the area under the PA%K curve


def segments(flags: np.ndarray) -> np.ndarray:
    """Runs of 1 in `flags` as an (n, 2) array of [start, stop) indices."""
    flags = _as_flags(flags)
    edges = np.diff(np.concatenate(([0], flags.astype(np.int8), [0])))
    starts = np.flatnonzero(edges == 1)
    stops = np.flatnonzero(edges == -1)
    return np.column_stack((starts, stops)).astype(np.int64).reshape(-1, 2)


def point_f1(y_true, y_pred) -> float:
    """Point-wise F1: every time step is one sample."""
    y_true, y_pred = _pair(y_true, y_pred)
    tp = int(np.sum(y_true & y_pred))
    return _f1(tp, int(np.sum(y_pred)), int(np.sum(y_true)))


def point_adjust(y_true, y_pred) -> np.ndarray:
    """The standard point adjustment: a true anomaly segment with any detected step counts as wholly
    detected; predictions outside true segments are left as they are."""
    y_true, y_pred = _pair(y_true, y_pred)
    adjusted = y_pred.copy()
    for start, stop in segments(y_true):
        if y_pred[start:stop].any():
            adjusted[start:stop] = True
    return adjusted


def point_adjusted_f1(y_true, y_pred) -> float:
    """Point-wise F1 after `point_adjust`."""
    return point_f1(y_true, point_adjust(y_true, y_pred))


def pa_k_adjust(y_true, y_pred, k: float) -> np.ndarray:
    """PA%K adjustment: a true segment with at least one flagged row and at least `k` % of its rows
    flagged counts as wholly detected; other rows are left as they are. k = 0 is `point_adjust`;
    k = 100 changes nothing (only a wholly flagged segment qualifies)."""
    y_true, y_pred = _pair(y_true, y_pred)
    events = segments(y_true)
    credited = _credited(_counts(y_pred, events), events[:, 1] - events[:, 0], np.array([_check_k(k)]))[0]
    adjusted = y_pred.copy()
    for start, stop in events[credited]:
        adjusted[start:stop] = True
    return adjusted


def pa_k_f1(y_true, y_pred, k: float) -> float:
    """Point-wise F1 after `pa_k_adjust` with this `k`."""
    return float(pa_k_curve(y_true, y_pred, [k])[0])


def pa_k_curve(y_true, y_pred, ks=PA_K_GRID) -> np.ndarray:
    """PA%K F1 for every K in `ks` at once, from per-segment counts (no pass over rows per K)."""
    y_true, y_pred = _pair(y_true, y_pred)
    ks = np.array([_check_k(k) for k in np.atleast_1d(ks)], dtype=np.float64)
    events = segments(y_true)
    lengths = events[:, 1] - events[:, 0]
    hits = _counts(y_pred, events)
    filled = _credited(hits, lengths, ks) @ (lengths - hits)  # rows each K's adjustment turns on
    tp = int(hits.sum()) + filled
    predicted = int(y_pred.sum()) + filled
    return _f1s(tp, predicted, int(lengths.sum()))


def pa_k_auc(y_true, y_pred) -> float:
    """Area under the PA%K F1 curve over K = 0, 1, ..., 100 (trapezoids), divided by 100: in [0, 1]."""
    return float(np.trapezoid(pa_k_curve(y_true, y_pred, PA_K_GRID), PA_K_GRID) / 100.0)


def event_precision(y_true, y_pred) -> float:
    """Predicted events (runs of 1 in y_pred) that overlap a true event, over predicted events."""
    y_true, y_pred = _pair(y_true, y_pred)
    predicted = segments(y_pred)
    return float(np.mean(_counts(y_true, predicted) > 0)) if len(predicted) else 0.0


def event_recall(y_true, y_pred) -> float:
    """True events with any detected step, over true events."""
    y_true, y_pred = _pair(y_true, y_pred)
    events = segments(y_true)
    return float(np.mean(_counts(y_pred, events) > 0)) if len(events) else 0.0


def event_f1(y_true, y_pred) -> float:
    """Harmonic mean of `event_precision` and `event_recall`."""
    precision, recall = event_precision(y_true, y_pred), event_recall(y_true, y_pred)
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def best_f1(y_true, scores) -> float:
    """The best point-wise F1 of "flag rows scoring at least s" over every threshold s, read off the
    labels: an UPPER BOUND for any label-free threshold on these scores, never a result. Sorts once."""
    y_true = _as_flags(y_true)
    scores = np.asarray(scores, dtype=np.float64)
    if scores.shape != y_true.shape:
        raise ValueError(f"y_true has {y_true.size} steps, scores has shape {scores.shape}")
    if not np.isfinite(scores).all():
        raise ValueError("scores must be finite")
    actual = int(y_true.sum())
    if actual == 0:
        return 0.0
    order = np.argsort(-scores, kind="stable")
    ranked = scores[order]
    tp = np.cumsum(y_true[order])
    # a threshold cannot split tied scores: only the last row of each run of equal scores is a cut
    cuts = np.flatnonzero(np.append(ranked[1:] != ranked[:-1], True))
    return float(_f1s(tp[cuts], cuts + 1, actual).max())


def detection_delays(y_true, y_pred) -> np.ndarray:
    """For each detected true event: first detected step minus the event's first step (in steps)."""
    y_true, y_pred = _pair(y_true, y_pred)
    delays = []
    for start, stop in segments(y_true):
        hit = np.flatnonzero(y_pred[start:stop])
        if hit.size:
            delays.append(int(hit[0]))
    return np.asarray(delays, dtype=np.int64)


def median_delay(y_true, y_pred) -> float:
    """Median of `detection_delays`; NaN when no event was detected."""
    delays = detection_delays(y_true, y_pred)
    return float(np.median(delays)) if delays.size else float("nan")


@dataclass(frozen=True)
class SeriesScores:
    """Every metric for one series (one machine) and one detector."""

    f1: float
    pa_f1: float
    pa_k20: float
    pa_k_auc: float
    event_precision: float
    event_recall: float
    event_f1: float
    median_delay: float

    def as_dict(self) -> dict:
        return asdict(self)


def score_series(y_true, y_pred) -> SeriesScores:
    """All the metrics above for one series."""
    curve = pa_k_curve(y_true, y_pred, PA_K_GRID)
    return SeriesScores(
        f1=point_f1(y_true, y_pred),
        pa_f1=point_adjusted_f1(y_true, y_pred),
        pa_k20=float(curve[PA_K_REPORTED]),
        pa_k_auc=float(np.trapezoid(curve, PA_K_GRID) / 100.0),
        event_precision=event_precision(y_true, y_pred),
        event_recall=event_recall(y_true, y_pred),
        event_f1=event_f1(y_true, y_pred),
        median_delay=median_delay(y_true, y_pred),
    )


def average_scores(rows: list[SeriesScores], delays: list[np.ndarray]) -> SeriesScores:
    """Unweighted mean of every ratio over `rows` (each series, or each seed, counts once); the delay
    is the median over every detected event of every row (`delays` holds each row's
    `detection_delays`). The mean event F1 is the mean of the rows' event F1, not the harmonic mean
    of the mean precision and recall."""
    if not rows:
        raise ValueError("no series to average")
    pooled = np.concatenate([np.asarray(d, dtype=np.int64) for d in delays]) if delays else np.array([])
    means = {f.name: float(np.mean([getattr(r, f.name) for r in rows]))
             for f in fields(SeriesScores) if f.name != "median_delay"}
    return SeriesScores(**means, median_delay=float(np.median(pooled)) if pooled.size else float("nan"))


def _f1(tp: int, predicted: int, actual: int) -> float:
    precision = tp / predicted if predicted else 0.0
    recall = tp / actual if actual else 0.0
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def _f1s(tp, predicted, actual) -> np.ndarray:
    """`_f1` over arrays: 2PR / (P + R) = 2 tp / (predicted + actual), 0 where tp is 0."""
    tp, predicted = np.asarray(tp, dtype=np.float64), np.asarray(predicted, dtype=np.float64)
    total = predicted + actual
    return np.divide(2 * tp, total, out=np.zeros_like(tp), where=(tp > 0) & (total > 0))


def _counts(flags: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """Number of set `flags` inside each [start, stop) of `spans`."""
    cumulative = np.concatenate(([0], np.cumsum(flags, dtype=np.int64)))
    return cumulative[spans[:, 1]] - cumulative[spans[:, 0]]


def _credited(hits: np.ndarray, lengths: np.ndarray, ks: np.ndarray) -> np.ndarray:
    """(len(ks), segments) booleans: segment flagged at all and at least K % flagged. Compared as
    100 * hits >= K * length so that 3 of 10 rows is exactly 30 %."""
    return (hits > 0) & (100 * hits >= ks[:, None] * lengths)


def _check_k(k) -> float:
    k = float(k)
    if not 0.0 <= k <= 100.0:
        raise ValueError(f"K must be a percentage in [0, 100], got {k:g}")
    return k


def _as_flags(a) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim != 1:
        raise ValueError(f"expected a 1-D 0/1 array, got shape {a.shape}")
    if a.size and not np.isin(a, (0, 1)).all():
        raise ValueError("expected only 0/1 values")
    return a.astype(bool)


def _pair(y_true, y_pred) -> tuple[np.ndarray, np.ndarray]:
    y_true, y_pred = _as_flags(y_true), _as_flags(y_pred)
    if y_true.shape != y_pred.shape:
        raise ValueError(f"y_true has {y_true.size} steps, y_pred {y_pred.size}")
    return y_true, y_pred
