"""Tests for the strict exposition parser, on every real dcgm-exporter capture and on bad input.

Expectations come from the capture text itself (line positions, label substrings) or from an
independent parser (prometheus_client), never from our own output.
"""

from __future__ import annotations

import gc
import math
import random
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from telemetry.ingest.prometheus import (
    ExpositionError,
    _scan_sample,
    parse_exposition,
)
from tests.conftest import SHARED_DATA

CAPTURES = sorted(p.relative_to(SHARED_DATA).as_posix() for p in SHARED_DATA.glob("dcgm/**/*.prom"))
MIG_CAPTURE = "dcgm/nvidia-cloud-native-docs/a100-mig-1g.5gb-dcgm-exporter.prom"
TYPED_CAPTURE = "dcgm/cncf-k8s-ai-conformance/v1.35_kops.prom"  # has # HELP / # TYPE lines


def read(shared_data: Path, rel: str) -> str:
    return (shared_data / rel).read_text(encoding="utf-8")


def sample_lines(text: str) -> list[tuple[int, str]]:
    """(1-based line number, line) of every line that is neither blank nor a comment."""
    return [
        (n, line)
        for n, line in enumerate(text.split("\n"), 1)
        if line.strip() and not line.lstrip().startswith("#")
    ]


def first_sample_line(text: str) -> tuple[int, str]:
    """A real sample line well inside the capture (not the first line, to test numbering)."""
    lines = sample_lines(text)
    return lines[len(lines) // 2]


def replace_line(text: str, lineno: int, new: str) -> str:
    lines = text.split("\n")
    lines[lineno - 1] = new
    return "\n".join(lines)


def expect_error(data: str | bytes, lineno: int, *fragments: str) -> ExpositionError:
    with pytest.raises(ExpositionError) as info:
        parse_exposition(data)
    err = info.value
    assert err.line == lineno
    for fragment in fragments:
        assert fragment in err.message
    assert str(err).startswith(f"line {lineno}: ")
    return err


# --- every real capture ----------------------------------------------------------------------


def test_captures_present_found(shared_data: Path) -> None:
    assert CAPTURES, f"no .prom captures under {shared_data / 'dcgm'}"
    assert MIG_CAPTURE in CAPTURES and TYPED_CAPTURE in CAPTURES


@pytest.mark.parametrize("capture", CAPTURES)
def test_capture_sample_per_line_counted(shared_data: Path, capture: str) -> None:
    text = read(shared_data, capture)
    samples = parse_exposition(text.encode("utf-8"))
    expected = sample_lines(text)
    assert len(samples) == len(expected)
    assert [s.line for s in samples] == [n for n, _ in expected]
    assert [s.name for s in samples] == [line.split("{", 1)[0] for _, line in expected]


@pytest.mark.parametrize("capture", CAPTURES)
def test_capture_samples_match_prometheus_client(shared_data: Path, capture: str) -> None:
    text = read(shared_data, capture)
    # prometheus_client appends "_total" to the samples of a TYPE counter family; we keep names
    # as written, so compare without that suffix.
    ours = [
        (s.name.removesuffix("_total"), sorted(s.labels.items()), s.value, s.timestamp_ms)
        for s in parse_exposition(text)
    ]
    theirs = [
        (s.name.removesuffix("_total"), sorted(s.labels.items()), s.value, s.timestamp)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]
    assert ours == theirs


@pytest.mark.parametrize("capture", CAPTURES)
def test_capture_crlf_and_str_same_samples(shared_data: Path, capture: str) -> None:
    text = read(shared_data, capture)
    plain = parse_exposition(text)
    assert parse_exposition(text.replace("\n", "\r\n").encode("utf-8")) == plain


@pytest.mark.parametrize("capture", CAPTURES)
def test_capture_fast_path_and_scanner_agree(shared_data: Path, capture: str) -> None:
    text = read(shared_data, capture)
    by_line = {s.line: s for s in parse_exposition(text)}
    for lineno, line in sample_lines(text):
        scanned = _scan_sample(line, lineno, {})
        assert scanned == tuple(by_line[lineno][:4])


def mutate(line: str, rng: random.Random) -> str:
    alphabet = '{}",= \t\\_.-+eE0123456789xnNaIf#:\r\u0661\u00e9\x0b'
    for _ in range(rng.randint(1, 3)):
        pos = rng.randrange(len(line) + 1)
        op = rng.random()
        if op < 0.4:
            line = line[:pos] + rng.choice(alphabet) + line[pos:]
        elif op < 0.8:
            line = line[:pos] + line[pos + 1 :]
        else:
            line = line[:pos] + rng.choice(alphabet) + line[pos + 1 :]
    return line


def test_mutated_capture_lines_fast_path_and_scanner_agree(shared_data: Path) -> None:
    """Random edits of real lines: the fast path accepts exactly what the scanner accepts, with
    the same result, and fails with the same message (fixed seed, so failures reproduce)."""
    rng = random.Random(20261130)
    lines = [line for c in CAPTURES for _, line in sample_lines(read(shared_data, c))]
    outcomes = {"accepted": 0, "rejected": 0}
    for _ in range(5000):
        line = mutate(rng.choice(lines), rng).rstrip("\r")  # a body-final CR ends the line
        try:
            scanned, expected_error = _scan_sample(line, 1, {}), None
        except ExpositionError as exc:
            scanned, expected_error = None, exc.message
        try:
            parsed = parse_exposition(line)
        except ExpositionError as exc:
            assert exc.message == expected_error, line
            outcomes["rejected"] += 1
            continue
        assert expected_error is None, line
        got = tuple(parsed[0][:4]) if parsed else None
        assert repr(got) == repr(scanned), line  # repr: NaN == NaN
        outcomes["accepted"] += 1
    assert min(outcomes.values()) > 500, outcomes


def test_label_values_with_spaces_preserved(shared_data: Path) -> None:
    seen_space = False
    for capture in CAPTURES:
        text = read(shared_data, capture)
        by_line = {s.line: s for s in parse_exposition(text)}
        for lineno, line in sample_lines(text):
            if 'modelName="' in line:
                model = line.split('modelName="', 1)[1].split('"', 1)[0]
                assert by_line[lineno].labels["modelName"] == model
                seen_space = seen_space or " " in model
    assert seen_space, "no capture has a label value with a space; the test proves nothing"


def test_identical_label_strings_share_dict(shared_data: Path) -> None:
    text = read(shared_data, MIG_CAPTURE)
    samples = parse_exposition(text)
    raw = {n: line[line.index("{") : line.rindex("}")] for n, line in sample_lines(text)}
    for a in samples:
        for b in samples:
            assert (a.labels is b.labels) == (raw[a.line] == raw[b.line])


# --- syntax accepted -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "token", ["0", "-7", "+3", "0.995630", "1e3", "-1.5E-2", ".5", "5.", "NaN", "nan",
              "+Inf", "-Inf", "Inf", "inf", "Infinity"],
)
def test_value_forms_parsed(token: str) -> None:
    (sample,) = parse_exposition(f'm{{a="b"}} {token}\n')
    expected = float(token)
    assert sample.value == expected or (math.isnan(expected) and math.isnan(sample.value))


def test_timestamp_parsed_as_int_ms() -> None:
    samples = parse_exposition('m{a="b"} 1 1700000000123\nm -2.5 -1000\nm 3\n')
    assert [s.timestamp_ms for s in samples] == [1700000000123, -1000, None]
    assert [s.value for s in samples] == [1.0, -2.5, 3.0]


def test_label_escapes_decoded() -> None:
    line = 'm{a="x\\\\y",b="say \\"hi\\"",c="l1\\nl2"} 1'
    first, plain, again = parse_exposition(f"{line}\nn 2\n{line}\n")
    assert first.labels == {"a": "x\\y", "b": 'say "hi"', "c": "l1\nl2"}
    assert again.labels is first.labels and plain.labels == {}


def test_interleaved_label_sets_shared_and_kept_apart(shared_data: Path) -> None:
    text = read(shared_data, MIG_CAPTURE)
    lines = [line for _, line in sample_lines(text)]
    gpu = [line for line in lines if "GPU_I_ID" not in line]
    instance = [line for line in lines if "GPU_I_ID" in line]
    mixed = [line for pair in zip(gpu, instance, strict=False) for line in pair]
    samples = parse_exposition("\n".join(mixed))
    assert [("GPU_I_ID" in s.labels) for s in samples] == [("GPU_I_ID" in m) for m in mixed]
    assert samples[0].labels is samples[2].labels and samples[1].labels is samples[3].labels


def test_blanks_and_spacing_accepted() -> None:
    text = 'm { a = "1" , b="2", }  1  \n\n   \nm{} 2\nm 3\n'
    samples = parse_exposition(text)
    assert [(s.labels, s.value, s.line) for s in samples] == [
        ({"a": "1", "b": "2"}, 1.0, 1),
        ({}, 2.0, 4),
        ({}, 3.0, 5),
    ]
    assert samples[1].labels is samples[2].labels


@pytest.mark.parametrize(
    "kind", ["counter", "gauge", "histogram", "summary", "untyped", "info", "stateset",
             "gaugehistogram", "unknown"],
)
def test_type_comment_known_kind_accepted(kind: str) -> None:
    assert parse_exposition(f"# HELP m Some help.\n# TYPE m {kind}\n# free comment\nm 1\n")


def test_byte_order_mark_rejected() -> None:
    expect_error("\ufeffm 1\n", 1, "invalid metric name")


# --- bad input: each corrupts one line of a real capture, so the line number is known ----------


def test_unterminated_label_value_reports_line(shared_data: Path) -> None:
    text = read(shared_data, MIG_CAPTURE)
    lineno, line = first_sample_line(text)
    cut = line[: line.index('"') + 2]  # e.g. DCGM_FI_...{gpu="0
    err = expect_error(replace_line(text, lineno, cut), lineno, "unterminated label value")
    assert err.message == f"unterminated label value in '{cut}'"


def test_missing_value_reports_line(shared_data: Path) -> None:
    text = read(shared_data, MIG_CAPTURE)
    lineno, line = first_sample_line(text)
    expect_error(replace_line(text, lineno, line.rsplit(" ", 1)[0]), lineno, "missing value")


@pytest.mark.parametrize("token", ["abc", "0x1p3", "1_000", "1.2.3", "--1", "\u0661", "1e"])
def test_bad_value_token_reports_line(shared_data: Path, token: str) -> None:
    text = read(shared_data, MIG_CAPTURE)
    lineno, line = first_sample_line(text)
    bad = f"{line.rsplit(' ', 1)[0]} {token}"
    expect_error(replace_line(text, lineno, bad), lineno, f"invalid value '{token}'")


@pytest.mark.parametrize("prefix", ["1", "-", "."])
def test_bad_metric_name_reports_line(shared_data: Path, prefix: str) -> None:
    text = read(shared_data, MIG_CAPTURE)
    lineno, line = first_sample_line(text)
    expect_error(replace_line(text, lineno, prefix + line), lineno, "invalid metric name")


def test_duplicate_label_reports_line(shared_data: Path) -> None:
    text = read(shared_data, MIG_CAPTURE)
    lineno, line = first_sample_line(text)
    bad = line.replace("{", '{gpu="7",', 1)
    expect_error(replace_line(text, lineno, bad), lineno, "duplicate label name 'gpu'")


def test_unknown_type_reports_line(shared_data: Path) -> None:
    text = read(shared_data, TYPED_CAPTURE)
    lineno, line = next(
        (n, text_line) for n, text_line in enumerate(text.split("\n"), 1)
        if text_line.startswith("# TYPE") and n > 3
    )
    bad = line.rsplit(" ", 1)[0] + " gauges"
    expect_error(replace_line(text, lineno, bad), lineno, "unknown TYPE 'gauges'")


def test_type_without_kind_reports_line() -> None:
    expect_error("m 1\n# TYPE m\n", 2, "TYPE without a metric type")


def test_invalid_utf8_reports_line(shared_data: Path) -> None:
    text = read(shared_data, MIG_CAPTURE)
    lineno, line = first_sample_line(text)
    data = replace_line(text, lineno, line.replace('gpu="0"', 'gpu="0\udcff"')).encode(
        "utf-8", "surrogateescape"
    )
    expect_error(data, lineno, "invalid UTF-8", "0xff")
    expect_error(data.decode("utf-8", "surrogateescape"), lineno, "UTF-8")


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ('m{a="1"', "unterminated label set"),
        ('m{a="1"} 1 12.5', "invalid timestamp '12.5'"),
        ('m{a="1"} 1 5 6', "unexpected text after the timestamp"),
        ('m{a="1"}1', "expected a blank before the value"),
        ('m{a="\\t"} 1', "invalid escape '\\t'"),
        ("m{,} 1", "invalid label name"),
        ('m{1a="x"} 1', "invalid label name"),
        ('m{a "x"} 1', "expected '=' after label name 'a'"),
        ("m{a=x} 1", "expected '\"' to open the value of label 'a'"),
        ('m{a="x" b="y"} 1', "expected ',' or '}' after a label value"),
        ("m 1\r2", "invalid value"),
        ("# HELP", "HELP without a metric name"),
        ("# TYPE 9m gauge", "invalid metric name '9m' in TYPE"),
    ],
)
def test_malformed_line_rejected_with_reason(line: str, fragment: str) -> None:
    expect_error(f"ok 1\n\n{line}\nok 2\n", 3, fragment)


def test_error_snippet_truncated_to_80_chars() -> None:
    line = 'm{a="' + "x" * 200
    err = expect_error(line, 1, "unterminated label value")
    snippet = err.message.split(" in '", 1)[1][:-1]
    assert len(snippet) == 80 and snippet.endswith("...") and line.startswith(snippet[:-3])
    assert isinstance(err, ValueError)


def set_gc(enabled: bool) -> None:
    if enabled:
        gc.enable()
    else:
        gc.disable()


@pytest.mark.parametrize("enabled", [True, False])
def test_gc_state_restored_after_parse_and_error(enabled: bool) -> None:
    was = gc.isenabled()
    try:
        set_gc(enabled)
        parse_exposition("m 1\n")
        assert gc.isenabled() is enabled
        with pytest.raises(ExpositionError):
            parse_exposition("m\n")
        assert gc.isenabled() is enabled
    finally:
        set_gc(was)
