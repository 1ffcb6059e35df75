"""The ingest API end to end: HTTP request → validation → COPY → hypertable, last-value table.

These tests use transaction=True because the API writes from a worker thread on its own
database connection, exactly as in production.
"""

from __future__ import annotations

import gzip
import json
from datetime import timedelta

import pytest
from django.db import connection

from telemetry.actions import do_create_collector_token
from telemetry.models import Gpu, IngestBatch, Node
from tests.conftest import FIXED_NOW

pytestmark = pytest.mark.django_db(transaction=True)

T0 = FIXED_NOW


@pytest.fixture(autouse=True)
def _fixed_clock(monkeypatch):
    # Future/past checks compare against the server clock; pin it to the fixtures' epoch.
    from telemetry.api import views

    monkeypatch.setattr(views, "_times", lambda: views.TimeParser(T0, timedelta(minutes=5), timedelta(days=7)))


@pytest.fixture
def token():
    return do_create_collector_token("test-collector")


@pytest.fixture
def post(client, token):
    def _post(body, *, content_type="application/json", path="/api/v1/ingest", auth=True, headers=None):
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        extra = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if auth else {}
        for k, v in (headers or {}).items():
            extra["HTTP_" + k.upper().replace("-", "_")] = v
        return client.post(path, data=body, content_type=content_type, **extra)

    return _post


def _gpu(uuid, host="node-a", t=T0, **fields):
    return {"host": host, "uuid": uuid, "index": 0, "model": "NVIDIA H100 80GB HBM3",
            "time": t.isoformat(), "fields": fields}


def _count(table: str, where: str = "true") -> int:
    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {table} WHERE {where}")
        return cur.fetchone()[0]


def test_json_batch_writes_rows_latest_and_log(post):
    body = {"gpus": [_gpu("GPU-1", gpu_util=50.0, energy_mj=1000), _gpu("GPU-2", gpu_util=70.0)]}
    resp = post(body)
    assert resp.status_code == 200, resp.content
    assert resp.json()["accepted"] == 3
    assert _count("telemetry_gpu_sample") == 2
    with connection.cursor() as cur:
        cur.execute("SELECT g.uuid, l.gpu_util, l.energy_mj FROM telemetry_gpu_sample_latest l "
                    "JOIN telemetry_gpu g ON g.id = l.gpu_id ORDER BY g.uuid")
        assert cur.fetchall() == [("GPU-1", 50.0, 1000), ("GPU-2", 70.0, None)]
    assert IngestBatch.objects.get().samples == 3


def test_resent_batch_is_harmless(post):
    body = {"gpus": [_gpu("GPU-1", gpu_util=50.0), _gpu("GPU-1", t=T0 + timedelta(seconds=10), gpu_util=60.0)]}
    assert post(body).status_code == 200
    assert post(body).status_code == 200
    assert _count("telemetry_gpu_sample") == 2
    with connection.cursor() as cur:
        cur.execute("SELECT gpu_util FROM telemetry_gpu_sample_latest")
        assert cur.fetchall() == [(60.0,)]


def test_second_source_fills_missing_fields_without_overwriting(post):
    assert post({"gpus": [_gpu("GPU-1", gpu_util=50.0)]}).status_code == 200
    assert post({"gpus": [_gpu("GPU-1", gpu_temp=61.0)]}).status_code == 200
    with connection.cursor() as cur:
        cur.execute("SELECT gpu_util, gpu_temp FROM telemetry_gpu_sample")
        assert cur.fetchall() == [(50.0, 61.0)]


def test_latest_ignores_older_samples(post):
    post({"gpus": [_gpu("GPU-1", t=T0, gpu_util=10.0)]})
    post({"gpus": [_gpu("GPU-1", t=T0 - timedelta(minutes=1), gpu_util=99.0)]})
    with connection.cursor() as cur:
        cur.execute("SELECT gpu_util, time FROM telemetry_gpu_sample_latest")
        assert cur.fetchall() == [(10.0, T0)]


def test_unseen_gpu_registers_unplaced_node(post):
    post({"gpus": [_gpu("GPU-NEW", host="stray-01", gpu_util=1.0)]})
    gpu = Gpu.objects.select_related("node").get(uuid="GPU-NEW")
    assert gpu.node.hostname == "stray-01" and not gpu.node.placed
    assert gpu.model == "NVIDIA H100 80GB HBM3"


def test_ndjson_batch_accepted(post):
    lines = [
        {"kind": "gpu", **_gpu("GPU-1", gpu_util=5.0)},
        {"kind": "port", "host": "node-a", "port": "mlx5_0/1", "time": T0.isoformat(), "fields": {"xmit_wait": 7}},
    ]
    resp = post("\n".join(json.dumps(x) for x in lines), content_type="application/x-ndjson")
    assert resp.status_code == 200, resp.content
    assert _count("telemetry_port_sample") == 1 and _count("telemetry_gpu_sample") == 1


def test_ndjson_error_names_the_line(post):
    lines = [json.dumps({"kind": "gpu", **_gpu("GPU-1", gpu_util=5.0)}), "{not json"]
    resp = post("\n".join(lines), content_type="application/x-ndjson")
    assert resp.status_code == 400
    assert resp.json()["error"]["where"].startswith("line 2")
    assert _count("telemetry_gpu_sample") == 0


def test_malformed_record_rejects_whole_batch(post):
    body = {"gpus": [_gpu("GPU-1", gpu_util=5.0), _gpu("GPU-2", gpu_util="lots")]}
    resp = post(body)
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["where"] == "$.gpus[1].fields.gpu_util" and "'lots'" in err["message"]
    assert _count("telemetry_gpu_sample") == 0 and not Gpu.objects.exists() and not IngestBatch.objects.exists()


def test_unknown_field_is_named(post):
    resp = post({"gpus": [_gpu("GPU-1", gpu_utl=5.0)]})
    assert resp.status_code == 400 and resp.json()["error"]["where"] == "$.gpus[0].fields.gpu_utl"


def test_nan_and_future_samples_rejected_and_counted(post):
    body = ('{"gpus": [' + json.dumps(_gpu("GPU-1", gpu_util=5.0, gpu_temp=40.0))[:-2]
            + ', "power_w": NaN}}, '
            + json.dumps(_gpu("GPU-2", t=T0 + timedelta(minutes=6), gpu_util=1.0, gpu_temp=2.0)) + "]}")
    resp = post(body)
    assert resp.status_code == 200, resp.content
    data = resp.json()
    assert data["accepted"] == 2 and data["rejected"] == 3
    reasons = " ".join(r["reason"] for r in data["rejections"])
    assert "non-finite" in reasons and "future" in reasons
    assert _count("telemetry_gpu_sample") == 1


def test_missing_token_is_401_and_bad_token_403(post, client):
    resp = post({"gpus": []}, auth=False)
    assert resp.status_code == 401 and "Bearer" in resp["WWW-Authenticate"]
    resp = client.post("/api/v1/ingest", data="{}", content_type="application/json",
                       HTTP_AUTHORIZATION="Bearer bwc_not-a-real-token")
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "bad_token"


def test_revoked_token_is_403(post, token):
    from django.utils import timezone

    from telemetry.models import CollectorToken

    CollectorToken.objects.update(revoked_at=timezone.now())
    assert post({"gpus": []}).status_code == 403


def test_body_over_limit_is_413(post, settings):
    settings.INGEST_MAX_BODY_BYTES = 1000
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    resp = post({"gpus": [_gpu(f"GPU-{i}", gpu_util=1.0) for i in range(50)]})
    assert resp.status_code == 413
    assert _count("telemetry_gpu_sample") == 0


def test_gzip_body_accepted_and_gzip_bomb_is_413(post, settings):
    body = json.dumps({"gpus": [_gpu("GPU-1", gpu_util=5.0)]}).encode()
    assert post(gzip.compress(body), headers={"Content-Encoding": "gzip"}).status_code == 200
    settings.INGEST_MAX_BODY_BYTES = 10_000
    bomb = gzip.compress(b" " * 1_000_000)
    resp = post(bomb, headers={"Content-Encoding": "gzip"})
    assert resp.status_code == 413 and "decompressed" in resp.json()["error"]["message"]


def test_get_is_405(client):
    assert client.get("/api/v1/ingest").status_code == 405


def test_unknown_switch_port_rejected_per_record(post):
    body = {"ports": [{"switch": "no-such-leaf", "port": "p1", "time": T0.isoformat(), "fields": {"xmit_wait": 1}}],
            "gpus": [_gpu("GPU-1", gpu_util=5.0)]}
    resp = post(body)
    assert resp.status_code == 200
    assert resp.json()["rejected"] == 1 and "unknown switch" in resp.json()["rejections"][0]["reason"]
    assert _count("telemetry_port_sample") == 0 and _count("telemetry_gpu_sample") == 1


def test_node_first_seen_by_port_is_unplaced(post):
    post(
        {
            "ports": [
                {"host": "ib-only-host", "port": "mlx5_0/1", "time": T0.isoformat(), "fields": {"symbol_errors": 0}}
            ]
        }
    )
    assert Node.objects.get(hostname="ib-only-host").rack is None


def _columns(n, t=T0, **fields):
    return {"host": [f"node-{i // 8}" for i in range(n)], "uuid": [f"GPU-c{i}" for i in range(n)],
            "index": [i % 8 for i in range(n)], "time": t.isoformat(), "fields": fields}


def test_columnar_batch_matches_row_batch(post):
    resp = post(
        {"gpus": _columns(16, gpu_util=[float(i) for i in range(16)], energy_mj=[1000.0 + i for i in range(16)])}
    )
    assert resp.status_code == 200, resp.content
    assert resp.json()["accepted"] == 32
    with connection.cursor() as cur:
        cur.execute("SELECT g.uuid, s.gpu_util, s.energy_mj FROM telemetry_gpu_sample s "
                    "JOIN telemetry_gpu g ON g.id = s.gpu_id WHERE g.uuid = 'GPU-c5'")
        assert cur.fetchall() == [("GPU-c5", 5.0, 1005)]
    assert Node.objects.count() == 2


def test_columnar_nan_strings_and_nulls_counted_per_sample(post):
    resp = post({"gpus": _columns(3, gpu_util=[1.0, "NaN", None], gpu_temp=[40, 41, 42])})
    assert resp.status_code == 200, resp.content
    data = resp.json()
    assert data["accepted"] == 4 and data["rejected"] == 1
    assert data["rejections"][0]["where"] == "$.gpus.fields.gpu_util[1]"


def test_columnar_bad_value_names_row(post):
    resp = post({"gpus": _columns(3, gpu_util=[1.0, 2.0, "hot"])})
    assert resp.status_code == 400
    assert resp.json()["error"]["where"] == "$.gpus.fields.gpu_util[2]"
    assert _count("telemetry_gpu_sample") == 0


def test_columnar_length_mismatch_is_400(post):
    resp = post({"gpus": _columns(3, gpu_util=[1.0, 2.0])})
    assert resp.status_code == 400 and resp.json()["error"]["where"] == "$.gpus.fields.gpu_util"


def test_columnar_future_rows_rejected(post):
    cols = _columns(2, gpu_util=[1.0, 2.0])
    cols["time"] = [T0.isoformat(), (T0 + timedelta(hours=1)).isoformat()]
    resp = post({"gpus": cols})
    assert resp.status_code == 200 and resp.json()["rejected"] == 1
    assert _count("telemetry_gpu_sample") == 1


@pytest.mark.parametrize(("column", "bad"), [
    ("uuid", "GPU-" + "x" * 300), ("uuid", "GPU-\x00nul"), ("uuid", "GPU-\ud800"), ("host", "h" * 300),
    ("index", 40000), ("index", -1),
])
def test_columnar_identity_problem_names_its_row_in_a_large_frame(post, column, bad):
    """Identity columns are checked as whole columns first; a bad value deep in a 1,024-row frame is
    still named by its row, and nothing of the frame is written."""
    cols = _columns(1024, gpu_util=[1.0] * 1024)
    cols[column][700] = bad
    resp = post({"gpus": cols})
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["where"] == f"$.gpus.{column}[700]"
    assert _count("telemetry_gpu_sample") == 0


def test_column_identity_clean_agrees_with_the_per_value_check():
    from telemetry.ingest.schema import column_identity_clean, identity_problem

    columns = [("uuid", ["GPU-a", "GPU-b"]), ("uuid", ["GPU-é", "GPU-b"]), ("uuid", ["GPU-\ud800"]),
               ("uuid", ["a" * 254]), ("host", ["n1", None, "n2"]), ("host", [None, None]), ("index", [0, 7, 32767]),
               ("index", [0, 32768]), ("index", [-1]), ("index", [1, "2"]), ("uuid", ["x\x00"])]
    verdicts = []
    for key, col in columns:
        per_value = all(identity_problem(key, v) is None for v in col if v is not None)
        clean = column_identity_clean(key, col)
        assert per_value or not clean, (key, col)  # "clean" never hides a problem
        verdicts.append(clean)
    # clean columns pass without a look at each value; the others are looked at value by value
    assert verdicts == [True, False, False, False, True, True, True, False, False, False, False]


def test_columnar_ports_name_a_host_or_a_switch_per_row(post):
    """A rack's HCA ports and its switches' ports may share one frame: each row names one owner."""
    ports = {"host": ["ib-host-1", None, "ib-host-1"], "switch": [None, "no-such-leaf", None],
             "port": ["mlx5_0/1", "p1", "mlx5_1/1"], "time": T0.isoformat(), "fields": {"symbol_errors": [0, 0, 3]}}
    resp = post({"ports": ports})
    assert resp.status_code == 200, resp.content
    # The switch row names a switch nobody imported: rejected per sample, the host rows are stored.
    assert resp.json()["accepted"] == 2 and resp.json()["rejected"] == 1
    assert "no-such-leaf" in resp.json()["rejections"][0]["reason"]
    assert _count("telemetry_port_sample") == 2

    both = post({"ports": {**ports, "switch": [None, "no-such-leaf", "leaf-1"]}})
    assert both.status_code == 400 and both.json()["error"]["where"] == "$.ports.host[2]"
    neither = post({"ports": {**ports, "host": ["ib-host-1", None, None]}})
    assert neither.status_code == 400 and neither.json()["error"]["where"] == "$.ports.host[2]"
    no_owner = post({"ports": {"port": ["p1"], "time": T0.isoformat(), "fields": {"symbol_errors": [0]}}})
    assert no_owner.status_code == 400 and "owner" in no_owner.json()["error"]["message"]
    host_null = post({"ports": {"host": ["ib-host-1", None], "port": ["a", "b"], "time": T0.isoformat(),
                                "fields": {"symbol_errors": [0, 0]}}})
    assert host_null.status_code == 400 and host_null.json()["error"]["where"] == "$.ports.host[1]"
    assert _count("telemetry_port_sample") == 2  # nothing from the refused batches


def test_rebuild_latest_refills_an_emptied_table(post, monkeypatch):
    from django.utils import timezone

    from telemetry.actions import do_rebuild_latest
    from telemetry.api import views

    # The rebuild window is measured from the database clock, so this test needs the real "now";
    # the module's pinned clock would reject these rows as future once the real date moved on.
    now = timezone.now().replace(microsecond=0)
    monkeypatch.setattr(views, "_times", lambda: views.TimeParser(now, timedelta(minutes=5), timedelta(days=7)))
    assert post({"gpus": [_gpu("GPU-1", t=now - timedelta(seconds=20), gpu_util=1.0),
                           _gpu("GPU-1", t=now - timedelta(seconds=10), gpu_util=2.0)]}).json()["accepted"] == 2
    with connection.cursor() as cur:
        cur.execute("TRUNCATE telemetry_gpu_sample_latest")  # what a crash does to an UNLOGGED table
    assert do_rebuild_latest(timedelta(hours=1))["gpu"] == 1
    with connection.cursor() as cur:
        cur.execute("SELECT gpu_util FROM telemetry_gpu_sample_latest")
        assert cur.fetchall() == [(2.0,)]


def test_deleted_inventory_is_not_served_from_another_process_cache(post):
    from telemetry.ingest import entities

    post({"gpus": [_gpu("GPU-1", gpu_util=1.0)]})
    old_id = Gpu.objects.get(uuid="GPU-1").id
    assert entities._CACHE["gpu"]["GPU-1"] == old_id  # filled by the API worker thread
    with connection.cursor() as cur:  # as the admin or a topology replace would, elsewhere
        cur.execute("DELETE FROM telemetry_gpu_sample_latest")
        cur.execute("DELETE FROM telemetry_gpu")
    post({"gpus": [_gpu("GPU-1", t=T0 + timedelta(seconds=10), gpu_util=2.0)]})
    new = Gpu.objects.get(uuid="GPU-1")
    assert new.id != old_id
    with connection.cursor() as cur:
        cur.execute("SELECT gpu_id FROM telemetry_gpu_sample_latest")
        assert cur.fetchall() == [(new.id,)]


def test_rolled_back_batch_does_not_leave_a_missing_stage_behind():
    """The temp staging table is created once per connection; a rollback must not fool that."""
    from django.db import transaction

    from telemetry.ingest.documents import parse_json
    from telemetry.ingest.schema import TimeParser
    from telemetry.ingest.writer import write_batch

    def batch(t):
        times = TimeParser(T0, timedelta(minutes=5), timedelta(days=7))
        return parse_json(json.dumps({"gpus": [_gpu("GPU-1", t=t, gpu_util=1.0)]}).encode(), times)

    with pytest.raises(RuntimeError), transaction.atomic():
        write_batch(batch(T0), collector="t", fmt="json")
        raise RuntimeError("the caller failed after the write")
    write_batch(batch(T0 + timedelta(seconds=10)), collector="t", fmt="json")
    write_batch(batch(T0 + timedelta(seconds=20)), collector="t", fmt="json")
    assert _count("telemetry_gpu_sample") == 2


def test_stage_is_emptied_between_batches_of_one_transaction_and_skipped_after_a_commit(monkeypatch):
    """The writer skips the stage's DELETE once a commit has emptied it, but never inside one
    transaction: a second batch there would otherwise merge the first one's staged rows again."""
    import psycopg
    from django.db import transaction

    from telemetry.ingest.documents import parse_json
    from telemetry.ingest.schema import TimeParser
    from telemetry.ingest.writer import write_batch

    def batch(t, util):
        times = TimeParser(T0, timedelta(minutes=5), timedelta(days=7))
        return parse_json(json.dumps({"gpus": [_gpu("GPU-1", t=t, gpu_util=util)]}).encode(), times)

    deletes = []
    execute = psycopg.Cursor.execute

    def counting(cur, query, *args, **kwargs):
        if str(query).startswith("DELETE FROM bw_stage_gpu"):
            deletes.append(query)
        return execute(cur, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counting)
    write_batch(batch(T0, 1.0), collector="t", fmt="json")  # creates the stage on this connection
    deletes.clear()
    with transaction.atomic():
        write_batch(batch(T0 + timedelta(seconds=10), 2.0), collector="t", fmt="json")
        write_batch(batch(T0 + timedelta(seconds=10), 3.0), collector="t", fmt="json")  # a re-send, merged
    assert len(deletes) == 1  # the second batch emptied what the first staged
    write_batch(batch(T0 + timedelta(seconds=20), 4.0), collector="t", fmt="json")
    assert len(deletes) == 1  # the commit emptied it: no DELETE
    with connection.cursor() as cur:
        cur.execute("SELECT time, gpu_util FROM telemetry_gpu_sample ORDER BY time")
        assert [v for _, v in cur.fetchall()] == [1.0, 3.0, 4.0]
        cur.execute("SELECT gpu_util FROM telemetry_gpu_sample_latest")
        assert cur.fetchall() == [(4.0,)]


def test_bmc_power_registers_a_device_for_its_node_but_a_bare_unknown_device_is_rejected(post):
    from telemetry.models import PowerDevice

    bmc = {"device": "node-a/bmc", "host": "node-a", "time": T0.isoformat(), "fields": {"watts": 5200.0}}
    typo = {"device": "pdu-typo", "time": T0.isoformat(), "fields": {"watts": 1.0}}
    resp = post({"power": [bmc, typo]})
    assert resp.status_code == 200 and resp.json()["rejected"] == 1
    dev = PowerDevice.objects.get(name="node-a/bmc")
    assert dev.kind == "psu" and [n.hostname for n in dev.nodes.all()] == ["node-a"]
    assert not PowerDevice.objects.filter(name="pdu-typo").exists()
    assert _count("telemetry_power_sample") == 1
