"""Validation of ingest batches: JSON, NDJSON and parsed Prometheus exposition.

Every source ends up as a `Batch`: records per entity kind with resolved timestamps and
validated field values. Two kinds of problem are told apart:

- a *malformed* batch (bad syntax, wrong types, unknown field names, a record without an
  identity) raises `BatchError`; the API answers 400 and nothing of the batch is written;
- a *rejected sample* (NaN/Inf, a timestamp more than the allowed skew in the future, or older
  than raw retention) is dropped and counted; the rest of the batch is written.

A "sample" is one field value of one entity at one time.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import numpy as np
import orjson

from core.api import ApiError, ErrorCode
from telemetry.fields import KINDS

# The largest finite float4: a "real" field beyond it would overflow when COPYed (psycopg raises).
FLOAT32_MAX = 3.4028234663852886e38
NON_FINITE_STRINGS = {"nan", "+nan", "-nan", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"}
MAX_REJECTION_DETAILS = 20

# Identity keys per kind: required (name -> type) and optional.
IDENTITY = {
    "gpu": ({"host": str, "uuid": str}, {"index": int, "model": str, "pci_bus_id": str, "serial": str, "driver": str}),
    "mig": ({"host": str, "gpu_uuid": str, "gi_id": int}, {"ci_id": int, "profile": str, "gpu_index": int}),
    "port": ({"port": str}, {"host": str, "switch": str, "guid": str, "link_layer": str}),
    # `host` on a power record: the node whose BMC reported it; an unknown device named with a host
    # is registered (kind `device_kind`, default psu) and linked to that node.
    "power": ({"device": str}, {"host": str, "device_kind": str}),
}
COLLECTION_KEYS = {"gpus": "gpu", "migs": "mig", "ports": "port", "power": "power"}
# Longest text per identity key: the inventory columns they are stored in (telemetry/models/inventory.py)
# or looked up against. A longer value would fail in PostgreSQL, after validation, as a 5xx.
IDENTITY_LENGTHS = {
    "host": 253, "uuid": 64, "gpu_uuid": 64, "model": 128, "pci_bus_id": 32, "serial": 64, "driver": 32,
    "profile": 32, "port": 64, "switch": 128, "guid": 32, "link_layer": 16, "device": 128, "device_kind": 16,
}
# Integer identity keys are PositiveSmallIntegerFields.
IDENTITY_INT_RANGE = (0, 32767)
RECORD_COMMON = {"time", "fields", "extra", "kind"}


class BatchError(ApiError, ValueError):
    """A malformed batch (the API's 400): `where` names the line or JSON path, `message` the problem."""

    def __init__(self, where: str, message: str, *, code: ErrorCode | str = ErrorCode.MALFORMED):
        super().__init__(400, code, message, where=where)

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" if self.where else self.message


@dataclass(slots=True)
class Record:
    """One entity's validated sample set at one time (row-shaped input)."""

    kind: str
    ident: dict
    time: datetime
    values: dict[str, float | int]
    extra: dict[str, float]


@dataclass
class Frame:
    """Validated samples of one kind in columns: what the writer COPYs.

    Every column has `n` entries. A value column is a list (None: not reported) or, from a binary
    body, a numpy masked array (masked: not reported); `present` and `take` read both.
    """

    kind: str
    n: int
    ident: dict[str, list]
    times: list[datetime]
    values: dict[str, list]
    extra: dict[str, list] = field(default_factory=dict)

    @property
    def sample_count(self) -> int:
        return sum(map(present, (*self.values.values(), *self.extra.values())))

    def take(self, keep: list[int]) -> Frame:
        """The rows at `keep`, in order."""
        at = np.asarray(keep, dtype=np.intp)
        pick = lambda col: col[at] if isinstance(col, np.ndarray) else [col[i] for i in keep]  # noqa: E731
        return Frame(
            self.kind, len(keep), {k: pick(v) for k, v in self.ident.items()}, pick(self.times),
            {k: pick(v) for k, v in self.values.items()}, {k: pick(v) for k, v in self.extra.items()},
        )


def present(col) -> int:
    """Values reported in one column of a Frame (a list with None, or a masked array)."""
    return int(col.count()) if isinstance(col, np.ma.MaskedArray) else len(col) - col.count(None)


def frame_from_records(kind: str, records: list[Record]) -> Frame:
    """Row-shaped records to one column frame."""
    idents = [r.ident for r in records]
    ident_keys = set().union(*(i.keys() for i in idents))
    value_keys = set().union(*(r.values.keys() for r in records))
    extra_keys = set().union(*(r.extra.keys() for r in records))
    return Frame(
        kind, len(records),
        {k: [i.get(k) for i in idents] for k in ident_keys},
        [r.time for r in records],
        {k: [r.values.get(k) for r in records] for k in value_keys},
        {k: [r.extra.get(k) for r in records] for k in extra_keys},
    )


@dataclass
class Batch:
    """A validated batch ready for the writer: row records and/or column frames per kind."""

    records: dict[str, list[Record]] = field(default_factory=lambda: {k: [] for k in KINDS})
    columnar: dict[str, list[Frame]] = field(default_factory=lambda: {k: [] for k in KINDS})
    rejected: int = 0
    rejections: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)  # validated fault events (ingest/events.py)
    agent: dict | None = None  # the pushing agent's self-report

    def reject(self, where: str, reason: str, samples: int = 1) -> None:
        self.rejected += samples
        if len(self.rejections) < MAX_REJECTION_DETAILS:
            self.rejections.append({"where": where, "reason": reason, "samples": samples})

    def frames(self) -> dict[str, list[Frame]]:
        out = {}
        for kind in KINDS:
            frames = list(self.columnar[kind])
            if self.records[kind]:
                frames.append(frame_from_records(kind, self.records[kind]))
            if frames:
                out[kind] = frames
        return out


class TimeParser:
    """Parses record times with a cache (a batch usually shares one timestamp) and checks bounds."""

    def __init__(self, now: datetime, max_future: timedelta, max_age: timedelta):
        self.latest_ok = now + max_future
        self.oldest_ok = now - max_age
        self.now = now
        self._cache: dict = {}

    def parse(self, raw, where: str) -> datetime:
        # Only str/int/float are cached: a list is unhashable, and True == 1 must not hit 1's entry.
        cacheable = type(raw) in (str, int, float)
        cached = self._cache.get(raw) if cacheable else None
        if cached is not None:
            return cached
        value = self._parse(raw, where)
        if cacheable:
            self._cache[raw] = value
        return value

    def _parse(self, raw, where: str) -> datetime:
        if isinstance(raw, bool) or raw is None:
            raise BatchError(where, f"time must be an RFC 3339 string or epoch seconds, got {raw!r}")
        if isinstance(raw, (int, float)):
            if isinstance(raw, float) and not math.isfinite(raw):
                raise BatchError(where, f"time {raw!r} is not a finite number")
            try:
                return datetime.fromtimestamp(raw, UTC)
            except (OverflowError, OSError, ValueError) as exc:
                raise BatchError(where, f"time {short_repr(raw)} is out of range") from exc
        if isinstance(raw, str):
            try:
                parsed = datetime.fromisoformat(raw)
            except ValueError as exc:
                raise BatchError(where, f"time {short_repr(raw)} is not RFC 3339") from exc
            if parsed.tzinfo is None:
                raise BatchError(where, f"time {short_repr(raw)} has no timezone; send UTC ('Z')")
            try:
                return parsed.astimezone(UTC)
            except OverflowError as exc:  # 0001-01-01T00:00:00+01:00 is before year 1 in UTC
                raise BatchError(where, f"time {short_repr(raw)} is out of range") from exc
        raise BatchError(where, f"time must be an RFC 3339 string or epoch seconds, got {type(raw).__name__}")

    def problem(self, t: datetime) -> str | None:
        if t > self.latest_ok:
            return (
                f"time {t.isoformat()} is more than "
                f"{int((self.latest_ok - self.now).total_seconds())} s in the future"
            )
        if t < self.oldest_ok:
            return f"time {t.isoformat()} is older than raw retention"
        return None


def short_repr(value, limit: int = 80) -> str:
    """repr() for an error message, cut short: a 5,000-character value must not become the message."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**60:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def path_key(key) -> str:
    """A JSON key as a path segment, cut short (a 5,000-character key must not become the path)."""
    text = str(key)
    return text if len(text) <= 80 else text[:77] + "..."


def storable_text_problem(value: str, limit: int) -> str | None:
    """Why PostgreSQL would refuse `value` in a varchar(limit) column, or None."""
    if len(value) > limit:
        return f"longer than {limit} characters: {short_repr(value)}"
    if "\x00" in value:
        return f"contains a NUL character: {short_repr(value)}"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"is not valid Unicode (a lone surrogate): {short_repr(value)}"
    return None


def identity_problem(key: str, value: str | int) -> str | None:
    """Why the inventory tables cannot store this identity value (too long, NUL, out of range), or None."""
    if isinstance(value, str):
        return storable_text_problem(value, IDENTITY_LENGTHS.get(key, 253))
    if not IDENTITY_INT_RANGE[0] <= value <= IDENTITY_INT_RANGE[1]:
        return f"must be from {IDENTITY_INT_RANGE[0]} to {IDENTITY_INT_RANGE[1]}, got {short_repr(value)}"
    return None


def column_identity_clean(key: str, values: list) -> bool:
    """True when `identity_problem` has nothing to say about any value of a column (None skipped), by a
    few C-level passes over the whole column; False means "look value by value" (to name the first bad
    one), not that one is bad. A 1,024-GPU frame has four identity columns: one check per value costs
    ~10 ms of the ingest worker's CPU a frame, this ~0.3 ms."""
    present = [v for v in values if v is not None] if None in values else values
    if not present:
        return True
    try:  # a mixed column raises TypeError in join() or min(): look value by value
        if type(present[0]) is str:
            joined = "".join(present)
            return (max(map(len, present)) <= IDENTITY_LENGTHS.get(key, 253) and "\x00" not in joined
                    and joined.isascii())
        return IDENTITY_INT_RANGE[0] <= min(present) and max(present) <= IDENTITY_INT_RANGE[1]
    except TypeError:
        return False


def _check_identity_value(key: str, value: str | int, where: str) -> None:
    problem = identity_problem(key, value)
    if problem:
        raise BatchError(f"{where}.{key}", problem)


def _check_identity(kind: str, rec: dict, where: str) -> dict:
    required, optional = IDENTITY[kind]
    ident = {}
    for key, typ in required.items():
        value = rec.get(key)
        if not isinstance(value, typ) or isinstance(value, bool) or (typ is str and not value.strip()):
            raise BatchError(f"{where}.{key}", f"required {typ.__name__}, got {short_repr(value)}")
        ident[key] = value.strip() if typ is str else value
        _check_identity_value(key, ident[key], where)
    for key, typ in optional.items():
        value = rec.get(key)
        if value is None:
            continue
        if not isinstance(value, typ) or isinstance(value, bool):
            raise BatchError(f"{where}.{key}", f"must be {typ.__name__}, got {short_repr(value)}")
        _check_identity_value(key, value, where)
        ident[key] = value
    unknown = set(rec) - set(required) - set(optional) - RECORD_COMMON
    if unknown:
        raise BatchError(f"{where}.{path_key(sorted(unknown)[0])}", f"unknown key for a {kind} record")
    if kind == "port" and ("host" in ident) == ("switch" in ident):
        raise BatchError(where, "a port record names exactly one of 'host' or 'switch'")
    return ident


_NUMBER_TYPES = frozenset({int, float})
_INT_FIELDS = {k: frozenset(f.name for f in kind.fields if f.is_int) for k, kind in KINDS.items()}


def value_problem(value: int | float, sql_type: str) -> str | None:
    """Why a finite number cannot be stored in a column of `sql_type` (None: it can)."""
    if sql_type == "bigint":
        return None  # rounded and range-checked by the caller, which names the 64-bit limit
    try:
        magnitude = abs(float(value))
    except OverflowError:
        return f"{short_repr(value)} is out of range for a 64-bit float"
    if sql_type == "real" and magnitude > FLOAT32_MAX:
        return f"{short_repr(value)} is out of range for a 32-bit float field"
    return None


_KNOWN = {k: frozenset(kind.by_name) for k, kind in KINDS.items()}


def _fast_values(kind: str, raw: dict) -> dict | None:
    """The common case checked at C speed: known names, plain finite numbers. None means
    'look closer' (the slow path finds and names the problem)."""
    if not raw.keys() <= _KNOWN[kind]:
        return None
    vals = raw.values()
    if not set(map(type, vals)) <= _NUMBER_TYPES:
        return None
    try:
        if not math.isfinite(sum(vals)) or max(map(abs, vals), default=0) > FLOAT32_MAX:
            return None
    except OverflowError:
        return None
    out = dict(raw)
    for name in _INT_FIELDS[kind] & out.keys():
        value = out[name]
        if type(value) is float:
            out[name] = int(round(value))
        elif not -(2**63) <= value < 2**63:
            return None
    return out


def _values(kind: str, raw, where: str, batch: Batch, *, registry: bool) -> dict:
    """Validated numeric values; non-finite ones are rejected and counted, not stored."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise BatchError(where, f"must be an object of field: number, got {type(raw).__name__}")
    if registry:
        fast = _fast_values(kind, raw)
        if fast is not None:
            return fast
    known = KINDS[kind].by_name if registry else None
    out = {}
    for name, value in raw.items():
        if known is not None and name not in known:
            raise BatchError(f"{where}.{path_key(name)}", f"unknown {kind} field (put unmapped fields in 'extra')")
        if not registry and (not name or storable_text_problem(name, 128)):
            raise BatchError(f"{where}.{path_key(name)}", "extra field names are 1-128 characters of valid text")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise BatchError(f"{where}.{name}", f"must be a number, got {short_repr(value)}")
        if isinstance(value, str):
            if value.strip().lower() not in NON_FINITE_STRINGS:
                raise BatchError(f"{where}.{name}", f"must be a number, got {short_repr(value)}")
            batch.reject(f"{where}.{name}", f"non-finite value {short_repr(value)}")
            continue
        if isinstance(value, float) and not math.isfinite(value):
            batch.reject(f"{where}.{name}", f"non-finite value {value!r}")
            continue
        if known is not None and known[name].is_int:
            value = int(value) if isinstance(value, int) else int(round(value))
            if not -(2**63) <= value < 2**63:
                raise BatchError(f"{where}.{name}", f"{short_repr(value)} does not fit a 64-bit counter")
        # Like NaN: a reading the column cannot hold is dropped and counted, the rest is kept.
        problem = value_problem(value, known[name].sql_type if known is not None else "double precision")
        if problem:
            batch.reject(f"{where}.{name}", problem)
            continue
        out[name] = value
    return out


def add_record(batch: Batch, kind: str, rec, where: str, times: TimeParser, default_time) -> None:
    """Validate one record dict and append it to the batch (or count its samples as rejected)."""
    if not isinstance(rec, dict):
        raise BatchError(where, f"a {kind} record must be an object, got {type(rec).__name__}")
    ident = _check_identity(kind, rec, where)
    raw_time = rec.get("time", default_time)
    t = times.now if raw_time is None else times.parse(raw_time, f"{where}.time")
    values = _values(kind, rec.get("fields"), f"{where}.fields", batch, registry=True)
    extra = _values(kind, rec.get("extra"), f"{where}.extra", batch, registry=False)
    problem = times.problem(t)
    if problem:
        batch.reject(where, problem, len(values) + len(extra))
        return
    if values or extra:
        batch.records[kind].append(Record(kind, ident, t, values, extra))


def loads_json(body: bytes, where: str):
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    # orjson refuses NaN/Infinity tokens, which Python's json emits by default; the standard
    # parser accepts them, so such values reach the per-sample check instead of failing the batch.
    prefix = f"{where}, " if where else ""
    try:
        return json.loads(body)
    except UnicodeDecodeError as exc:
        line = body.count(b"\n", 0, exc.start) + 1
        column = exc.start - (body.rfind(b"\n", 0, exc.start) + 1) + 1
        raise BatchError(f"{prefix}line {line} column {column}",
                         f"body is not UTF-8 (byte 0x{body[exc.start]:02x} at offset {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise BatchError(f"{prefix}line {exc.lineno} column {exc.colno}", exc.msg) from exc
    except ValueError as exc:  # an integer of more than 4,300 digits (Python's int/str conversion limit)
        raise BatchError(where or "$", f"number too long: {exc}") from exc
    except RecursionError as exc:  # the C scanner's own depth guard, not a stack overflow: safe to catch
        raise BatchError(where or "$", "JSON nested deeper than 1,024 levels") from exc
