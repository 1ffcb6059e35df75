"""Loaders for labelled anomaly benchmarks, and the evaluation of one series.

SMD-style layout: ``DIR/train/<name>``, ``DIR/test/<name>``, ``DIR/test_label/<name>``: comma-separated
numbers, no header, one row per time step; the label file holds one 0/1 per test row. A name counts when
it is present in all three folders.

NAB layout: ``DIR/data/<category>/<name>.csv`` (``timestamp,value`` with a header) and
``DIR/labels/combined_windows.json`` (windows keyed ``<category>/<name>.csv``).

Bad input raises `BenchmarkError` naming the file, the line and the value at fault.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from anomaly.evaluation.metrics import SeriesScores, detection_delays, score_series

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

@dataclass(frozen=True)
class SeriesResult:
    """Both detectors' scores on one series, plus the delays that make the pooled median."""

    name: str
    ours: SeriesScores
    baseline: SeriesScores
    ours_delays: np.ndarray
    baseline_delays: np.ndarray


def evaluate_predictions(name: str, labels: np.ndarray, ours: np.ndarray, baseline: np.ndarray) -> SeriesResult:
    """Score two detectors' 0/1 predictions for one labelled series."""
    return SeriesResult(
        name=name, ours=score_series(labels, ours), baseline=score_series(labels, baseline),
        ours_delays=detection_delays(labels, ours), baseline_delays=detection_delays(labels, baseline),
    )


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
