"""Job-level detectors on training steps: straggling ranks and diverging runs.

Both follow the scikit-learn estimator contract (keyword-only parameters stored unchanged and
checked in `fit`, learned state in `*_` attributes, `fit` returns self) and are pure: arrays in,
arrays out. `anomaly.jobs` loads the steps and turns the results into findings.

- `StragglerDetector` is a peer comparison. `fit` learns each gang's reference from its ranks'
  recent median step times: the gang median and a robust σ (MAD × 1.4826, floored at a share of
  the median so a very uniform gang does not turn a hair of difference into many σ). A rank
  straggles when it is at least `sigmas` σ *and* `min_slowdown` slower than its gang's median,
  having made at least `min_steps` steps, in a gang of at least `min_ranks` such ranks.
- `DivergenceDetector` compares a job with its own rolling history. `fit` learns, per job, the
  median and robust σ of the loss, the grad norm and the NaN / Inf counts over the older part of
  the window; `evaluate` scores the recent part: a loss spike (recent median ≥ `sigmas` σ and
  `loss_min_rise` above, or `loss_alarm_ratio` × the history's lower quartile), a grad-norm
  explosion (≥ `sigmas` σ and `grad_min_ratio` × the baseline), and any NaN or Inf at all.

Scores are 0..1, higher = more abnormal (the opposite sign of scikit-learn's outlier detectors,
so a score reads like the stored anomaly score). A test is one or more gates (a robust z, a
relative size); each gate is put as a multiple of its threshold and the smallest, e, counts:
score = e / (1 + e) for e > 0, else 0, and a field with several tests takes its best. So 0.5 is
exactly "every gate just reached", a flag always scores at least 0.5, 0.75 is every gate at three
times its threshold, and 1 is never reached, except by a job with a NaN or Inf: it scores 1.0, as
no loss value is worse than a non-finite one.
"""

from __future__ import annotations

from numbers import Integral, Real
from typing import NamedTuple

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

MAD_TO_SIGMA = 1.4826  # MAD × this estimates σ for normally distributed values


# --- shared helpers ------------------------------------------------------------------------------

def group_quantile(codes: np.ndarray, values: np.ndarray, n_groups: int, q: float) -> tuple[np.ndarray, np.ndarray]:
    """(q-quantile, count) of the finite `values` per group code 0..n_groups-1, interpolated
    linearly like numpy's default; NaN where a group has none.

    One sort for all groups: with values ordered inside their group, each group's quantile sits
    at a fixed offset from the group's first position.
    """
    ok = np.isfinite(values)
    c, v = codes[ok], values[ok]
    order = np.lexsort((v, c))
    c, v = c[order], v[order]
    counts = np.bincount(c, minlength=n_groups)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    out = np.full(n_groups, np.nan)
    has = counts > 0
    at = q * (counts[has] - 1)
    lo, frac = np.floor(at).astype(int), at - np.floor(at)
    hi = np.minimum(lo + 1, counts[has] - 1)
    out[has] = v[starts[has] + lo] * (1 - frac) + v[starts[has] + hi] * frac
    return out, counts


def group_median(codes: np.ndarray, values: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """(median, count) of the finite `values` per group; NaN median where a group has none."""
    return group_quantile(codes, values, n_groups, 0.5)


def excess_score(*multiples: np.ndarray) -> np.ndarray:
    """e / (1 + e) for e = the smallest of the gates' multiples of their thresholds; 0 if e <= 0 or NaN."""
    e = np.minimum.reduce([np.asarray(m, dtype=float) for m in multiples])
    e = np.where(np.isnan(e), 0.0, np.maximum(e, 0.0))
    with np.errstate(invalid="ignore"):
        return np.where(np.isinf(e), 1.0, e / (1.0 + e))


def _multiple(x: np.ndarray, threshold: float) -> np.ndarray:
    """x as a multiple of its threshold; a zero threshold is no gate at all (infinitely passed)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return x / threshold if threshold > 0 else np.where(np.isnan(x), np.nan, np.inf)


def _codes(labels: np.ndarray, known: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of `labels` in the sorted `known` labels, len(known) for a label not there; and
    whether each is there. Index a learned array padded with one row of fill (`_padded`)."""
    pos = np.minimum(np.searchsorted(known, labels), len(known))
    member = np.zeros(len(labels), dtype=bool)
    inside = pos < len(known)
    member[inside] = known[pos[inside]] == labels[inside]
    return np.where(member, pos, len(known)), member


def _padded(learned: np.ndarray, fill: float) -> np.ndarray:
    """`learned` with one more row of `fill`: what a label unseen in `fit` gets."""
    pad = np.full((1, *learned.shape[1:]), fill)
    return np.concatenate([learned.astype(float), pad])


def _check(name: str, value, kind, low: float, high: float = np.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, kind) or not low <= value <= high:
        raise ValueError(f"{name} must be a {'number' if kind is Real else 'whole number'} "
                         f"in [{low}, {high}], got {value!r}")


def _vector(name: str, x, n: int | None = None, dtype=float) -> np.ndarray:
    a = np.asarray(x, dtype=dtype)
    if a.ndim != 1 or (n is not None and len(a) != n):
        raise ValueError(f"{name} must be 1-D{'' if n is None else f' of length {n}'}, got shape {a.shape}")
    return a


# --- stragglers ----------------------------------------------------------------------------------

class Straggling(NamedTuple):
    """Per rank (aligned with the input): robust z and relative slowdown against its gang, the
    gang's median, whether it straggles, and its 0..1 score."""

    z: np.ndarray
    slowdown: np.ndarray  # value / gang median - 1; 0.3 is 30 % slower
    reference: np.ndarray
    flagged: np.ndarray
    score: np.ndarray


class StragglerDetector(BaseEstimator):
    """Peer comparison of ranks' recent median step times within their gang (the job).

    Parameters (keyword-only):
        sigmas: robust z a rank must reach (σ = MAD × 1.4826 over the gang's ranks, floored).
        min_slowdown: and the relative slowdown it must reach: 0.08 is 8 % slower than the median.
        sigma_floor: σ is at least this share of the gang median (a uniform gang has MAD ≈ 0).
        min_steps: a rank with fewer recent steps is neither scored nor part of the reference
            (warm-up, a rank that just joined).
        min_ranks: a gang needs this many such ranks for a median that a straggler cannot move.

    Learned (`fit`): `gangs_` (sorted gang labels), `gang_median_`, `gang_sigma_`, `gang_ranks_`.
    """

    def __init__(self, *, sigmas: float = 4.0, min_slowdown: float = 0.08, sigma_floor: float = 0.01,
                 min_steps: int = 3, min_ranks: int = 4):
        self.sigmas = sigmas
        self.min_slowdown = min_slowdown
        self.sigma_floor = sigma_floor
        self.min_steps = min_steps
        self.min_ranks = min_ranks

    def _validate(self) -> None:
        _check("sigmas", self.sigmas, Real, 0.5)
        _check("min_slowdown", self.min_slowdown, Real, 0.0, 10.0)
        _check("sigma_floor", self.sigma_floor, Real, 0.0, 1.0)
        _check("min_steps", self.min_steps, Integral, 1)
        _check("min_ranks", self.min_ranks, Integral, 3)

    def _inputs(self, step_time, gang, n_steps):
        x = _vector("step_time", step_time)
        g = _vector("gang", gang, len(x), dtype=None)
        n = np.full(len(x), self.min_steps) if n_steps is None else _vector("n_steps", n_steps, len(x), int)
        eligible = np.isfinite(x) & (x > 0) & (n >= self.min_steps)
        return x, g, eligible

    def fit(self, step_time, *, gang, n_steps=None) -> StragglerDetector:
        """Learn each gang's median step time and σ from its eligible ranks; returns self.

        `step_time`: one value per rank (its median over the recent steps); `gang`: the rank's
        job, any sortable label; `n_steps`: how many steps the value is the median of.
        """
        self._validate()
        x, g, eligible = self._inputs(step_time, gang, n_steps)
        self.gangs_, codes = np.unique(g, return_inverse=True)
        n = len(self.gangs_)
        median, count = group_median(codes[eligible], x[eligible], n)
        safe = np.where(np.isfinite(median), median, 0.0)
        mad, _ = group_median(codes[eligible], np.abs(x[eligible] - safe[codes[eligible]]), n)
        self.gang_median_ = median
        self.gang_sigma_ = np.maximum(MAD_TO_SIGMA * mad, self.sigma_floor * median)
        self.gang_ranks_ = count
        return self

    def evaluate(self, step_time, *, gang, n_steps=None) -> Straggling:
        """Every rank's z, slowdown, gang median, flag and score (see the module docstring)."""
        check_is_fitted(self)
        x, g, eligible = self._inputs(step_time, gang, n_steps)
        pos, member = _codes(g, self.gangs_)
        valid = eligible & member & (_padded(self.gang_ranks_, 0)[pos] >= self.min_ranks)
        reference = _padded(self.gang_median_, np.nan)[pos]
        sigma = _padded(self.gang_sigma_, np.nan)[pos]
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.where(valid, (x - reference) / sigma, np.nan)
            slowdown = np.where(valid, x / reference - 1.0, np.nan)
        flagged = valid & (z >= self.sigmas) & (slowdown >= self.min_slowdown)
        score = excess_score(_multiple(z, self.sigmas), _multiple(slowdown, self.min_slowdown))
        return Straggling(z, slowdown, reference, flagged, score)

    def score_samples(self, step_time, *, gang, n_steps=None) -> np.ndarray:
        """0..1 per rank, higher = slower than its gang; 0 for ranks too new or in too small a gang."""
        return self.evaluate(step_time, gang=gang, n_steps=n_steps).score

    def predict(self, step_time, *, gang, n_steps=None) -> np.ndarray:
        """True for the ranks that straggle."""
        return self.evaluate(step_time, gang=gang, n_steps=n_steps).flagged


# --- divergence ----------------------------------------------------------------------------------

DIVERGENCE_FIELDS = ("loss", "grad_norm", "nan_count", "inf_count")  # the columns of X, in order
LOSS, GRAD, NAN, INF = range(4)


class Divergence(NamedTuple):
    """Per job in `jobs` (the sorted labels of the recent rows), per field of DIVERGENCE_FIELDS:
    its recent value, its baseline, the robust z and whether it flags; and the job's score."""

    jobs: np.ndarray
    value: np.ndarray  # (n_jobs, 4): recent median loss and grad norm, largest NaN / Inf count
    expected: np.ndarray  # (n_jobs, 4): the baseline median; NaN for loss / grad without history
    z: np.ndarray
    flagged: np.ndarray
    score: np.ndarray  # (n_jobs,)


class DivergenceDetector(BaseEstimator):
    """A job's recent loss, grad norm and NaN / Inf counts against its own rolling history.

    X is (n_points, 4) with the columns of DIVERGENCE_FIELDS, one row per reporting interval of
    a job (NaN where a value is missing); `job` labels the rows.

    Parameters (keyword-only):
        sigmas: robust z a loss or grad norm must reach.
        loss_min_rise: and the loss must be this share above its baseline (0.2 = 20 % higher).
        loss_alarm_ratio: a loss this many times the lower quartile of its history flags on its
            own, whatever the z. A loss that keeps climbing soon widens its own rolling history
            until the z says little; its low end still remembers where the loss was.
        grad_min_ratio: and the grad norm this many times its baseline (an explosion, not noise).
        sigma_floor: σ of loss and grad norm is at least this share of |baseline|.
        min_history: points of history a job needs before its loss and grad norm are judged;
            NaN and Inf need none.

    Learned (`fit`): `jobs_` (sorted labels), `center_` and `scale_` (n_jobs, 4): baseline median
    and robust σ (for the counts σ is at least 1, and a job without history has baseline 0), and
    `loss_low_` (n_jobs,): the lower quartile of the loss history.
    """

    def __init__(self, *, sigmas: float = 6.0, loss_min_rise: float = 0.2, loss_alarm_ratio: float = 2.0,
                 grad_min_ratio: float = 3.0, sigma_floor: float = 0.02, min_history: int = 3):
        self.sigmas = sigmas
        self.loss_min_rise = loss_min_rise
        self.loss_alarm_ratio = loss_alarm_ratio
        self.grad_min_ratio = grad_min_ratio
        self.sigma_floor = sigma_floor
        self.min_history = min_history

    def _validate(self) -> None:
        _check("sigmas", self.sigmas, Real, 0.5)
        _check("loss_min_rise", self.loss_min_rise, Real, 0.0)
        _check("loss_alarm_ratio", self.loss_alarm_ratio, Real, 1.1)  # np.inf turns the alarm off
        _check("grad_min_ratio", self.grad_min_ratio, Real, 1.0)  # 1.0: any rise that is `sigmas` σ
        _check("sigma_floor", self.sigma_floor, Real, 0.0, 1.0)
        _check("min_history", self.min_history, Integral, 1)

    @staticmethod
    def _inputs(X, job) -> tuple[np.ndarray, np.ndarray]:
        X = np.asarray(X, dtype=float)
        if X.ndim != 2 or X.shape[1] != len(DIVERGENCE_FIELDS):
            raise ValueError(f"X must be (n_points, {len(DIVERGENCE_FIELDS)}) {DIVERGENCE_FIELDS}, got {X.shape}")
        return X, _vector("job", job, len(X), dtype=None)

    def fit(self, X, *, job) -> DivergenceDetector:
        """Learn each job's baseline from its history rows; returns self."""
        self._validate()
        X, labels = self._inputs(X, job)
        self.jobs_, codes = np.unique(labels, return_inverse=True)
        self.n_features_in_ = X.shape[1]
        n = len(self.jobs_)
        self.center_, self.scale_ = np.full((n, 4), np.nan), np.full((n, 4), np.nan)
        for col in range(4):
            median, count = group_median(codes, X[:, col], n)
            mad, _ = group_median(codes, np.abs(X[:, col] - np.nan_to_num(median)[codes]), n)
            if col in (LOSS, GRAD):
                median[count < self.min_history] = np.nan
                floor = self.sigma_floor * np.abs(median)
            else:
                floor = np.ones(n)
            self.center_[:, col] = median
            self.scale_[:, col] = np.maximum(MAD_TO_SIGMA * mad, floor)
        self.loss_low_ = np.where(np.isfinite(self.center_[:, LOSS]), group_quantile(codes, X[:, LOSS], n, 0.25)[0],
                                  np.nan)
        return self

    def evaluate(self, X, *, job) -> Divergence:
        """Score the recent rows of every job in them (see `Divergence`)."""
        check_is_fitted(self)
        X, labels = self._inputs(X, job)
        jobs, codes = np.unique(labels, return_inverse=True)
        n = len(jobs)
        value = np.column_stack([group_median(codes, X[:, LOSS], n)[0], group_median(codes, X[:, GRAD], n)[0],
                                 _group_max(codes, X[:, NAN], n), _group_max(codes, X[:, INF], n)])
        pos, _ = _codes(jobs, self.jobs_)
        expected, scale = _padded(self.center_, np.nan)[pos], _padded(self.scale_, np.nan)[pos]
        for col in (NAN, INF):  # no history of NaNs is a history of none
            expected[:, col] = np.where(np.isfinite(expected[:, col]), expected[:, col], 0.0)
            scale[:, col] = np.where(np.isfinite(scale[:, col]), scale[:, col], 1.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            z = (value - expected) / scale
        flagged = np.zeros((n, 4), dtype=bool)
        scores = []
        for col, gates in self._gates(value, expected, z, _padded(self.loss_low_, np.nan)[pos]).items():
            flagged[:, col] = np.logical_or.reduce([np.minimum.reduce(g) >= 1.0 for g in gates])
            scores += [excess_score(*g) for g in gates]
        flagged[:, NAN], flagged[:, INF] = value[:, NAN] > 0, value[:, INF] > 0
        score = np.where(flagged[:, NAN] | flagged[:, INF], 1.0, np.maximum.reduce(scores))
        return Divergence(jobs, value, expected, z, flagged, score)

    def _gates(self, value, expected, z, low) -> dict[int, list[tuple[np.ndarray, ...]]]:
        """Per field, its alternative tests, each a tuple of gates as multiples of their thresholds
        (a test passes when all its gates reach 1): loss by z and rise, or by the alarm ratio to
        its history's low end; grad norm by z and ratio (its part above 1, so 3x is 2 of 2)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            rise = (value[:, LOSS] - expected[:, LOSS]) / np.abs(expected[:, LOSS])
            alarm = np.where(low > 0, value[:, LOSS] / low - 1.0, np.nan)
            return {
                LOSS: [(_multiple(z[:, LOSS], self.sigmas), _multiple(rise, self.loss_min_rise)),
                       (_multiple(alarm, self.loss_alarm_ratio - 1.0),)],
                GRAD: [(_multiple(z[:, GRAD], self.sigmas),
                        _multiple(value[:, GRAD] / expected[:, GRAD] - 1.0, self.grad_min_ratio - 1.0))],
            }

    def score_samples(self, X, *, job) -> np.ndarray:
        """0..1 per job of `np.unique(job)`, higher = diverging; 1.0 with any NaN or Inf."""
        return self.evaluate(X, job=job).score

    def predict(self, X, *, job) -> np.ndarray:
        """True per job of `np.unique(job)` that diverges by any of the fields."""
        return self.evaluate(X, job=job).flagged.any(axis=1)


def _group_max(codes: np.ndarray, values: np.ndarray, n_groups: int) -> np.ndarray:
    """Largest finite value per group; 0 where a group has none (counts: missing means none)."""
    out = np.zeros(n_groups)
    ok = np.isfinite(values)
    np.maximum.at(out, codes[ok], values[ok])
    return out
