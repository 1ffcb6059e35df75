"""Cross-channel surprise for the failure model: how rare a GPU's most unusual precursor is, in any channel.

Pure numpy; `anomaly.failure.FailurePredictor` uses it with ``cross_channel=True``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# --- cross-channel surprise: what lets a model trained on some fault shapes see another ------------------
# A family of faults the model never saw shows in a channel it never learned to fear. Each channel's
# precursors are mapped to how rare the value is among GPUs with no failure ahead (-log10 of the tail
# share, learned on the training rows; an exponential tail beyond the largest values), and the model's
# risk also follows the largest of those surprises over channels (FailurePredictor, `cross_channel`):
# "rarer than anything healthy" reads the same in every channel.
CHANNELS: dict[str, tuple[str, ...]] = {
    "memory errors": ("sbe_1h", "sbe_per_h_24h", "sbe_trend"),
    "row remaps": ("remap_growth_24h", "remap_pending"),
    "temperature": ("gpu_temp_max_24h", "memory_temp_max_24h", "hot_hours_24h", "gpu_temp_excess_1h",
                    "memory_temp_excess_1h"),
    "power": ("idle_power_w", "power_excess_1h"),
    "nvlink": ("nvlink_crc_1h", "nvlink_crc_trend"),
    "pcie": ("pcie_replay_24h",),
    "xid": ("xid_memory_7d", "xid_bus_7d", "xid_nvlink_7d", "xid_other_7d"),
}
_TAIL_QUANTILES, _TAIL_TOP = 512, 2048  # the grid: evenly spaced quantiles plus the exact top values
_TAIL_K = 1000  # the exponential tail is fitted to the values above the TAIL_K-th largest
_TAIL_MIN_BETA = 0.01  # relative floor of the tail's scale (a column whose top values are all equal)
_MAX_SURPRISE = 50.0


@dataclass(frozen=True)
class TailReference:
    """The upper-tail shares of one column's reference values on a grid, and an exponential tail above the
    k-th largest value (peaks over a threshold), so that far beyond every reference value reads rarer
    than just beyond it."""

    grid: np.ndarray
    tail: np.ndarray  # (values >= grid[k] + 1) / (n + 1)
    n: int
    u: float = np.inf  # the tail threshold: the TAIL_K-th largest reference value
    u_share: float = 1.0  # (values >= u + 1) / (n + 1)
    beta: float = 1.0  # the mean excess over u of the values above it

    @classmethod
    def fit(cls, values: np.ndarray) -> TailReference:
        v = np.sort(values[~np.isnan(values)])
        if not len(v):
            return cls(np.zeros(0), np.zeros(0), 0)
        grid = np.unique(np.r_[np.quantile(v, np.linspace(0, 1, _TAIL_QUANTILES)), v[-_TAIL_TOP:]])
        u = v[-min(_TAIL_K, len(v))]
        excess = v[v > u] - u
        beta = float(excess.mean()) if len(excess) else 0.0
        return cls(grid, (len(v) - np.searchsorted(v, grid, side="left") + 1) / (len(v) + 1), len(v), float(u),
                   (np.sum(v >= u) + 1) / (len(v) + 1), max(beta, _TAIL_MIN_BETA * max(abs(float(u)), 1.0)))

    def surprise(self, x: np.ndarray) -> np.ndarray:
        """-log10 of the share of reference values at or above x (conservative between grid points);
        above the tail threshold, the exponential tail's. 0 for NaN and for values at or below the
        smallest reference value."""
        if not self.n:
            return np.zeros(len(x))
        k = np.searchsorted(self.grid, x, side="right") - 1
        share = np.where(k < 0, 1.0, self.tail[np.clip(k, 0, None)])
        with np.errstate(invalid="ignore"):
            beyond = -np.log10(self.u_share) + (x - self.u) / (self.beta * np.log(10))
            out = np.where(x > self.u, np.maximum(-np.log10(share), beyond), -np.log10(share))
        return np.where(np.isnan(x), 0.0, np.minimum(out, _MAX_SURPRISE))


def fit_channel_tails(X: np.ndarray, names: Sequence[str]) -> dict[str, TailReference]:
    """A TailReference per channel column of X (columns `names`), from rows with no failure ahead."""
    return {name: TailReference.fit(X[:, names.index(name)]) for cols in CHANNELS.values() for name in cols}


def cross_channel(X: np.ndarray, tails: dict[str, TailReference], names: Sequence[str]) -> np.ndarray:
    """Per row, the largest surprise over the channel columns: how rare its most unusual precursor is
    among GPUs with no failure ahead, whichever channel it is in."""
    return np.max([tails[name].surprise(X[:, names.index(name)]) for cols in CHANNELS.values()
                   for name in cols], axis=0)
