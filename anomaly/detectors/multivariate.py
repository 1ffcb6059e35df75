"""The per-entity detector: one entity's metric vectors over time, judged against its own history.

Rows of X are consecutive time steps of one entity (a machine, a GPU, a switch port, a rack), columns
are its metrics, in whatever units they come (bytes, counts, percentages, °C): nothing assumes a
scale. `anomaly_eval` and `nab_eval` measure this class with its default settings, and the fleet
scorer runs the same class, with the same settings, on every GPU, port and rack (`fit_many`).

Fit, on the entity's training rows:
  1. per metric a centre (median) and a scale: the `tail_quantile` of |value - median| (1.0 = as far
     as the metric went in 99.9 % of training), or the largest deviation when that quantile is 0 (a
     metric that is nearly always constant). A metric constant in training has no scale: any change
     from its constant scores `clip` (a counter that never moved and now moves is news);
  2. deviation = value - median, or value - median of the trailing `len(train) // baseline_fraction`
     rows when that is smaller: a level that has held that long is the new normal;
  3. two scores per row on the scaled deviations z (clipped at ±`clip`):
       * spread: the mean of the `top_k` largest |z| (one metric far out, or several together);
       * density: the mean distance to the `neighbours` nearest of up to `reference_rows` training
         rows (a combination of values never seen together, even when each is in range);
     each divided into "normal" units by its own training distribution ((s - median) / (q99 - median)),
     and the row's score is the larger of the two;
  4. the alarm level: a peaks-over-threshold fit to the training scores (a generalised Pareto tail
     above their `threshold_level` quantile, extrapolated to `threshold_risk` per row), the rule
     SPOT uses. No labels anywhere.

The settings were chosen by the protocol in docs/anomaly-eval.md (leave-one-series-out over SMD and
NAB, plus variants with anomalies inside the training rows), not by reading the figures it reports.
"""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted, validate_data

from anomaly.detectors._robust import MAD_TO_SIGMA, _quiet, nan_quantiles

MIN_EXCEEDANCES = 10  # fewer tail points than this cannot fit a Pareto tail; use the training max
# |z| of a normal variable at its 99.9th percentile of |deviation|: turns a tail scale back into σ
# for explanations of metrics whose MAD is 0.
TAIL_TO_SIGMA = 3.29
ROW_CHUNK = 2048  # rows per block of the distance computation (bounds memory to ~16 MB a block)
BLOCK_VALUES = 1 << 21  # values per block of the trailing medians (16 MB: a fleet's refit stays small and cached)


def pot_threshold(scores: np.ndarray, *, level: float = 0.98, risk: float = 1e-3) -> float:
    """Peaks-over-threshold alarm level for `scores` (higher = worse), as SPOT initialises it.

    The excesses over the `level` quantile (lowered so that at least MIN_EXCEEDANCES lie above it)
    are fitted with a generalised Pareto distribution by probability-weighted moments (Hosking &
    Wallis 1987: closed form, so ~50 µs, which matters when 16k entities each get a threshold), and
    the score exceeded with probability `risk` is returned. With too few distinct excesses, or a fit
    that does not exist, it returns the maximum.
    """
    scores = np.asarray(scores, dtype=float).ravel()
    scores = scores[np.isfinite(scores)]
    if scores.size == 0:
        raise ValueError("no scores to fit a threshold on")
    # The tail starts where at least MIN_EXCEEDANCES scores lie above it: with a short history (an
    # entity's last day) the 98th percentile leaves too few points to fit, and the training maximum
    # would stand in for a 1-in-len(scores) level instead of the intended risk.
    level = min(level, 1.0 - MIN_EXCEEDANCES / scores.size) if scores.size > 2 * MIN_EXCEEDANCES else level
    start = float(np.quantile(scores, level))
    excess = np.sort(scores[scores > start] - start)
    n = excess.size
    if n < MIN_EXCEEDANCES or np.ptp(excess) == 0:
        return float(scores.max())
    a0 = excess.mean()
    a1 = float(np.mean(excess * (n - 1 - np.arange(n)) / (n - 1)))
    if a0 - 2 * a1 <= 0:
        return float(scores.max())
    shape = 2 - a0 / (a0 - 2 * a1)  # ξ (Hosking's k is -ξ)
    scale = 2 * a0 * a1 / (a0 - 2 * a1)
    ratio = risk * scores.size / n
    if abs(shape) < 1e-6:
        level_score = start - scale * np.log(ratio)
    else:
        level_score = start + scale / shape * (ratio ** (-shape) - 1.0)
    return float(max(level_score, start))


def learned_threshold(scores: np.ndarray, *, method: str, level: float, risk: float) -> float:
    """The label-free alarm level for training `scores`: POT (see `pot_threshold`) or a quantile.
    The evaluation commands give the baselines their thresholds through this too."""
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


def _median_last_axis(a: np.ndarray) -> np.ndarray:
    """Median along the last axis of an array without NaN: one partition of a contiguous copy, about three
    times faster than np.median on a sliding-window view (which checks for NaN with a gather per window)."""
    n = a.shape[-1]
    part = np.partition(np.ascontiguousarray(a), ((n - 1) // 2, n // 2), axis=-1)
    return (part[..., (n - 1) // 2] + part[..., n // 2]) / 2


class RobustMultivariateDetector(BaseEstimator):
    """Per-entity detector: robust scaling, a trailing "new normal", spread and density scores, and a
    label-free peaks-over-threshold alarm level (see the module docstring).

    Parameters (keyword-only, stored unchanged, validated in `fit`):
        tail_quantile: quantile of training |deviation| that scales a metric to 1.0.
        baseline_fraction: the trailing window is len(train) // this many rows (0 disables it).
        top_k: how many of the largest scaled deviations make the spread score.
        clip: cap on one metric's scaled deviation.
        neighbours: k of the nearest-neighbour distance.
        reference_rows: at most this many training rows (evenly spaced) are the neighbours' pool.
        min_rows: an entity with fewer usable training rows gets no model (score NaN, threshold inf).
        threshold: "pot" (peaks over threshold) or "quantile".
        threshold_level: the POT starting quantile, or the quantile itself for "quantile".
        threshold_risk: POT false-alarm probability per row.

    `fit(X)` / `score_samples(X)` / `predict(X)` / `explain(X)` work on one entity (rows × metrics);
    `fit_many(H)` / `score_many(R)` / `explain_many(x)` on many at once ((entities, rows, metrics),
    NaN = missing), with the same arithmetic: one entity is a batch of one.

    Attributes after fit (leading entity axis after `fit_many`; without it after `fit`): center_,
    scale_, sigma_ (MAD-based σ for explanations), constant_, threshold_ (thresholds_ for a batch),
    n_features_in_.
    """

    def __init__(self, *, tail_quantile=0.999, baseline_fraction=4, top_k=3, clip=20.0, neighbours=5,
                 reference_rows=1000, min_rows=30, threshold="pot", threshold_level=0.98, threshold_risk=1e-3):
        self.tail_quantile = tail_quantile
        self.baseline_fraction = baseline_fraction
        self.top_k = top_k
        self.clip = clip
        self.neighbours = neighbours
        self.reference_rows = reference_rows
        self.min_rows = min_rows
        self.threshold = threshold
        self.threshold_level = threshold_level
        self.threshold_risk = threshold_risk

    # --- one entity ---------------------------------------------------------------------------

    def fit(self, X, y=None):
        """Learn centres, scales, the reference pool and the alarm level from (mostly normal) rows X;
        y is ignored."""
        X = validate_data(self, X, dtype=np.float64, ensure_min_samples=2)
        self._fit_batch(X[None])
        self._single = True
        for name in ("center_", "scale_", "sigma_", "constant_"):
            setattr(self, name, getattr(self, name)[0])
        self.threshold_ = float(self.thresholds_[0])
        return self

    def score_samples(self, X) -> np.ndarray:
        """Anomaly score per row: HIGHER = MORE ANOMALOUS (unlike scikit-learn's outlier detectors).
        Rows are taken to follow the training rows in time (the trailing window reaches back into them)."""
        self._check_single()
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return self.score_many(X[None])[0]

    def decision_function(self, X) -> np.ndarray:
        """Score minus the learned threshold: positive = anomalous."""
        return self.score_samples(X) - self.threshold_

    def predict(self, X) -> np.ndarray:
        """1 for an anomalous row, 0 for a normal one."""
        return (self.decision_function(X) > 0).astype(np.int64)

    def explain(self, X, top: int = 3) -> tuple[np.ndarray, np.ndarray]:
        """The metrics that drove each row's score: (features, z), both (n_rows, top): column indices
        of the largest scaled deviations, most important first, and their signed robust z (σ units,
        MAD-based; + above what was expected, - below)."""
        self._check_single()
        X = validate_data(self, X, dtype=np.float64, reset=False)
        top = self._check_top(top, X.shape[1])
        z, _, expected = self._scaled(X[None])
        deviation = X - expected[0]
        features = np.argsort(-np.abs(z[0]), axis=1, kind="stable")[:, :top]
        return features, np.take_along_axis(self._sigmas(deviation, self.sigma_[None], self.constant_[None]),
                                            features, axis=1)

    # --- many entities ------------------------------------------------------------------------

    def fit_many(self, H):
        """Fit one model per entity: H is (entities, rows, metrics), rows oldest first, NaN = missing.
        An entity with fewer than `min_rows` rows that have any value gets threshold +inf."""
        H = np.asarray(H, dtype=np.float64)
        if H.ndim != 3:
            raise ValueError(f"expected (entities, rows, metrics), got shape {H.shape}")
        self.n_features_in_ = H.shape[2]
        self._fit_batch(H)
        self._single = False
        return self

    def score_many(self, R) -> np.ndarray:
        """(entities, w) scores for rows R (entities, w, metrics) that follow each entity's history;
        NaN where the entity has no model or the row has no value."""
        check_is_fitted(self, "thresholds_")
        R = self._check_batch(R)
        z, valid, _ = self._scaled(R)
        spread, density = self._raw_scores(z, valid, np.isfinite(R))
        modelled = np.isfinite(self.thresholds_)[:, None]  # an entity below min_rows has no model to score with
        return np.where(modelled, self._combine(spread, density, valid), np.nan)

    def explain_many(self, x, top: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For one row per entity x (entities, metrics): (features (E, top), z (E, top), expected
        (E, metrics)): the metrics with the largest scaled deviations, their signed σ, and the value
        each was compared with (the training median or the trailing one)."""
        check_is_fitted(self, "thresholds_")
        x = np.asarray(x, dtype=np.float64)
        R = self._check_batch(x[:, None, :])
        top = self._check_top(top, R.shape[2])
        z, _, expected = self._scaled(R)
        z, expected = z[:, 0], expected[:, 0]
        features = np.argsort(-np.abs(z), axis=1, kind="stable")[:, :top]
        sigmas = self._sigmas(np.nan_to_num(x - expected), self._batch("sigma_"), self._batch("constant_"))
        return features, np.take_along_axis(sigmas, features, axis=1), expected

    # --- the arithmetic (entities, rows, metrics) ----------------------------------------------

    def _fit_batch(self, H: np.ndarray) -> None:
        self._check_params()
        self._single = False
        n_ent, n_rows, _ = H.shape
        with np.errstate(all="ignore"), _quiet():
            if np.isnan(H).any():
                center = np.nan_to_num(nan_quantiles(H, (0.5,), axis=1)[0])
                deviation = np.abs(H - center[:, None, :])
                mad, scale = (np.nan_to_num(v) for v in nan_quantiles(deviation, (0.5, self.tail_quantile), axis=1))
            else:  # a history without gaps takes numpy's partition-based statistics (the same values)
                center = np.median(H, axis=1)
                deviation = np.abs(H - center[:, None, :])
                scale = np.quantile(deviation, self.tail_quantile, axis=1, method="lower")
                mad = np.median(deviation, axis=1)
            largest = np.nan_to_num(np.nanmax(deviation, axis=1))
        mad = mad * MAD_TO_SIGMA
        scale = np.where(scale > 0, scale, largest)
        self.constant_ = scale <= 0
        self.scale_ = np.where(self.constant_, 1.0, scale)
        self.center_ = center
        self.sigma_ = np.where(mad > 0, mad, self.scale_ / TAIL_TO_SIGMA)
        self.window_ = n_rows // self.baseline_fraction if self.baseline_fraction else 0
        self.history_ = np.empty((n_ent, 0, H.shape[2]))
        z, valid, _ = self._scaled(H)
        self.history_ = H[:, n_rows - self.window_:] if self.window_ else self.history_
        # The neighbours' pool: evenly spaced training rows, the same positions for every entity.
        pool = np.unique(np.linspace(0, n_rows - 1, min(self.reference_rows, n_rows)).astype(int))
        self.reference_, self.reference_valid_ = z[:, pool], valid[:, pool]
        spread, density = self._raw_scores(z, valid, np.isfinite(H), in_pool=np.isin(np.arange(n_rows), pool))
        self.norms_ = np.stack([self._norm(spread, valid), self._norm(density, valid)], axis=1)  # (E, 2, 2)
        train = self._combine(spread, density, valid)
        enough = valid.sum(axis=1) >= max(self.min_rows, 2)
        self.thresholds_ = np.array([
            learned_threshold(train[e][valid[e]], method=self.threshold, level=self.threshold_level,
                              risk=self.threshold_risk) if enough[e] else np.inf for e in range(n_ent)])

    def _scaled(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(z, valid, expected) for rows X (E, n, F) that follow `history_`: z clipped to ±clip, with
        missing values at 0 ("not reported" must not look extreme); valid = the row has any value;
        expected = the median each value was compared with."""
        center, scale, constant = self._batch("center_"), self._batch("scale_"), self._batch("constant_")
        expected = np.broadcast_to(center[:, None, :], X.shape).copy()
        if self.window_:
            full = np.concatenate([self.history_, X], axis=1)
            local = self._trailing_reference(full, self.history_.shape[1], center)
            own = np.abs(X - local) < np.abs(X - center[:, None, :])
            expected = np.where(own, local, expected)
        deviation = X - expected
        with np.errstate(invalid="ignore", divide="ignore"):
            z = deviation / scale[:, None, :]
        changed = np.where(deviation != 0, self.clip, 0.0) * np.sign(deviation)
        z = np.where(constant[:, None, :], changed, z)
        valid = np.isfinite(X).any(axis=2)
        return np.clip(np.nan_to_num(z), -self.clip, self.clip), valid, expected

    def _trailing_reference(self, full: np.ndarray, start: int, center: np.ndarray) -> np.ndarray:
        """Per row of full[:, start:], the median of the `window_` rows before its refresh block
        (causal; recomputed every window_ // 24 rows), or the training median while fewer than half
        a window of rows precede it."""
        window, step = self.window_, max(self.window_ // 24, 1)
        n = full.shape[1] - start
        out = np.empty((full.shape[0], n, full.shape[2]))
        first = 0
        with np.errstate(all="ignore"), _quiet():
            if step == 1:  # short windows: every row has its own median, taken in vectorised chunks
                first = min(max(window - start, 0), n)  # rows before this lack a full window
                views = np.lib.stride_tricks.sliding_window_view(full, window, axis=1)  # (E, pos, F, window)
                rows = min(ROW_CHUNK, max(n - first, 1))
                ents = max(1, BLOCK_VALUES // (rows * full.shape[2] * window))  # bounds the block's copy
                for e in range(0, full.shape[0], ents):
                    for lo in range(first, n, rows):
                        hi = min(lo + rows, n)
                        block = views[e:e + ents, start + lo - window:start + hi - window]
                        gaps = np.isnan(block).any()
                        med = nan_quantiles(block, (0.5,), axis=3)[0] if gaps else _median_last_axis(block)
                        out[e:e + ents, lo:hi] = np.where(np.isfinite(med), med, center[e:e + ents, None, :])
            for block in range(0, first if step == 1 else n, step):
                at = start + block
                history = full[:, max(0, at - window):at]
                med = nan_quantiles(history, (0.5,), axis=1)[0] if history.shape[1] >= max(window // 2, 1) else center
                out[:, block:block + step] = np.where(np.isfinite(med), med, center)[:, None, :]
        return out

    def _raw_scores(self, z: np.ndarray, valid: np.ndarray, observed: np.ndarray,
                    in_pool=None) -> tuple[np.ndarray, np.ndarray]:
        """Spread (mean of the top_k |z|) and density (mean distance to the `neighbours` nearest pool
        rows) per row. A training row that is itself in the pool skips its own zero distance. The
        distance runs over the metrics the row reported: a missing value is no evidence either way, and
        imputing it (z = 0) would pair it with its correlated metrics in a combination never seen."""
        n_feat = z.shape[2]
        k = min(self.top_k, n_feat)
        spread = np.partition(np.abs(z), n_feat - k, axis=2)[:, :, -k:].mean(axis=2)
        ref, ref_ok = self.reference_, self.reference_valid_
        nn = min(self.neighbours, ref.shape[1])
        skip = 1 if in_pool is not None else 0
        take = min(nn + skip, ref.shape[1])
        density = np.empty(z.shape[:2])
        ref_sq = (ref ** 2).sum(axis=2)
        ref_t = ref.transpose(0, 2, 1)
        for lo in range(0, z.shape[1], ROW_CHUNK):
            block = z[:, lo:lo + ROW_CHUNK]
            seen = observed[:, lo:lo + ROW_CHUNK]
            # block is 0 where a value is missing, so only the pool's side needs the row's mask
            # batched matmul, not einsum: einsum's own loop costs ~4x a stack of BLAS products here
            ref_part = ref_sq[:, None, :] if seen.all() else np.matmul(seen.astype(float), ref_t ** 2)
            d2 = (block ** 2).sum(axis=2)[:, :, None] + ref_part - 2 * np.matmul(block, ref_t)
            d2 = np.where(ref_ok[:, None, :], np.maximum(d2, 0.0), np.inf)
            nearest = np.sqrt(np.partition(d2, take - 1, axis=2)[:, :, :take])
            nearest.sort(axis=2)
            if skip:  # only pool rows see themselves; for the others drop the farthest instead
                mine = in_pool[lo:lo + ROW_CHUNK][None, :, None]
                nearest = np.where(mine, nearest[:, :, skip:], nearest[:, :, :take - skip])
            with np.errstate(invalid="ignore"):
                density[:, lo:lo + ROW_CHUNK] = np.where(np.isfinite(nearest), nearest, np.nan).mean(axis=2)
        return np.where(valid, spread, np.nan), np.where(valid, density, np.nan)

    @staticmethod
    def _norm(scores: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """(E, 2): each entity's training median of a score and the unit that maps its 99th percentile
        to 1 above it."""
        with np.errstate(all="ignore"), _quiet():
            med, q = (np.nan_to_num(v) for v in nan_quantiles(scores, (0.5, 0.99), axis=1, linear=True))
            spread = np.nan_to_num(np.nanstd(scores, axis=1))
        unit = np.where(q > med, q - med, np.where(spread > 0, spread, 1.0))
        return np.stack([med, unit], axis=1)

    def _combine(self, spread: np.ndarray, density: np.ndarray, valid: np.ndarray) -> np.ndarray:
        norms = self.norms_
        a = (spread - norms[:, 0, 0, None]) / norms[:, 0, 1, None]
        b = (density - norms[:, 1, 0, None]) / norms[:, 1, 1, None]
        return np.where(valid, np.fmax(a, b), np.nan)

    def _sigmas(self, deviation: np.ndarray, sigma: np.ndarray, constant: np.ndarray) -> np.ndarray:
        """Deviation in σ; a metric constant in training reads ±clip when it moved."""
        z = deviation / sigma
        return np.where(constant, np.sign(deviation) * self.clip, z)

    # --- checks -------------------------------------------------------------------------------

    def _batch(self, name: str) -> np.ndarray:
        value = getattr(self, name)
        return value[None] if getattr(self, "_single", False) else value

    def _check_single(self) -> None:
        check_is_fitted(self, "thresholds_")
        if not getattr(self, "_single", False):
            raise ValueError("this detector was fitted with fit_many; use score_many / explain_many")

    def _check_batch(self, R) -> np.ndarray:
        R = np.asarray(R, dtype=np.float64)
        expected = (self.thresholds_.shape[0], self.n_features_in_)
        if R.ndim != 3 or (R.shape[0], R.shape[2]) != expected:
            raise ValueError(f"expected (entities, rows, metrics) with {expected[0]} entities and "
                             f"{expected[1]} metrics, got shape {R.shape}")
        return R

    @staticmethod
    def _check_top(top, n_features: int) -> int:
        if isinstance(top, bool) or not isinstance(top, Integral) or top < 1:
            raise ValueError(f"top must be a positive integer, got {top!r}")
        return min(int(top), n_features)

    def _check_params(self) -> None:
        checks = [
            ("tail_quantile", self.tail_quantile, Real, 0.5, 1.0),
            ("baseline_fraction", self.baseline_fraction, Integral, 0, np.inf),
            ("top_k", self.top_k, Integral, 1, np.inf),
            ("clip", self.clip, Real, np.finfo(float).tiny, np.inf),
            ("neighbours", self.neighbours, Integral, 1, np.inf),
            ("reference_rows", self.reference_rows, Integral, 2, np.inf),
            ("min_rows", self.min_rows, Integral, 2, np.inf),
            ("threshold_level", self.threshold_level, Real, 0.0, 1.0),
            ("threshold_risk", self.threshold_risk, Real, np.finfo(float).tiny, 1.0),
        ]
        for name, value, kind, low, high in checks:
            if isinstance(value, bool) or not isinstance(value, kind) or not low <= value <= high:
                raise ValueError(f"{name} must be a {kind.__name__} in [{low}, {high}], got {value!r}")
        if self.threshold not in ("pot", "quantile"):
            raise ValueError(f"threshold must be 'pot' or 'quantile', got {self.threshold!r}")
