"""The Jobs pages: access, the 404 page, the Dash callbacks and the live consumer's changes.

The gang and its steps are built with the selector tests' helpers (tests.telemetry.
test_selectors_jobs): two racks of two 4-GPU nodes, one NVLink domain and one leaf per rack.
"""

from __future__ import annotations

import itertools
import json
from datetime import timedelta
from types import SimpleNamespace

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.urls import reverse

from dashboard.consumers import jobs as consumer
from dashboard.dash_apps import jobs as dash_jobs
from telemetry.models import JobState, JobStateChange, TrainingStep
from telemetry.selectors import jobs as job_selectors
from telemetry.slurm import parse
from telemetry.slurm.sync import do_sync_slurm
from tests import personas
from tests.conftest import FIXED_NOW
from tests.dashboard.conftest import assert_dash_app_refuses_anonymous, ws_communicator
from tests.telemetry.test_selectors_jobs import allocate, cluster, make_job, steps  # noqa: F401  (fixture)

NOW = FIXED_NOW


@pytest.fixture
def fixed_now(monkeypatch):
    """Selectors, Dash callbacks and the consumer read the clock; here it is FIXED_NOW."""
    clock = SimpleNamespace(now=lambda: NOW)
    monkeypatch.setattr(job_selectors, "timezone", clock)
    monkeypatch.setattr(dash_jobs, "timezone", clock)
    monkeypatch.setattr(consumer, "now", clock.now)


@pytest.fixture
def operator(client, django_user_model):
    user = personas.operator("operator")
    client.force_login(user)
    return user


def straggling_job():
    """slurm:100 on a1 and b1 (8 ranks); rank 5 runs 1.6x slower than the rest."""
    job = make_job("100", name="llm-pretrain", user="alice", account="ml")
    allocate(job, [("a1", [0, 1, 2, 3]), ("b1", [0, 1, 2, 3])])
    steps(job, {rank: (1.6 if rank == 5 else 1.0) for rank in range(8)})
    JobStateChange.objects.create(job=job, time=NOW - timedelta(hours=2), state=JobState.PENDING)
    JobStateChange.objects.create(job=job, time=NOW - timedelta(hours=1), state=JobState.RUNNING)
    return job


# --- access --------------------------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.usefixtures("cluster")
def test_pages_and_dash_endpoints_need_a_login(client):
    straggling_job()
    for url in (reverse("jobs"), reverse("job", args=["slurm:100"])):
        page = client.get(url)
        assert page.status_code == 302 and page["Location"].startswith("/login/"), url
    for app in ("jobs", "job"):
        assert_dash_app_refuses_anonymous(client, app)


@pytest.mark.django_db
@pytest.mark.usefixtures("cluster", "operator")
def test_pages_embed_their_dash_apps(client):
    straggling_job()
    for url, app in ((reverse("jobs"), "jobs"), (reverse("job", args=["slurm:100"]), "job")):
        page = client.get(url)
        assert page.status_code == 200
        html = page.content.decode()
        assert 'id="react-entry-point"' in html and "DashRenderer" in html and 'data-live-url="/ws/jobs/"' in html
        assert client.get(f"/django_plotly_dash/app/{app}/_dash-layout").status_code == 200
    assert "llm-pretrain" in client.get(reverse("job", args=["slurm:100"])).content.decode()


@pytest.mark.django_db
def test_unknown_job_is_a_404_page_that_says_so(client, operator):
    for key in ("slurm:nope", "no-source"):
        page = client.get(reverse("job", args=[key]))
        assert page.status_code == 404
        html = page.content.decode()
        assert f"No job {key}" in html and "react-entry-point" not in html


# --- Dash callbacks ------------------------------------------------------------------------------

def _dash_update(client, app: str, outputs: list[tuple[str, str]], inputs: list[tuple[str, str, object]]) -> dict:
    """POST one callback the way the Dash renderer does; returns {component id: {prop: value}}."""
    body = {
        "output": (".." + "...".join(f"{i}.{p}" for i, p in outputs) + "..") if len(outputs) > 1
        else f"{outputs[0][0]}.{outputs[0][1]}",
        "outputs": [{"id": i, "property": p} for i, p in outputs] if len(outputs) > 1
        else {"id": outputs[0][0], "property": outputs[0][1]},
        "inputs": [{"id": i, "property": p, "value": v} for i, p, v in inputs],
        "changedPropIds": [f"{i}.{p}" for i, p, _ in inputs],
        "state": [],
    }
    resp = client.post(f"/django_plotly_dash/app/{app}/_dash-update-component", data=json.dumps(body),
                       content_type="application/json")
    assert resp.status_code == 200, resp.content[:500]
    return json.loads(resp.content)["response"]


@pytest.mark.django_db
@pytest.mark.usefixtures("cluster", "operator", "fixed_now")
def test_list_callback_returns_the_selector_page_and_dropdowns(client):
    straggling_job()
    make_job("101", JobState.PENDING, account="vision", partition="debug")
    make_job("102", JobState.COMPLETED, end_time=NOW - timedelta(minutes=5))
    # A job the Slurm sync wrote, as it does from squeue.
    do_sync_slurm([parse.Job(
        job_id="103", raw_job_id=103, name="sft-chat", user="bob", account="ml", partition="gpu", qos="normal",
        priority=10, state="RUNNING", submit=NOW - timedelta(minutes=30), start=NOW - timedelta(minutes=26),
        end=None, nodes=["a2"], node_count=1, gpu_count=4, gpus_requested=4, requeue=False, restart_count=0,
        preempted=False)],
        [parse.Allocation(job_id="103", node="a2", gpu_indexes=[0, 1, 2, 3], start=NOW - timedelta(minutes=26),
                          end=None)], now=NOW)

    out = _dash_update(client, "jobs",
                       [("jobs-data", "data"), ("jobs-state", "options"), ("jobs-account", "options"),
                        ("jobs-partition", "options")],
                       [("jobs-query", "data", {"state": "", "q": "", "offset": 0})])

    data = out["jobs-data"]["data"]
    assert data == {**json.loads(json.dumps(job_selectors.job_list(limit=50, now=NOW))),
                    "query": {"state": "", "account": "", "user": "", "partition": "", "q": "", "offset": 0,
                              "limit": 50}}
    assert [j["key"] for j in data["jobs"]] == ["slurm:103", "slurm:100", "slurm:101", "slurm:102"]
    assert data["jobs"][0]["queued_s"] == 240.0 and data["jobs"][0]["gpu_count"] == 4
    assert {o["value"]: o["label"] for o in out["jobs-state"]["options"]} == {
        "running": "Running (2)", "pending": "Pending (1)", "completed": "Completed (1)"}
    assert [o["value"] for o in out["jobs-account"]["options"]] == ["ml", "vision"]
    assert [o["value"] for o in out["jobs-partition"]["options"]] == ["debug", "gpu"]

    running = _dash_update(client, "jobs", [("jobs-data", "data"), ("jobs-state", "options"),
                                            ("jobs-account", "options"), ("jobs-partition", "options")],
                           [("jobs-query", "data", {"state": "running", "user": "alice", "offset": 0})])
    assert [j["key"] for j in running["jobs-data"]["data"]["jobs"]] == ["slurm:100"]


@pytest.mark.django_db
@pytest.mark.usefixtures("cluster", "operator", "fixed_now")
def test_job_callbacks_return_detail_and_step_series(client):
    straggling_job()

    detail = _dash_update(client, "job", [("job-data", "data")],
                          [("url", "pathname", "/jobs/slurm%3A100/")])["job-data"]["data"]

    assert detail == json.loads(json.dumps(job_selectors.job_detail("slurm:100", now=NOW)))
    assert detail["gang"]["stragglers"] == [5]
    assert [(r["rank"], r["host"], r["gpu_index"], r["straggler"]) for r in detail["ranks"]][4:6] == [
        (4, "b1", 0, False), (5, "b1", 1, True)]
    assert detail["locality"] == {"nvlink": 0.5, "leaf": 0.5, "racks": 2, "nodes": 2, "gpus": 8}
    assert [h["state"] for h in detail["history"]] == ["pending", "running"]

    series = _dash_update(client, "job", [("job-series", "data")],
                          [("job-data", "data", detail), ("job-range", "value", "15m")])["job-series"]["data"]
    assert series["range"] == "15m" and series["bucket_s"] == 4.0
    assert len(series["ranks"]) == 8 and series["gang_median"]["times"]
    slow = next(r for r in series["ranks"] if r["rank"] == 5)
    assert min(v for v in slow["step_time_s"] if v) > 1.5
    assert _dash_update(client, "job", [("job-data", "data")], [("url", "pathname", "/jobs/slurm:nope/")]) == {
        "job-data": {"data": None}}


@pytest.mark.django_db
@pytest.mark.usefixtures("operator", "fixed_now")
def test_list_callback_filters_by_pending(client):
    make_job("201", JobState.PENDING)
    out = _dash_update(client, "jobs", [("jobs-data", "data"), ("jobs-state", "options"),
                                        ("jobs-account", "options"), ("jobs-partition", "options")],
                       [("jobs-query", "data", {"state": "pending"})])
    assert [j["key"] for j in out["jobs-data"]["data"]["jobs"]] == ["slurm:201"]


@pytest.mark.django_db
def test_a_job_with_no_allocations_and_no_steps_loads_empty(client, operator, fixed_now):
    make_job("200", JobState.PENDING)
    detail = _dash_update(client, "job", [("job-data", "data")], [("url", "pathname", "/jobs/slurm:200/")])
    detail = detail["job-data"]["data"]
    assert detail["ranks"] == [] and detail["gang"]["stragglers"] == [] and detail["locality"]["gpus"] == 0
    series = _dash_update(client, "job", [("job-series", "data")],
                          [("job-data", "data", detail), ("job-range", "value", "all")])["job-series"]["data"]
    assert series["ranks"] == [] and series["gang_median"] == {"times": [], "step_time_s": []}


def test_job_key_comes_from_the_path():
    assert dash_jobs.key_from_path("/jobs/slurm:4242/") == "slurm:4242"
    assert dash_jobs.key_from_path("/jobs/k8s%3Aabc-123/") == "k8s:abc-123"
    assert dash_jobs.key_from_path("/jobs/") is None
    assert dash_jobs.key_from_path("/racks/") is None
    assert dash_jobs.key_from_path(None) is None


def test_step_range_stops_at_the_jobs_end_and_start():
    job = {"start": (NOW - timedelta(minutes=40)).isoformat(), "end": (NOW - timedelta(minutes=10)).isoformat()}
    start, end = dash_jobs.step_range(job, "1h", NOW)
    assert (start, end) == (NOW - timedelta(minutes=40), NOW - timedelta(minutes=10) + timedelta(seconds=1))
    start, end = dash_jobs.step_range({"start": None, "end": None}, "15m", NOW)
    assert end - start == timedelta(minutes=15)
    assert dash_jobs.list_query({"state": " running ", "offset": "-5", "evil": 1}) == {
        "state": "running", "account": "", "user": "", "partition": "", "q": "", "offset": 0}


# --- live consumer -------------------------------------------------------------------------------

def _communicator(cookie: bytes | None = None):
    return ws_communicator("/ws/jobs/", cookie)


_ticks = itertools.count(1)


def tick() -> dict:
    """A telemetry tick as ingest sends it: each one carries a new time (pages share reads per tick)."""
    return {"type": "telemetry.tick", "at": f"2026-01-01T00:00:{next(_ticks):09.6f}"}


def one_step_each(job, values: dict[int, float], at) -> None:
    TrainingStep.objects.bulk_create(
        [TrainingStep(job=job, rank=rank, time=at, step=1, step_time_s=v) for rank, v in values.items()])


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("cluster", "fixed_now")
def test_job_subscription_sends_the_job_then_only_the_rank_that_started_to_straggle(session_cookie):
    job = make_job("300")
    allocate(job, [("a1", [0, 1, 2, 3])])
    one_step_each(job, dict.fromkeys(range(4), 1.0), NOW - timedelta(seconds=60))

    async def scenario():
        ws = _communicator(session_cookie)
        assert (await ws.connect())[0]
        await ws.send_json_to({"subscribe": "job", "sub": 7, "key": "slurm:300",
                               "since": (NOW - timedelta(seconds=60)).isoformat(), "bucket_s": 10})
        first = await ws.receive_json_from(timeout=5)
        # Rank 2 reports a 3 s step: its median doubles and it straggles.
        await sync_to_async(one_step_each)(job, {2: 3.0}, NOW - timedelta(seconds=30))
        await ws.send_input(tick())
        second = await ws.receive_json_from(timeout=5)
        await ws.send_input(tick())  # nothing changed: nothing sent
        quiet = await ws.receive_nothing(timeout=0.5)
        await ws.send_json_to({"subscribe": "job", "key": "slurm:nope"})
        unknown = await ws.receive_json_from(timeout=5)
        await ws.send_json_to({"subscribe": "everything"})
        refused = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return first, second, quiet, unknown, refused

    first, second, quiet, unknown, refused = async_to_sync(scenario)()

    assert first["full"] is True and first["sub"] == 7 and first["type"] == "job"
    assert [r["rank"] for r in first["ranks"]] == [0, 1, 2, 3] and first["gang"]["stragglers"] == []
    assert first["job"]["key"] == "slurm:300" and first["locality"]["gpus"] == 4
    assert [s["rank"] for s in first["steps"]["ranks"]] == [0, 1, 2, 3]

    assert second["full"] is False and second["seq"] == 2
    assert set(second) == {"type", "key", "full", "sub", "seq", "ranks", "gang", "steps"}
    (rank,) = second["ranks"]
    assert (rank["rank"], rank["straggler"], rank["step_time_s"], rank["steps"]) == (2, True, 2.0, 2)
    assert second["gang"]["stragglers"] == [2] and second["gang"]["median_step_time_s"] == 1.0
    # Only the new step: the bucket the page already had is not sent again.
    assert second["steps"]["ranks"] == [{"rank": 2, "times": [(NOW - timedelta(seconds=30)).isoformat()],
                                         "step_time_s": [3.0]}]
    assert second["steps"]["gang_median"]["step_time_s"] == [3.0]
    assert quiet is True
    assert unknown["type"] == "error" and "slurm:nope" in unknown["message"]
    assert refused["type"] == "error"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("cluster", "fixed_now")
def test_list_subscription_sends_the_page_then_only_changed_rows(session_cookie):
    a = make_job("400", start_time=NOW - timedelta(minutes=20))
    make_job("401", start_time=NOW - timedelta(minutes=10))

    def preempt_a():
        a.state, a.preempt_count, a.end_time = JobState.PREEMPTED, 1, NOW
        a.save()

    async def scenario():
        ws = _communicator(session_cookie)
        assert (await ws.connect())[0]
        await ws.send_json_to({"subscribe": "list", "sub": 1, "limit": 50})
        first = await ws.receive_json_from(timeout=5)
        await ws.send_input(tick())  # the clock moved, nothing else: nothing sent
        quiet = await ws.receive_nothing(timeout=0.5)
        await sync_to_async(preempt_a)()
        await ws.send_input(tick())
        second = await ws.receive_json_from(timeout=5)
        await sync_to_async(make_job)("402", JobState.CANCELLED, start_time=None, end_time=NOW)
        await ws.send_json_to({"subscribe": "list", "sub": 2, "state": "cancelled"})
        pending = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return first, quiet, second, pending

    first, quiet, second, pending = async_to_sync(scenario)()

    assert first["full"] is True and first["order"] == ["slurm:401", "slurm:400"] and first["total"] == 2
    assert quiet is True
    assert [r["key"] for r in second["rows"]] == ["slurm:400"] and second["rows"][0]["state"] == "preempted"
    assert "order" not in second  # still second: it moved from the running group to the ended one
    assert second["removed"] == [] and second["total"] == 2
    assert pending["sub"] == 2 and pending["order"] == ["slurm:402"] and pending["total"] == 1


@pytest.mark.django_db(transaction=True)
def test_consumer_rejects_anonymous_users():
    async def scenario():
        ws = _communicator(None)
        connected, code = await ws.connect()
        await ws.disconnect()
        return connected, code

    assert async_to_sync(scenario)() == (False, 4401)


# --- the consumer's pure parts -------------------------------------------------------------------

def _row(key: str, state: str = "running", runtime: float = 1.0) -> dict:
    return {"key": key, "state": state, "runtime_s": runtime, "queued_s": 2.0}


def test_list_diff_ignores_the_clock_and_reports_moves_and_removals():
    rows = {k: _row(k) for k in ("a", "b")}
    same = {"jobs": [_row("a", runtime=99.0), _row("b")], "total": 2}
    assert consumer.list_diff(rows, ["a", "b"], 2, same, full=False) is None
    moved = {"jobs": [_row("b"), _row("c", "pending")], "total": 3}
    msg = consumer.list_diff(rows, ["a", "b"], 2, moved, full=False)
    assert msg["rows"] == [_row("c", "pending")] and msg["removed"] == ["a"] and msg["order"] == ["b", "c"]
    assert msg["total"] == 3


def test_subscriptions_are_cleaned_or_refused():
    sub = consumer.parse_subscription({"subscribe": "list", "limit": 10_000, "offset": -3, "user": 5})
    assert (sub["limit"], sub["offset"], sub["filters"]["user"]) == (consumer.MAX_LIST_LIMIT, 0, "")
    assert isinstance(consumer.parse_subscription({"subscribe": "job", "key": "1234"}), str)
    job = consumer.parse_subscription({"subscribe": "job", "key": "slurm:1", "since": "2026-11-30T12:00:00"})
    assert job["since"] is None and job["bucket_s"] == 15  # a naive time is ignored, not trusted
