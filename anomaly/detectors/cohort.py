"""A multivariate model per cohort (GPU model): IsolationForest on robustly scaled features.

Peers catch a GPU that disagrees with its node; the cohort model catches a combination no GPU
of that model shows (full power at low clocks and a cool die, say) even when each field alone
is within range. Each cohort has its own forest because an H100 and an A100 differ in every
level; rows of a cohort the model never saw are not scored.

An IsolationForest cuts along one feature at a time, so on its own it misses a row that breaks a
correlation (temperature follows power: full power on a cold die lies inside both ranges). The
forest therefore also sees the features rotated onto their principal axes and whitened: along the
minor axes of a correlated pair, such a row is many σ out. Its distance in that whitened space (a
robust Mahalanobis distance) is a second score with its own label-free threshold: a row is
flagged when either score is beyond what the training rows reached.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.ensemble import IsolationForest
from sklearn.utils.validation import check_array, check_is_fitted

from anomaly.detectors._robust import MAD_TO_SIGMA, _quiet


class CohortIsolationForest(BaseEstimator):
    """One IsolationForest per cohort, with a label-free threshold and per-feature explanations.

    Parameters (keyword-only): ``n_estimators``, ``max_samples`` (per tree, as IsolationForest),
    ``quantile`` (the threshold is this quantile of the training scores: the share of training
    rows that would have been flagged), ``margin`` (subtracted from that quantile, so a row must
    be clearly stranger than the strangest training rows), ``min_rows`` (a cohort with fewer
    training rows gets no forest), ``scale_floor`` (absolute floor of each feature's robust σ,
    scalar or per feature: SM clocks that agree to the MHz must not make 20 MHz read as 1,000σ),
    ``random_state`` (seeds every forest).

    Learned: ``forests_`` {cohort: IsolationForest}, ``thresholds_`` {cohort: float},
    ``center_``/``scale_`` {cohort: per-feature median and MAD-σ}, ``whiten_`` {cohort: the
    rotation onto whitened principal axes}, ``distance_thresholds_`` {cohort: float}. `score_samples(X, cohorts)`
    returns IsolationForest's score NEGATED, so HIGHER = MORE anomalous (NaN for unknown cohorts);
    `predict` is 1 where the score exceeds the cohort threshold.
    """

    def __init__(self, *, n_estimators: int = 100, max_samples: int = 256, quantile: float = 0.001,
                 margin: float = 0.02, min_rows: int = 64, scale_floor=1e-9, random_state: int = 0):
        self.n_estimators = n_estimators
        self.scale_floor = scale_floor
        self.max_samples = max_samples
        self.quantile = quantile
        self.margin = margin
        self.min_rows = min_rows
        self.random_state = random_state

    def fit(self, X, cohorts, y=None):
        X = check_array(X, ensure_all_finite="allow-nan")
        cohorts = np.asarray(cohorts).astype(str)
        if len(cohorts) != len(X):
            raise ValueError(f"cohorts has {len(cohorts)} entries for {len(X)} rows")
        if not 0 < self.quantile < 0.5:
            raise ValueError(f"quantile must lie in (0, 0.5), got {self.quantile}")
        self.forests_, self.thresholds_, self.center_, self.scale_, self.whiten_ = {}, {}, {}, {}, {}
        self.distance_thresholds_ = {}
        for c in np.unique(cohorts):
            rows = X[cohorts == c]
            if len(rows) < self.min_rows:
                continue
            self._fit_cohort(str(c), rows)
        self.n_features_in_ = X.shape[1]
        return self

    def _fit_cohort(self, c: str, rows: np.ndarray) -> None:
        with np.errstate(all="ignore"), _quiet():
            center = np.nanmedian(rows, axis=0)
            scale = np.nanmedian(np.abs(rows - center), axis=0) * MAD_TO_SIGMA
        center = np.nan_to_num(center, nan=0.0)
        floor = np.maximum(np.broadcast_to(np.asarray(self.scale_floor, dtype=float), center.shape), 1e-9)
        self.center_[c], self.scale_[c] = center, np.maximum(np.nan_to_num(scale), floor)
        Z = self._scaled(c, rows)
        cov = np.cov(Z, rowvar=False) if len(Z) > 1 else np.eye(Z.shape[1])
        eigval, eigvec = np.linalg.eigh(np.atleast_2d(cov))
        # Floor the variances (σ ≥ 0.1 of a robust unit) so a constant feature cannot blow up.
        self.whiten_[c] = eigvec / np.sqrt(np.maximum(eigval, 0.01))
        Z = self._expanded(c, Z)
        forest = IsolationForest(n_estimators=self.n_estimators, max_samples=min(self.max_samples, len(rows)),
                                 random_state=self.random_state, n_jobs=1).fit(Z)
        train = -forest.score_samples(Z)
        self.forests_[c] = forest
        self.thresholds_[c] = float(np.quantile(train, 1 - self.quantile) + self.margin)
        dist = self._distance(c, Z)
        self.distance_thresholds_[c] = float(np.quantile(dist, 1 - self.quantile) * (1 + 10 * self.margin))

    def _distance(self, c: str, expanded: np.ndarray) -> np.ndarray:
        """Euclidean norm of the whitened half of an expanded row: a robust Mahalanobis distance."""
        return np.linalg.norm(expanded[:, expanded.shape[1] // 2:], axis=1)

    def distances(self, X, cohorts) -> np.ndarray:
        """Whitened distance from the cohort centre (HIGHER = MORE anomalous; NaN for unknown cohorts)."""
        check_is_fitted(self, ["forests_", "distance_thresholds_"])
        X = check_array(X, ensure_all_finite="allow-nan")
        cohorts = np.asarray(cohorts).astype(str)
        out = np.full(len(X), np.nan)
        for c in self.forests_:
            mask = cohorts == c
            if mask.any():
                out[mask] = self._distance(c, self._expanded(c, self._scaled(c, X[mask])))
        return out

    def _expanded(self, c: str, Z: np.ndarray) -> np.ndarray:
        return np.hstack([Z, Z @ self.whiten_[c]])

    def _scaled(self, c: str, rows: np.ndarray) -> np.ndarray:
        # Missing fields sit at the cohort median: "not reported" must not look extreme.
        return np.nan_to_num((rows - self.center_[c]) / self.scale_[c], nan=0.0)

    def score_samples(self, X, cohorts) -> np.ndarray:
        check_is_fitted(self, ["forests_", "whiten_"])
        X = check_array(X, ensure_all_finite="allow-nan")
        cohorts = np.asarray(cohorts).astype(str)
        out = np.full(len(X), np.nan)
        for c, forest in self.forests_.items():
            mask = cohorts == c
            if mask.any():
                out[mask] = -forest.score_samples(self._expanded(c, self._scaled(c, X[mask])))
        return out

    def predict(self, X, cohorts) -> np.ndarray:
        """1 where the forest score or the whitened distance exceeds its cohort threshold."""
        cohorts = np.asarray(cohorts).astype(str)
        scores, dist = self.score_samples(X, cohorts), self.distances(X, cohorts)
        limits = np.array([self.thresholds_.get(c, np.inf) for c in cohorts])
        dist_limits = np.array([self.distance_thresholds_.get(c, np.inf) for c in cohorts])
        return ((np.nan_to_num(scores, nan=-np.inf) > limits)
                | (np.nan_to_num(dist, nan=-np.inf) > dist_limits)).astype(int)

    def deviations(self, X, cohorts) -> tuple[np.ndarray, np.ndarray]:
        """(z, expected): each feature's robust z against its cohort (the explanation of a flag)."""
        check_is_fitted(self, "forests_")
        X = check_array(X, ensure_all_finite="allow-nan")
        cohorts = np.asarray(cohorts).astype(str)
        z = np.full(X.shape, np.nan)
        expected = np.full(X.shape, np.nan)
        for c in self.forests_:
            mask = cohorts == c
            z[mask] = (X[mask] - self.center_[c]) / self.scale_[c]
            expected[mask] = self.center_[c]
        return z, expected
