"""The columnar form of a JSON batch: one object of equal-length arrays per entity kind.

    "gpus": {"host": ["gpu-0001", …], "uuid": ["GPU-…", …], "index": [0, …],
             "time": "2026-11-30T12:00:00Z"  (or one time per row),
             "fields": {"gpu_util": [97, 12, …], "power_w": [655.1, null, …]},
             "extra": {"DCGM_FI_DEV_VGPU_LICENSE_STATUS": [0, 0, …]}}

It carries the same information as a list of records at a fraction of the bytes, and it is
validated a column at a time, so a fleet-wide push costs C-speed set and sum operations instead
of a Python loop over every value. Problems are named by path and row: `$.gpus.fields.gpu_util[17]`.
"""

from __future__ import annotations

import math

from telemetry.fields import KINDS
from telemetry.ingest.schema import (
    FLOAT32_MAX,
    IDENTITY,
    NON_FINITE_STRINGS,
    Batch,
    BatchError,
    Frame,
    TimeParser,
    column_identity_clean,
    identity_problem,
    storable_text_problem,
    value_problem,
)

_NUMERIC = frozenset({int, float, type(None)})
_INT64 = 2**63
_F32 = FLOAT32_MAX


def _length(cols: dict, where: str) -> int:
    lengths = {len(v) for v in cols.values() if isinstance(v, list)}
    if len(lengths) != 1:
        raise BatchError(where, f"every column must be an array of the same length, got lengths {sorted(lengths)}")
    return lengths.pop()


def ident_columns(kind: str, cols: dict, n: int, where: str) -> dict[str, list]:
    """The identity columns of a columnar collection, checked (types, empties, lengths, port owners)."""
    required, optional = IDENTITY[kind]
    out = {}
    for key, typ in {**required, **optional}.items():
        col = cols.get(key)
        if col is None:
            if key in required:
                raise BatchError(f"{where}.{key}", "required column is missing")
            continue
        if not isinstance(col, list) or len(col) != n:
            raise BatchError(f"{where}.{key}", f"must be an array of {n}")
        allowed = {typ} if key in required else {typ, type(None)}
        if not set(map(type, col)) <= allowed:
            bad = next(i for i, v in enumerate(col) if type(v) not in allowed)
            raise BatchError(f"{where}.{key}[{bad}]", f"must be {typ.__name__}, got {col[bad]!r}")
        if typ is str and key in required and not all(map(str.strip, col)):
            bad = next(i for i, v in enumerate(col) if not v.strip())
            raise BatchError(f"{where}.{key}[{bad}]", "must not be empty")
        for i, v in enumerate(() if column_identity_clean(key, col) else col):
            problem = None if v is None else identity_problem(key, v)
            if problem:
                raise BatchError(f"{where}.{key}[{i}]", problem)
        out[key] = col
    unknown = set(cols) - set(required) - set(optional) - {"time", "fields", "extra"}
    if unknown:
        raise BatchError(f"{where}.{sorted(unknown)[0]}", f"unknown column for {kind}")
    if kind == "port":
        _port_owners(out, where)
    return out


def _port_owners(cols: dict[str, list], where: str) -> None:
    """Each port row names its owner: a `host` or a `switch`, never both and never neither.

    A batch may carry one of the two columns, or both with one null on each row (a rack's HCA
    ports and its switches' ports in one frame).
    """
    hosts, switches = cols.get("host"), cols.get("switch")
    if hosts is None and switches is None:
        raise BatchError(where, "port columns name each port's owner: a 'host' or a 'switch' column")
    if hosts is not None and switches is not None:
        pairs = enumerate(zip(hosts, switches, strict=True))
        bad = next((i for i, (h, s) in pairs if (h is None) == (s is None)), None)
        if bad is not None:
            raise BatchError(f"{where}.host[{bad}]", "each port row names exactly one of 'host' or 'switch'")
        return
    key, col = ("host", hosts) if hosts is not None else ("switch", switches)
    if None in col:
        raise BatchError(f"{where}.{key}[{col.index(None)}]", f"must name the port's {key}, got null")


def _clean_strings(col: list, where: str, batch: Batch) -> list:
    """NaN/Inf spelled as strings are rejected per sample; any other string is an error."""
    out = list(col)
    for i, v in enumerate(col):
        if isinstance(v, str):
            if v.strip().lower() not in NON_FINITE_STRINGS:
                raise BatchError(f"{where}[{i}]", f"must be a number, got {v!r}")
            batch.reject(f"{where}[{i}]", f"non-finite value {v!r}")
            out[i] = None
    return out


def _numeric_column(col, sql_type: str, where: str, batch: Batch) -> list:
    if not isinstance(col, list):
        raise BatchError(where, f"must be an array, got {type(col).__name__}")
    types = set(map(type, col))
    if str in types:
        col, types = _clean_strings(col, where, batch), types - {str}
    if not types <= _NUMERIC:
        bad = next(i for i, v in enumerate(col) if type(v) not in _NUMERIC)
        raise BatchError(f"{where}[{bad}]", f"must be a number, got {col[bad]!r}"[:200])
    present = [v for v in col if v is not None] if type(None) in types else col
    try:
        # One C-level pass for the common case; the loop below only runs for a column with a problem.
        fine = math.isfinite(sum(present)) and (sql_type != "real" or max(map(abs, present), default=0) <= _F32)
    except OverflowError:
        fine = False
    if not fine:
        col = list(col)
        for i, v in enumerate(col):
            if v is None or sql_type == "bigint" and type(v) is int:
                continue  # integers are range-checked by _int_column, which names the 64-bit limit
            problem = f"non-finite value {v!r}" if type(v) is float and not math.isfinite(v) else value_problem(
                v, sql_type
            )
            if problem:
                batch.reject(f"{where}[{i}]", problem)
                col[i] = None
    if sql_type == "bigint":
        col = _int_column(col, types, where)
    return col


def _int_column(col: list, types: set, where: str) -> list:
    if float in types:
        col = [None if v is None else int(round(v)) for v in col]
    present = [v for v in col if v is not None]
    if present and not (-_INT64 <= min(present) and max(present) < _INT64):
        bad = next(i for i, v in enumerate(col) if v is not None and not -_INT64 <= v < _INT64)
        raise BatchError(f"{where}[{bad}]", f"{col[bad]} does not fit a 64-bit counter")
    return col


def _value_columns(kind: str, raw, n: int, where: str, batch: Batch, *, registry: bool) -> dict[str, list]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise BatchError(where, f"must be an object of field: array, got {type(raw).__name__}")
    known = KINDS[kind].by_name
    out = {}
    for name, col in raw.items():
        if registry and name not in known:
            raise BatchError(f"{where}.{name[:80]}", f"unknown {kind} field (put unmapped fields in 'extra')")
        if not registry and (not name or storable_text_problem(name, 128)):
            raise BatchError(f"{where}.{name[:80]}", "extra field names are 1-128 characters of valid text")
        if isinstance(col, list) and len(col) != n:
            raise BatchError(f"{where}.{name}", f"has {len(col)} values for {n} rows")
        sql_type = known[name].sql_type if registry else "double precision"
        out[name] = _numeric_column(col, sql_type, f"{where}.{name}", batch)
    return out


def _times(raw, n: int, where: str, times: TimeParser) -> list:
    if isinstance(raw, list):
        if len(raw) != n:
            raise BatchError(where, f"has {len(raw)} times for {n} rows")
        return [times.now if t is None else times.parse(t, f"{where}[{i}]") for i, t in enumerate(raw)]
    return [times.now if raw is None else times.parse(raw, where)] * n


def add_columns(batch: Batch, kind: str, cols: dict, where: str, times: TimeParser, default_time) -> None:
    """Validate a columnar collection and add it to the batch as one frame."""
    n = _length({k: v for k, v in cols.items() if k not in ("fields", "extra", "time")}, where)
    ident = ident_columns(kind, cols, n, where)
    tcol = _times(cols.get("time", default_time), n, f"{where}.time", times)
    values = _value_columns(kind, cols.get("fields"), n, f"{where}.fields", batch, registry=True)
    extra = _value_columns(kind, cols.get("extra"), n, f"{where}.extra", batch, registry=False)
    frame = Frame(kind, n, ident, tcol, values, extra)
    bad = [i for i, t in enumerate(set(tcol)) if times.problem(t)] if len(set(tcol)) > 0 else []
    if bad:
        keep = [i for i, t in enumerate(tcol) if not times.problem(t)]
        for i in set(range(n)) - set(keep):
            row = frame.take([i])
            batch.reject(f"{where}[{i}]", times.problem(tcol[i]), row.sample_count)
        frame = frame.take(keep)
    if frame.n:
        batch.columnar[kind].append(frame)
