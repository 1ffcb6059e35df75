"""A robust per-series baseline aware of the time of day: rolling median and MAD per slot.

Workloads and cooling follow the clock (a site's inlet air is warmer in the afternoon; batch
queues fill at night), so a GPU is compared with itself at the same hour on earlier days, with
its recent history as the fallback while a slot has too few points.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_array, check_is_fitted

from anomaly.detectors._robust import grouped_median_mad, robust_z, z_to_score


class SeasonalRobustBaseline(BaseEstimator):
    """Median/MAD per (series, time-of-day slot), falling back to per-series over all slots.

    Parameters (keyword-only): ``period`` (slots per day, 24 = hourly), ``min_points`` (history
    points a slot needs before it is used alone), ``z_threshold``, ``scale_floor`` (absolute σ
    floor per feature, scalar or one per feature: a counter rate that is always 0 has MAD 0).

    `fit(X, series, slot)` learns ``center_``/``scale_`` keyed by series and slot.
    `deviations(X, series, slot)` gives the robust z (positive = above its own baseline; NaN
    where the series has no history). `score_samples` gives 0..1, HIGHER = MORE anomalous.
    """

    def __init__(self, *, period: int = 24, min_points: int = 5, z_threshold: float = 6.0, scale_floor=1.0):
        self.period = period
        self.min_points = min_points
        self.z_threshold = z_threshold
        self.scale_floor = scale_floor

    def fit(self, X, series, slot):
        X = check_array(X, ensure_all_finite="allow-nan")
        series, slot = np.asarray(series), np.asarray(slot, dtype=int)
        if not (len(series) == len(slot) == len(X)):
            raise ValueError("X, series and slot must have the same length")
        if self.period < 1 or self.min_points < 1 or self.z_threshold <= 0:
            raise ValueError("period and min_points must be >= 1 and z_threshold positive")
        if ((slot < 0) | (slot >= self.period)).any():
            raise ValueError(f"slot values must lie in [0, {self.period})")
        self.floor_ = np.broadcast_to(np.asarray(self.scale_floor, dtype=float), (X.shape[1],)).copy()
        self.n_features_in_ = X.shape[1]
        self.slot_stats_ = self._stats(X, series * self.period + slot if series.dtype.kind in "iu"
                                       else np.char.add(series.astype(str), "@" + slot.astype(str)))
        self.series_stats_ = self._stats(X, series)
        return self

    def _stats(self, X, keys) -> dict:
        med, mad, size = grouped_median_mad(X, keys)
        out = {}
        for k, i in zip(*np.unique(keys, return_index=True), strict=True):
            out[k.item() if hasattr(k, "item") else k] = (med[i], mad[i], int(size[i]))
        return out

    def deviations(self, X, series, slot) -> tuple[np.ndarray, np.ndarray]:
        """(z, expected) per cell; rows whose series has fewer than min_points points are NaN."""
        check_is_fitted(self, "series_stats_")
        X = check_array(X, ensure_all_finite="allow-nan")
        series, slot = np.asarray(series), np.asarray(slot, dtype=int)
        center = np.full_like(X, np.nan, dtype=float)
        scale = np.full_like(center, np.nan)
        slot_keys = (series * self.period + slot if series.dtype.kind in "iu"
                     else np.char.add(series.astype(str), "@" + slot.astype(str)))
        for i, (s, k) in enumerate(zip(series.tolist(), slot_keys.tolist(), strict=True)):
            stats = self.slot_stats_.get(k)
            if stats is None or stats[2] < self.min_points:
                stats = self.series_stats_.get(s)
            if stats is not None and stats[2] >= self.min_points:
                center[i], scale[i] = stats[0], stats[1]
        return robust_z(X, center, scale, self.floor_), center

    def score_samples(self, X, series, slot) -> np.ndarray:
        z, _ = self.deviations(X, series, slot)
        return z_to_score(np.nanmax(np.abs(np.nan_to_num(z, nan=0.0)), axis=1), self.z_threshold)
