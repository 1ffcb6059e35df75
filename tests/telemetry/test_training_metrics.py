"""Training metrics: the endpoint and the client a training job uses, against a real server."""

from __future__ import annotations

import json
import math

import pytest
from django.db import connection

from telemetry.actions import do_create_collector_token
from telemetry.agent.training import TrainingReporter
from telemetry.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


def _rows():
    with connection.cursor() as cur:
        cur.execute("SELECT rank, step, loss, nan_count, inf_count FROM telemetry_training_step ORDER BY rank, step")
        return cur.fetchall()


def test_client_steps_arrive_per_rank_with_nan_counted(asgi_server):
    token = do_create_collector_token("trainer")
    ranks = [TrainingReporter(asgi_server.url, token, job="slurm:4242", rank=r, flush_every=3) for r in (0, 1)]
    for step in range(3):
        for r in ranks:
            loss = math.nan if (r.rank, step) == (1, 2) else 2.0 - step * 0.1
            r.step(step, step_time_s=0.8, loss=loss, grad_norm=1.0, tokens_per_s=48_000)
    assert all(not r.buffer for r in ranks)
    rows = _rows()
    assert len(rows) == 6 and rows[-1] == (1, 2, None, 1, 0)
    job = Job.objects.get()
    assert (job.source, job.external_id) == ("slurm", "4242")


def test_client_keeps_steps_while_server_is_down():
    reporter = TrainingReporter("http://127.0.0.1:9", "t", job="slurm:1", rank=0, flush_every=1, timeout=0.5)
    reporter.step(1, loss=1.0)
    assert len(reporter.buffer) == 1 and not reporter.flush()


def test_bad_records_are_400_with_path(client):
    token = do_create_collector_token("trainer")
    body = {"job": "slurm:7", "records": [{"rank": 0, "step": 1}, {"rank": -1, "step": 2}]}
    resp = client.post("/api/v1/training", data=json.dumps(body), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {token}")
    assert resp.status_code == 400 and resp.json()["error"]["where"] == "$.records[1].rank"
    assert _rows() == [] and not Job.objects.exists()


def test_unknown_scheduler_is_400(client):
    token = do_create_collector_token("trainer")
    resp = client.post("/api/v1/training", data=json.dumps({"job": "lsf:1", "records": []}),
                       content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert resp.status_code == 400 and resp.json()["error"]["where"] == "$.job"


def test_training_endpoint_needs_a_token(client):
    resp = client.post("/api/v1/training", data="{}", content_type="application/json")
    assert resp.status_code == 401


@pytest.mark.parametrize(("body", "where"), [
    ({"job": "slurm:7", "records": [{"rank": 2**31, "step": 1}]}, "$.records[0].rank"),  # past the integer column
    ({"job": "slurm:7", "records": [{"rank": 0, "step": 2**63}]}, "$.records[0].step"),  # past bigint
    ({"job": "slurm:7", "records": [{"rank": 0, "step": 1, "nan_count": 2**31}]}, "$.records[0].nan_count"),
    ({"job": "slurm:" + "7" * 129, "records": []}, "$.job"),  # Job.external_id holds 128 characters
    ({"job": "slurm:7\x00", "records": []}, "$.job"),  # PostgreSQL refuses NUL in text
])
def test_values_the_database_cannot_hold_are_400_not_503(client, body, where):
    token = do_create_collector_token("trainer")
    resp = client.post("/api/v1/training", data=json.dumps(body), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {token}")
    assert resp.status_code == 400 and resp.json()["error"]["where"] == where, resp.content
    assert _rows() == [] and not Job.objects.exists()


def test_within_a_batch_the_last_record_of_a_rank_and_time_wins_and_a_resend_replaces(client):
    token = do_create_collector_token("trainer")
    at = "2026-11-30T12:00:00Z"
    records = [{"rank": r, "step": 10, "time": at, "loss": 1.0 + r} for r in range(64)]
    records.append({"rank": 3, "step": 11, "time": at, "loss": 9.5, "nan_count": 2})  # the same rank and time again

    def post(recs):
        return client.post("/api/v1/training", data=json.dumps({"job": "slurm:9", "records": recs}),
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")

    resp = post(records)
    assert resp.status_code == 200 and resp.json() == {"stored": 65}
    rows = _rows()
    assert len(rows) == 64 and rows[3] == (3, 11, 9.5, 2, 0)
    # A re-send replaces what it names, and only that.
    assert post([{"rank": 3, "step": 11, "time": at, "loss": 4.0}]).status_code == 200
    assert _rows()[3] == (3, 11, 4.0, 0, 0) and _rows()[4] == (4, 10, 5.0, 0, 0)



def test_whole_and_fractional_numbers_mix_in_a_batch_and_a_number_past_a_double_is_400(client):
    token = do_create_collector_token("trainer")

    def post(recs):
        return client.post("/api/v1/training", data=json.dumps({"job": "slurm:9", "records": recs}),
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")

    ok = post([{"rank": 0, "step": 1, "loss": 2, "tokens_per_s": 48000}, {"rank": 1, "step": 1, "loss": 1.5}])
    assert ok.status_code == 200, ok.content
    assert [r[2] for r in _rows()] == [2.0, 1.5]
    bad = post([{"rank": 2, "step": 1, "loss": 1.0}, {"rank": 3, "step": 1, "grad_norm": 10**400}])
    assert bad.status_code == 400 and bad.json()["error"]["where"] == "$.records[1].grad_norm"
    assert len(_rows()) == 2  # nothing of the refused batch


def test_a_job_remembered_by_id_that_was_deleted_or_names_another_job_gets_its_steps_all_the_same(client):
    """The endpoint remembers each job's id between requests (telemetry.api.training._JOB_IDS). Steps for a job
    deleted since go to its new row, and a remembered id that names another job never receives them."""
    from telemetry.api import training

    token = do_create_collector_token("trainer")

    def post(job, step):
        body = {"job": job, "records": [{"rank": 0, "step": step, "time": f"2026-11-30T12:00:{step:02d}Z"}]}
        return client.post("/api/v1/training", data=json.dumps(body), content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {token}")

    def steps_of(external_id):
        with connection.cursor() as cur:
            cur.execute("SELECT s.step FROM telemetry_training_step s JOIN telemetry_job j ON j.id = s.job_id "
                        "WHERE j.source = 'slurm' AND j.external_id = %s ORDER BY s.step", [external_id])
            return [r[0] for r in cur.fetchall()]

    assert post("slurm:77", 1).status_code == 200
    first = Job.objects.get(external_id="77")
    assert training._JOB_IDS[("slurm", "77")] == first.id
    first.delete()
    assert post("slurm:77", 2).status_code == 200
    again = Job.objects.get(external_id="77")
    assert again.id != first.id and steps_of("77") == [2]
    assert training._JOB_IDS[("slurm", "77")] == again.id

    other = Job.objects.create(source="slurm", external_id="78", state="running")
    training._JOB_IDS[("slurm", "77")] = other.id  # as if ids had been reused
    assert post("slurm:77", 3).status_code == 200
    assert steps_of("77") == [2, 3] and steps_of("78") == []
    assert training._JOB_IDS[("slurm", "77")] == again.id


def test_compute_time_is_stored_per_rank_and_a_bad_one_is_400_naming_it(asgi_server, client):
    token = do_create_collector_token("trainer")
    ranks = [TrainingReporter(asgi_server.url, token, job="slurm:77", rank=r, flush_every=1) for r in (0, 1)]
    for r in ranks:
        r.step(5, step_time_s=1.0, compute_time_s=0.8 * (1.15 if r.rank else 1.0), loss=2.0)
    with connection.cursor() as cur:
        cur.execute("SELECT rank, step_time_s, compute_time_s FROM telemetry_training_step ORDER BY rank")
        assert cur.fetchall() == [(0, 1.0, 0.8), (1, 1.0, pytest.approx(0.92))]
    body = {"job": "slurm:77", "records": [{"rank": 0, "step": 6, "compute_time_s": "fast"}]}
    resp = client.post("/api/v1/training", data=json.dumps(body), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {token}")
    assert resp.status_code == 400 and resp.json()["error"]["where"] == "$.records[0].compute_time_s"
