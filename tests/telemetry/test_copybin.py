"""The numpy binary COPY encoder against PostgreSQL itself and against psycopg's own row writer.

The writer sends every ingest frame through `copybin.encode`; a wrong byte there would store
wrong values silently or fail every batch, so the edges are checked: NULLs in any position,
integer and float limits, float4 rounding, times before PostgreSQL's 2000 epoch and with
microseconds, and rows of different lengths.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import psycopg
import pytest
from django.db import connection

from telemetry.ingest import copybin

pytestmark = pytest.mark.django_db

TYPES = ["int4", "timestamptz", "int8", "float4", "float8"]
T = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)
COLUMNS = [
    [1, 2, -7, 2**31 - 1, 5, 6],
    [T, T, datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), T + timedelta(seconds=10),
     datetime(2000, 1, 1, tzinfo=UTC), T.astimezone(ZoneInfo("Asia/Kolkata"))],
    [None, 0, -(2**63), 2**63 - 1, 41, None],
    [0.1, None, 3.4e38, -1.5, 7, None],
    [1e-300, None, -0.0, 12345.678901234, 3, None],
]


def _table(cur, name: str) -> None:
    cur.execute(f"CREATE TEMP TABLE {name} (i int4, t timestamptz, c int8, r real, d float8)")


def _rows(cur, name: str) -> list[tuple]:
    cur.execute(f"SELECT i, t, c, r, d FROM {name} ORDER BY i")
    return cur.fetchall()


def test_encoded_rows_read_back_exactly_as_psycopg_writes_them():
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cur:
        _table(cur, "ours")
        _table(cur, "theirs")
        with cur.copy("COPY ours FROM STDIN (FORMAT BINARY)") as cp:
            cp.write(copybin.encode(TYPES, COLUMNS))
        with cur.copy("COPY theirs FROM STDIN (FORMAT BINARY)") as cp:
            cp.set_types(TYPES)
            for row in zip(*COLUMNS, strict=True):
                cp.write_row(row)
        ours, theirs = _rows(cur, "ours"), _rows(cur, "theirs")
    assert ours == theirs
    assert len(ours) == 6
    by_id = {r[0]: r for r in ours}
    assert by_id[-7][1] == datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert by_id[-7][2] == -(2**63) and by_id[2**31 - 1][2] == 2**63 - 1
    assert by_id[1][2] is None and by_id[2][3] is None and by_id[6][4] is None
    assert by_id[6][1] == T  # the same instant, whatever zone it was written in


def test_bytes_match_the_documented_layout():
    # One row (int4 7, NULL int8): field count 2, then length 4 + big-endian 7, then length -1.
    payload = copybin.encode(["int4", "int8"], [[7], [None]])
    assert payload == (
        b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8
        + b"\x00\x02" + b"\x00\x00\x00\x04\x00\x00\x00\x07" + b"\xff\xff\xff\xff"
        + b"\xff\xff"
    )


def test_no_rows_is_a_valid_empty_copy():
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cur:
        _table(cur, "empty")
        with cur.copy("COPY empty FROM STDIN (FORMAT BINARY)") as cp:
            cp.write(copybin.encode(TYPES, [[] for _ in TYPES]))
        assert _rows(cur, "empty") == []


def test_a_naive_time_is_refused_rather_than_guessed():
    with pytest.raises(ValueError, match="naive datetime"):
        copybin.encode(["int4", "timestamptz"], [[1], [datetime(2026, 1, 1)]])  # noqa: DTZ001  (the naive time is the point)


def test_decode_reads_a_copy_to_stream_into_columns_and_refuses_nulls():
    connection.ensure_connection()
    query = "SELECT i::int4, i * 2::int8, i / 4.0::float8 FROM generate_series(-2, 3) i ORDER BY i"
    with psycopg.Cursor(connection.connection) as cur:
        with cur.copy(f"COPY ({query}) TO STDOUT (FORMAT BINARY)") as cp:
            payload = b"".join(cp)
        with cur.copy("COPY (SELECT 1::int4, NULL::float8) TO STDOUT (FORMAT BINARY)") as cp:
            with_null = b"".join(cp)
    ints, bigs, floats = copybin.decode(["int4", "int8", "float8"], payload)
    assert ints.tolist() == [-2, -1, 0, 1, 2, 3] and bigs.tolist() == [-4, -2, 0, 2, 4, 6]
    assert floats.tolist() == [-0.5, -0.25, 0.0, 0.25, 0.5, 0.75]
    with pytest.raises(ValueError, match="NULL"):
        copybin.decode(["int4", "float8"], with_null)
    with pytest.raises(ValueError):
        copybin.decode(["int4", "int8", "float8"], payload[:-2])
    assert [len(c) for c in copybin.decode(["int4"], copybin.HEADER + copybin.TRAILER)] == [0]


def test_decode_array_reads_array_send_of_postgresql_itself_and_refuses_what_it_cannot():
    import numpy as np

    with connection.cursor() as cur:
        cur.execute("SELECT array_send(ARRAY[1.5, -0.0, 1e-300, 'NaN', 'Infinity']::float8[]), "
                    "array_send(ARRAY[-9223372036854775808, 0, 9223372036854775807]::int8[]), "
                    "(SELECT array_send(array_agg(x)) FROM (SELECT 1.0::float8 AS x WHERE false) none_), "
                    "array_send('{}'::float8[]), array_send(ARRAY[1.0, NULL]::float8[]), "
                    "array_send(ARRAY[[1.0, 2.0]]::float8[]), array_send(ARRAY[1, 2]::int4[])")
        floats, ints, nothing, empty, with_null, two_dims, int4s = cur.fetchone()
    got = copybin.decode_array(floats, "float8")
    np.testing.assert_array_equal(got, [1.5, -0.0, 1e-300, np.nan, np.inf])
    assert copybin.decode_array(ints, "int8").tolist() == [-(2**63), 0, 2**63 - 1]
    assert copybin.decode_array(nothing, "float8").size == 0 and copybin.decode_array(empty, "float8").size == 0
    with pytest.raises(ValueError, match="NULL"):
        copybin.decode_array(with_null, "float8")
    with pytest.raises(ValueError, match="2-dimensional"):
        copybin.decode_array(two_dims, "float8")
    with pytest.raises(ValueError, match="not int8"):
        copybin.decode_array(int4s, "int8")
