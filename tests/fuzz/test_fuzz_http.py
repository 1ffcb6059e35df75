"""The ingest endpoints under generated requests: never a 5xx, every refusal a JSON error with code and message.

Bodies come from the same generators as the parser fuzzers (mutated real captures, the exposition grammar)
plus junk, sent with right and wrong content types and encodings (gzip that is valid, truncated or not gzip at
all). The requests go through Django's test client into the real views, validators, writer and database, so a
value that passes validation but fails in PostgreSQL (too long for its column, NUL, out of range) shows up as
the 5xx it would be in production.
"""

from __future__ import annotations

import gzip
import json
import zlib
from datetime import timedelta
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from telemetry.actions import do_create_collector_token
from tests.fuzz import strategies as s
from tests.fuzz import targets
from tests.fuzz.conftest import fuzz_settings

pytestmark = pytest.mark.django_db(transaction=True)

ENDPOINTS = ("/api/v1/ingest", "/api/v1/ingest/prometheus", "/api/v1/jobs", "/api/v1/training")
CONTENT_TYPES = ("application/json", "application/x-ndjson", "text/plain; version=0.0.4", "text/plain",
                 "application/x-www-form-urlencoded", "multipart/form-data; boundary=xyz", "application/json; x=1",
                 "", "application/octet-stream")
ENCODINGS = ("", "", "", "gzip", "gzip-truncated", "gzip-garbage", "deflate", "br")


@pytest.fixture(autouse=True)
def _fixed_clock(monkeypatch):
    # As in tests/telemetry/test_ingest_api.py: the future/past checks compare against the fixtures' epoch.
    from telemetry.api import views

    monkeypatch.setattr(views, "_times", lambda: views.TimeParser(targets.FIXED_NOW, timedelta(minutes=5),
                                                                  timedelta(days=7)))


@pytest.fixture
def token():
    return do_create_collector_token("fuzz-collector")


@cache
def jobs_seeds() -> list[dict]:
    """Snapshots for POST /api/v1/jobs built from the real squeue capture."""
    from telemetry.slurm.parse import parse_squeue_json

    docs = targets.slurm_seeds()["jobs"]
    jobs = []
    for job in parse_squeue_json(json.dumps(docs[0]))[:20]:
        jobs.append({
            "job_id": job.job_id, "name": job.name, "user": job.user, "account": job.account,
            "partition": job.partition, "qos": job.qos, "priority": job.priority, "state": job.state,
            "submit": job.submit and job.submit.isoformat(), "start": job.start and job.start.isoformat(),
            "end": job.end and job.end.isoformat(), "nodes": job.nodes, "gpus": job.gpu_count,
        })
    return [{"source": "slurm", "complete": False, "jobs": jobs}]


TRAINING_SEEDS = [{"job": "slurm:4242", "records": [
    {"rank": 0, "step": 100, "time": targets.FIXED_NOW.isoformat(), "step_time_s": 0.82, "loss": 2.31,
     "grad_norm": 1.7, "tokens_per_s": 48000, "nan_count": 0, "inf_count": 0},
    {"rank": 1, "step": 100, "time": targets.FIXED_NOW.timestamp(), "loss": float("nan")},
]}]


def _encode(ch: s.Chooser, body: bytes) -> tuple[bytes, str]:
    encoding = ch.pick(ENCODINGS)
    if encoding == "gzip":
        return gzip.compress(body), "gzip"
    if encoding == "gzip-truncated":
        packed = gzip.compress(body)
        return packed[: ch.below(len(packed) + 1)], "gzip"
    if encoding == "gzip-garbage":
        return body, "gzip"
    if encoding == "deflate":
        return zlib.compress(body), "deflate"
    return body, encoding


def request(ch: s.Chooser) -> tuple[str, str, bytes, str]:
    path = ch.pick(ENDPOINTS)
    kind = ch.below(4)
    if kind == 0:
        body = ch.binary(200)
    elif path == "/api/v1/ingest/prometheus":
        body = targets.exposition_inputs(ch)[0]
        body = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    elif path == "/api/v1/jobs":
        body = s.json_body(ch, jobs_seeds())
    elif path == "/api/v1/training":
        body = s.json_body(ch, TRAINING_SEEDS)
    else:
        body = targets.ingest_inputs(ch)[1]
    content_type = ch.pick(CONTENT_TYPES) if ch.chance(3) else (
        "application/x-ndjson" if b"\n{" in body[:2000] else "application/json")
    body, encoding = _encode(ch, body)
    return path, content_type, body, encoding


def _post(client, token, case):
    path, content_type, body, encoding = case
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if encoding:
        headers["HTTP_CONTENT_ENCODING"] = encoding
    if path.endswith("prometheus") and content_type.startswith("text/plain; version"):
        path += "?host=fuzz-host"
    return client.post(path, data=body, content_type=content_type, **headers)


def check_response(resp) -> None:
    assert resp.status_code < 500, (resp.status_code, resp.content[:500])
    if resp.status_code >= 400:
        error = json.loads(resp.content)["error"]
        assert isinstance(error["code"], str) and error["code"], error
        assert isinstance(error["message"], str) and error["message"], error


@pytest.fixture
def warm_client(client, token):
    """The first request of a process pays for URL and app loading (seconds): not the examples' deadline."""
    for path in ENDPOINTS:
        client.post(path, data=b"{}", content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@settings(fuzz_settings(100), suppress_health_check=[*fuzz_settings(100).suppress_health_check,
                                                    HealthCheck.function_scoped_fixture])
@given(st.deferred(lambda: s.cases(request)))
def test_ingest_endpoints_never_answer_5xx(warm_client, token, case):
    check_response(_post(warm_client, token, case))


# --- regressions: inputs that passed validation and failed in the writer or PostgreSQL -------------------

GPU = {"host": "fuzz-node", "uuid": "GPU-fuzz-1", "time": targets.FIXED_NOW.isoformat()}


@pytest.mark.parametrize(("body", "where", "message"), [
    # 503: value too long for type character varying(64)
    ({"gpus": [{**GPU, "uuid": "G" * 65, "fields": {"gpu_util": 1}}]}, "$.gpus[0].uuid", "longer than 64"),
    # 503: smallint out of range
    ({"gpus": [{**GPU, "index": 40000, "fields": {"gpu_util": 1}}]}, "$.gpus[0].index", "from 0 to 32767"),
    # 503: integer out of range (GpuEvent.code)
    ({"events": [{"host": "fuzz-node", "gpu_uuid": "GPU-fuzz-1", "kind": "xid", "code": 2**40}]},
     "$.events[0].code", "from 0 to 2147483647"),
    # 503: invalid input syntax for type json (NaN in the agent report)
    ('{"agent": {"host": "fuzz-node", "x": NaN}}', "$.agent", "not storable as JSON"),
    # 503: PostgreSQL text cannot contain NUL
    ({"ports": [{"host": "fuzz-node", "port": "mlx5_0/1\x00", "fields": {"link_downed": 1}}]}, "$.ports[0].port",
     "NUL character"),
])
def test_values_postgresql_would_refuse_are_answered_400(warm_client, token, body, where, message):
    resp = _post(warm_client, token, ("/api/v1/ingest", "application/json",
                                      body.encode() if isinstance(body, str) else json.dumps(body).encode(), ""))
    assert resp.status_code == 400, resp.content
    error = resp.json()["error"]
    assert error["where"] == where and message in error["message"], error


def test_reading_past_float4_is_a_rejected_sample_not_a_500(warm_client, token):
    # 500: OverflowError (float too large to pack with f format) in the writer's binary COPY
    body = {"gpus": [{**GPU, "fields": {"gpu_util": 1e39, "power_w": 300.5}}]}
    resp = _post(warm_client, token, ("/api/v1/ingest", "application/json", json.dumps(body).encode(), ""))
    assert resp.status_code == 200, resp.content
    assert (resp.json()["accepted"], resp.json()["rejected"]) == (1, 1)
    assert "32-bit float" in resp.json()["rejections"][0]["reason"]
