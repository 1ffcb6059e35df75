"""Evaluate our detector against an IsolationForest and a random scorer on NAB series.

``manage.py nab_eval DIR`` (DIR = the NAB folder: data/<category>/*.csv, labels/combined_windows.json).
NAB has no train split: each series' probationary rows (first 15%, at most 750) are the training data
for every detector and its label-free threshold, and are not scored.

Two reports:
  1. NAB's standard-profile score of ours and of the IsolationForest with the first of ``--seeds``.
     Alerts are the first row of each run of flagged rows (``--every-row`` scores every flagged row).
  2. The point metrics of anomaly_eval, with the rows inside a NAB window as the labels and every
     flagged row as a detection, for ours, the IsolationForest (mean over seeds) and the random scorer
     (mean over seeds), on the rows after probation; then ``SUMMARY nab_eval ..`` with every overall figure.
The last line is ``RESULT nab_eval score=.. baseline_score=.. window_recall=.. baseline_window_recall=..
window_precision=.. baseline_window_precision=..`` (NAB corpus score; window ratios averaged).
``--json PATH`` writes every figure of both reports.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from anomaly.evaluation.benchmarks import (
    BenchmarkError,
    NabSeries,
    SeriesResult,
    load_nab,
    overall_scores,
    run_detectors,
    score_detections,
)
from anomaly.evaluation.nab import (
    NabScore,
    alert_onsets,
    combine,
    probation_length,
    scaled_values,
    score_series,
    window_labels,
    window_rows,
)
from anomaly.evaluation.report import best_f1_lines, cpu_lines, report_data, score_table, summary_line, write_json
from anomaly.management.commands.anomaly_eval import (
    add_evaluation_arguments,
    chosen_seeds,
    name_list,
    threshold_params,
)


@dataclass(frozen=True)
class NabRow:
    """One series: NAB scores of ours and of the first-seed IsolationForest, and the point metrics."""

    name: str
    ours: NabScore
    baseline: NabScore
    points: SeriesResult


class Command(BaseCommand):
    help = "Score our detector, an IsolationForest and a random scorer on NAB series (standard profile)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("dir", type=Path, help="NAB folder holding data/ and labels/combined_windows.json")
        parser.add_argument("--category", default="realKnownCause", help="Folder under data/ (default realKnownCause)")
        parser.add_argument("--names", type=name_list, help="Only these files, comma-separated (default: all)")
        parser.add_argument("--every-row", action="store_true",
                            help="NAB score: every flagged row is an alert, not only the first of each run")
        add_evaluation_arguments(parser)

    def handle(self, *args, dir: Path, category: str, names: list[str] | None, every_row: bool, **opts) -> None:
        started = time.monotonic()
        seeds, params = chosen_seeds(opts), threshold_params(opts)
        try:
            corpus = load_nab(dir, category, names)
        except BenchmarkError as exc:
            raise CommandError(str(exc)) from exc
        rows = [self._evaluate(s, seeds, params, every_row) for s in tqdm(corpus, desc="nab_eval", unit="series")]
        ours, base = [r.ours for r in rows], [r.baseline for r in rows]
        summary = {
            "score": combine(ours), "baseline_score": combine(base),
            "window_recall": _mean(ours, "window_recall"), "baseline_window_recall": _mean(base, "window_recall"),
            "window_precision": _mean(ours, "window_precision"),
            "baseline_window_precision": _mean(base, "window_precision"),
        }
        points = [r.points for r in rows]
        overall = overall_scores(points)
        lines = [*self._table(rows, seeds[0]), "",
                 "Point metrics: label rows = rows inside a NAB window; every flagged row after probation counts",
                 *score_table(points, overall), *best_f1_lines(points), *cpu_lines(points)]
        for line in lines:
            self.stdout.write(line)
        if opts["json"]:
            data = report_data("nab_eval", points, overall, dir=str(dir), category=category, params=params,
                               every_row=every_row)
            write_json(opts["json"], {**data, "nab": _nab_data(rows, summary, seeds[0])})
        self.stdout.write(f"{len(rows)} series, {time.monotonic() - started:.1f} s")
        self.stdout.write(summary_line("nab_eval", overall))
        self.stdout.write("RESULT nab_eval " + " ".join(f"{k}={v:.4f}" for k, v in summary.items()))

    def _evaluate(self, series: NabSeries, seeds: list[int], params: dict, every_row: bool) -> NabRow:
        probation = probation_length(series.values.size)
        X = scaled_values(series.values, probation)
        found = run_detectors(X[:probation], X, seeds=seeds, params=params)
        windows = window_rows(series.timestamps, series.windows)
        points = score_detections(series.name, window_labels(X.shape[0], windows), found, scored_from=probation)
        ours, base = found.ours, found.baseline[0]
        if not every_row:
            ours, base = alert_onsets(ours), alert_onsets(base)
        return NabRow(name=series.name, ours=score_series(ours, windows, probation=probation),
                      baseline=score_series(base, windows, probation=probation), points=points)

    def _table(self, rows: list[NabRow], seed: int) -> list[str]:
        width = max(len("corpus"), *(len(r.name) for r in rows))
        head = " score  windows  FP  win-P  win-R"
        lines = [f"{'':{width}}  {'ours':^33} | {f'IsolationForest seed {seed}':^33}",
                 f"{'series':{width}}  {head} | {head}"]
        lines += [f"{r.name:{width}}  {_row(r.ours)} | {_row(r.baseline)}" for r in rows]
        ours, base = [r.ours for r in rows], [r.baseline for r in rows]
        lines.append(f"{'corpus':{width}}  {_total(ours)} | {_total(base)}")
        return lines


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


def _nab_data(rows: list[NabRow], summary: dict, seed: int) -> dict:
    """The NAB report for --json: the RESULT line's figures and every series' scores."""
    def score(s: NabScore) -> dict:
        return {**asdict(s), "normalized": s.normalized}

    return {"corpus": summary, "baseline_seed": seed,
            "series": {r.name: {"ours": score(r.ours), "baseline": score(r.baseline)} for r in rows}}
