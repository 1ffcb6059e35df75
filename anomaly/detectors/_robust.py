"""Robust statistics shared by the detectors: grouped medians and MAD-scaled deviations."""

from __future__ import annotations

import warnings

import numpy as np

# MAD × 1.4826 estimates σ for normal data, so deviations read as "σ" on the page.
MAD_TO_SIGMA = 1.4826


def group_index(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, starts, inverse): rows sorted by group, where each group starts, row -> group number."""
    uniq, inverse = np.unique(groups, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    counts = np.bincount(inverse, minlength=len(uniq))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return order, starts, inverse


def nan_quantiles(a: np.ndarray, qs: tuple[float, ...], axis: int, *, linear: bool = False) -> list[np.ndarray]:
    """Per `axis`, the 'lower' quantile of the finite values for each q in `qs` (q = 0.5 gives the
    median, the mean of the two middle values, as np.nanmedian does), or with `linear` numpy's default
    interpolation between the two nearest; NaN where none is finite. One sort for all of them:
    numpy's nan-aware quantiles run one 1-D slice at a time, which for a fleet (16k entities ×
    metrics, or × rows × metrics for trailing windows) is seconds instead of ms."""
    a = np.sort(np.moveaxis(a, axis, -1), axis=-1)  # NaN sorts last
    count = np.isfinite(a).sum(axis=-1)
    last = np.maximum(count - 1, 0)
    pick = lambda i: np.take_along_axis(a, i[..., None], axis=-1)[..., 0]  # noqa: E731
    out = []
    for q in qs:
        if q == 0.5:
            value = (pick(last // 2) + pick(np.minimum(count // 2, last))) / 2
        elif linear:
            h = q * last
            lo = np.floor(h).astype(int)
            below, above, t = pick(lo), pick(np.minimum(lo + 1, last)), h - lo
            step = above - below
            value = np.where(t >= 0.5, above - step * (1 - t), below + step * t)  # numpy's _lerp
        else:
            value = pick(np.floor(q * last).astype(int))
        out.append(np.where(count > 0, value, np.nan))
    return out


def grouped_median_mad(X: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: its group's median and MAD-σ of each column (NaNs ignored), and the group's size.

    Groups are processed by size class, so 2,000 node groups of 8 are one (2000, 8, f) median,
    not 2,000 Python calls.
    """
    order, starts, inverse = group_index(groups)
    counts = np.bincount(inverse)
    med = np.full((len(counts), X.shape[1]), np.nan)
    mad = np.full_like(med, np.nan)
    Xs = X[order]
    for size in np.unique(counts):
        gids = np.flatnonzero(counts == size)
        idx = starts[gids][:, None] + np.arange(size)[None, :]
        block = Xs[idx]  # (groups, size, features)
        with np.errstate(all="ignore"), _quiet():
            m = nan_quantiles(block, (0.5,), axis=1)[0]
            d = nan_quantiles(np.abs(block - m[:, None, :]), (0.5,), axis=1)[0] * MAD_TO_SIGMA
        med[gids], mad[gids] = m, d
    return med[inverse], mad[inverse], counts[inverse]


class _quiet:
    """Silence numpy's 'All-NaN slice' warnings: an all-NaN group simply has no median."""

    def __enter__(self):
        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        return self._w.__exit__(*exc)


def robust_z(X: np.ndarray, center: np.ndarray, scale: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """(X - center) / max(scale, floor), NaN where X or center is missing."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return (X - center) / np.maximum(np.nan_to_num(scale, nan=0.0), floor)


def z_to_score(z: np.ndarray, threshold: float) -> np.ndarray:
    """Map |z| to 0..1: 0.5 at the threshold, approaching 1 at twice the threshold and beyond."""
    a = np.nan_to_num(np.abs(z), nan=0.0)
    return np.clip(0.5 * a / threshold, 0.0, 1.0) if threshold > 0 else np.zeros_like(a)
