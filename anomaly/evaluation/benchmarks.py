"""Loaders for labelled anomaly benchmarks, and the evaluation of one series by three detectors: ours, a
default IsolationForest (mean over seeds) and a random scorer (mean over seeds), all thresholded by the
same label-free rule on their own train scores.

SMD-style layout: ``DIR/train/<name>``, ``DIR/test/<name>``, ``DIR/test_label/<name>``: comma-separated
numbers, no header, one row per time step; the label file holds one 0/1 per test row. A name counts when
it is present in all three folders.

NAB layout: ``DIR/data/<category>/<name>.csv`` (``timestamp,value`` with a header) and
``DIR/labels/combined_windows.json`` (windows keyed ``<category>/<name>.csv``).

Bad input raises `BenchmarkError` naming the file, the line and the value at fault.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.ensemble import IsolationForest

from anomaly.detectors.multivariate import RobustMultivariateDetector, learned_threshold
from anomaly.evaluation.metrics import SeriesScores, average_scores, best_f1, detection_delays, score_series

FOLDERS = ("train", "test", "test_label")


class BenchmarkError(ValueError):
    """A benchmark file or folder that cannot be evaluated; the message names file, line and value."""


@dataclass(frozen=True)
class LabelledSeries:
    """One machine of an SMD-style benchmark."""

    name: str
    train: np.ndarray
    test: np.ndarray
    labels: np.ndarray


def common_names(root: Path) -> list[str]:
    """Names present in train/, test/ and test_label/ under `root`, sorted."""
    root = Path(root)
    if not root.is_dir():
        raise BenchmarkError(f"{root}: not a directory")
    found = []
    for folder in FOLDERS:
        path = root / folder
        if not path.is_dir():
            raise BenchmarkError(f"{path}: missing folder (expected {', '.join(FOLDERS)} under {root})")
        found.append({p.name for p in path.iterdir() if p.is_file() and not p.name.startswith(".")})
    names = sorted(set.intersection(*found))
    if not names:
        raise BenchmarkError(f"{root}: no file name is present in all of {', '.join(FOLDERS)}")
    return names


def select_names(root: Path, names: list[str] | None = None) -> list[str]:
    """Every name present in all three folders, or only `names` (each must be present)."""
    available = common_names(root)
    if names:
        missing = [n for n in names if n not in available]
        if missing:
            raise BenchmarkError(f"{root}: not in all of {', '.join(FOLDERS)}: {', '.join(missing)}")
        available = [n for n in available if n in names]
    return available


def load_benchmark(root: Path, names: list[str] | None = None) -> list[LabelledSeries]:
    """Every selected series (see `select_names`), read and checked."""
    return [load_series(Path(root), name) for name in select_names(root, names)]


def load_series(root: Path, name: str) -> LabelledSeries:
    """Read and cross-check one series' train, test and label files."""
    train = read_matrix(root / "train" / name)
    test = read_matrix(root / "test" / name)
    if train.shape[1] != test.shape[1]:
        raise BenchmarkError(f"{root / 'test' / name}: {test.shape[1]} columns, but the train file has "
                             f"{train.shape[1]}")
    labels = read_labels(root / "test_label" / name, expected_rows=test.shape[0])
    return LabelledSeries(name=name, train=train, test=test, labels=labels)


def read_matrix(path: Path) -> np.ndarray:
    """A comma-separated numeric file without header as a 2-D float array."""
    lines = _lines(path)
    cells = [line.split(",") for line in lines]
    try:
        matrix = np.array(cells, dtype=np.float64)
    except ValueError:
        _raise_first_bad_row(path, cells)
        raise  # unreachable: the scan above always finds the bad row
    if matrix.ndim != 2:
        _raise_first_bad_row(path, cells)
    bad = np.argwhere(~np.isfinite(matrix))
    if bad.size:
        row, col = bad[0]
        raise BenchmarkError(f"{path}:{row + 1}: column {col + 1} is not a finite number: {cells[row][col].strip()!r}")
    return matrix


def read_labels(path: Path, *, expected_rows: int) -> np.ndarray:
    """One 0/1 label per line; their count must equal the test file's rows."""
    lines = _lines(path)
    labels = np.empty(len(lines), dtype=np.int64)
    for n, line in enumerate(lines):
        value = line.strip()
        if value not in ("0", "1"):
            raise BenchmarkError(f"{path}:{n + 1}: label must be 0 or 1, got {value!r}")
        labels[n] = int(value)
    if labels.size != expected_rows:
        raise BenchmarkError(f"{path}: {labels.size} labels, but the test file has {expected_rows} rows")
    return labels


def _lines(path: Path) -> list[str]:
    """The file's lines without trailing blank ones; a blank line inside the data is an error."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchmarkError(f"{path}: cannot read ({exc})") from exc
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise BenchmarkError(f"{path}: empty file")
    for n, line in enumerate(lines):
        if not line.strip():
            raise BenchmarkError(f"{path}:{n + 1}: blank line inside the data")
    return lines


def _raise_first_bad_row(path: Path, cells: list[list[str]]) -> None:
    width = len(cells[0])
    for n, row in enumerate(cells):
        if len(row) != width:
            raise BenchmarkError(f"{path}:{n + 1}: {len(row)} columns, expected {width} like line 1")
        for col, cell in enumerate(row):
            try:
                float(cell)
            except ValueError:
                raise BenchmarkError(f"{path}:{n + 1}: column {col + 1} is not a number: {cell.strip()!r}") from None
    raise BenchmarkError(f"{path}: cannot be read as a numeric matrix")


# --- Evaluating one series -----------------------------------------------------------------------

DEFAULT_SEEDS = (0, 1, 2, 3, 4)
DETECTORS = ("ours", "baseline", "random")  # the keys of SeriesResult.runs and of every report


@dataclass(frozen=True)
class Detections:
    """Every detector's 0/1 output on one series' test rows; one array per seed for the seeded ones."""

    seeds: tuple[int, ...]
    ours: np.ndarray
    ours_scores: np.ndarray  # higher = more anomalous, for the label-read best-F1 bound
    baseline: list[np.ndarray]
    baseline_scores: np.ndarray  # the first seed's, for its best-F1 bound
    random: list[np.ndarray]
    cpu_seconds: float  # process time of our fit + predict, nothing else
    fitted_rows: int  # the rows our detector fitted on and scored (train + test)


def run_detectors(train: np.ndarray, test: np.ndarray, *, seeds, params: dict) -> Detections:
    """Fit our detector, an IsolationForest per seed and a random scorer per seed on `train`, each
    thresholded by the same label-free rule (`params`: threshold, threshold_level, threshold_risk)
    on its own train scores, and flag `test`."""
    seeds = tuple(seeds)
    if not seeds:
        raise ValueError("at least one seed is needed")
    started = time.process_time()
    detector = RobustMultivariateDetector(**params).fit(train)
    ours = detector.predict(test)
    cpu_seconds = time.process_time() - started
    forests = [forest_detections(train, test, seed, params) for seed in seeds]
    return Detections(
        seeds=seeds, ours=ours, ours_scores=detector.score_samples(test),
        baseline=[flags for flags, _ in forests], baseline_scores=forests[0][1],
        random=[random_detections(len(train), len(test), seed, params) for seed in seeds],
        cpu_seconds=cpu_seconds, fitted_rows=len(train) + len(test),
    )


def forest_detections(train: np.ndarray, test: np.ndarray, seed: int, params: dict) -> tuple[np.ndarray, np.ndarray]:
    """A default `IsolationForest(random_state=seed)`: its 0/1 flags and scores on `test`. Its score is
    negated so that, like ours, higher = more anomalous; the threshold is our rule on its train scores."""
    forest = IsolationForest(random_state=seed).fit(train)
    threshold = _threshold(-forest.score_samples(train), params)
    scores = -forest.score_samples(test)
    return (scores > threshold).astype(np.int64), scores


def random_detections(n_train: int, n_test: int, seed: int, params: dict) -> np.ndarray:
    """The floor any detector must clear: train then test scores drawn i.i.d. uniform(0, 1) from
    `default_rng(seed)`, thresholded by the same rule on the random train scores."""
    rng = np.random.default_rng(seed)
    threshold = _threshold(rng.uniform(size=n_train), params)
    return (rng.uniform(size=n_test) > threshold).astype(np.int64)


def _threshold(train_scores: np.ndarray, params: dict) -> float:
    return learned_threshold(train_scores, method=params["threshold"], level=params["threshold_level"],
                             risk=params["threshold_risk"])


@dataclass(frozen=True)
class DetectorRun:
    """One detector's scores on one series, with the detection delays that make pooled medians. For a
    seeded detector the scores are the mean over seeds (delays pooled), and `per_seed` holds each seed's."""

    scores: SeriesScores
    delays: np.ndarray
    per_seed: tuple[SeriesScores, ...] = ()


def score_run(labels: np.ndarray, flags: np.ndarray) -> DetectorRun:
    return DetectorRun(scores=score_series(labels, flags), delays=detection_delays(labels, flags))


def mean_run(runs: list[DetectorRun]) -> DetectorRun:
    """The seed mean: ratios averaged, delays pooled (their median is the run's median delay)."""
    delays = [r.delays for r in runs]
    return DetectorRun(scores=average_scores([r.scores for r in runs], delays),
                       delays=np.concatenate(delays), per_seed=tuple(r.scores for r in runs))




@dataclass(frozen=True)
class SeriesResult:
    """Our detector, the IsolationForest (mean over seeds) and the random scorer (mean over seeds) on
    one series, scored on its `rows` scored rows."""

    name: str
    rows: int
    runs: dict[str, DetectorRun]  # keyed by DETECTORS
    best_f1: dict[str, float]  # UPPER BOUNDS, thresholds read off the labels: "ours" and "baseline"
    seeds: tuple[int, ...]
    cpu_seconds: float
    fitted_rows: int


def score_detections(name: str, labels: np.ndarray, found: Detections, *, scored_from: int = 0) -> SeriesResult:
    """Score every detector's flags for one series against `labels` (one per test row), counting only
    rows from `scored_from` on (NAB's probation rows are fitted on, not scored)."""
    cut = slice(scored_from, None)
    labels = np.asarray(labels)[cut]
    runs = {
        "ours": score_run(labels, found.ours[cut]),
        "baseline": mean_run([score_run(labels, flags[cut]) for flags in found.baseline]),
        "random": mean_run([score_run(labels, flags[cut]) for flags in found.random]),
    }
    bounds = {"ours": best_f1(labels, found.ours_scores[cut]), "baseline": best_f1(labels, found.baseline_scores[cut])}
    return SeriesResult(name=name, rows=int(labels.size), runs=runs, best_f1=bounds, seeds=found.seeds,
                        cpu_seconds=found.cpu_seconds, fitted_rows=found.fitted_rows)


def overall_scores(results: list[SeriesResult]) -> dict[str, SeriesScores]:
    """Per detector, the unweighted mean over series; the delay is the median over every detected
    event of every series (and, for the seeded detectors, of every seed)."""
    return {key: average_scores([r.runs[key].scores for r in results], [r.runs[key].delays for r in results])
            for key in DETECTORS}


# --- NAB ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NabSeries:
    """One NAB data file with its label windows (as timestamps)."""

    name: str  # "<category>/<file>.csv", the key used by NAB's label files
    timestamps: np.ndarray  # datetime64[s], in file order (not always increasing)
    values: np.ndarray
    windows: list[tuple[np.datetime64, np.datetime64]]


def load_nab(root: Path, category: str = "realKnownCause", names: list[str] | None = None) -> list[NabSeries]:
    """Every `<category>/*.csv` under root/data with its windows from labels/combined_windows.json."""
    root = Path(root)
    folder = root / "data" / category
    labels_path = root / "labels" / "combined_windows.json"
    if not folder.is_dir():
        raise BenchmarkError(f"{folder}: missing folder")
    windows = _read_windows(labels_path)
    files = sorted(folder.glob("*.csv"))
    if names:
        missing = [n for n in names if not (folder / n).is_file() and not (folder / f"{n}.csv").is_file()]
        if missing:
            raise BenchmarkError(f"{folder}: no such file: {', '.join(missing)}")
        files = [f for f in files if f.name in names or f.stem in names]
    if not files:
        raise BenchmarkError(f"{folder}: no .csv files")
    series = []
    for path in files:
        key = f"{category}/{path.name}"
        if key not in windows:
            raise BenchmarkError(f"{labels_path}: no windows for {key}")
        stamps, values = _read_nab_csv(path)
        pairs = [(_timestamp(labels_path, a), _timestamp(labels_path, b)) for a, b in windows[key]]
        series.append(NabSeries(name=key, timestamps=stamps, values=values, windows=pairs))
    return series


def _read_windows(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BenchmarkError(f"{path}: cannot read label windows ({exc})") from exc
    if not isinstance(data, dict):
        raise BenchmarkError(f"{path}: expected an object keyed by data file")
    return data


def _read_nab_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    lines = _lines(path)
    if lines[0].strip().lower() != "timestamp,value":
        raise BenchmarkError(f"{path}:1: expected the header 'timestamp,value', got {lines[0].strip()!r}")
    stamps, values = [], []
    for n, line in enumerate(lines[1:], start=2):
        parts = line.split(",")
        if len(parts) != 2:
            raise BenchmarkError(f"{path}:{n}: {len(parts)} columns, expected 2 (timestamp,value)")
        stamps.append(_timestamp(path, parts[0], n))
        try:
            values.append(float(parts[1]))
        except ValueError:
            raise BenchmarkError(f"{path}:{n}: value is not a number: {parts[1].strip()!r}") from None
    stamps = np.array(stamps, dtype="datetime64[s]")
    # Rows stay in file order, as NAB scores them: real files repeat timestamps at a DST change and
    # machine_temperature_system_failure.csv steps back an hour once.
    if stamps.size < 2:
        raise BenchmarkError(f"{path}: fewer than two rows")
    return stamps, np.array(values, dtype=np.float64)


def _timestamp(path: Path, text: str, line: int | None = None) -> np.datetime64:
    try:
        return np.datetime64(text.strip().replace(" ", "T"), "s")
    except ValueError:
        where = f"{path}:{line}" if line else str(path)
        raise BenchmarkError(f"{where}: not a timestamp: {text.strip()!r}") from None
