"""The Arrow IPC ingest body (Content-Type: application/vnd.apache.arrow.stream).

One Arrow IPC *stream* per entity kind (each kind at most once), back to back in one body. A stream's
schema metadata names its kind (`kind`: gpu, mig, port or power); its columns are

    the kind's identity keys   host, uuid, index, … (strings and integers, as in the JSON body)
    time                       optional: a timestamp with a time zone, or epoch seconds; null or
                               absent means the server's receive time
    <field>                    registry fields (docs/fields.md), any integer or floating type
    extra.<name>               unmapped numeric fields, stored in the narrow table

so it carries what the JSON columnar form carries (docs/ingest.md), with the same rules: an unknown
column, a wrong type or a bad identity fails the whole batch (400, the problem named as
`stream 0 (gpu).power_w`); a NaN, an infinity or a value its column cannot hold is one rejected
sample, counted and dropped, and the rest is written.

Why it exists: a JSON number becomes a Python object before it can be checked or encoded, and at
16,384 GPUs a tick that is ~600k objects in the web process. Here the value columns are checked
with numpy and handed to the COPY encoder as numpy arrays (masked where a value is missing), so
the per-value cost is C. Identity columns are small (a few per row) and become Python lists,
which the entity resolver reads.
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from telemetry.fields import KINDS
from telemetry.ingest.columnar import ident_columns
from telemetry.ingest.schema import COLLECTION_KEYS as COLLECTIONS
from telemetry.ingest.schema import (
    FLOAT32_MAX,
    IDENTITY,
    Batch,
    BatchError,
    Frame,
    TimeParser,
    storable_text_problem,
)

CONTENT_TYPE = "application/vnd.apache.arrow.stream"
EXTRA_PREFIX = "extra."
_INT64 = 2.0**63


def parse_arrow(body: bytes, times: TimeParser) -> Batch:
    """A validated batch from an Arrow IPC body (see the module docstring); BatchError names what is wrong."""
    batch = Batch()
    source = pa.BufferReader(body)
    stream = 0
    while source.tell() < len(body):
        start = source.tell()
        where = f"stream {stream}"
        try:
            table = ipc.open_stream(source).read_all()
            # Offsets and lengths inside the buffers are checked before any value is read: a
            # crafted body must fail here, not read past a buffer.
            table.validate(full=True)
        except (pa.ArrowException, ValueError, OSError) as exc:
            raise BatchError(f"{where} (byte {start})", f"not a valid Arrow IPC stream: {exc}"[:300]) from exc
        if source.tell() <= start:
            raise BatchError(f"{where} (byte {start})", "not a valid Arrow IPC stream")
        kind = (table.schema.metadata or {}).get(b"kind", b"").decode(errors="replace")
        if kind not in KINDS:
            raise BatchError(where, f"the schema's metadata must name the kind (gpu, mig, port or power), got {kind!r}")
        # One stream per kind, as the JSON body has one collection per kind: each stream becomes a frame and
        # costs its own COPYs, and 64 MB of one-row streams would be ~100k of them.
        if batch.columnar[kind]:
            raise BatchError(where, f"a second {kind} stream: send each kind once (concatenate its tables)")
        try:
            add_table(batch, kind, table, f"{where} ({kind})", times)
        except UnicodeDecodeError as exc:  # a column name or a string value that is not UTF-8
            raise BatchError(f"{where} ({kind})", f"text that is not UTF-8: {exc}"[:300]) from exc
        stream += 1
    if not stream:
        raise BatchError("$", "empty body: send at least one Arrow IPC stream")
    return batch


def add_table(batch: Batch, kind: str, table: pa.Table, where: str, times: TimeParser) -> None:
    """Validate one kind's table and add it to the batch as one frame."""
    n = table.num_rows
    required, optional = IDENTITY[kind]
    known = KINDS[kind].by_name
    ident_cols, values, extra = {}, {}, {}
    tcol = None
    for name, col in zip(table.column_names, table.columns, strict=True):
        path = f"{where}.{name[:80]}"
        if name in required or name in optional:
            ident_cols[name] = _ident_list(col, (required | optional)[name], path)
        elif name == "time":
            tcol = col
        elif name in known:
            values[name] = _numeric(col, known[name].sql_type, path, batch)
        elif name.startswith(EXTRA_PREFIX) and name != EXTRA_PREFIX:
            if storable_text_problem(name[len(EXTRA_PREFIX):], 128):
                raise BatchError(path, "extra field names are 1-128 characters of valid text")
            extra[name[len(EXTRA_PREFIX):]] = _numeric(col, "double precision", path, batch).tolist()
        else:
            raise BatchError(path, f"unknown column for {kind} (an identity key, 'time', a {kind} field, "
                                   f"or 'extra.<name>' for an unmapped field)")
    if len(set(table.column_names)) != len(table.column_names):
        raise BatchError(where, "a column name appears twice")
    if not n:
        return
    ident = ident_columns(kind, ident_cols, n, where)
    tlist = _times(tcol, n, f"{where}.time", times)
    frame = Frame(kind, n, ident, tlist, values, extra)
    late = {t: times.problem(t) for t in set(tlist)}
    if any(late.values()):
        keep = [i for i, t in enumerate(tlist) if not late[t]]
        for i in sorted(set(range(n)) - set(keep)):
            batch.reject(f"{where}[{i}]", late[tlist[i]], frame.take([i]).sample_count)
        frame = frame.take(keep)
    if frame.n:
        batch.columnar[kind].append(frame)


def _ident_list(col: pa.ChunkedArray, typ: type, path: str) -> list:
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    wanted = pa.types.is_string(col.type) or pa.types.is_large_string(col.type) if typ is str \
        else pa.types.is_integer(col.type)
    if not wanted:
        raise BatchError(path, f"must be a {'string' if typ is str else 'integer'} column, got {col.type}")
    return col.to_pylist()


def _times(col: pa.ChunkedArray | None, n: int, where: str, times: TimeParser) -> list:
    if col is None:
        return [times.now] * n
    typ = col.type
    if pa.types.is_timestamp(typ):
        if typ.tz is None:
            raise BatchError(where, "a timestamp column needs a time zone (send UTC)")
        # The values are UTC instants whatever the zone (which only says how to display them).
        col = col.cast(pa.timestamp("us", tz="UTC"), safe=False)
    elif not (pa.types.is_integer(typ) or pa.types.is_floating(typ)):
        raise BatchError(where, f"must be a timestamp with a time zone or epoch seconds, got {typ}")
    distinct = pc.unique(col)
    try:
        parsed = {v: times.now if v is None else
                  (v if pa.types.is_timestamp(typ) else times.parse(v, where))
                  for v in distinct.to_pylist()}
    except (OverflowError, ValueError) as exc:  # a timestamp past year 9999
        raise BatchError(where, f"a time is out of range: {exc}") from exc
    if len(parsed) == 1:
        return [next(iter(parsed.values()))] * n
    return [parsed[v] for v in col.to_pylist()]


def _numeric(col: pa.ChunkedArray, sql_type: str, path: str, batch: Batch) -> np.ma.MaskedArray:
    """The column as a masked numpy array (masked: not reported, or rejected here)."""
    typ = col.type
    if not (pa.types.is_integer(typ) or pa.types.is_floating(typ)):
        raise BatchError(path, f"must be an integer or floating-point column, got {typ}")
    arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    null = None
    if arr.null_count:  # the common case has none: to_numpy is then a view of the Arrow buffer
        null = arr.is_null().to_numpy(zero_copy_only=False)
        arr = pc.fill_null(arr, 0)
    raw = arr.to_numpy(zero_copy_only=False)
    if pa.types.is_integer(typ):
        if pa.types.is_uint64(typ) and raw.size and raw.max() >= 2**63:
            bad = int(np.flatnonzero(raw >= 2**63)[0])
            raise BatchError(f"{path}[{bad}]", f"{raw[bad]} does not fit a 64-bit counter")
        return np.ma.MaskedArray(raw.astype(np.int64 if sql_type == "bigint" else np.float64),
                                 mask=np.ma.nomask if null is None else null)
    raw = raw.astype(np.float64)
    bad = ~np.isfinite(raw)
    if bad.any():
        _reject(batch, path, np.flatnonzero(bad), raw, None)
    if sql_type == "real":
        big = ~bad & (np.abs(np.where(bad, 0, raw)) > FLOAT32_MAX)
        if big.any():
            _reject(batch, path, np.flatnonzero(big), raw, "is out of range for a 32-bit float field")
            bad |= big
    mask = bad if null is None else bad | null
    if sql_type == "bigint":
        present = raw[~mask]
        if present.size and (present.min() < -_INT64 or present.max() >= _INT64):
            i = int(np.flatnonzero(~mask & ((raw < -_INT64) | (raw >= _INT64)))[0])
            raise BatchError(f"{path}[{i}]", f"{raw[i]:.17g} does not fit a 64-bit counter")
        raw = np.where(mask, 0, np.rint(raw)).astype(np.int64)
    return np.ma.MaskedArray(raw, mask=mask if mask.any() else np.ma.nomask)


def _reject(batch: Batch, path: str, rows: np.ndarray, raw: np.ndarray, reason: str | None) -> None:
    for i in rows.tolist():
        value = float(raw[i])
        batch.reject(f"{path}[{i}]", f"non-finite value {value!r}" if reason is None else f"{value!r} {reason}")


def encode_arrow(body: dict) -> bytes | None:
    """The Arrow IPC body for a JSON batch (docs/ingest.md: the record or the columnar form), or None when the
    batch carries what only JSON carries (fault events, an agent's self-report): send that one as JSON.

    What a collector that aggregates many hosts (the simulator, a site relay) sends instead of JSON."""
    if body.get("events") or body.get("agent") or set(body) - {"time", *COLLECTIONS}:
        return None
    sink = pa.BufferOutputStream()
    for key, kind in COLLECTIONS.items():
        coll = body.get(key)
        if not coll:
            continue
        table = _table(kind, coll if isinstance(coll, dict) else _rows_to_columns(coll), body.get("time"))
        with ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    return sink.getvalue().to_pybytes() or None  # no rows at all: nothing Arrow can say that JSON cannot


def _rows_to_columns(records: list[dict]) -> dict:
    keys = list(dict.fromkeys(k for r in records for k in r if k not in ("fields", "extra")))
    out: dict = {k: [r.get(k) for r in records] for k in keys}
    for part in ("fields", "extra"):
        names = list(dict.fromkeys(f for r in records for f in r.get(part) or ()))
        out[part] = {f: [(r.get(part) or {}).get(f) for r in records] for f in names}
    return out


def _table(kind: str, cols: dict, default_time) -> pa.Table:
    n = len(next(v for k, v in cols.items() if k not in ("fields", "extra", "time")))
    known = KINDS[kind].by_name
    arrays: dict[str, pa.Array] = {}
    for key, col in cols.items():
        if key in ("fields", "extra", "time"):
            continue
        typ = (IDENTITY[kind][0] | IDENTITY[kind][1]).get(key)
        arrays[key] = pa.array(col, type=pa.string() if typ is str else pa.int32() if typ is int else None)
    raw_time = cols.get("time", default_time)
    if raw_time is not None:
        stamps = raw_time if isinstance(raw_time, list) else [raw_time] * n
        arrays["time"] = pa.array([None if t is None else _instant(t) for t in stamps], pa.timestamp("us", "UTC"))
    for name, col in (cols.get("fields") or {}).items():
        sql_type = known[name].sql_type if name in known else None
        arrays[name] = _real(col) if sql_type == "real" else pa.array(col)
    for name, col in (cols.get("extra") or {}).items():
        arrays[EXTRA_PREFIX + name] = pa.array(col, type=pa.float64())
    return pa.table(arrays).replace_schema_metadata({"kind": kind})


def _real(col: list) -> pa.Array:
    """A `real` field is stored as float4, so it travels as float32: half the bytes, the same stored values (one
    rounding from float64 either way). A value beyond float4's range stays float64, for the server to reject
    by name as the JSON body's would be."""
    wide = pa.array(col, type=pa.float64())
    narrow = wide.cast(pa.float32(), safe=False)
    return narrow if pc.sum(pc.is_inf(narrow)).as_py() == pc.sum(pc.is_inf(wide)).as_py() else wide


def _instant(t):
    if isinstance(t, str):
        return datetime.fromisoformat(t)
    return datetime.fromtimestamp(t, UTC) if isinstance(t, (int, float)) else t
