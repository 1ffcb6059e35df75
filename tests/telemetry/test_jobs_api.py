"""POST /api/v1/jobs: a scheduler snapshot lands as jobs, state history and the allocation ledger."""

from __future__ import annotations

import copy
import gzip
import json

import pytest

from telemetry.actions import do_create_collector_token
from telemetry.models import Allocation, Gpu, Job, JobStateChange, Node

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/api/v1/jobs"
T0, T1, T2, T3 = "2026-11-30T11:50:00Z", "2026-11-30T12:00:00Z", "2026-11-30T12:10:00Z", "2026-11-30T12:20:00Z"
ALL_GPUS = list(range(8))


def _job(job_id: str, state: str, **over) -> dict:
    job = {"job_id": job_id, "name": "sft-chat", "user": "alee", "account": "applied-ml", "partition": "gpu",
           "qos": "normal", "priority": 10_500, "state": state, "submit": T0, "start": None, "end": None,
           "nodes": [], "gpus": 8, "restart_count": 0, "allocations": []}
    return {**job, **over}


def _running(job_id: str, nodes: list[str], start: str = T1, **over) -> dict:
    allocations = [{"node": n, "gpu_indexes": ALL_GPUS, "start": start, "end": None} for n in nodes]
    return _job(job_id, "RUNNING", start=start, nodes=nodes, gpus=8 * len(nodes), allocations=allocations, **over)


def _ended(job: dict, state: str, end: str) -> dict:
    allocations = [{**a, "end": end} for a in job["allocations"]]
    return {**job, "state": state, "end": end, "allocations": allocations}


def _snapshot(*jobs: dict) -> dict:
    return {"source": "slurm", "jobs": list(jobs)}


@pytest.fixture
def post(client):
    token = do_create_collector_token("slurm-push")

    def send(doc, **headers):
        data = doc if isinstance(doc, bytes) else json.dumps(doc)
        return client.post(URL, data=data, content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {token}", **headers)

    return send


def _db() -> tuple:
    """Everything the endpoint writes, in a comparable form."""
    jobs = sorted(Job.objects.values_list("external_id", "state", "gpu_count", "requeue_count", "preempt_count"))
    allocations = sorted(Allocation.objects.values_list("job__external_id", "node__hostname", "gpu_index",
                                                        "gpu_id", "start", "end"))
    history = sorted(JobStateChange.objects.values_list("job__external_id", "time", "state"))
    return jobs, allocations, history


# --- valid snapshots ----------------------------------------------------------------------------------
def test_snapshot_creates_jobs_allocations_and_state_history(post):
    node = Node.objects.create(hostname="gpu-0001")
    gpu3 = Gpu.objects.create(uuid="GPU-00000000-0000-0000-0000-000000000003", node=node, index=3)
    resp = post(_snapshot(_job("sim-1", "PENDING", gpus=16, node_count=2),
                          _running("sim-2", ["gpu-0001", "gpu-0002"]),
                          _ended(_running("sim-3", ["gpu-0003"]), "COMPLETED", T2)))
    assert resp.status_code == 200, resp.content
    assert resp.json() == {"jobs": 3, "created": 3, "allocations": 24, "closed": 0, "vanished": 0}
    jobs = {j.external_id: j for j in Job.objects.all()}
    assert {k: (j.source, j.state) for k, j in jobs.items()} == {
        "sim-1": ("slurm", "pending"), "sim-2": ("slurm", "running"), "sim-3": ("slurm", "completed")}
    assert (jobs["sim-1"].node_count, jobs["sim-1"].gpu_count, jobs["sim-1"].start_time) == (2, 16, None)
    assert (jobs["sim-2"].user, jobs["sim-2"].qos, jobs["sim-2"].priority) == ("alee", "normal", 10_500)
    assert jobs["sim-2"].submit_time.isoformat() == "2026-11-30T11:50:00+00:00"
    open_rows = Allocation.objects.filter(job=jobs["sim-2"], end__isnull=True)
    assert open_rows.count() == 16
    assert open_rows.get(node=node, gpu_index=3).gpu == gpu3, "the known GPU at that index is linked"
    assert not Allocation.objects.filter(job=jobs["sim-3"], end__isnull=True).exists()
    assert Node.objects.filter(hostname="gpu-0003").exists(), "an unknown node is registered unplaced"
    history = [(h.job.external_id, h.state, h.time.isoformat()) for h in JobStateChange.objects.order_by("job_id")]
    assert history == [("sim-1", "pending", "2026-11-30T11:50:00+00:00"),
                       ("sim-2", "running", "2026-11-30T12:00:00+00:00"),
                       ("sim-3", "completed", "2026-11-30T12:10:00+00:00")]


def test_resending_a_snapshot_changes_nothing(post):
    doc = _snapshot(_job("sim-1", "PENDING"), _running("sim-2", ["gpu-0001"]))
    assert post(doc).status_code == 200
    before = _db()
    resp = post(doc)
    assert resp.status_code == 200
    assert resp.json() == {"jobs": 2, "created": 0, "allocations": 0, "closed": 0, "vanished": 0}
    assert _db() == before


def test_a_job_through_queue_preemption_requeue_and_completion(post):
    post(_snapshot(_job("sim-7", "PENDING", qos="low")))
    first = _running("sim-7", ["gpu-0001"], qos="low")
    post(_snapshot(first))
    assert post(_snapshot(_ended(first, "PREEMPTED", T2))).json()["closed"] == 8
    post(_snapshot(_job("sim-7", "PENDING", qos="low", submit=T2, restart_count=1)))
    second = _running("sim-7", ["gpu-0002"], start=T2, qos="low", submit=T2, restart_count=1)
    post(_snapshot(_ended(second, "COMPLETED", T3)))
    job = Job.objects.get(external_id="sim-7")
    assert (job.state, job.preempt_count, job.requeue_count) == ("completed", 1, 1)
    assert [h.state for h in job.history.order_by("time", "id")] == [
        "pending", "running", "preempted", "pending", "completed"]
    runs = sorted(Allocation.objects.filter(job=job).values_list("node__hostname", "start", "end").distinct())
    assert [(n, s.isoformat(), e.isoformat()) for n, s, e in runs] == [
        ("gpu-0001", "2026-11-30T12:00:00+00:00", "2026-11-30T12:10:00+00:00"),
        ("gpu-0002", "2026-11-30T12:10:00+00:00", "2026-11-30T12:20:00+00:00")]


def test_gzip_body_is_accepted(post):
    body = gzip.compress(json.dumps(_snapshot(_job("sim-1", "PENDING"))).encode())
    assert post(body, HTTP_CONTENT_ENCODING="gzip").status_code == 200
    assert Job.objects.get().external_id == "sim-1"


# --- bad input: 400 naming the path and the value, nothing written -------------------------------------
def _bad(doc: dict, path: list, value) -> dict:
    """`doc` with the value at `path` (keys and indexes) replaced; DELETE removes the key."""
    doc = copy.deepcopy(doc)
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


DELETE = object()
GOOD = _snapshot(_job("sim-1", "PENDING"), _running("sim-2", ["gpu-0001", "gpu-0002"]))

BAD = [
    (["jobs", 1, "start"], "2026-13-01", "jobs[1].start", "not an ISO 8601 time with a zone: '2026-13-01'"),
    (["jobs", 1, "start"], "2026-11-30T12:00:00", "jobs[1].start", "'2026-11-30T12:00:00'"),
    (["jobs", 0, "submit"], 1796040000, "jobs[0].submit", "1796040000"),
    (["jobs", 1, "state"], "RUNING", "jobs[1].state", "'RUNING'"),
    (["source"], "k8s", "source", "only 'slurm' is accepted for now, got 'k8s'"),
    (["source"], DELETE, "source", "got None"),
    (["jobs"], {"sim-1": {}}, "jobs", "must be a list"),
    (["jobs", 0], "sim-1", "jobs[0]", "must be an object"),
    (["jobs", 1, "gpus"], -8, "jobs[1].gpus", "-8"),
    (["jobs", 1, "gpus"], True, "jobs[1].gpus", "True"),
    (["jobs", 1, "restart_count"], "1", "jobs[1].restart_count", "'1'"),
    (["jobs", 1, "priority"], 1.5, "jobs[1].priority", "1.5"),
    (["jobs", 1, "job_id"], " ", "jobs[1].job_id", "' '"),
    (["jobs", 1, "job_id"], "sim-1", "jobs[1].job_id", "'sim-1' is already at jobs[0]"),
    (["jobs", 1, "name"], "x" * 300, "jobs[1].name", "longer than 256 characters"),
    (["jobs", 1, "name"], "gpt\x00-7b", "jobs[1].name", "contains a NUL character"),  # PostgreSQL refuses NUL
    (["jobs", 1, "colour"], "red", "jobs[1].colour", "unknown key"),
    (["jobs", 1, "nodes"], ["gpu-0001", "gpu-0001"], "jobs[1].nodes[1]", "'gpu-0001' is listed twice"),
    (["jobs", 1, "start"], None, "jobs[1].start", "a RUNNING job needs its start time"),
    (["jobs", 1, "state"], "COMPLETED", "jobs[1].end", "a COMPLETED job needs its end time"),
    (["jobs", 1], _ended(_running("sim-2", ["gpu-0001"]), "FAILED", T0), "jobs[1].end",
     f"'{T0}' is before the start '{T1}'"),
    (["jobs", 1, "submit"], T2, "jobs[1].start", f"'{T1}' is before the submit time '{T2}'"),
    (["jobs", 0, "allocations"], [{"node": "gpu-0001", "gpu_indexes": [0], "start": T1, "end": None}],
     "jobs[0].allocations", "a PENDING job that has not started holds no GPUs, got 1 allocation(s)"),
    (["jobs", 1, "allocations", 1, "node"], "gpu-0009", "jobs[1].allocations[1].node",
     "'gpu-0009' is not one of the job's nodes"),
    (["jobs", 1, "allocations", 0, "gpu_indexes"], [0, 300], "jobs[1].allocations[0].gpu_indexes[1]", "300"),
    (["jobs", 1, "allocations", 0, "gpu_indexes"], [0, 0], "jobs[1].allocations[0].gpu_indexes[1]",
     "GPU 0 is listed twice"),
    (["jobs", 1, "allocations", 0, "gpu_indexes"], [], "jobs[1].allocations[0].gpu_indexes", "[]"),
    (["jobs", 1, "allocations", 0, "start"], None, "jobs[1].allocations[0].start", "None"),
    (["jobs", 1, "allocations", 0, "end"], T0, "jobs[1].allocations[0].end", f"'{T0}' is before"),
]


def test_each_bad_snapshot_is_400_naming_path_and_value_and_writes_nothing(post):
    # One test for every case: each test here costs a database flush, the cases cost milliseconds.
    wrong = []
    for path, value, where, says in BAD:
        resp = post(_bad(GOOD, path, value))
        error = resp.json().get("error", {})
        if (resp.status_code, error.get("code"), error.get("where")) != (400, "malformed", where) or \
                says not in error.get("message", ""):
            wrong.append(f"{path}={value!r}: {resp.status_code} {error}")
    assert wrong == []
    assert _db() == ([], [], []) and not Node.objects.exists()
    assert post(GOOD).status_code == 200, "the cases break a snapshot that is otherwise accepted"


def test_bad_json_is_400_and_oversized_body_is_413(post, settings):
    resp = post(b'{"source": "slurm", "jobs": [')
    assert resp.status_code == 400 and "line 1" in resp.json()["error"]["where"]
    settings.INGEST_MAX_BODY_BYTES = 100
    resp = post(GOOD)
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "too_large"
    assert _db() == ([], [], [])


# --- access -------------------------------------------------------------------------------------------
def test_missing_token_is_401_and_unknown_token_403(client):
    body = json.dumps(GOOD)
    resp = client.post(URL, data=body, content_type="application/json")
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "not_authenticated"
    assert "Bearer" in resp["WWW-Authenticate"]
    resp = client.post(URL, data=body, content_type="application/json", HTTP_AUTHORIZATION="Bearer bwc_nope")
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "bad_token"
    assert _db() == ([], [], [])


def test_only_post_is_allowed(client):
    resp = client.get(URL)
    assert resp.status_code == 405 and resp["Allow"] == "POST"


def test_a_complete_snapshot_closes_open_jobs_it_does_not_list(post):
    """A restarted simulator (or a full squeue) lists every live job: the rest ended unseen."""
    post(_snapshot(_running("sim-1", ["gpu-0001"]), _job("sim-2", "PENDING"),
                   _ended(_running("sim-3", ["gpu-0002"]), "COMPLETED", T2)))
    resp = post({**_snapshot(_running("sim-9", ["gpu-0003"])), "complete": True})
    assert resp.status_code == 200 and resp.json()["vanished"] == 2
    states = dict(Job.objects.values_list("external_id", "state"))
    assert states == {"sim-1": "cancelled", "sim-2": "cancelled", "sim-3": "completed", "sim-9": "running"}
    assert not Allocation.objects.filter(job__external_id="sim-1", end__isnull=True).exists()
    assert JobStateChange.objects.get(job__external_id="sim-1", state="cancelled").reason.startswith("not in")
    bad = post({**_snapshot(), "complete": "yes"})
    assert bad.status_code == 400 and "complete" in bad.content.decode()

