"""manage.py anomaly_eval and nab_eval on small benchmarks cut from the real SMD and NAB files."""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

MACHINE = "machine-3-3.txt"
TRAIN_ROWS = 2000
# Test rows 4061..5077 of machine-3-3 hold two labelled events: rows 4561-4577 and rows 5059-5061.
TEST_SLICE = slice(4061, 5078)
RESULT = re.compile(
    r"^RESULT anomaly_eval f1=(\d+\.\d{4}) pa_f1=(\d+\.\d{4}) baseline_f1=(\d+\.\d{4}) baseline_pa_f1=(\d+\.\d{4})$"
)


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


def test_anomaly_eval_ends_with_result_line_and_finds_the_event(bench):
    output = _run("anomaly_eval", str(bench))
    lines = output.strip().splitlines()
    match = RESULT.match(lines[-1])
    assert match, lines[-1]
    f1, pa_f1, baseline_f1, baseline_pa_f1 = map(float, match.groups())
    assert pa_f1 > 0.9  # the labelled event is detected and false alarms are few
    assert f1 > 0.5
    assert 0.0 <= baseline_f1 <= 1.0 and 0.0 <= baseline_pa_f1 <= 1.0
    row = next(line for line in lines if line.startswith(MACHINE))
    assert "machine-9-9" not in output  # present in test_label/ only
    assert row.split()[4] == "1.000"  # ours: event recall, both labelled events found


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


def test_nab_eval_ends_with_result_line(nab_dir):
    lines = _run("nab_eval", str(nab_dir)).strip().splitlines()
    assert re.match(
        r"^RESULT nab_eval score=-?\d+\.\d{4} baseline_score=-?\d+\.\d{4} window_recall=\d\.\d{4} "
        r"baseline_window_recall=\d\.\d{4} window_precision=\d\.\d{4} baseline_window_precision=\d\.\d{4}$",
        lines[-1],
    ), lines[-1]
    assert any(line.startswith(f"realKnownCause/{NAB_FILE}") for line in lines)


def test_nab_eval_bad_value_names_file_and_line(nab_dir):
    path = nab_dir / "data" / "realKnownCause" / NAB_FILE
    lines = _lines(path)
    lines[5] = lines[5].split(",")[0] + ",oops"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CommandError, match=re.escape(f"{path}:6: value is not a number: 'oops'")):
        _run("nab_eval", str(nab_dir))
