"""Strict, fast parser for the Prometheus text exposition format (version 0.0.4).

dcgm-exporter and the node collectors push ``/metrics`` bodies of tens of thousands of lines per
scrape round, so :func:`parse_exposition` is built for throughput while still rejecting anything
malformed with the 1-based line number of the first bad line:

- Lines are split once. A sample line in the usual ``name{labels} value [timestamp]`` shape is
  taken apart with ``str.rpartition``/``partition`` and ``float()``, all C-level calls.
- Label sets repeat across every metric of a GPU, so each distinct raw label string is parsed once
  per call and the resulting dict is shared by every sample that carries it.
- Any line the fast path is not sure about (escapes, extra blanks, a bad token) is re-read by a
  character scanner that either accepts it or says precisely what is wrong.
- The cyclic GC is paused during a parse (see :func:`_gc_paused`).

Values accept decimal and exponent forms plus ``NaN``/``Inf`` in the spellings Go's
``strconv.ParseFloat`` takes (case-insensitive ``nan``, ``inf``, ``infinity``, optional sign);
hexadecimal, digit-group underscores and non-ASCII digits are rejected. Timestamps are optional
integer milliseconds.
"""

from __future__ import annotations

import gc
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

__all__ = ["METRIC_TYPES", "ExpositionError", "PromSample", "parse_exposition"]

METRIC_TYPES = frozenset(
    {
        "counter", "gauge", "histogram", "summary", "untyped",
        "info", "stateset", "gaugehistogram", "unknown",
    }
)

_METRIC_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Exactly the inputs Python's float() takes once whitespace, underscores and non-ASCII digits are
# excluded, so the fast path (float() plus those checks) and the scanner agree on every token.
_VALUE_RE = re.compile(
    r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf|infinity|nan)", re.IGNORECASE | re.ASCII
)
_TIMESTAMP_RE = re.compile(r"-?\d+", re.ASCII)
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_BLANKS = " \t"
_SNIPPET_MAX = 80
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class PromSample(NamedTuple):
    """One sample line.

    ``labels`` is shared between every sample of the same parse that had the identical raw label
    string: treat it as read-only (copy it before changing it).
    """

    name: str
    labels: dict[str, str]
    value: float
    timestamp_ms: int | None
    line: int


class ExpositionError(ValueError):
    """Malformed exposition text; ``line`` is 1-based."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(line, message)
        self.line = line
        self.message = message

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


def _snippet(line: str) -> str:
    if len(line) > _SNIPPET_MAX:
        return line[: _SNIPPET_MAX - 3] + "..."
    return line


def _fail(lineno: int, problem: str, line: str) -> ExpositionError:
    return ExpositionError(lineno, f"{problem} in '{_snippet(line)}'")


def parse_exposition(data: bytes | str) -> list[PromSample]:
    """Parse a whole exposition body into samples, in input order.

    Raises :class:`ExpositionError` (a ``ValueError``) at the first malformed line.
    """
    text = _decode(data)
    if "\r" in text:
        # Only CRLF pairs (and a CR ending the body) are line ends; a lone CR elsewhere stays in
        # its line and is judged there.
        text = text.replace("\r\n", "\n")
        if text.endswith("\r"):
            text = text[:-1]
    with _gc_paused():
        return _parse_lines(text.split("\n"))


_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Hold off the cyclic GC while a parse allocates its (acyclic) samples.

    Each sample line allocates two GC-tracked tuples, so a large body triggers hundreds of
    generational passes that find nothing and cost ~20% of the parse. The counter makes
    concurrent parses in other threads safe: only the last one out restores the prior state.
    """
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


def _decode(data: bytes | str) -> str:
    if isinstance(data, str):
        if not data.isascii():
            _check_encodable(data)
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        lineno = data.count(b"\n", 0, exc.start) + 1
        raise ExpositionError(
            lineno, f"invalid UTF-8 byte 0x{data[exc.start]:02x} at offset {exc.start}"
        ) from None


def _check_encodable(text: str) -> None:
    """Reject lone surrogates (undecodable bytes smuggled in via surrogateescape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        lineno = text.count("\n", 0, exc.start) + 1
        raise ExpositionError(lineno, "invalid UTF-8 (lone surrogate) in text") from None


def _parse_lines(lines: list[str]) -> list[PromSample]:
    # One flat loop with everything bound to locals: this is the hot path, so the usual
    # "small functions" rule gives way to keeping calls and global lookups out of it.
    out: list[PromSample] = []
    append = out.append
    new = tuple.__new__
    sample_cls = PromSample
    no_labels: dict[str, str] = {}
    label_cache: dict[str, dict[str, str]] = {"": no_labels}
    cached_labels = label_cache.get
    known_names: set[str] = set()
    # HELP/TYPE lines repeat verbatim when several hosts' scrapes are concatenated.
    known_comments: set[str] = set()
    # Consecutive lines often carry the same label set (a single-GPU node, or an exporter that
    # groups by GPU); comparing with the previous raw string skips hashing ~200 characters.
    last_raw: str | None = None
    last_labels = no_labels
    for lineno, line in enumerate(lines, 1):
        if not line or line[0] == "#":
            if line and line not in known_comments:
                _check_comment(line, lineno)
                known_comments.add(line)
            continue
        try:
            # The last "} " ends the label set: the value and timestamp cannot contain "}".
            head, sep, token = line.rpartition("} ")
            if sep:
                name, brace, raw = head.partition("{")
                if not brace:
                    raise ValueError(line)
                if raw == last_raw:
                    labels = last_labels
                else:
                    labels = cached_labels(raw)
                    if labels is None:
                        labels = label_cache[raw] = _labels_quick(raw)
                    last_raw, last_labels = raw, labels
            else:
                name, _, token = line.partition(" ")
                labels = no_labels
            if name not in known_names:
                if not _METRIC_NAME_RE.fullmatch(name):
                    raise ValueError(line)
                known_names.add(name)
            stamp = None
            if " " in token:
                token, _, stamp_token = token.partition(" ")
                stamp = _timestamp(stamp_token)
            # float() would also take surrounding whitespace, "1_0" and non-ASCII digits.
            if "_" in token or not (token.isascii() and token.isprintable()):
                raise ValueError(line)
            value = float(token)
        except ValueError:
            scanned = _scan_sample(line, lineno, label_cache)
            if scanned is None:
                continue
            name, labels, value, stamp = scanned
        append(new(sample_cls, (name, labels, value, stamp, lineno)))
    return out


def _timestamp(token: str) -> int:
    if not _TIMESTAMP_RE.fullmatch(token):
        raise ValueError(token)
    stamp = int(token)
    if not _INT64_MIN <= stamp <= _INT64_MAX:
        raise ValueError(token)
    return stamp


def _labels_quick(raw: str) -> dict[str, str]:
    """Parse ``a="x",b="y"`` with no escapes and no blanks; ValueError means 'ask the scanner'.

    Without backslashes every double quote is a delimiter, so splitting on it alternates
    separators (``a=``, ``,b=``, then ``""`` or a trailing ``","``) and values.
    """
    if "\\" in raw:
        raise ValueError(raw)
    parts = raw.split('"')
    count = len(parts)
    if count == 1:
        if raw:
            raise ValueError(raw)
        return {}
    if not count & 1 or parts[-1] not in ("", ","):
        raise ValueError(raw)
    labels: dict[str, str] = {}
    for i in range(0, count - 1, 2):
        key = parts[i]
        if i:
            if key[:1] != ",":
                raise ValueError(raw)
            key = key[1:]
        if key[-1:] != "=":
            raise ValueError(raw)
        key = key[:-1]
        # For ASCII text isidentifier() is exactly [A-Za-z_][A-Za-z0-9_]*.
        if not (key.isascii() and key.isidentifier()):
            raise ValueError(raw)
        labels[key] = parts[i + 1]
    if len(labels) * 2 != count - 1:
        raise ValueError(raw)  # duplicate label name: the scanner names it
    return labels


def _check_comment(line: str, lineno: int) -> None:
    """Validate ``# HELP`` and ``# TYPE``; any other ``#`` line is a free comment."""
    fields = line[1:].split(None, 3)
    if len(fields) < 1 or fields[0] not in ("HELP", "TYPE") or line[1:2] not in _BLANKS:
        return
    keyword = fields[0]
    if len(fields) < 2:
        raise _fail(lineno, f"{keyword} without a metric name", line)
    if not _METRIC_NAME_RE.fullmatch(fields[1]):
        raise _fail(lineno, f"invalid metric name '{fields[1]}' in {keyword}", line)
    if keyword == "TYPE":
        if len(fields) < 3:
            raise _fail(lineno, "TYPE without a metric type", line)
        if len(fields) > 3 or fields[2] not in METRIC_TYPES:
            kind = " ".join(fields[2:])
            raise _fail(lineno, f"unknown TYPE '{kind}'", line)


# --- the careful path ------------------------------------------------------------------------


def _skip_blanks(line: str, pos: int) -> int:
    end = len(line)
    while pos < end and line[pos] in _BLANKS:
        pos += 1
    return pos


def _scan_sample(
    line: str, lineno: int, label_cache: dict[str, dict[str, str]]
) -> tuple[str, dict[str, str], float, int | None] | None:
    """Character scanner for any line the fast path declined; raises the precise error.

    Returns None for lines that carry no sample (only blanks, or an indented comment).
    """
    pos = _skip_blanks(line, 0)
    if pos == len(line):
        return None
    if line[pos] == "#":
        _check_comment(line[pos:], lineno)
        return None
    match = _METRIC_NAME_RE.match(line, pos)
    if match is None or (match.end() < len(line) and line[match.end()] not in " \t{"):
        raise _fail(lineno, "invalid metric name", line)
    name = match.group()
    pos = match.end()
    brace = _skip_blanks(line, pos)
    labels: dict[str, str] = {}
    if brace < len(line) and line[brace] == "{":
        labels, pos = _scan_labels(line, brace + 1, lineno)
        # Share the dict with fast-path lines that carry the same raw label string.
        labels = label_cache.setdefault(line[brace + 1 : pos - 1], labels)
    else:
        labels = label_cache.setdefault("", labels)
    value, stamp = _scan_value_and_timestamp(line, pos, lineno)
    return name, labels, value, stamp


def _scan_labels(line: str, pos: int, lineno: int) -> tuple[dict[str, str], int]:
    """Scan from just after ``{``; return the labels and the index just past ``}``."""
    labels: dict[str, str] = {}
    end = len(line)
    while True:
        pos = _skip_blanks(line, pos)
        if pos < end and line[pos] == "}":
            return labels, pos + 1
        match = _LABEL_NAME_RE.match(line, pos)
        if match is None:
            problem = "unterminated label set" if pos >= end else "invalid label name"
            raise _fail(lineno, problem, line)
        key = match.group()
        pos = _skip_blanks(line, match.end())
        if pos >= end or line[pos] != "=":
            raise _fail(lineno, f"expected '=' after label name '{key}'", line)
        pos = _skip_blanks(line, pos + 1)
        if pos >= end or line[pos] != '"':
            raise _fail(lineno, f"expected '\"' to open the value of label '{key}'", line)
        value, pos = _scan_label_value(line, pos + 1, lineno)
        if key in labels:
            raise _fail(lineno, f"duplicate label name '{key}'", line)
        labels[key] = value
        pos = _skip_blanks(line, pos)
        if pos < end and line[pos] == ",":
            pos += 1
        elif pos >= end:
            raise _fail(lineno, "unterminated label set", line)
        elif line[pos] != "}":
            raise _fail(lineno, "expected ',' or '}' after a label value", line)


def _scan_label_value(line: str, pos: int, lineno: int) -> tuple[str, int]:
    """Scan from just after the opening quote; return the decoded value and the index past it."""
    chunks: list[str] = []
    end = len(line)
    start = pos
    while pos < end:
        char = line[pos]
        if char == '"':
            chunks.append(line[start:pos])
            return "".join(chunks), pos + 1
        if char == "\\":
            escaped = line[pos + 1 : pos + 2]
            if escaped not in _ESCAPES:
                if not escaped:
                    break
                raise _fail(lineno, f"invalid escape '\\{escaped}' in label value", line)
            chunks.append(line[start:pos])
            chunks.append(_ESCAPES[escaped])
            pos += 2
            start = pos
            continue
        pos += 1
    raise _fail(lineno, "unterminated label value", line)


def _scan_value_and_timestamp(line: str, pos: int, lineno: int) -> tuple[float, int | None]:
    """Scan from just past the name or label set: blank, value, optional timestamp, blanks."""
    rest = line[pos:].replace("\t", " ")
    if not rest.strip(" "):
        raise _fail(lineno, "missing value", line)
    if rest[0] != " ":
        raise _fail(lineno, "expected a blank before the value", line)
    # Only space and tab separate tokens; any other control character stays in its token.
    words = [word for word in rest.split(" ") if word]
    if not _VALUE_RE.fullmatch(words[0]):
        raise _fail(lineno, f"invalid value '{words[0][:20]}'", line)
    value = float(words[0])
    if len(words) == 1:
        return value, None
    try:
        stamp = _timestamp(words[1])
    except ValueError:
        raise _fail(lineno, f"invalid timestamp '{words[1][:20]}'", line) from None
    if len(words) > 2:
        raise _fail(lineno, "unexpected text after the timestamp", line)
    return value, stamp
