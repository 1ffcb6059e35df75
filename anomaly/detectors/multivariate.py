"""A robust multivariate detector for one entity's metric vectors over time (pure numpy/scikit-learn).

Rows of X are consecutive time steps of one entity (a machine, a GPU), columns are its metrics.
The detector learns, per metric, a robust centre (median) and two scales from training rows: the
MAD (for σ units an operator reads) and a high quantile of the absolute deviation (for scoring).

Scoring a row:
  1. deviation per metric = value minus the training median, or minus the median of the trailing
     `baseline_window` rows when that is smaller: a level that has held for a day is the new
     normal, so a metric that drifted does not alarm forever (disable with baseline_window=0);
  2. each |deviation| is divided by the metric's `tail_quantile` deviation in training (1.0 = as far
     as the metric went in 99.9% of training) and clipped at `clip`;
  3. the row's score is the mean of its `top_k` largest scaled deviations, so one noisy metric
     cannot alarm alone unless it is far out; optionally smoothed by a trailing mean.

Higher score = more anomalous. The alarm threshold is learned from the training scores alone (no
labels): by default a peaks-over-threshold fit (a generalised Pareto tail above the `threshold_level`
quantile, extrapolated to a false-alarm probability `threshold_risk`), or a plain quantile.
"""

from __future__ import annotations

import warnings
from numbers import Integral, Real

import numpy as np
from scipy.stats import genpareto
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted, validate_data

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation
MIN_EXCEEDANCES = 10  # fewer tail points than this cannot fit a Pareto tail; use the training max


def pot_threshold(scores: np.ndarray, *, level: float = 0.98, risk: float = 1e-3) -> float:
    """Peaks-over-threshold alarm level for `scores` (higher = worse), as SPOT initialises it.

    Fits a generalised Pareto distribution to the excesses over the `level` quantile and returns the
    score exceeded with probability `risk`. With too few distinct excesses it returns the maximum.
    """
    scores = np.asarray(scores, dtype=float).ravel()
    if scores.size == 0:
        raise ValueError("no scores to fit a threshold on")
    start = float(np.quantile(scores, level))
    excess = scores[scores > start] - start
    if excess.size < MIN_EXCEEDANCES or np.ptp(excess) == 0:
        return float(scores.max())
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        shape, _, scale = genpareto.fit(excess, floc=0)
    ratio = risk * scores.size / excess.size
    if not np.isfinite(shape) or not np.isfinite(scale) or scale <= 0:
        return float(scores.max())
    if abs(shape) < 1e-6:
        level_score = start - scale * np.log(ratio)
    else:
        level_score = start + scale / shape * (ratio ** (-shape) - 1.0)
    return float(max(level_score, start))


def learned_threshold(scores: np.ndarray, *, method: str, level: float, risk: float) -> float:
    """The label-free alarm level for training `scores`: POT (see `pot_threshold`) or a quantile.
    The evaluation commands give the IsolationForest baseline its threshold through this too."""
    if method == "pot":
        return pot_threshold(scores, level=level, risk=risk)
    if method == "quantile":
        return float(np.quantile(np.asarray(scores, dtype=float), level))
    raise ValueError(f"threshold must be 'pot' or 'quantile', got {method!r}")


def trailing_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of each value and the `window - 1` before it (fewer at the start)."""
    if window <= 1:
        return values
    sums = np.cumsum(np.concatenate(([0.0], values)))
    idx = np.arange(values.size)
    lo = np.maximum(0, idx - window + 1)
    return (sums[idx + 1] - sums[lo]) / (idx + 1 - lo)


class RobustMultivariateDetector(BaseEstimator):
    """Robust per-metric deviation detector with a label-free threshold.

    Parameters (keyword-only, stored unchanged, validated in `fit`):
        tail_quantile: quantile of training |deviation| that scales a metric to 1.0.
        scale_floor: smallest scale, in the units of X, for metrics that barely move in training
            (0.03 suits metrics min-max scaled to [0, 1]).
        top_k: how many of the largest scaled deviations make a row's score.
        clip: cap on one metric's scaled deviation.
        baseline_window: rows of trailing history whose median may replace the training median
            (0 disables; needs at least half of it before it applies).
        baseline_refresh: rows between recomputations of that trailing median.
        smoothing_window: trailing mean of the score over this many rows (1 = none).
        threshold: "pot" (peaks over threshold) or "quantile".
        threshold_level: the POT starting quantile, or the quantile itself for "quantile".
        threshold_risk: POT false-alarm probability per row.

    Attributes after fit: center_, sigma_ (MAD-based σ per metric), tail_scale_, threshold_,
    n_features_in_.
    """

    def __init__(self, *, tail_quantile=0.999, scale_floor=0.03, top_k=3, clip=20.0, baseline_window=1440,
                 baseline_refresh=60, smoothing_window=1, threshold="pot", threshold_level=0.98,
                 threshold_risk=1e-3):
        self.tail_quantile = tail_quantile
        self.scale_floor = scale_floor
        self.top_k = top_k
        self.clip = clip
        self.baseline_window = baseline_window
        self.baseline_refresh = baseline_refresh
        self.smoothing_window = smoothing_window
        self.threshold = threshold
        self.threshold_level = threshold_level
        self.threshold_risk = threshold_risk

    def fit(self, X, y=None):
        """Learn centres, scales and the alarm threshold from (mostly normal) rows X; y is ignored."""
        self._check_params()
        X = validate_data(self, X, dtype=np.float64, ensure_min_samples=2)
        self.center_ = np.median(X, axis=0)
        deviation = np.abs(X - self.center_)
        self.sigma_ = np.maximum(MAD_TO_SIGMA * np.median(deviation, axis=0), self.scale_floor)
        self.tail_scale_ = np.maximum(np.quantile(deviation, self.tail_quantile, axis=0), self.scale_floor)
        self.threshold_ = learned_threshold(self._scores(X), method=self.threshold, level=self.threshold_level,
                                            risk=self.threshold_risk)
        return self

    def score_samples(self, X) -> np.ndarray:
        """Anomaly score per row: HIGHER = MORE ANOMALOUS (unlike scikit-learn's outlier detectors).

        Roughly how many times further out than in `tail_quantile` of training the top_k metrics are.
        """
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return self._scores(X)

    def decision_function(self, X) -> np.ndarray:
        """Score minus the learned threshold: positive = anomalous."""
        return self.score_samples(X) - self.threshold_

    def predict(self, X) -> np.ndarray:
        """1 for an anomalous row, 0 for a normal one."""
        return (self.decision_function(X) > 0).astype(np.int64)

    def explain(self, X, top: int = 3) -> tuple[np.ndarray, np.ndarray]:
        """The metrics that drove each row's score.

        Returns (features, z), both shaped (n_rows, top): column indices of the metrics with the
        largest scaled deviations, most important first, and their signed robust z (σ units,
        MAD-based; + above what was expected, - below).
        """
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        if not isinstance(top, Integral) or top < 1:
            raise ValueError(f"top must be a positive integer, got {top!r}")
        top = min(int(top), X.shape[1])
        deviation = self._deviations(X)
        scaled = np.minimum(np.abs(deviation) / self.tail_scale_, self.clip)
        features = np.argsort(-scaled, axis=1, kind="stable")[:, :top]
        z = np.take_along_axis(deviation / self.sigma_, features, axis=1)
        return features, z

    def _scores(self, X: np.ndarray) -> np.ndarray:
        scaled = np.minimum(np.abs(self._deviations(X)) / self.tail_scale_, self.clip)
        k = min(self.top_k, X.shape[1])
        top = np.partition(scaled, X.shape[1] - k, axis=1)[:, -k:]
        return trailing_mean(top.mean(axis=1), self.smoothing_window)

    def _deviations(self, X: np.ndarray) -> np.ndarray:
        """Signed deviation from the training median or from the trailing median, whichever is smaller."""
        global_dev = X - self.center_
        if self.baseline_window == 0:
            return global_dev
        local_dev = X - self._trailing_reference(X)
        return np.where(np.abs(local_dev) < np.abs(global_dev), local_dev, global_dev)

    def _trailing_reference(self, X: np.ndarray) -> np.ndarray:
        """Per row, the median of the `baseline_window` rows before its refresh block (causal),
        or the training median while fewer than half that many rows precede it."""
        window, step = self.baseline_window, self.baseline_refresh
        needed = max(window // 2, 1)
        reference = np.empty_like(X)
        for start in range(0, X.shape[0], step):
            history = X[max(0, start - window):start]
            reference[start:start + step] = np.median(history, axis=0) if len(history) >= needed else self.center_
        return reference

    def _check_params(self) -> None:
        checks = [
            ("tail_quantile", self.tail_quantile, Real, 0.5, 1.0),
            ("scale_floor", self.scale_floor, Real, np.finfo(float).tiny, np.inf),
            ("top_k", self.top_k, Integral, 1, np.inf),
            ("clip", self.clip, Real, np.finfo(float).tiny, np.inf),
            ("baseline_window", self.baseline_window, Integral, 0, np.inf),
            ("baseline_refresh", self.baseline_refresh, Integral, 1, np.inf),
            ("smoothing_window", self.smoothing_window, Integral, 1, np.inf),
            ("threshold_level", self.threshold_level, Real, 0.0, 1.0),
            ("threshold_risk", self.threshold_risk, Real, np.finfo(float).tiny, 1.0),
        ]
        for name, value, kind, low, high in checks:
            if isinstance(value, bool) or not isinstance(value, kind) or not low <= value <= high:
                raise ValueError(f"{name} must be a {kind.__name__} in [{low}, {high}], got {value!r}")
        if self.threshold not in ("pot", "quantile"):
            raise ValueError(f"threshold must be 'pot' or 'quantile', got {self.threshold!r}")
