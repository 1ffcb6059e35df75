"""PostgreSQL's binary COPY format, encoded a column at a time with numpy.

psycopg's `Copy.write_row` formats one row per Python call: about 2 µs a row for a 32-column GPU
frame, and the writer COPYs every frame twice (hypertable and staging table). At 16k GPUs that
Python loop was the largest single cost of ingest in the daphne process. Here each column becomes
one numpy array, the whole frame one byte buffer, encoded once and written to both COPYs with
`Copy.write`, so the per-row cost is C.

The format (PostgreSQL docs, "COPY … Binary Format"): an 11-byte signature, a 32-bit flags word
and a 32-bit header-extension length; then per row a 16-bit field count and, per field, a 32-bit
length (-1 for NULL, with no data) followed by the value in network byte order; then a 16-bit -1.
A NULL field is 4 bytes and a present one 4 + width, so rows differ in length: the encoder lays
every row out at full width and drops the data bytes of NULL fields with one boolean mask.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np

SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
HEADER = SIGNATURE + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
TRAILER = b"\xff\xff"
# timestamptz is int64 microseconds since 2000-01-01 00:00 UTC on the wire.
PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
WIRE = {"int4": np.dtype(">i4"), "int8": np.dtype(">i8"), "float4": np.dtype(">f4"), "float8": np.dtype(">f8"),
        "timestamptz": np.dtype(">i8")}
_COMPUTE = {"int4": np.int64, "int8": np.int64, "float4": np.float64, "float8": np.float64, "timestamptz": np.int64}


def _micros(times: list[datetime]) -> list[int]:
    """Each distinct time is converted once: a batch usually carries one or a few."""
    seen: dict[datetime, int] = {}
    for t in set(times):
        if t.tzinfo is None:
            raise ValueError(f"naive datetime {t!r} for a timestamptz column")
        seen[t] = (t - PG_EPOCH) // _MICROSECOND
    if len(seen) == 1:
        return [next(iter(seen.values()))] * len(times)
    return [seen[t] for t in times]


def _column(typ: str, col: list) -> tuple[np.ndarray, np.ndarray | None]:
    """(values, null mask or None) for one column (a list with None, or a masked array); NULLs hold 0."""
    if isinstance(col, np.ma.MaskedArray):
        null = np.ma.getmaskarray(col) if col.mask is not np.ma.nomask and col.mask.any() else None
        return col.filled(0).astype(_COMPUTE[typ], copy=False), null
    if typ == "timestamptz":
        col = _micros(col)
    dtype = _COMPUTE[typ]
    if col.count(None) == 0:  # the common case: one C conversion
        return np.asarray(col, dtype=dtype), None
    obj = np.asarray(col, dtype=object)
    null = np.equal(obj, None)
    obj[null] = 0
    return obj.astype(dtype), null


def encode(types: list[str], columns: list[list]) -> bytes:
    """The binary COPY payload for `columns` (equal-length lists; None is NULL) of `types`."""
    n = len(columns[0]) if columns else 0
    if n == 0:
        return HEADER + TRAILER
    blocks = [np.full(n, len(columns), dtype=">i2").view(np.uint8).reshape(n, 2)]
    masks: list[np.ndarray] = [np.ones((n, 2), dtype=bool)]
    any_null = False
    for typ, col in zip(types, columns, strict=True):
        wire = WIRE[typ]
        width = wire.itemsize
        values, null = _column(typ, col)
        block = np.empty((n, 4 + width), dtype=np.uint8)
        lengths = np.full(n, width, dtype=">i4")
        keep = np.ones((n, 4 + width), dtype=bool)
        if null is not None:
            any_null = True
            lengths[null] = -1
            keep[null, 4:] = False
        block[:, :4] = lengths.view(np.uint8).reshape(n, 4)
        block[:, 4:] = values.astype(wire).view(np.uint8).reshape(n, width)
        blocks.append(block)
        masks.append(keep)
    rows = np.hstack(blocks)
    body = rows[np.hstack(masks)].tobytes() if any_null else rows.tobytes()
    return HEADER + body + TRAILER


def decode(types: list[str], payload: bytes) -> list[np.ndarray]:
    """The columns of a binary `COPY … TO STDOUT` whose fields are all fixed-width and never NULL.

    The reverse of `encode` for the case where every row has the same length (COALESCE NULLs in
    the query), so the whole result is one numpy view with no Python object per value: a read of
    ~200k rows then costs a few MB of arrays instead of ~1.4M short-lived Python objects, whose
    scattered survivors keep a long-lived worker's heap from shrinking back.
    Raises ValueError for anything else (a NULL, a field of another width, a damaged stream).
    """
    if not payload.startswith(SIGNATURE) or len(payload) < len(HEADER) + len(TRAILER):
        raise ValueError("not a binary COPY stream")
    extension = int.from_bytes(payload[15:19], "big")
    body = memoryview(payload)[19 + extension:]
    if bytes(body[-2:]) != TRAILER:
        raise ValueError("binary COPY stream without its trailer")
    layout = [("count", ">i2")]
    for k, typ in enumerate(types):
        layout += [(f"len{k}", ">i4"), (f"val{k}", WIRE[typ])]
    row = np.dtype(layout)
    if (len(body) - 2) % row.itemsize:
        raise ValueError(f"rows are not all {row.itemsize} bytes: a NULL or a field of another width")
    rows = np.frombuffer(body[:-2], dtype=row)
    if (rows["count"] != len(types)).any():
        raise ValueError(f"rows of other than {len(types)} fields")
    for k, typ in enumerate(types):
        if (rows[f"len{k}"] != WIRE[typ].itemsize).any():
            raise ValueError(f"field {k} is NULL or not {typ} on some row")
    return [rows[f"val{k}"].astype(_COMPUTE[typ]) for k, typ in enumerate(types)]


def decode_array(raw: bytes | memoryview | None, typ: str) -> np.ndarray:
    """A one-dimensional array of a fixed-width `typ` without NULLs, as `array_send()` writes it (PostgreSQL's
    binary array format: ndim, flags, element type, then size and lower bound per dimension, then a length
    and the value per element). NULL (array_agg of no rows) is an empty array.

    A wide read sent as one array per column crosses the wire as a handful of values instead of one message
    per row: psycopg steps a Python generator for every message of a COPY, ~5 µs a row.
    Raises ValueError for anything else (several dimensions, a NULL element, another width)."""
    dtype = _COMPUTE[typ]
    if raw is None:
        return np.empty(0, dtype=dtype)
    buf = memoryview(raw)
    if len(buf) < 12:
        raise ValueError("not a binary array")
    ndim = int.from_bytes(buf[0:4], "big")
    if ndim == 0:
        return np.empty(0, dtype=dtype)
    if ndim != 1:
        raise ValueError(f"a {ndim}-dimensional array where one dimension was expected")
    n = int.from_bytes(buf[12:16], "big")
    wire = WIRE[typ]
    cell = np.dtype([("len", ">i4"), ("value", wire)])
    if len(buf) - 20 != n * cell.itemsize:
        raise ValueError(f"array elements are NULL or not {typ}")
    cells = np.frombuffer(buf[20:], dtype=cell)
    if (cells["len"] != wire.itemsize).any():
        raise ValueError(f"array elements are NULL or not {typ}")
    return cells["value"].astype(dtype)
