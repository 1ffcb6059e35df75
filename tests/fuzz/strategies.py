"""Input generators for the parser fuzzers: mutated real captures plus small grammars.

Random bytes alone almost never get past a parser's first check, so most inputs start from a real
capture in shared/data (README.md there) and are damaged in ways that reach the deep code paths:

- byte level (`mutate_bytes`): flip or delete bytes, cut the body short, duplicate, delete or swap
  lines, swap a number or word for an extreme one (NaN, Inf, 1e999, 2**64, 5,000 digits, superscript
  digits...), splice in delimiters and escapes, repeat a chunk hundreds of times (huge label sets,
  long lines), open thousands of brackets (deep nesting);
- tree level (`mutate_tree`, for JSON documents): walk to a random node and replace it with a value
  of the wrong type, delete or add keys, duplicate list items, nest deeply. Only the containers on
  the path are copied, so a large document costs O(depth) per mutation.

Generators take a `Chooser`, not a Hypothesis `draw`: under pytest every choice is a Hypothesis draw
(`HypothesisChooser`, so failures shrink to a small input and CI runs are derandomized), while
bench/fuzz.py drives the very same generators from a seeded `random.Random` (`RandomChooser`), which
is two orders of magnitude faster per example and is what makes 100,000 examples per parser cheap.
"""

from __future__ import annotations

import json
import random
import re
import struct
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from hypothesis import strategies as st

T = TypeVar("T")

# --- dictionaries of troublemakers ---------------------------------------------------------------

NUMBERS = [
    "0", "-0", "1", "-1", "0.5", "NaN", "nan", "-nan", "+Inf", "-Inf", "inf", "Infinity", "-infinity",
    "1e308", "1e309", "-1e309", "1e-400", "1.7976931348623157e308", "4.9e-324", "1e999999",
    "2147483647", "2147483648", "-2147483649", "4294967296", "32768", "65536",
    "9223372036854775807", "9223372036854775808", "-9223372036854775809", "18446744073709551615",
    "18446744073709551616", "9223372036854775794", "99999999999999999999999999999",
    "1" * 400, "9" * 4301, "0x1F", "0X", "1_000", "0123", "00", ".5", "5.", "1e", "e5", "--1", "+", "-",
    "\u00b2", "\u0663", "\uff11\uff12", "1\u00a0", "1.2.3", "1,5", "1e+", "0b101", "1j",
]
TEXT = [
    "", " ", "  ", "\t", "\n", "\r", "\r\n", "\x00", "\x01", "\x0b", "\x0c", "\x7f", "\\", "\\\\", "\\n", "\\x",
    "\\u0000", '"', "'", "{", "}", "[", "]", "(", ")", "<", ">", "&", "&amp;", "&#0;", "&bogus;", "]]>", "<!--",
    "<?xml", "=", "==", ":", "::", ",", ",,", ";", "|", "||", "/", "..", "-", "#", "# TYPE x gauge", "# HELP",
    "N/A", "[N/A]", "(null)", "None", "null", "true", "false", "Unknown", "UNLIMITED", "é", "\u2028", "\u0085",
    "\ufeff", "\U0001f4a5", "\u202e", "x" * 300, "a" * 5000, "GPU-", "gpu:", "gpu[1-3]", "gpu[", "a-b",
    "gpu[0-99999999999]", "n[1-3]x[1-3]", "gpu:²", "gpu:h100:2(IDX:0-²)", "0:",
]
# Python values for JSON trees; big ints and non-finite floats are legal in Python's json module.
VALUES: list[Any] = [
    None, True, False, 0, -1, 1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30, 10**400, 1.5, -0.0,
    1e308, float("nan"), float("inf"), float("-inf"), "", " ", "x", "0", "1", "NaN", "inf", "x" * 300,
    "\x00", "é", "\U0001f4a5", "\ud800", "2026-11-30T12:00:00Z", "2026-11-30T12:00:00", "9999-12-31T23:59:59+14:00",
    "0001-01-01T00:00:00-12:00", "0001-01-01T00:00:00+14:00", "RUNNING", "N/A", "gpu[1-99999999]", "9" * 4400,
    [], [None], [1, 2], [[]], {}, {"": None}, {"set": True}, {"set": True, "number": 10**30},
    {"set": True, "infinite": False, "number": 1e308}, {"set": True, "number": float("nan")},
    {"set": True, "number": float("inf")}, {"@odata.id": "/redfish/v1"}, {"@odata.id": 5},
    {"@odata.id": "file:///etc/hostname"}, {"@odata.id": "http://[::1"}, {"@odata.id": "/redfish/v1/../../x"},
]
NEW_KEYS = ["", "x", "kind", "time", "fields", "extra", "Members", "@odata.id", "name", "nodes", "gpus"]


# --- choosers -------------------------------------------------------------------------------------


class Chooser:
    """Where a generator gets its choices from; see the module docstring."""

    def below(self, n: int) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def pick(self, items: Sequence[T]) -> T:
        return items[self.below(len(items))]

    def chance(self, one_in: int) -> bool:
        return self.below(one_in) == 0

    def integer(self) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def real(self) -> float:  # pragma: no cover - interface
        raise NotImplementedError

    def text(self, max_size: int = 8) -> str:  # pragma: no cover - interface
        raise NotImplementedError

    def binary(self, max_size: int = 64) -> bytes:  # pragma: no cover - interface
        raise NotImplementedError


_INDEX = st.integers(0, 2**32)  # one shared strategy: a fresh st.integers(0, n) per draw costs more
_INTEGER = st.integers()
_REAL = st.floats()
_TEXTS = {n: st.text(max_size=n) for n in (4, 8, 12, 20)}
_BINARY = {n: st.binary(max_size=n) for n in (64, 200)}


class HypothesisChooser(Chooser):
    """Every choice is a Hypothesis draw; modulo keeps shrinking toward the first option."""

    def __init__(self, draw: Callable) -> None:
        self.draw = draw

    def below(self, n: int) -> int:
        return self.draw(_INDEX) % n

    def integer(self) -> int:
        return self.draw(_INTEGER)

    def real(self) -> float:
        return self.draw(_REAL)

    def text(self, max_size: int = 8) -> str:
        return self.draw(_TEXTS[max_size])

    def binary(self, max_size: int = 64) -> bytes:
        return self.draw(_BINARY[max_size])


class RandomChooser(Chooser):
    """Choices from a seeded `random.Random`: the long fuzz mode (bench/fuzz.py)."""

    def __init__(self, seed: int) -> None:
        self.rnd = random.Random(seed)

    def below(self, n: int) -> int:
        return self.rnd.randrange(n)

    def integer(self) -> int:
        bits = self.rnd.choice((8, 16, 32, 64, 65, 128))
        return self.rnd.getrandbits(bits) - (1 << (bits - 1))

    def real(self) -> float:
        return struct.unpack("<d", self.rnd.getrandbits(64).to_bytes(8, "little"))[0]

    def text(self, max_size: int = 8) -> str:
        pool = ("\x00\t\n\r \"'\\{}[]()<>:=,|#-+.0123456789aZ_é\u2028\ufeff\U0001f4a5", None)
        out = []
        for _ in range(self.rnd.randrange(max_size + 1)):
            alphabet = self.rnd.choice(pool)
            # Surrogates are left out: str.encode would refuse them before any parser sees them.
            out.append(self.rnd.choice(alphabet) if alphabet else chr(self.rnd.choice(
                (self.rnd.randrange(0x80), self.rnd.randrange(0x800), self.rnd.randrange(0xE000, 0x110000)))))
        return "".join(out)

    def binary(self, max_size: int = 64) -> bytes:
        return self.rnd.randbytes(self.rnd.randrange(max_size + 1))


def cases(generate: Callable[[Chooser], T]) -> st.SearchStrategy[T]:
    """A Hypothesis strategy from a generator function."""
    return st.composite(lambda draw: generate(HypothesisChooser(draw)))()


# --- byte mutations -------------------------------------------------------------------------------

_NUMBER_RE = re.compile(rb"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_WORD_RE = re.compile(rb"[A-Za-z0-9_.+-]+")


def _enc(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def token(ch: Chooser) -> str:
    kind = ch.below(3)
    return ch.pick(NUMBERS) if kind == 0 else ch.pick(TEXT) if kind == 1 else ch.text()


def _flip(ch: Chooser, data: bytearray) -> bytearray:
    if data:
        data[ch.below(len(data))] = ch.below(256)
    return data


def _delete(ch: Chooser, data: bytearray) -> bytearray:
    i = ch.below(len(data) + 1)
    del data[i : i + 1 + ch.below(64)]
    return data


def _truncate(ch: Chooser, data: bytearray) -> bytearray:
    return data[: ch.below(len(data) + 1)]


def _insert(ch: Chooser, data: bytearray) -> bytearray:
    i = ch.below(len(data) + 1)
    data[i:i] = _enc(token(ch))
    return data


def _lines(ch: Chooser, data: bytearray) -> bytearray:
    lines = bytes(data).split(b"\n")
    i, op, j = ch.below(len(lines)), ch.below(4), ch.below(len(lines))
    if op == 0:
        lines[i:i] = [lines[i]] * (1 + ch.below(3))
    elif op == 1:
        del lines[i]
    elif op == 2:
        lines[i], lines[j] = lines[j], lines[i]
    else:
        lines.insert(j, lines.pop(i))
    return bytearray(b"\n".join(lines))


def _replace_match(ch: Chooser, data: bytearray, pattern: re.Pattern, choose: Callable[[Chooser], str]) -> bytearray:
    matches = [m for _, m in zip(range(64), pattern.finditer(data, ch.below(len(data) + 1)), strict=False)]
    if matches:
        m = ch.pick(matches)
        data[m.start() : m.end()] = _enc(choose(ch))
    return data


def _number(ch: Chooser, data: bytearray) -> bytearray:
    return _replace_match(ch, data, _NUMBER_RE, lambda c: c.pick(NUMBERS))


def _word(ch: Chooser, data: bytearray) -> bytearray:
    return _replace_match(ch, data, _WORD_RE, token)


def _repeat(ch: Chooser, data: bytearray) -> bytearray:
    # Huge label sets, long lines, thousands of sections: one chunk repeated, kept under ~128 KiB.
    i = ch.below(len(data) + 1)
    chunk = bytes(data[i : i + 1 + ch.below(200)])
    data[i:i] = chunk * min(ch.pick((2, 10, 100, 1000)), 131_072 // max(1, len(chunk)))
    return data


_OPENERS = (b"[", b"{", b'{"a":', b"(", b"<a>", b"- ", b"\n  ", b"a:\n ", b"[1,")


def _nest(ch: Chooser, data: bytearray) -> bytearray:
    i = ch.below(len(data) + 1)
    data[i:i] = ch.pick(_OPENERS) * ch.pick((50, 1000, 5000, 20000))
    return data


BYTE_OPS = (_flip, _delete, _truncate, _insert, _lines, _number, _number, _word, _word, _repeat, _nest)


def mutate_bytes(ch: Chooser, data: bytes, max_ops: int = 4) -> bytes:
    """`data` damaged by 0 to `max_ops` byte-level mutations (none: the seed itself must parse)."""
    buf = bytearray(data)
    for _ in range(ch.below(max_ops + 1)):
        buf = ch.pick(BYTE_OPS)(ch, buf)
    return bytes(buf)


def mutated_seed(ch: Chooser, seeds: Sequence[bytes], max_ops: int = 4) -> bytes:
    return mutate_bytes(ch, ch.pick(seeds), max_ops)


def as_text(data: bytes) -> str:
    """For parsers that take text: bytes decoded the way a caller would (undecodable bytes replaced)."""
    return data.decode("utf-8", "replace")


# --- tree mutations (parsed JSON) -----------------------------------------------------------------


def _nested(depth: int, kind: str) -> Any:
    node: Any = 1
    for _ in range(depth):
        node = [node] if kind == "list" else {"a": node}
    return node


def value(ch: Chooser) -> Any:
    """A JSON-able value of any type, biased toward the troublemakers."""
    kind = ch.below(6)
    if kind <= 1:
        return ch.pick(VALUES)
    if kind == 2:
        return ch.integer()
    if kind == 3:
        return ch.real()
    if kind == 4:
        return ch.text(20)
    return _nested(ch.pick((10, 100, 600)), ch.pick(("list", "dict")))


def _children(node: Any) -> list:
    if isinstance(node, dict):
        return list(node)
    if isinstance(node, list):
        return list(range(len(node)))
    return []


def _edit(ch: Chooser, node: Any, depth: int = 0) -> Any:
    """A shallow copy of `node` with one edit somewhere below it (copy-on-write along the path)."""
    keys = _children(node)
    if keys and ch.below(10) < 8 and depth < 40:
        key = ch.pick(keys)
        copy = dict(node) if isinstance(node, dict) else list(node)
        copy[key] = _edit(ch, node[key], depth + 1)
        return copy
    op = ch.below(6)
    if op <= 1 or not keys:
        return value(ch)
    copy = dict(node) if isinstance(node, dict) else list(node)
    if op == 2:
        del copy[ch.pick(keys)]
        return copy
    if op == 3:
        if isinstance(copy, dict):
            copy[ch.pick(NEW_KEYS)] = value(ch)
        else:
            copy.append(value(ch))
        return copy
    if op == 4:
        return copy + copy * ch.pick((1, 50)) if isinstance(copy, list) else copy
    return [node] if ch.chance(2) else {"x": node}


def mutate_tree(ch: Chooser, doc: Any, max_ops: int = 3) -> Any:
    """`doc` with 0 to `max_ops` structural edits; the original is never modified."""
    for _ in range(ch.below(max_ops + 1)):
        doc = _edit(ch, doc)
    return doc


def dumps(doc: Any) -> bytes:
    """JSON text as a sloppy client would write it: NaN/Infinity tokens and huge ints pass through."""
    return json.dumps(doc, allow_nan=True, ensure_ascii=False).encode("utf-8", "surrogatepass")


def json_body(ch: Chooser, seeds: Sequence[Any]) -> bytes:
    """A structurally wrong document, sometimes with byte damage on top, rarely plain junk."""
    kind = ch.below(8)
    if kind == 0:
        return ch.binary()
    body = dumps(mutate_tree(ch, ch.pick(seeds)))
    return mutate_bytes(ch, body, 2) if kind <= 2 else body


# --- grammar: Prometheus text exposition ----------------------------------------------------------

DCGM_NAMES = [
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_POWER_MGMT_LIMIT",
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_UNKNOWN", "up", "x:y",
]
LABEL_NAMES = ["UUID", "gpu", "Hostname", "modelName", "pci_bus_id", "GPU_I_ID", "GPU_I_PROFILE", "GPU_I_CI_ID",
               "DCGM_FI_DRIVER_VERSION", "device", "_", "a1"]
LABEL_VALUES = ["GPU-1", "GPU-2", "0", "1", "7", "node-a", "", "1g.5gb", "\u0663", "-1", "99999999999999999999",
                "9" * 5000, "x" * 300]
_NAME_CHARS = "abcxyzABC_:019"
_VALUE_CHARS = 'ab\\"n\n{},= é'
_BLANKS = (" ", " ", "\t", "  ", "")


def _chars(ch: Chooser, alphabet: str, max_size: int) -> str:
    return "".join(ch.pick(alphabet) for _ in range(ch.below(max_size + 1)))


def _metric_name(ch: Chooser) -> str:
    kind = ch.below(3)
    return ch.pick(DCGM_NAMES) if kind == 0 else _chars(ch, _NAME_CHARS, 12) or "x" if kind == 1 else ch.text(4)


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(ch: Chooser) -> str:
    if ch.chance(3):
        return ""
    escape = not ch.chance(4)
    pairs = []
    for _ in range(ch.below(7)):
        name = ch.pick(LABEL_NAMES) if ch.below(4) else _chars(ch, _NAME_CHARS + " =", 4)
        text = ch.pick(LABEL_VALUES) if ch.chance(2) else _chars(ch, _VALUE_CHARS, 12)
        pairs.append(f'{name}{ch.pick(_BLANKS)}={ch.pick(_BLANKS)}"{_escape(text) if escape else text}"')
    return "{" + ",".join(pairs) + ch.pick(("}", "}", "", ",}", " }"))


def exposition_line(ch: Chooser) -> str:
    kind = ch.below(10)
    if kind == 0:
        word = ch.pick(("HELP", "TYPE", "EOF", "", "TYPE  ", "HELP\t"))
        kinds = ("gauge", "counter", "untyped", "histogram", "bogus", "", "gauge x")
        return f"#{ch.pick(_BLANKS)}{word} {_metric_name(ch)} {ch.pick(kinds)}"
    if kind == 1:
        return ch.pick(("", " ", "\t", "#", "# just a comment", "\r"))
    number = ch.below(3)
    val = ch.pick(NUMBERS) if number == 0 else repr(ch.real()) if number == 1 else str(ch.integer())
    stamp = ("", f" {ch.integer()}", f" {ch.pick(NUMBERS)}")[ch.below(3)]
    return f"{_metric_name(ch)}{_labels(ch)}{ch.pick(_BLANKS)} {val}{stamp}{ch.pick(('', '', ' ', chr(13)))}"


def exposition_text(ch: Chooser) -> str:
    return "\n".join(exposition_line(ch) for _ in range(1 + ch.below(30)))


# --- Redfish trees --------------------------------------------------------------------------------


def redfish_tree(ch: Chooser, trees: Sequence[dict[str, bytes]]) -> dict[str, bytes]:
    """A BMC's URL -> body map with a few bodies damaged (as trees or as bytes) or removed."""
    tree = dict(ch.pick(trees))
    urls = sorted(tree)
    for _ in range(ch.below(5)):
        url, how = ch.pick(urls), ch.below(4)
        if how == 0:
            tree.pop(url, None)
        elif how == 1:
            tree[url] = mutate_bytes(ch, tree.get(url, b"{}"), 2)
        else:
            try:
                doc = json.loads(tree.get(url, b"{}"))
            except (ValueError, RecursionError):  # an earlier edit of this body damaged it beyond JSON
                continue
            tree[url] = dumps(mutate_tree(ch, doc, 2))
    return tree
