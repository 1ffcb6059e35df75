"""Peer comparison: each row against the median of its group (GPUs in a node or a job, links on a leaf).

A fleet that is all busy at once has no "normal" level, only normal *agreement*: eight GPUs of one
job on one node draw the same power and run at the same clocks, so the one that runs 9 °C hotter
or 20 % slower stands out against its peers while a fleet-wide threshold sees nothing.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_array, check_is_fitted

from anomaly.detectors._robust import MAD_TO_SIGMA, _quiet, grouped_median_mad, robust_z, z_to_score


class PeerDeviation(BaseEstimator):
    """Robust z of every feature against the median and MAD of the row's peer group.

    Parameters (keyword-only): ``min_peers`` (groups smaller than this are not scored),
    ``z_threshold`` (|z| at which a feature is abnormal), ``min_delta`` (per-feature absolute
    difference from the group median that must also be exceeded, so a group with near-zero
    spread does not flag noise; a scalar or one value per feature), ``floor_fraction`` (the
    group MAD is floored at this fraction of the fleet-wide MAD learned in `fit`), ``scale_floor``
    (an absolute σ floor, scalar or per feature: a counter that is 0 everywhere has MAD 0, and one
    error must not read as a billion σ).

    `fit(X)` learns ``scale_``, the fleet-wide MAD-σ per feature. `deviations(X, groups)` returns
    the (n, f) robust z (positive = above peers). `score_samples` returns 0..1, HIGHER = MORE
    anomalous (0.5 at the threshold), NaN-free.
    """

    def __init__(self, *, min_peers: int = 4, z_threshold: float = 6.0, min_delta=0.0, floor_fraction: float = 0.25,
                 scale_floor=1e-9):
        self.min_peers = min_peers
        self.z_threshold = z_threshold
        self.min_delta = min_delta
        self.floor_fraction = floor_fraction
        self.scale_floor = scale_floor

    def fit(self, X, y=None):
        X = check_array(X, ensure_all_finite="allow-nan")
        if self.min_peers < 2:
            raise ValueError(f"min_peers must be at least 2, got {self.min_peers}")
        if self.z_threshold <= 0 or self.floor_fraction < 0:
            raise ValueError("z_threshold must be positive and floor_fraction non-negative")
        with np.errstate(all="ignore"), _quiet():
            med = np.nanmedian(X, axis=0)
            scale = np.nanmedian(np.abs(X - med), axis=0) * MAD_TO_SIGMA
        self.scale_ = np.nan_to_num(scale, nan=0.0)
        self.min_delta_ = np.broadcast_to(np.asarray(self.min_delta, dtype=float), (X.shape[1],)).copy()
        self.floor_ = np.maximum(self.floor_fraction * self.scale_,
                                 np.broadcast_to(np.asarray(self.scale_floor, dtype=float), (X.shape[1],)))
        self.n_features_in_ = X.shape[1]
        return self

    def deviations(self, X, groups) -> tuple[np.ndarray, np.ndarray]:
        """(z, expected): robust z per cell (NaN where not scored) and the peer median."""
        check_is_fitted(self, "scale_")
        X = check_array(X, ensure_all_finite="allow-nan")
        groups = np.asarray(groups)
        if len(groups) != len(X):
            raise ValueError(f"groups has {len(groups)} entries for {len(X)} rows")
        med, mad, size = grouped_median_mad(X, groups)
        z = robust_z(X, med, mad, self.floor_)
        z[np.abs(X - med) < self.min_delta_] = 0.0
        z[size < self.min_peers] = np.nan
        return z, med

    def score_samples(self, X, groups) -> np.ndarray:
        z, _ = self.deviations(X, groups)
        return z_to_score(np.nanmax(np.abs(np.nan_to_num(z, nan=0.0)), axis=1), self.z_threshold)
