"""Evaluate our detector and a plain IsolationForest on NAB series with NAB's standard-profile scoring.

``manage.py nab_eval DIR`` (DIR = the NAB folder: data/<category>/*.csv, labels/combined_windows.json).
NAB has no train split: each series' probationary rows (first 15%, at most 750) are the training data
for both detectors and their label-free thresholds, and are not scored. Alerts are the first row of
each run of flagged rows (``--every-row`` scores every flagged row instead). The last line is
``RESULT nab_eval score=.. baseline_score=.. window_recall=.. baseline_window_recall=..
window_precision=.. baseline_window_precision=..`` (NAB corpus score; window ratios averaged).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from anomaly.detectors.multivariate import RobustMultivariateDetector
from anomaly.evaluation.benchmarks import BenchmarkError, NabSeries, load_nab
from anomaly.evaluation.nab import (
    NabScore,
    alert_onsets,
    combine,
    probation_length,
    scaled_values,
    score_series,
    window_rows,
)
from anomaly.management.commands.anomaly_eval import add_threshold_arguments, fit_baseline, name_list, threshold_params


class Command(BaseCommand):
    help = "Score our detector and an IsolationForest baseline on NAB series (standard profile)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("dir", type=Path, help="NAB folder holding data/ and labels/combined_windows.json")
        parser.add_argument("--category", default="realKnownCause", help="Folder under data/ (default realKnownCause)")
        parser.add_argument("--names", type=name_list, help="Only these files, comma-separated (default: all)")
        parser.add_argument("--every-row", action="store_true",
                            help="Score every flagged row, not only the first of each run")
        add_threshold_arguments(parser)

    def handle(self, *args, dir: Path, category: str, names: list[str] | None, every_row: bool, **opts) -> None:
        started = time.monotonic()
        try:
            corpus = load_nab(dir, category, names)
        except BenchmarkError as exc:
            raise CommandError(str(exc)) from exc
        params = threshold_params(opts)
        rows = [self._evaluate(s, opts["seed"], params, every_row)
                for s in tqdm(corpus, desc="nab_eval", unit="series")]
        ours, base = [r[1] for r in rows], [r[2] for r in rows]
        self._table(rows)
        summary = {
            "score": combine(ours), "baseline_score": combine(base),
            "window_recall": _mean(ours, "window_recall"), "baseline_window_recall": _mean(base, "window_recall"),
            "window_precision": _mean(ours, "window_precision"),
            "baseline_window_precision": _mean(base, "window_precision"),
        }
        self.stdout.write(f"{len(rows)} series, {time.monotonic() - started:.1f} s")
        self.stdout.write("RESULT nab_eval " + " ".join(f"{k}={v:.4f}" for k, v in summary.items()))

    def _evaluate(self, series: NabSeries, seed: int, params: dict, every_row: bool) -> tuple[str, NabScore, NabScore]:
        probation = probation_length(series.values.size)
        X = scaled_values(series.values, probation)
        train = X[:probation]
        ours = RobustMultivariateDetector(**params).fit(train).predict(X)
        forest, threshold = fit_baseline(train, seed, params)
        base = (-forest.score_samples(X) > threshold).astype(np.int64)
        if not every_row:
            ours, base = alert_onsets(ours), alert_onsets(base)
        windows = window_rows(series.timestamps, series.windows)
        return (series.name, score_series(ours, windows, probation=probation),
                score_series(base, windows, probation=probation))

    def _table(self, rows: list[tuple[str, NabScore, NabScore]]) -> None:
        width = max(len("corpus"), *(len(name) for name, _, _ in rows))
        head = " score  windows  FP  win-P  win-R"
        self.stdout.write(f"{'':{width}}  {'ours':^33} | {'IsolationForest baseline':^33}")
        self.stdout.write(f"{'series':{width}}  {head} | {head}")
        for name, ours, base in rows:
            self.stdout.write(f"{name:{width}}  {_row(ours)} | {_row(base)}")
        ours, base = [r[1] for r in rows], [r[2] for r in rows]
        self.stdout.write(f"{'corpus':{width}}  {_total(ours)} | {_total(base)}")


def _row(s: NabScore) -> str:
    return (f"{s.normalized:6.1f}  {s.detected_windows:>3}/{s.windows:<3} {s.false_positives:>4}  "
            f"{s.window_precision:5.3f}  {s.window_recall:5.3f}")


def _total(scores: list[NabScore]) -> str:
    found, windows = sum(s.detected_windows for s in scores), sum(s.windows for s in scores)
    fp = sum(s.false_positives for s in scores)
    return (f"{combine(scores):6.1f}  {found:>3}/{windows:<3} {fp:>4}  {_mean(scores, 'window_precision'):5.3f}  "
            f"{_mean(scores, 'window_recall'):5.3f}")


def _mean(scores: list[NabScore], field: str) -> float:
    return float(np.mean([getattr(s, field) for s in scores]))
