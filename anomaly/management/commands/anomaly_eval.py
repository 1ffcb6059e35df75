"""Evaluate our detector and a plain IsolationForest on a labelled benchmark (SMD layout).

``manage.py anomaly_eval DIR`` reads DIR/train/<name>, DIR/test/<name> and DIR/test_label/<name> for
every name present in all three, fits both detectors on train, thresholds both the same label-free
way from their own train scores, and scores test against the labels (docs/anomaly-eval.md). The last
line is ``RESULT anomaly_eval f1=.. pa_f1=.. baseline_f1=.. baseline_pa_f1=..`` (means over series).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from django.core.management.base import BaseCommand, CommandError, CommandParser
from sklearn.ensemble import IsolationForest
from tqdm import tqdm

from anomaly.detectors.multivariate import RobustMultivariateDetector, learned_threshold
from anomaly.evaluation.benchmarks import (
    BenchmarkError,
    LabelledSeries,
    SeriesResult,
    evaluate_predictions,
    load_series,
    select_names,
)
from anomaly.evaluation.metrics import SeriesScores, average_scores


def name_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(text)
    return names


name_list.__name__ = "comma-separated names"


def probability(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise ValueError(text)
    return value


probability.__name__ = "number between 0 and 1"


def add_threshold_arguments(parser: CommandParser) -> None:
    """Threshold options shared with nab_eval; the defaults are the detector's own."""
    defaults = RobustMultivariateDetector().get_params()
    parser.add_argument("--seed", type=int, default=0, help="IsolationForest random_state (default 0)")
    parser.add_argument("--threshold", choices=("pot", "quantile"), default=defaults["threshold"],
                        help="Label-free threshold rule for BOTH detectors, fitted on their own train scores "
                             f"(default {defaults['threshold']})")
    parser.add_argument("--threshold-level", type=probability, default=defaults["threshold_level"],
                        help=f"POT starting quantile, or the quantile itself (default {defaults['threshold_level']})")
    parser.add_argument("--threshold-risk", type=probability, default=defaults["threshold_risk"],
                        help=f"POT false-alarm probability per row (default {defaults['threshold_risk']:g})")


def threshold_params(opts: dict) -> dict:
    return {"threshold": opts["threshold"], "threshold_level": opts["threshold_level"],
            "threshold_risk": opts["threshold_risk"]}


def fit_baseline(train: np.ndarray, seed: int, params: dict) -> tuple[IsolationForest, float]:
    """A default IsolationForest and its threshold, chosen by the same rule as ours.
    Its score is negated so that, like ours, higher = more anomalous."""
    forest = IsolationForest(random_state=seed).fit(train)
    threshold = learned_threshold(-forest.score_samples(train), method=params["threshold"],
                                  level=params["threshold_level"], risk=params["threshold_risk"])
    return forest, threshold


class Command(BaseCommand):
    help = "Score our detector and an IsolationForest baseline on a labelled benchmark (train/test/test_label)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("dir", type=Path, help="Benchmark folder holding train/, test/ and test_label/")
        parser.add_argument("--names", type=name_list,
                            help="Only these file names, comma-separated (default: all present in the three folders)")
        add_threshold_arguments(parser)

    def handle(self, *args, dir: Path, names: list[str] | None, **opts) -> None:
        started = time.monotonic()
        try:  # read and check every file before fitting anything
            with tqdm(select_names(dir, names), desc="load", unit="series") as selected:
                series = [load_series(dir, name) for name in selected]
        except BenchmarkError as exc:
            raise CommandError(str(exc)) from exc
        params = threshold_params(opts)
        results = [self._evaluate(s, opts["seed"], params)
                   for s in tqdm(series, desc="anomaly_eval", unit="series")]
        ours = average_scores([r.ours for r in results], [r.ours_delays for r in results])
        base = average_scores([r.baseline for r in results], [r.baseline_delays for r in results])
        self._table(results, ours, base)
        self.stdout.write(f"{len(results)} series, {time.monotonic() - started:.1f} s")
        self.stdout.write(f"RESULT anomaly_eval f1={ours.f1:.4f} pa_f1={ours.pa_f1:.4f} "
                          f"baseline_f1={base.f1:.4f} baseline_pa_f1={base.pa_f1:.4f}")

    def _evaluate(self, series: LabelledSeries, seed: int, params: dict) -> SeriesResult:
        detector = RobustMultivariateDetector(**params).fit(series.train)
        forest, threshold = fit_baseline(series.train, seed, params)
        baseline = (-forest.score_samples(series.test) > threshold).astype(np.int64)
        return evaluate_predictions(series.name, series.labels, detector.predict(series.test), baseline)

    def _table(self, results: list[SeriesResult], ours: SeriesScores, base: SeriesScores) -> None:
        width = max(len("overall"), *(len(r.name) for r in results))
        head = "   F1  PA-F1  ev-P  ev-R  delay"
        self.stdout.write(f"{'':{width}}  {'ours':^31} | {'IsolationForest baseline':^31}")
        self.stdout.write(f"{'series':{width}}  {head} | {head}")
        for r in results:
            self.stdout.write(f"{r.name:{width}}  {_row(r.ours)} | {_row(r.baseline)}")
        self.stdout.write(f"{'overall':{width}}  {_row(ours)} | {_row(base)}")


def _row(s: SeriesScores) -> str:
    delay = "  n/a" if np.isnan(s.median_delay) else f"{s.median_delay:5.0f}"
    return f"{s.f1:5.3f}  {s.pa_f1:5.3f} {s.event_precision:5.3f} {s.event_recall:5.3f}  {delay}"
