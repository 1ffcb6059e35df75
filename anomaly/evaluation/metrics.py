"""Scores for a detector's 0/1 output against 0/1 ground truth, both indexed by time step.

Every function takes two equal-length 1-D arrays (`y_true`, `y_pred`) of 0/1 and is pure.
A ratio with an empty denominator (no predicted positives, no true positives) is 0.0, as
scikit-learn's `zero_division=0`; the median delay with no detected event is NaN.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


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


def event_precision(y_true, y_pred) -> float:
    """Predicted events (runs of 1 in y_pred) that overlap a true event, over predicted events."""
    y_true, y_pred = _pair(y_true, y_pred)
    predicted = segments(y_pred)
    hits = sum(bool(y_true[start:stop].any()) for start, stop in predicted)
    return hits / len(predicted) if len(predicted) else 0.0


def event_recall(y_true, y_pred) -> float:
    """True events with any detected step, over true events."""
    y_true, y_pred = _pair(y_true, y_pred)
    events = segments(y_true)
    hits = sum(bool(y_pred[start:stop].any()) for start, stop in events)
    return hits / len(events) if len(events) else 0.0


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
    event_precision: float
    event_recall: float
    median_delay: float

    def as_dict(self) -> dict:
        return asdict(self)


def score_series(y_true, y_pred) -> SeriesScores:
    """All the metrics above for one series."""
    return SeriesScores(
        f1=point_f1(y_true, y_pred),
        pa_f1=point_adjusted_f1(y_true, y_pred),
        event_precision=event_precision(y_true, y_pred),
        event_recall=event_recall(y_true, y_pred),
        median_delay=median_delay(y_true, y_pred),
    )


def average_scores(rows: list[SeriesScores], delays: list[np.ndarray]) -> SeriesScores:
    """Unweighted mean over series (each machine counts once) of the ratios; the delay is the median
    over every detected event of every series (`delays` holds each series' `detection_delays`)."""
    if not rows:
        raise ValueError("no series to average")
    pooled = np.concatenate([np.asarray(d, dtype=np.int64) for d in delays]) if delays else np.array([])
    return SeriesScores(
        f1=float(np.mean([r.f1 for r in rows])),
        pa_f1=float(np.mean([r.pa_f1 for r in rows])),
        event_precision=float(np.mean([r.event_precision for r in rows])),
        event_recall=float(np.mean([r.event_recall for r in rows])),
        median_delay=float(np.median(pooled)) if pooled.size else float("nan"),
    )


def _f1(tp: int, predicted: int, actual: int) -> float:
    precision = tp / predicted if predicted else 0.0
    recall = tp / actual if actual else 0.0
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


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
