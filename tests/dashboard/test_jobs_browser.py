"""The Jobs pages in a real browser against a real daphne.

The first test feeds the real ingest and training APIs by hand and watches a rank start to
straggle live. The second runs the real simulator with its `straggler` scenario against the
server (job snapshots to /api/v1/jobs, per-rank step times to /api/v1/training) and checks that
the job page marks exactly the rank the scenario slowed down.
"""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from telemetry.actions import do_create_collector_token
from telemetry.simulator.client import IngestClient
from telemetry.simulator.dynamics import Cluster
from telemetry.simulator.runner import Runner
from telemetry.simulator.scenarios import ScenarioSet, parse_spec
from telemetry.simulator.topology import build_layout, topology_document
from telemetry.slurm import parse
from telemetry.slurm.sync import do_sync_slurm
from telemetry.topology import do_import_topology
from tests.conftest import save_screenshot
from tests.telemetry.test_selectors_jobs import cluster_doc

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PASSWORD = "correct-horse-battery"


def _post(server, token: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(
        f"{server.url}{path}", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _login(page, server, path: str) -> None:
    get_user_model().objects.create_superuser("op", "op@example.com", PASSWORD)
    page.goto(f"{server.url}{path}")
    page.fill("input[name=username]", "op")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit], input[type=submit]")


def _sync_job(external_id: str, hosts: list[str], start: datetime, **kw) -> None:
    """A running Slurm job on every GPU of `hosts`, as the Slurm poller would record it."""
    job = parse.Job(job_id=external_id, raw_job_id=int(external_id), name=kw.get("name", "llm-pretrain"),
                    user=kw.get("user", "alice"), account=kw.get("account", "ml"), partition="gpu", qos="normal",
                    priority=100, state="RUNNING", submit=start - timedelta(minutes=3), start=start, end=None,
                    nodes=hosts, node_count=len(hosts), gpu_count=4 * len(hosts), gpus_requested=4 * len(hosts),
                    requeue=False, restart_count=0, preempted=False)
    allocations = [parse.Allocation(job_id=external_id, node=h, gpu_indexes=[0, 1, 2, 3], start=start, end=None)
                   for h in hosts]
    do_sync_slurm([job], allocations, now=start)


def _steps(server, token: str, key: str, times: list[datetime], step_time: dict[int, float]) -> None:
    records = [{"rank": rank, "step": k, "time": _iso(t), "step_time_s": s}
               for k, t in enumerate(times) for rank, s in step_time.items()]
    assert _post(server, token, "/api/v1/training", {"job": key, "records": records})["stored"] == len(records)


def _tick(server, token: str) -> None:
    """One GPU sample through the ingest API: after its commit every live page gets a tick."""
    body = {"gpus": {"host": ["a1"], "uuid": ["GPU-00000000-0000-0000-0000-000000000000"], "index": [0],
                     "time": _iso(datetime.now(UTC)), "fields": {"gpu_util": [97.0], "gpu_temp": [61.0]}}}
    _post(server, token, "/api/v1/ingest", body)


def _rank_badges(page) -> list[int]:
    return page.eval_on_selector_all(
        "#job-ranks tr[data-rank]", "rows => rows.filter(r => r.querySelector('.bw-straggler'))"
        ".map(r => Number(r.dataset.rank))")


def test_job_list_and_job_page_follow_the_apis_live(asgi_server, browser_page):
    do_import_topology(cluster_doc())
    token = do_create_collector_token("browser-jobs")
    now = datetime.now(UTC).replace(microsecond=0)
    _sync_job("500", ["a1", "b1"], now - timedelta(minutes=10))
    history = [now - timedelta(seconds=20 * k) for k in range(12, 0, -1)]
    _steps(asgi_server, token, "slurm:500", history, dict.fromkeys(range(8), 1.0))

    _tick(asgi_server, token)  # a1's GPU 0 reports before the page opens: the ticks below change no health

    page = browser_page
    _login(page, asgi_server, "/jobs/")
    page.wait_for_selector("#jobs-table tr[data-key='slurm:500']", timeout=15_000)
    row = page.text_content("#jobs-table tr[data-key='slurm:500']")
    for part in ("slurm:500", "llm-pretrain", "alice", "ml", "gpu", "Running", "8", "3 min", "10 min"):
        assert part in row, (part, row)
    page.wait_for_selector("#bw-conn[data-state=live]", timeout=10_000)

    # A job the scheduler reports while the page is open appears without a reload.
    _sync_job("501", ["a2"], now - timedelta(minutes=1), name="sft-chat", user="bob")
    _tick(asgi_server, token)
    page.wait_for_selector("#jobs-table tr[data-key='slurm:501']", timeout=10_000)
    assert page.evaluate("BW.jobsStats.lastRows") == 1  # the push carried the new row only
    # Filters go through the server callback: bob's jobs only.
    page.fill("#jobs-user", "bob")
    page.press("#jobs-user", "Enter")
    page.wait_for_function("document.querySelectorAll('#jobs-table tr[data-key]').length === 1", timeout=10_000)
    assert page.get_attribute("#jobs-table tr[data-key] a", "href") == "/jobs/slurm%3A501/"
    save_screenshot(page, "jobs-filtered")
    # The filters are in the address, so the filtered list can be linked and reloaded.
    assert page.evaluate("location.search") == "?user=bob"
    page.goto(f"{asgi_server.url}/jobs/?q=slurm:500&account=ml&state=running&bogus=1")
    page.wait_for_function("document.querySelectorAll('#jobs-table tr[data-key]').length === 1", timeout=15_000)
    assert page.get_attribute("#jobs-table tr[data-key]", "data-key") == "slurm:500"
    assert page.input_value("#jobs-q") == "slurm:500"
    assert "ml" in page.text_content("#jobs-account") and "Running" in page.text_content("#jobs-state")
    assert page.evaluate("location.search") == "?state=running&account=ml&q=slurm%3A500"
    page.goto(f"{asgi_server.url}/jobs/?state=no-such-state")  # a hand-edited state: every job, not none
    page.wait_for_function("document.querySelectorAll('#jobs-table tr[data-key]').length === 2", timeout=15_000)

    page.goto(f"{asgi_server.url}/jobs/slurm:500/")
    page.wait_for_function("window.BW && BW.jobStats && BW.jobStats.renderedAt !== null", timeout=15_000)
    assert page.eval_on_selector_all("#job-ranks tr[data-rank]", "rows => rows.length") == 8
    assert _rank_badges(page) == []
    assert "100 %" not in page.text_content("#job-locality")  # a1 and b1: two racks, two NVLink domains
    assert page.text_content("[data-locality=racks] .bw-big") == "2"
    page.wait_for_selector("#bw-conn[data-state=live]", timeout=10_000)

    # Rank 6 slows down: its new steps reach the page with the next tick, badge and all.
    applied = page.evaluate("BW.jobStats.applied")
    recent = datetime.now(UTC).replace(microsecond=0)
    _steps(asgi_server, token, "slurm:500", [recent - timedelta(seconds=s) for s in range(12, -1, -1)],
           {**dict.fromkeys(range(8), 1.0), 6: 2.5})
    _tick(asgi_server, token)
    page.wait_for_selector("#job-ranks tr[data-rank='6'] .bw-straggler", timeout=10_000)
    assert _rank_badges(page) == [6]
    assert page.evaluate("BW.jobStats.applied") > applied
    assert "rank 6" in page.text_content("#job-gang")
    # The placement marks it too: one outlined cell, and the step chart has its own line.
    assert page.evaluate("document.querySelector('#job-placement .js-plotly-plot').layout.shapes"
                         ".filter(s => s.type === 'rect').length") == 1
    names = page.evaluate("document.querySelector('#job-steps .js-plotly-plot').data.map(t => t.name)")
    assert "Rank 6 (straggler)" in names and "Gang median" in names
    save_screenshot(page, "job-live-straggler", full_page=True)


def test_job_page_marks_the_rank_the_straggler_scenario_slowed(asgi_server, browser_page, tmp_path: Path):
    seed, interval = 9, 5.0
    layout = build_layout(64, seed)
    do_import_topology(topology_document(layout))
    token = do_create_collector_token("simulator-browser")
    scenarios = ScenarioSet([parse_spec("straggler")], seed=seed, speed=1.0, truth=tmp_path / "truth.jsonl")
    cluster = Cluster(layout, seed=seed, interval=interval, scenarios=scenarios)
    client = IngestClient(asgi_server.url, token)
    lines: list[str] = []
    runner = Runner(cluster, client, interval=interval, write=lines.append, server=asgi_server.url)
    try:
        runner.wait_for_server(30)
        runner.backfill(6)  # the job warms up (at most 2 min), then steps with one slow rank
        truth = json.loads((tmp_path / "truth.jsonl").read_text().splitlines()[0])
        key, rank = f"slurm:sim-{truth['entity']}", truth["details"]["rank"]

        page = browser_page
        _login(page, asgi_server, "/jobs/")
        page.wait_for_selector(f"#jobs-table tr[data-key='{key}']", timeout=15_000)
        assert "Running" in page.text_content(f"#jobs-table tr[data-key='{key}']")
        page.wait_for_selector("#bw-conn[data-state=live]", timeout=10_000)
        save_screenshot(page, "jobs")

        page.click(f"#jobs-table tr[data-key='{key}'] a")
        page.wait_for_function("window.BW && BW.jobStats && BW.jobStats.renderedAt !== null", timeout=15_000)
        page.wait_for_selector("#job-ranks .bw-straggler", timeout=10_000)
        assert _rank_badges(page) == [rank], (truth, lines[-5:])
        row = page.text_content(f"#job-ranks tr[data-rank='{rank}']")
        assert truth["details"]["gpu_uuid"] not in row  # the uuid is the link's title, the GPU index is shown
        gpu_link = page.get_attribute(f"#job-ranks tr[data-rank='{rank}'] a[title]", "title")
        assert gpu_link == truth["details"]["gpu_uuid"]
        assert page.text_content("[data-locality=size] .bw-big") == "2 · 16"
        page.wait_for_selector("#bw-conn[data-state=live]", timeout=10_000)

        # The simulator keeps ticking: new step points arrive over the websocket, not by reload.
        applied = page.evaluate("BW.jobStats.applied")
        runner.run(2)
        page.wait_for_function(f"BW.jobStats.applied > {applied}", timeout=15_000)
        assert _rank_badges(page) == [rank]
        save_screenshot(page, "job", full_page=True)
    finally:
        runner.close()
        client.close()
