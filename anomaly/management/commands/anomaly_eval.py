"""Evaluate our detector against an IsolationForest and a random scorer on a labelled benchmark (SMD layout).

``manage.py anomaly_eval DIR`` reads DIR/train/<name>, DIR/test/<name> and DIR/test_label/<name> for
every name present in all three, fits the three detectors on train, thresholds each the same label-free
way from its own train scores, and scores test against the labels (docs/anomaly-eval.md). The
IsolationForest and the random scorer are run once per seed (``--seeds``, default 0-4) and reported as
the mean over seeds. Before the last line comes ``SUMMARY anomaly_eval ..`` with every overall figure of
the three detectors; the last line is ``RESULT anomaly_eval f1=.. pa_f1=.. baseline_f1=.. baseline_pa_f1=..``
(means over series; the baseline's over seeds too). ``--json PATH`` writes every figure.
"""

from __future__ import annotations

import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from anomaly.detectors.multivariate import RobustMultivariateDetector
from anomaly.evaluation.benchmarks import (
    DEFAULT_SEEDS,
    BenchmarkError,
    LabelledSeries,
    SeriesResult,
    load_series,
    overall_scores,
    run_detectors,
    score_detections,
    select_names,
)
from anomaly.evaluation.report import (
    best_f1_lines,
    cpu_lines,
    json_path,
    report_data,
    score_table,
    summary_line,
    write_json,
)


def name_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(text)
    return names


name_list.__name__ = "comma-separated names"


def seed_list(text: str) -> list[int]:
    seeds = [int(s) for s in text.split(",") if s.strip()]
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(text)
    return seeds


seed_list.__name__ = "comma-separated distinct non-negative integers"


def one_seed(text: str) -> int:
    (seed,) = seed_list(text)
    return seed


one_seed.__name__ = "non-negative integer"


def probability(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise ValueError(text)
    return value


probability.__name__ = "number between 0 and 1"


def add_evaluation_arguments(parser: CommandParser) -> None:
    """Seed, threshold and JSON options shared with nab_eval; the threshold defaults are the detector's own."""
    defaults = RobustMultivariateDetector().get_params()
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", type=seed_list, default=list(DEFAULT_SEEDS),
                       help="Seeds of the IsolationForest and random baselines, reported as their mean "
                            f"(default {','.join(map(str, DEFAULT_SEEDS))})")
    seeds.add_argument("--seed", type=one_seed, help="Shorthand for --seeds N (one seed)")
    parser.add_argument("--threshold", choices=("pot", "quantile"), default=defaults["threshold"],
                        help="Label-free threshold rule for EVERY detector, fitted on its own train scores "
                             f"(default {defaults['threshold']})")
    parser.add_argument("--threshold-level", type=probability, default=defaults["threshold_level"],
                        help=f"POT starting quantile, or the quantile itself (default {defaults['threshold_level']})")
    parser.add_argument("--threshold-risk", type=probability, default=defaults["threshold_risk"],
                        help=f"POT false-alarm probability per row (default {defaults['threshold_risk']:g})")
    parser.add_argument("--json", type=json_path, metavar="PATH",
                        help="Also write every per-series and overall figure of the three detectors to PATH")


def threshold_params(opts: dict) -> dict:
    return {"threshold": opts["threshold"], "threshold_level": opts["threshold_level"],
            "threshold_risk": opts["threshold_risk"]}


def chosen_seeds(opts: dict) -> list[int]:
    if opts.get("seed") is not None:
        return [opts["seed"]]
    return list(opts["seeds"])


class Command(BaseCommand):
    help = ("Score our detector, an IsolationForest and a random scorer on a labelled benchmark "
            "(train/test/test_label).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("dir", type=Path, help="Benchmark folder holding train/, test/ and test_label/")
        parser.add_argument("--names", type=name_list,
                            help="Only these file names, comma-separated (default: all present in the three folders)")
        add_evaluation_arguments(parser)

    def handle(self, *args, dir: Path, names: list[str] | None, **opts) -> None:
        started = time.monotonic()
        seeds, params = chosen_seeds(opts), threshold_params(opts)
        try:  # read and check every file before fitting anything
            with tqdm(select_names(dir, names), desc="load", unit="series") as selected:
                series = [load_series(dir, name) for name in selected]
        except BenchmarkError as exc:
            raise CommandError(str(exc)) from exc
        results = [self._evaluate(s, seeds, params) for s in tqdm(series, desc="anomaly_eval", unit="series")]
        overall = overall_scores(results)
        for line in [*score_table(results, overall), *best_f1_lines(results), *cpu_lines(results)]:
            self.stdout.write(line)
        if opts["json"]:
            write_json(opts["json"], report_data("anomaly_eval", results, overall, dir=str(dir), params=params))
        self.stdout.write(f"{len(results)} series, {time.monotonic() - started:.1f} s")
        self.stdout.write(summary_line("anomaly_eval", overall))
        ours, base = overall["ours"], overall["baseline"]
        self.stdout.write(f"RESULT anomaly_eval f1={ours.f1:.4f} pa_f1={ours.pa_f1:.4f} "
                          f"baseline_f1={base.f1:.4f} baseline_pa_f1={base.pa_f1:.4f}")

    def _evaluate(self, series: LabelledSeries, seeds: list[int], params: dict) -> SeriesResult:
        found = run_detectors(series.train, series.test, seeds=seeds, params=params)
        return score_detections(series.name, series.labels, found)
