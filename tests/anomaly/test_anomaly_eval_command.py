"""manage.py anomaly_eval and nab_eval on small benchmarks cut from the real SMD and NAB files."""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from sklearn.ensemble import IsolationForest

from anomaly.detectors.multivariate import RobustMultivariateDetector, learned_threshold
from anomaly.evaluation.metrics import point_adjusted_f1, point_f1
from anomaly.evaluation.nab import probation_length

MACHINE = "machine-3-3.txt"
TRAIN_ROWS = 2000
# Test rows 4061..5077 of machine-3-3 hold two labelled events: rows 4561-4577 and rows 5059-5061.
TEST_SLICE = slice(4061, 5078)
RESULT = re.compile(
    r"^RESULT anomaly_eval f1=(\d+\.\d{4}) pa_f1=(\d+\.\d{4}) baseline_f1=(\d+\.\d{4}) baseline_pa_f1=(\d+\.\d{4})$"
)
METRICS = ("f1", "pa_f1", "pa_k20", "pa_k_auc", "event_precision", "event_recall", "event_f1", "median_delay")
SUMMARY_KEYS = [f"{prefix}{m}" for prefix in ("", "baseline_", "random_") for m in METRICS]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


@pytest.fixture(scope="module")
def smd_lines(shared_data) -> dict[str, list[str]]:
    smd = shared_data / "anomaly-benchmarks" / "smd"
    return {
        "train": _lines(smd / "train" / MACHINE)[:TRAIN_ROWS],
        "test": _lines(smd / "test" / MACHINE)[TEST_SLICE],
        "test_label": _lines(smd / "test_label" / MACHINE)[TEST_SLICE],
    }


@pytest.fixture
def bench(tmp_path, smd_lines) -> Path:
    """DIR/train, DIR/test, DIR/test_label with the machine-3-3 slices, plus a label with no data."""
    for folder, lines in smd_lines.items():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / MACHINE).write_text("\n".join(lines) + "\n")
    (tmp_path / "test_label" / "machine-9-9.txt").write_text("0\n")  # only labels: not evaluated
    return tmp_path


def _run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def _summary(line: str, command: str) -> dict[str, float]:
    """The SUMMARY line's figures, checking its keys and their order."""
    head, *pairs = line.split(" ")
    assert (head, pairs[0]) == ("SUMMARY", command)
    figures = dict(pair.split("=") for pair in pairs[1:])
    assert list(figures) == SUMMARY_KEYS
    assert all(re.fullmatch(r"-?\d+\.\d{4}|nan", v) for v in figures.values()), figures
    return {k: float(v) for k, v in figures.items()}


def _test_labels(bench: Path) -> np.ndarray:
    return np.loadtxt(bench / "test_label" / MACHINE, dtype=np.int64)


def test_anomaly_eval_ends_with_summary_and_result_lines_and_finds_the_event(bench, tmp_path):
    report = tmp_path / "report.json"
    output = _run("anomaly_eval", str(bench), "--seeds", "0,1", "--json", str(report))
    lines = output.strip().splitlines()
    match = RESULT.match(lines[-1])
    assert match, lines[-1]
    f1, pa_f1, baseline_f1, baseline_pa_f1 = map(float, match.groups())
    assert 0.0 <= baseline_f1 <= 1.0 and 0.0 <= baseline_pa_f1 <= 1.0
    summary = _summary(lines[-2], "anomaly_eval")
    assert (summary["f1"], summary["pa_f1"], summary["baseline_f1"]) == (f1, pa_f1, baseline_f1)
    # A 1,017-row slice after 2,000 training rows: both labelled events found, and better than chance.
    assert pa_f1 > summary["random_pa_f1"] and f1 > 10 * summary["random_f1"]
    assert "machine-9-9" not in output  # present in test_label/ only
    data = json.loads(report.read_text())
    assert list(data["series"]) == [MACHINE]
    assert data["series"][MACHINE]["ours"]["event_recall"] == 1.0  # both labelled events found
    assert any(line.startswith(MACHINE) and "upper bound, thresholds read off the labels" in line for line in lines)
    assert any(re.fullmatch(r"ours: fit\+score \d+\.\d{2} s CPU per 10,000 rows \(train \+ test\), .*", line)
               for line in lines)


def test_anomaly_eval_json_holds_every_figure_of_the_three_detectors(bench, tmp_path):
    report = tmp_path / "report.json"
    lines = _run("anomaly_eval", str(bench), "--seeds", "0,1", "--json", str(report)).strip().splitlines()
    data = json.loads(report.read_text())
    summary = _summary(lines[-2], "anomaly_eval")
    assert data["command"] == "anomaly_eval" and data["seeds"] == [0, 1]
    assert data["params"] == {k: RobustMultivariateDetector().get_params()[k]
                              for k in ("threshold", "threshold_level", "threshold_risk")}
    for prefix, key in (("", "ours"), ("baseline_", "baseline"), ("random_", "random")):
        assert set(data["overall"][key]) == set(METRICS)
        for metric in METRICS:  # the SUMMARY line prints the JSON's overall figures (NaN as null)
            value, printed = data["overall"][key][metric], summary[prefix + metric]
            if value is None:
                assert np.isnan(printed), (key, metric)
            else:
                assert printed == pytest.approx(value, abs=5e-5), (key, metric)
    series = data["series"][MACHINE]
    assert series["rows"] == len(_test_labels(bench))
    assert set(series["baseline_per_seed"]) == set(series["random_per_seed"]) == {"0", "1"}
    assert "ours_per_seed" not in series  # ours has no seed
    bound = series["best_f1_upper_bound"]
    assert set(bound) == {"ours", "baseline_seed0"}
    assert bound["ours"] >= series["ours"]["f1"]  # an upper bound over every threshold, ours included
    assert series["ours_cpu_seconds"] >= 0 and series["ours_fitted_rows"] == TRAIN_ROWS + series["rows"]


def _forest_flags(train: np.ndarray, test: np.ndarray, seed: int, params: dict) -> np.ndarray:
    """The baseline rule written out again: default IsolationForest, our threshold rule on its train scores."""
    forest = IsolationForest(random_state=seed).fit(train)
    threshold = learned_threshold(-forest.score_samples(train), method=params["threshold"],
                                  level=params["threshold_level"], risk=params["threshold_risk"])
    return (-forest.score_samples(test) > threshold).astype(int)


def _random_flags(n_train: int, n_test: int, seed: int, params: dict) -> np.ndarray:
    """The random scorer written out again: train then test scores from default_rng(seed)."""
    rng = np.random.default_rng(seed)
    threshold = learned_threshold(rng.uniform(size=n_train), method=params["threshold"],
                                  level=params["threshold_level"], risk=params["threshold_risk"])
    return (rng.uniform(size=n_test) > threshold).astype(int)


def test_anomaly_eval_baselines_are_the_mean_over_seeds(bench, tmp_path):
    params = RobustMultivariateDetector().get_params()
    train = np.loadtxt(bench / "train" / MACHINE, delimiter=",")
    test = np.loadtxt(bench / "test" / MACHINE, delimiter=",")
    labels = _test_labels(bench)
    seeds = (0, 1, 2)
    forest = [_forest_flags(train, test, seed, params) for seed in seeds]
    noise = [_random_flags(len(train), len(test), seed, params) for seed in seeds]
    report = tmp_path / "report.json"
    lines = _run("anomaly_eval", str(bench), "--seeds", "0,1,2", "--json", str(report)).strip().splitlines()
    data = json.loads(report.read_text())
    base, rand = data["overall"]["baseline"], data["overall"]["random"]
    assert base["f1"] == pytest.approx(np.mean([point_f1(labels, f) for f in forest]))
    assert base["pa_f1"] == pytest.approx(np.mean([point_adjusted_f1(labels, f) for f in forest]))
    assert rand["f1"] == pytest.approx(np.mean([point_f1(labels, f) for f in noise]))
    assert rand["pa_f1"] == pytest.approx(np.mean([point_adjusted_f1(labels, f) for f in noise]))
    per_seed = data["series"][MACHINE]["baseline_per_seed"]
    assert [per_seed[str(s)]["f1"] for s in seeds] == pytest.approx([point_f1(labels, f) for f in forest])
    # the seeds differ, so the mean is not any one seed's figure
    assert len({round(per_seed[str(s)]["pa_f1"], 6) for s in seeds}) > 1
    _, _, baseline_f1, baseline_pa_f1 = map(float, RESULT.match(lines[-1]).groups())
    assert (baseline_f1, baseline_pa_f1) == (round(base["f1"], 4), round(base["pa_f1"], 4))


def test_anomaly_eval_seed_is_shorthand_for_one_seed(bench, tmp_path):
    one, many = tmp_path / "one.json", tmp_path / "many.json"
    _run("anomaly_eval", str(bench), "--seed", "1", "--json", str(one))
    _run("anomaly_eval", str(bench), "--seeds", "1", "--json", str(many))
    assert json.loads(one.read_text())["overall"] == json.loads(many.read_text())["overall"]
    assert json.loads(one.read_text())["seeds"] == [1]
    with pytest.raises(CommandError):
        _run("anomaly_eval", str(bench), "--seeds", "0,0")
    with pytest.raises(CommandError):
        _run("anomaly_eval", str(bench), "--seed", "1", "--seeds", "0,1")


def test_anomaly_eval_names_option_restricts_and_rejects_unknown(bench):
    assert RESULT.match(_run("anomaly_eval", str(bench), "--names", MACHINE).strip().splitlines()[-1])
    with pytest.raises(CommandError, match="machine-1-1.txt"):
        _run("anomaly_eval", str(bench), "--names", "machine-1-1.txt")


def test_anomaly_eval_label_file_one_row_short_is_refused(bench, smd_lines):
    label_file = bench / "test_label" / MACHINE
    label_file.write_text("\n".join(smd_lines["test_label"][:-1]) + "\n")
    with pytest.raises(CommandError) as exc:
        _run("anomaly_eval", str(bench))
    message = str(exc.value)
    assert str(label_file) in message
    assert f"{len(smd_lines['test']) - 1} labels" in message and f"{len(smd_lines['test'])} rows" in message


def test_anomaly_eval_non_numeric_cell_names_file_and_line(bench, smd_lines):
    lines = list(smd_lines["test"])
    cells = lines[41].split(",")
    cells[5] = "n/a"
    lines[41] = ",".join(cells)
    test_file = bench / "test" / MACHINE
    test_file.write_text("\n".join(lines) + "\n")
    out = io.StringIO()
    with pytest.raises(CommandError, match=re.escape(f"{test_file}:42: column 6 is not a number: 'n/a'")):
        call_command("anomaly_eval", str(bench), stdout=out, stderr=io.StringIO())
    assert "RESULT" not in out.getvalue()


def test_anomaly_eval_ragged_row_names_file_and_line(bench, smd_lines):
    lines = list(smd_lines["train"])
    lines[9] = lines[9].rsplit(",", 1)[0]
    train_file = bench / "train" / MACHINE
    train_file.write_text("\n".join(lines) + "\n")
    with pytest.raises(CommandError, match=re.escape(f"{train_file}:10: 37 columns, expected 38")):
        _run("anomaly_eval", str(bench))


def test_anomaly_eval_label_other_than_zero_or_one_is_refused(bench, smd_lines):
    lines = list(smd_lines["test_label"])
    lines[2] = "2"
    label_file = bench / "test_label" / MACHINE
    label_file.write_text("\n".join(lines) + "\n")
    with pytest.raises(CommandError, match=re.escape(f"{label_file}:3: label must be 0 or 1, got '2'")):
        _run("anomaly_eval", str(bench))


def test_anomaly_eval_without_common_names_is_refused(tmp_path):
    for folder in ("train", "test", "test_label"):
        (tmp_path / folder).mkdir()
    (tmp_path / "train" / "a.txt").write_text("0.1,0.2\n")
    with pytest.raises(CommandError, match="no file name is present in all of"):
        _run("anomaly_eval", str(tmp_path))
    with pytest.raises(CommandError, match="missing folder"):
        _run("anomaly_eval", str(tmp_path / "train"))


# --- NAB -------------------------------------------------------------------------------------------
NAB_FILE = "rogue_agent_key_hold.csv"


@pytest.fixture
def nab_dir(tmp_path, shared_data) -> Path:
    """A NAB folder holding one real realKnownCause series and its windows."""
    nab = shared_data / "anomaly-benchmarks" / "nab"
    (tmp_path / "data" / "realKnownCause").mkdir(parents=True)
    (tmp_path / "labels").mkdir()
    shutil.copy(nab / "data" / "realKnownCause" / NAB_FILE, tmp_path / "data" / "realKnownCause" / NAB_FILE)
    windows = json.loads((nab / "labels" / "combined_windows.json").read_text())
    key = f"realKnownCause/{NAB_FILE}"
    (tmp_path / "labels" / "combined_windows.json").write_text(json.dumps({key: windows[key]}))
    return tmp_path


NAB_RESULT = re.compile(
    r"^RESULT nab_eval score=-?\d+\.\d{4} baseline_score=-?\d+\.\d{4} window_recall=\d\.\d{4} "
    r"baseline_window_recall=\d\.\d{4} window_precision=\d\.\d{4} baseline_window_precision=\d\.\d{4}$"
)


def _nab_folder(root: Path, shared_data: Path, category: str, name: str) -> Path:
    """A NAB folder holding one real series of `category` and its windows."""
    nab = shared_data / "anomaly-benchmarks" / "nab"
    (root / "data" / category).mkdir(parents=True)
    (root / "labels").mkdir()
    shutil.copy(nab / "data" / category / name, root / "data" / category / name)
    windows = json.loads((nab / "labels" / "combined_windows.json").read_text())
    key = f"{category}/{name}"
    (root / "labels" / "combined_windows.json").write_text(json.dumps({key: windows[key]}))
    return root


def test_nab_eval_ends_with_summary_and_result_lines(nab_dir):
    lines = _run("nab_eval", str(nab_dir)).strip().splitlines()
    assert NAB_RESULT.match(lines[-1]), lines[-1]
    _summary(lines[-2], "nab_eval")
    assert any(line.startswith(f"realKnownCause/{NAB_FILE}") for line in lines)


@pytest.mark.parametrize(("category", "name"), [("realKnownCause", NAB_FILE),
                                                ("realAWSCloudwatch", "ec2_cpu_utilization_825cc2.csv")])
def test_nab_eval_point_metrics_label_the_window_rows_after_probation(tmp_path, shared_data, category, name):
    folder = _nab_folder(tmp_path / "nab", shared_data, category, name)
    report = tmp_path / "report.json"
    lines = _run("nab_eval", str(folder), "--category", category, "--seeds", "0,1",
                 "--json", str(report)).strip().splitlines()
    assert NAB_RESULT.match(lines[-1]), lines[-1]
    summary = _summary(lines[-2], "nab_eval")
    data = json.loads(report.read_text())
    key = f"{category}/{name}"
    n_rows = len(_lines(folder / "data" / category / name)) - 1  # less the header
    series = data["series"][key]
    assert series["rows"] == n_rows - probation_length(n_rows)
    assert set(series["baseline_per_seed"]) == {"0", "1"}
    assert summary["f1"] == pytest.approx(data["overall"]["ours"]["f1"], abs=5e-5)
    nab = data["nab"]["series"][key]
    assert set(nab) == {"ours", "baseline"} and data["nab"]["baseline_seed"] == 0
    result = dict(pair.split("=") for pair in lines[-1].split()[2:])
    assert float(result["score"]) == pytest.approx(data["nab"]["corpus"]["score"], abs=5e-5)


def test_nab_eval_bad_value_names_file_and_line(nab_dir):
    path = nab_dir / "data" / "realKnownCause" / NAB_FILE
    lines = _lines(path)
    lines[5] = lines[5].split(",")[0] + ",oops"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CommandError, match=re.escape(f"{path}:6: value is not a number: 'oops'")):
        _run("nab_eval", str(nab_dir))


@pytest.mark.parametrize("command", ["anomaly_eval", "nab_eval"])
def test_json_path_in_a_missing_folder_is_refused_before_any_work(bench, tmp_path, command):
    target = tmp_path / "no-such-folder" / "report.json"
    with pytest.raises(CommandError, match="no-such-folder is not a writable folder"):
        _run(command, str(bench), "--json", str(target))
    with pytest.raises(CommandError, match="is a folder"):
        _run(command, str(bench), "--json", str(tmp_path))
    assert not target.parent.exists()


def test_json_report_is_written_whole_and_leaves_no_temporary_file(bench, tmp_path):
    report = tmp_path / "out" / "report.json"
    report.parent.mkdir()
    _run("anomaly_eval", str(bench), "--seeds", "0", "--json", str(report))
    assert json.loads(report.read_text())["command"] == "anomaly_eval"
    assert [p.name for p in report.parent.iterdir()] == ["report.json"]
