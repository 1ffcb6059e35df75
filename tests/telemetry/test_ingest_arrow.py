"""The Arrow IPC ingest body, end to end through the API: the same rows as the JSON columnar body,
the same rules for bad input (400 naming the column and row, rejected samples counted), nothing
half-written."""

from __future__ import annotations

import gzip
import json
from datetime import timedelta

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from django.db import connection

from telemetry.actions import do_create_collector_token
from telemetry.ingest import copybin
from telemetry.ingest.arrow import CONTENT_TYPE, encode_arrow, parse_arrow
from telemetry.ingest.faults import suspects
from telemetry.ingest.schema import BatchError, TimeParser
from tests.conftest import FIXED_NOW

pytestmark = pytest.mark.django_db(transaction=True)

T0 = FIXED_NOW
ALL_GPU_COLUMNS = "gpu_util, gpu_temp, power_w, energy_mj, xid, ecc_dbe_vol"


@pytest.fixture(autouse=True)
def _fixed_clock(monkeypatch):
    from telemetry.api import views

    monkeypatch.setattr(views, "_times", lambda: views.TimeParser(T0, timedelta(minutes=5), timedelta(days=7)))


@pytest.fixture
def post(client):
    token = do_create_collector_token("arrow-collector")

    def _post(body: bytes | dict, *, content_type=CONTENT_TYPE, headers=None):
        if isinstance(body, dict):
            body = json.dumps(body)
        extra = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
        extra.update({"HTTP_" + k.upper().replace("-", "_"): v for k, v in (headers or {}).items()})
        return client.post("/api/v1/ingest", data=body, content_type=content_type, **extra)

    return _post


def _stream(kind: str | None, columns: dict) -> bytes:
    table = pa.table(columns)
    if kind is not None:
        table = table.replace_schema_metadata({"kind": kind})
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _gpus(n: int, **fields) -> dict:
    return {"host": [f"node-{i // 8}" for i in range(n)], "uuid": [f"GPU-a{i}" for i in range(n)],
            "index": pa.array([i % 8 for i in range(n)], pa.int16()),
            "time": pa.array([T0] * n, pa.timestamp("us", "UTC")), **fields}


def _rows(uuid_prefix: str) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(f"SELECT replace(g.uuid, %s, ''), s.time, {ALL_GPU_COLUMNS} FROM telemetry_gpu_sample s "
                    "JOIN telemetry_gpu g ON g.id = s.gpu_id WHERE g.uuid LIKE %s ORDER BY g.uuid", [uuid_prefix,
                                                                                              uuid_prefix + "%"])
        return cur.fetchall()


def _latest() -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute("SELECT g.uuid, l.gpu_util, l.energy_mj FROM telemetry_gpu_sample_latest l "
                    "JOIN telemetry_gpu g ON g.id = l.gpu_id ORDER BY g.uuid")
        return cur.fetchall()


def test_arrow_body_writes_what_the_json_columnar_body_writes(post):
    rnd = np.random.default_rng(3)
    n = 40
    fields = {"gpu_util": [float(v) for v in rnd.uniform(0, 100, n)],
              "gpu_temp": [float(v) for v in rnd.uniform(30, 90, n)],
              "power_w": [None if i % 7 == 0 else float(v) for i, v in enumerate(rnd.uniform(100, 700, n))],
              "energy_mj": [int(v) for v in rnd.integers(0, 2**40, n)],
              "xid": [0] * n, "ecc_dbe_vol": [0] * n}
    cols = {"host": [f"node-{i // 8}" for i in range(n)], "index": [i % 8 for i in range(n)],
            "time": T0.isoformat(), "fields": fields}
    json_resp = post({"gpus": {**cols, "uuid": [f"GPU-j{i:03d}" for i in range(n)]}}, content_type="application/json")
    arrow_body = encode_arrow({"gpus": {**cols, "uuid": [f"GPU-b{i:03d}" for i in range(n)]}})
    arrow_resp = post(arrow_body)
    assert json_resp.status_code == 200 and arrow_resp.status_code == 200, arrow_resp.content
    got_json, got_arrow = json_resp.json(), arrow_resp.json()
    assert got_arrow["accepted"] == got_json["accepted"] == 6 * n - n // 7 - 1
    assert got_arrow["rows"] == got_json["rows"] == {"gpu": n, "narrow": 0}
    # Row for row, value for value (real columns included: both paths round to float4 the same way).
    assert _rows("GPU-b") == _rows("GPU-j") and len(_rows("GPU-b")) == n
    latest = dict((u, (g, e)) for u, g, e in _latest())
    assert latest["GPU-b007"] == latest["GPU-j007"] != (None, None)


def test_several_kinds_in_one_body_and_gzip(post):
    body = _stream("gpu", _gpus(3, gpu_util=pa.array([1.0, 2.0, None]))) + _stream(
        "port", {"port": ["mlx5_0:1", "mlx5_1:1"], "host": ["node-0", "node-0"],
                 "link_downed": pa.array([0, 1], pa.int64()), "extra.vendor_gauge": [0.5, None]})
    resp = post(gzip.compress(body), headers={"Content-Encoding": "gzip"})
    assert resp.status_code == 200, resp.content
    data = resp.json()
    assert data["rows"]["gpu"] == 3 and data["rows"]["port"] == 2 and data["rows"]["narrow"] == 1
    assert data["accepted"] == 2 + 2 + 1


def test_nan_inf_and_float4_overflow_are_rejected_samples_not_a_failed_batch(post):
    body = _stream("gpu", _gpus(4, gpu_util=[1.0, float("nan"), float("inf"), 4.0],
                                gpu_temp=pa.array([40.0, 1e39, 41.0, None]), energy_mj=[1.0, 2.6, None, 4.0]))
    resp = post(body)
    assert resp.status_code == 200, resp.content
    data = resp.json()
    assert data["rejected"] == 3 and data["accepted"] == 2 + 2 + 3
    assert {(r["where"], r["reason"]) for r in data["rejections"]} == {
        ("stream 0 (gpu).gpu_util[1]", "non-finite value nan"), ("stream 0 (gpu).gpu_util[2]", "non-finite value inf"),
        ("stream 0 (gpu).gpu_temp[1]", "1e+39 is out of range for a 32-bit float field")}
    with connection.cursor() as cur:
        cur.execute("SELECT g.uuid, s.gpu_util, s.gpu_temp, s.energy_mj FROM telemetry_gpu_sample s "
                    "JOIN telemetry_gpu g ON g.id = s.gpu_id ORDER BY g.uuid")
        rows = cur.fetchall()
    # A bigint field sent as floats is rounded, as the JSON body's is.
    assert rows == [("GPU-a0", 1.0, 40.0, 1), ("GPU-a1", None, None, 3), ("GPU-a2", None, 41.0, None),
                    ("GPU-a3", 4.0, None, 4)]


@pytest.mark.parametrize(("body", "where", "message"), [
    (lambda: _stream(None, _gpus(2, gpu_util=[1.0, 2.0])), "stream 0", "metadata must name the kind"),
    (lambda: _stream("gpu", _gpus(2, gpu_utilisation=[1.0, 2.0])), "stream 0 (gpu).gpu_utilisation",
     "unknown column"),
    (lambda: _stream("gpu", _gpus(2, gpu_util=["hot", "cold"])), "stream 0 (gpu).gpu_util",
     "must be an integer or floating-point column"),
    (lambda: _stream("gpu", {**_gpus(2), "uuid": ["GPU-x", None]}), "stream 0 (gpu).uuid[1]", "must be str"),
    (lambda: _stream("gpu", {**_gpus(2), "index": [1, 70000]}), "stream 0 (gpu).index[1]", "from 0 to 32767"),
    (lambda: _stream("gpu", {**_gpus(2), "time": pa.array([T0, T0], pa.timestamp("us"))}), "stream 0 (gpu).time",
     "needs a time zone"),
    (lambda: _stream("gpu", _gpus(2, energy_mj=pa.array([1, 2**64 - 1], pa.uint64()))), "stream 0 (gpu).energy_mj[1]",
     "does not fit a 64-bit counter"),
    (lambda: _stream("gpu", _gpus(2, energy_mj=[1.0, 1e30])), "stream 0 (gpu).energy_mj[1]",
     "does not fit a 64-bit counter"),
    (lambda: _stream("gpu", _gpus(1, **{"extra.bad\x00name": [1.0]})), "stream 0 (gpu).extra.bad",
     "extra field names"),
    (lambda: _stream("gpu", _gpus(1, gpu_util=[1.0])) + _stream("gpu", _gpus(1, gpu_util=[2.0])), "stream 1",
     "a second gpu stream"),
    (lambda: b"this is not arrow at all", "stream 0 (byte 0)", "not a valid Arrow IPC stream"),
    (lambda: _stream("gpu", _gpus(2, gpu_util=[1.0, 2.0]))[:-40], "stream 0 (byte 0)", "not a valid Arrow IPC"),
    (lambda: _stream("gpu", _gpus(1, gpu_util=[1.0])) + b"\x00" * 5, "stream 1", "not a valid Arrow IPC stream"),
])
def test_a_malformed_body_is_400_naming_the_problem_and_writes_nothing(post, body, where, message):
    raw = body()
    good = _stream("gpu", {"host": ["node-z"], "uuid": ["GPU-good"], "gpu_util": [1.0]})
    resp = post(raw)
    assert resp.status_code == 400, resp.content
    err = resp.json()["error"]
    assert err["where"].startswith(where) and message in err["message"], err
    # After a good stream, the whole body still fails: the good stream is not written either.
    assert post(good + raw).status_code == 400
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM telemetry_gpu_sample")
        assert cur.fetchone()[0] == 0


def test_an_empty_body_is_named():
    # Django's test client drops the Content-Type of an empty body, so this one is checked at the parser.
    with pytest.raises(BatchError, match="empty body"):
        parse_arrow(b"", TimeParser(T0, timedelta(minutes=5), timedelta(days=7)))


def test_corrupted_streams_never_crash_the_server(post):
    """Byte flips anywhere in a valid body: each answer is 200 or a named 400, never a 500."""
    good = _stream("gpu", _gpus(8, gpu_util=[float(i) for i in range(8)], energy_mj=list(range(8))))
    rnd = np.random.default_rng(11)
    answers = set()
    for _ in range(60):
        raw = bytearray(good)
        for pos in rnd.integers(0, len(raw), 3):
            raw[pos] = int(rnd.integers(0, 256))
        resp = post(bytes(raw))
        answers.add(resp.status_code)
        assert resp.status_code in (200, 400), resp.content
        if resp.status_code == 400:
            assert resp.json()["error"]["message"]
    assert 400 in answers


def test_masked_columns_encode_to_the_same_copy_payload_as_lists():
    values = [1.5, None, 3.0, None]
    masked = np.ma.MaskedArray([1.5, 0.0, 3.0, 0.0], mask=[False, True, False, True])
    assert copybin.encode(["float4"], [values]) == copybin.encode(["float4"], [masked])
    ints = np.ma.MaskedArray(np.array([5, 0, 7], dtype=np.int64), mask=np.ma.nomask)
    assert copybin.encode(["int8"], [[5, 0, 7]]) == copybin.encode(["int8"], [ints])


def test_fault_suspects_read_masked_columns_like_lists():
    ids = [11, 12, 13, 14]
    as_list = {"xid": [0, 79, None, 0], "ecc_dbe_vol": [0, 0, 0, 2]}
    masked = {k: np.ma.MaskedArray([v or 0 for v in col], mask=[v is None for v in col]) for k, col in as_list.items()}
    assert sorted(suspects(as_list, ids, {11})) == sorted(suspects(masked, ids, {11})) == [11, 12, 14]


def test_a_body_with_events_or_without_rows_is_left_to_json():
    assert encode_arrow({"gpus": [], "events": [{"kind": "xid"}]}) is None
    assert encode_arrow({"gpus": [{"host": "h", "uuid": "u", "fields": {"gpu_util": 1}}], "agent": {}}) is None
    assert encode_arrow({"time": T0.isoformat(), "gpus": [], "ports": []}) is None  # no rows: nothing to send


def test_the_encoder_sends_real_fields_as_float32_unless_a_value_is_beyond_float4(post):
    body = {"time": T0.isoformat(), "gpus": {"host": ["n", "n"], "uuid": ["GPU-r0", "GPU-r1"],
                                             "fields": {"gpu_temp": [41.3, 1e39], "power_w": [650.2, 700.0]}}}
    table = ipc.open_stream(encode_arrow(body)).read_all()
    assert table.schema.field("power_w").type == pa.float32() and table.schema.field("gpu_temp").type == pa.float64()
    resp = post(encode_arrow(body))
    assert resp.status_code == 200, resp.content
    assert resp.json()["rejections"] == [{"where": "stream 0 (gpu).gpu_temp[1]", "samples": 1,
                                          "reason": "1e+39 is out of range for a 32-bit float field"}]
