"""Text and JSON reports of `SeriesResult`s, shared by the anomaly_eval and nab_eval commands.

Every table shows the three detectors under the same label-free threshold rule: ours, the default
IsolationForest and the random scorer, the last two as the mean over their seeds. The best-F1 figures
read the threshold off the labels and are printed apart, labelled as the upper bounds they are.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
from dataclasses import fields
from pathlib import Path

from anomaly.evaluation.benchmarks import DETECTORS, SeriesResult
from anomaly.evaluation.metrics import PA_K_REPORTED, SeriesScores

LABELS = {"ours": "ours", "baseline": "iforest", "random": "random"}
PREFIXES = {"ours": "", "baseline": "baseline_", "random": "random_"}  # of the SUMMARY line's keys
HEAD = f"    F1  PA-F1 PA%K{PA_K_REPORTED}  PA%K-AUC  ev-P  ev-R  ev-F1  delay"
UPPER_BOUND = "upper bound, thresholds read off the labels"


def score_table(results: list[SeriesResult], overall: dict[str, SeriesScores]) -> list[str]:
    """One line per series and detector, then the overall means."""
    width = max(len("overall"), *(len(r.name) for r in results))
    seeds = ",".join(map(str, results[0].seeds))
    lines = [f"iforest = default IsolationForest, random = uniform(0, 1) scores: each the mean over seeds {seeds}, "
             "thresholded by the same rule as ours on its own train scores",
             f"{'series':{width}}  {'detector':8}{HEAD}"]
    for name, scores in [(r.name, {k: r.runs[k].scores for k in DETECTORS}) for r in results] + [("overall", overall)]:
        for n, key in enumerate(DETECTORS):
            lines.append(f"{name if n == 0 else '':{width}}  {LABELS[key]:8}{_row(scores[key])}")
    return lines


def best_f1_lines(results: list[SeriesResult]) -> list[str]:
    width = max(len(r.name) for r in results)
    return [f"{r.name:{width}}  best F1 ({UPPER_BOUND}): ours {r.best_f1['ours']:.3f}, "
            f"iforest seed {r.seeds[0]} {r.best_f1['baseline']:.3f}" for r in results]


def cpu_lines(results: list[SeriesResult]) -> list[str]:
    """Our detector's fit + predict process time, per series and per 10,000 rows (train + test)."""
    width = max(len(r.name) for r in results)
    lines = [f"{r.name:{width}}  ours: fit+score {r.cpu_seconds:.2f} s CPU for {r.fitted_rows:,} rows (train + test)"
             for r in results]
    seconds, rows = _cpu_totals(results)
    lines.append(f"ours: fit+score {1e4 * seconds / rows:.2f} s CPU per 10,000 rows (train + test), "
                 f"{seconds:.1f} s CPU in all")
    return lines


def summary_line(command: str, overall: dict[str, SeriesScores]) -> str:
    """`SUMMARY <command> f1=.. pa_f1=.. ... baseline_f1=.. ... random_f1=.. ...`: every overall figure."""
    pairs = [f"{PREFIXES[key]}{name}={value:.4f}" for key in DETECTORS
             for name, value in overall[key].as_dict().items()]
    return f"SUMMARY {command} " + " ".join(pairs)


def report_data(command: str, results: list[SeriesResult], overall: dict[str, SeriesScores], **extra) -> dict:
    """Every per-series and overall figure of every detector, with each seed's own scores."""
    seconds, rows = _cpu_totals(results)
    return {
        "command": command, **extra, "seeds": list(results[0].seeds),
        "metrics": [f.name for f in fields(SeriesScores)],
        "overall": {key: overall[key].as_dict() for key in DETECTORS},
        "series": {r.name: _series_data(r) for r in results},
        "ours_cpu": {"seconds": seconds, "rows": rows, "seconds_per_10k_rows": 1e4 * seconds / rows},
    }


def json_path(text: str) -> Path:
    """`--json PATH`, checked before any work: a file in an existing, writable folder."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a folder, not a file")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{folder} is not a writable folder")
    return path



def write_json(path: Path, data: dict) -> None:
    """Write `data` as JSON, whole or not at all (a temporary file renamed over PATH); NaN (a median
    delay with nothing detected) becomes null."""
    write_atomic(Path(path), (json.dumps(_finite(data), indent=2) + "\n").encode())


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` whole or not at all: a temporary file beside it, renamed over it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _series_data(r: SeriesResult) -> dict:
    data = {"rows": r.rows, "ours_cpu_seconds": r.cpu_seconds, "ours_fitted_rows": r.fitted_rows,
            "best_f1_upper_bound": {"ours": r.best_f1["ours"], f"baseline_seed{r.seeds[0]}": r.best_f1["baseline"]}}
    for key in DETECTORS:
        run = r.runs[key]
        data[key] = run.scores.as_dict()
        if run.per_seed:
            data[f"{key}_per_seed"] = {str(seed): s.as_dict() for seed, s in zip(r.seeds, run.per_seed, strict=True)}
    return data


def _cpu_totals(results: list[SeriesResult]) -> tuple[float, int]:
    return sum(r.cpu_seconds for r in results), sum(r.fitted_rows for r in results)


def _row(s: SeriesScores) -> str:
    delay = "  n/a" if math.isnan(s.median_delay) else f"{s.median_delay:5.0f}"
    return (f"{s.f1:6.3f} {s.pa_f1:6.3f} {s.pa_k20:6.3f}  {s.pa_k_auc:8.3f} {s.event_precision:5.3f} "
            f"{s.event_recall:5.3f}  {s.event_f1:5.3f}  {delay}")


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
