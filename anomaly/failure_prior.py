"""The failure risk's prior: the hazard by age and vertical position from the Titan survival model.

Pure numpy. `anomaly.survival.survival_report` (the `fit_survival` command's artefact) holds the
Kaplan-Meier curve of Titan's GPU lifetimes and the Cox hazard ratios by cage (the bottom, middle and
top third of a cabinet's compute stack). `SurvivalPrior` turns those into one number per GPU: log10 of
its probability of failing within 24 hours, from

- its age: the Kaplan-Meier hazard over the 90 days around that age (all GPUs), and
- its vertical position: the rank of its node among its rack's nodes, in thirds like Titan's cages,
  each third's Cox hazard ratio scaled so that the three average 1 (the curve is already the average).

Only what transfers is used: age and height in the rack (air and heat rise; Titan's top cage failed 22
times as often as its bottom one). Titan's cabinet columns, rows, slots and batch do not map onto another
site. The failure model takes the number as one feature, non-decreasing (`survival_log_hazard`), and
learns from its training rows how much it is worth; the simulated fleets place their failures by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from django.conf import settings

from anomaly.survival import lifetimes_from_records, read_records, survival_report

CAGES = 3
WINDOW_DAYS = 90.0  # the hazard at an age is the Kaplan-Meier slope over this window around it


@dataclass(frozen=True)
class SurvivalPrior:
    """Daily hazard on an age grid, and the hazard ratio of each vertical third (mean 1)."""

    age_days: np.ndarray
    daily_hazard: np.ndarray
    cage_ratio: tuple[float, ...]

    @classmethod
    def from_report(cls, report: dict) -> SurvivalPrior:
        curve = report["curves"]["all"]["overall"]
        t, s = np.asarray(curve["t"], float), np.asarray(curve["s"], float)
        if len(t) < 2:
            raise ValueError("the survival report's curve has fewer than two points")
        grid = np.arange(0.0, t.max() + 1, 30.0)
        lo, hi = np.maximum(grid - WINDOW_DAYS / 2, 0), np.minimum(grid + WINDOW_DAYS / 2, t.max())

        def surv(x):  # the step function at x
            return s[np.maximum(np.searchsorted(t, x, side="right") - 1, 0)]

        with np.errstate(divide="ignore", invalid="ignore"):
            hazard = np.log(surv(lo) / surv(hi)) / np.maximum(hi - lo, 1.0)
        hazard = np.nan_to_num(np.maximum(hazard, 0.0))
        hr = {row["level"]: row["hr"] for row in report["hazards"] if row["covariate"] == "cage"}
        ratios = np.array([1.0] + [float(hr.get(str(c), 1.0)) for c in range(1, CAGES)])
        return cls(grid, hazard, tuple((ratios / ratios.mean()).tolist()))

    def log_hazard_24h(self, age_days, vertical) -> np.ndarray:
        """log10 of the probability of failing within a day, per GPU; NaN where age or position is unknown.
        `vertical`: the node's rank among its rack's nodes over their count, in [0, 1)."""
        age, vertical = np.asarray(age_days, float), np.asarray(vertical, float)
        known = ~np.isnan(age) & ~np.isnan(vertical)
        cage = np.clip(np.floor(np.nan_to_num(vertical) * CAGES), 0, CAGES - 1).astype(int)
        daily = np.interp(np.nan_to_num(age), self.age_days, self.daily_hazard) * np.array(self.cage_ratio)[cage]
        with np.errstate(divide="ignore"):
            out = np.log10(-np.expm1(-daily))
        return np.where(known, np.maximum(out, -12.0), np.nan)

    def daily_hazard_at(self, age_days, vertical) -> np.ndarray:
        return 10 ** self.log_hazard_24h(age_days, vertical)


def titan_csv() -> Path:
    """Where Titan's GPU failure records (gc_full.csv) are by default: the shared captures beside the checkout."""
    return Path(settings.BASE_DIR).parent / "shared" / "data" / "traces" / "titan-gpu-failures" / "gc_full.csv"


def titan_prior(path) -> SurvivalPrior | None:
    """The prior from Titan's gc_full.csv at `path` (None when the file is missing)."""
    if not Path(path).is_file():
        return None
    life, _ = lifetimes_from_records(read_records(path))
    return SurvivalPrior.from_report(survival_report(life))
