"""The rack heatmap: the floor-plan grid, per-metric values, the live consumer and access."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.urls import reverse
from django.utils import timezone

from telemetry.models import Allocation, Gpu, GpuEvent, Job, Node
from telemetry.selectors.racks import METRICS, THROTTLE_LABELS, gpu_readings, heatmap_values, rack_grid, uses_readings
from telemetry.topology import do_import_topology
from tests import personas
from tests.conftest import FIXED_NOW
from tests.dashboard.conftest import assert_dash_app_refuses_anonymous, ws_communicator
from tests.dashboard.test_fleet_page import write_latest
from tests.telemetry.factories import insert_rollup


def _gpus(host: str, n: int) -> list[dict]:
    return [{"index": i, "uuid": f"GPU-{host}-{i}", "model": "NVIDIA H100 80GB HBM3"} for i in range(n)]


# Two hall rows; r1 holds an 8-GPU 4U node at U2, r2 a 1-GPU 1U node at U1, r3 is empty.
DOC = {"version": 1, "sites": [{"name": "dc1", "halls": [{"name": "hall-a", "rows": [
    {"name": "row-01", "racks": [
        {"name": "r1", "position": 1, "u_height": 10,
         "nodes": [{"hostname": "n1", "u": 2, "u_height": 4, "gpus": _gpus("n1", 8)}]},
        {"name": "r2", "position": 2, "u_height": 10,
         "nodes": [{"hostname": "n2", "u": 1, "u_height": 1, "gpus": _gpus("n2", 1)}]},
    ]},
    {"name": "row-02", "racks": [{"name": "r3", "position": 1, "u_height": 12}]},
]}]}]}


@pytest.fixture
def floor(db):
    do_import_topology(DOC)
    lost = Node.objects.create(hostname="lost")  # first seen in telemetry, never placed
    Gpu.objects.create(node=lost, index=0, uuid="GPU-lost-0")
    return {g.uuid: g for g in Gpu.objects.all()}


def _cell(grid: dict, uuid: str) -> tuple[int, int]:
    i = grid["gpus"]["uuid"].index(uuid)
    return grid["gpus"]["x"][i], grid["gpus"]["y"][i]


@pytest.mark.django_db
def test_grid_places_every_gpu_at_its_rack_and_u(floor):
    grid = rack_grid()

    assert len(grid["gpus"]["id"]) == len(floor) == 10
    assert [p["label"] for p in grid["panels"]] == ["hall-a · row row-01", "hall-a · row row-02", "Unplaced"]
    # r1 is 2 columns wide (8 GPUs in 4U), a blank column, then r2; row-02 after a 3-column gap.
    assert [(r["name"], r["x0"], r["y0"], r["w"], r["h"]) for r in grid["racks"]] == [
        ("r1", 0, 0, 2, 10), ("r2", 3, 0, 1, 10), ("r3", 7, 0, 1, 12)]
    # Top of the panel is U10: GPU 0 sits at the node's top U (5), GPU 3 at its bottom U (2).
    assert _cell(grid, "GPU-n1-0") == (0, 10 - 5)
    assert _cell(grid, "GPU-n1-3") == (0, 10 - 2)
    assert _cell(grid, "GPU-n1-4") == (1, 10 - 5)
    assert _cell(grid, "GPU-n2-0") == (3, 10 - 1)
    assert _cell(grid, "GPU-lost-0") == (11, 0)
    assert (grid["width"], grid["height"]) == (27, 12)
    # No two GPUs share a cell.
    assert len(set(zip(grid["gpus"]["x"], grid["gpus"]["y"], strict=True))) == 10
    i = grid["gpus"]["uuid"].index("GPU-lost-0")
    assert grid["hosts"][grid["gpus"]["host"][i]] == "lost" and grid["gpus"]["rack"][i] == -1


@pytest.mark.django_db
def test_grid_names_the_current_job_and_tenant(floor):
    job = Job.objects.create(source="slurm", external_id="4242", name="llm-pretrain", account="team-nlp",
                             state="running")
    gpu = floor["GPU-n1-2"]
    Allocation.objects.create(job=job, node=gpu.node, gpu=gpu, gpu_index=2, start=FIXED_NOW)
    ended = Job.objects.create(source="slurm", external_id="1", state="completed")
    Allocation.objects.create(job=ended, node=gpu.node, gpu=floor["GPU-n1-3"], gpu_index=3,
                              start=FIXED_NOW - timedelta(hours=2), end=FIXED_NOW - timedelta(hours=1))

    grid = rack_grid()

    jobs = grid["gpus"]["job"]
    assert grid["jobs"] == [{"key": "slurm:4242", "name": "llm-pretrain", "tenant": "team-nlp"}]
    assert jobs[grid["gpus"]["uuid"].index("GPU-n1-2")] == 0
    assert jobs[grid["gpus"]["uuid"].index("GPU-n1-3")] == -1


@pytest.mark.django_db
def test_empty_cluster_is_an_empty_grid_not_an_error():
    grid = rack_grid()
    assert grid["gpus"]["id"] == [] and grid["panels"] == [] and (grid["width"], grid["height"]) == (0, 0)
    for metric in METRICS:
        assert heatmap_values(metric, now=FIXED_NOW)["values"] == {}


@pytest.mark.django_db
def test_values_per_metric(floor):
    a, b, c = floor["GPU-n1-0"], floor["GPU-n1-1"], floor["GPU-n2-0"]
    write_latest(a, time=FIXED_NOW, gpu_util=87.5, fb_used=40960, throttle_reasons=0x04 | 0x40)
    write_latest(b, time=FIXED_NOW, gpu_util=12.0, throttle_reasons=0x01)  # idle is not a throttle
    # c never reported: it has no value for any metric (the page draws it grey).
    recent = [(a.id, FIXED_NOW - timedelta(minutes=m), {"ecc_sbe_vol_delta": 2.0}) for m in range(3)]
    insert_rollup("gpu", "1m", [*recent, (a.id, FIXED_NOW - timedelta(hours=2), {"ecc_sbe_vol_delta": 50.0})])
    GpuEvent.objects.create(gpu=b, kind="xid", code=13, first_seen=FIXED_NOW, last_seen=FIXED_NOW, count=3,
                            source="kmsg")  # an application fault: the GPU itself is fine

    def values(metric):
        return heatmap_values(metric, now=FIXED_NOW)["values"]

    assert values("gpu_util") == {a.id: 87.5, b.id: 12.0}
    assert values("fb_used") == {a.id: 40.0}  # GiB
    throttle = values("throttle")
    assert THROTTLE_LABELS[throttle[a.id]] == "HW thermal" and THROTTLE_LABELS[throttle[b.id]] == "None"
    assert values("ecc_rate") == {a.id: 6.0}  # the last hour only
    assert values("xid_events") == {b.id: 3}
    assert c.id not in values("gpu_util")
    health = heatmap_values("health", now=FIXED_NOW)
    assert [health["categories"][health["values"][g.id]] for g in (a, b, c)] == ["Degraded", "OK", "No data"]

    # A GPU that fell off the bus shows "no data" on every value metric, never its last reading.
    GpuEvent.objects.create(gpu=a, kind="fallen_off_bus", code=79, first_seen=FIXED_NOW, last_seen=FIXED_NOW,
                            source="kmsg")
    assert values("gpu_util") == {b.id: 12.0}
    assert health["categories"][values("health")[a.id]] == "Failed"
    # One fleet read serves every metric derived from it, with the same values as each metric's own read.
    readings = gpu_readings(FIXED_NOW)
    for metric in ("health", "gpu_util", "gpu_temp", "memory_temp", "power_w", "fb_used", "throttle"):
        assert uses_readings(metric)
        assert heatmap_values(metric, now=FIXED_NOW, readings=readings)["values"] == values(metric)
    assert not uses_readings("ecc_rate") and not uses_readings("anomaly_score")
    note = heatmap_values("anomaly_score", now=FIXED_NOW)
    assert note["values"] == {} and "not run" in note["note"]


# --- live consumer -------------------------------------------------------------------------------

def _communicator(cookie: bytes | None = None):
    return ws_communicator("/ws/heatmap/", cookie)


@pytest.mark.django_db(transaction=True)
def test_consumer_sends_all_values_then_only_changes(floor, session_cookie):
    a, b = floor["GPU-n1-0"], floor["GPU-n1-1"]
    write_latest(a, time=timezone.now(), gpu_temp=60.0)
    write_latest(b, time=timezone.now(), gpu_temp=61.0)

    async def scenario():
        ws = _communicator(session_cookie)
        assert (await ws.connect())[0]
        await ws.send_json_to({"subscribe": "gpu_temp"})
        first = await ws.receive_json_from(timeout=5)
        await sync_to_async(write_latest)(b, time=timezone.now(), gpu_temp=75.0)
        await ws.send_input({"type": "telemetry.tick", "at": "t1"})
        second = await ws.receive_json_from(timeout=5)
        await ws.send_input({"type": "telemetry.tick", "at": "t2"})  # nothing changed: nothing sent
        quiet = await ws.receive_nothing(timeout=0.5)
        await ws.send_json_to({"subscribe": "no-such-metric"})
        error = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return first, second, quiet, error

    first, second, quiet, error = async_to_sync(scenario)()

    assert first["full"] is True and first["metric"] == "gpu_temp"
    assert first["values"] == {str(a.id): 60.0, str(b.id): 61.0}
    assert second["full"] is False and second["values"] == {str(b.id): 75.0} and second["seq"] == 2
    assert quiet is True
    assert error["type"] == "error" and "no-such-metric" in error["message"]


@pytest.mark.django_db(transaction=True)
def test_pages_on_one_metric_share_one_read_per_tick(floor, session_cookie, monkeypatch):
    from telemetry.selectors import racks

    a = floor["GPU-n1-0"]
    write_latest(a, time=timezone.now(), gpu_temp=60.0)
    reads = []
    real = racks.heatmap_values
    monkeypatch.setattr(racks, "heatmap_values", lambda metric, **kw: reads.append(metric) or real(metric, **kw))

    async def scenario():
        pages = [_communicator(session_cookie) for _ in range(3)]
        for ws in pages:
            assert (await ws.connect())[0]
            await ws.send_json_to({"subscribe": "gpu_temp"})
            await ws.receive_json_from(timeout=5)
        subscribed = len(reads)
        await sync_to_async(write_latest)(a, time=timezone.now(), gpu_temp=70.0)
        for ws in pages:
            await ws.send_input({"type": "telemetry.tick", "at": "t1"})
        got = [await ws.receive_json_from(timeout=5) for ws in pages]
        for ws in pages:
            await ws.disconnect()
        return subscribed, got

    subscribed, got = async_to_sync(scenario)()

    assert subscribed == 3  # each new subscription reads for itself
    assert reads == ["gpu_temp"] * 4  # the tick: one read for the three pages
    assert [m["values"] for m in got] == [{str(a.id): 70.0}] * 3


@pytest.mark.django_db(transaction=True)
def test_pages_on_several_metrics_share_one_fleet_read_per_tick(floor, session_cookie, monkeypatch):
    from dashboard.consumers import heatmap as consumer

    a = floor["GPU-n1-0"]
    write_latest(a, time=timezone.now(), gpu_temp=60.0, gpu_util=40.0)
    fleet_reads = []
    real = consumer.gpu_readings
    monkeypatch.setattr(consumer, "gpu_readings", lambda *args: fleet_reads.append(1) or real(*args))
    metrics = ("gpu_temp", "gpu_util", "health", "ecc_rate")

    async def scenario():
        pages = [_communicator(session_cookie) for _ in metrics]
        for ws, metric in zip(pages, metrics, strict=True):
            assert (await ws.connect())[0]
            await ws.send_json_to({"subscribe": metric})
            await ws.receive_json_from(timeout=5)
        subscribed = len(fleet_reads)
        await sync_to_async(write_latest)(a, time=timezone.now(), gpu_temp=70.0, gpu_util=90.0)
        for ws in pages:
            await ws.send_input({"type": "telemetry.tick", "at": "t1"})
        got = [await ws.receive_json_from(timeout=5) for ws in pages[:2]]
        for ws in pages:
            await ws.disconnect()
        return subscribed, got

    subscribed, got = async_to_sync(scenario)()

    assert subscribed == 3  # each new subscription reads for itself; ecc_rate reads rollups, not the fleet
    assert len(fleet_reads) == 4, "the tick's pages on three metrics must share one fleet read"
    assert [m["values"] for m in got] == [{str(a.id): 70.0}, {str(a.id): 90.0}]


def test_shared_diff_is_found_once_per_pair_of_reads_and_marks_lost_cells():
    from dashboard.consumers.heatmap import SharedDiffs

    diffs = SharedDiffs()
    old = {1: 50.0, 2: 60.0, 3: 70.0, 4: None}
    new = {1: 50.0, 2: 61.0, 4: None, 5: None, 6: 10.0}
    changed, encoded = diffs.between(old, new)
    # 2 changed, 3 lost its value, 6 is new; 5 is new but has no value, which is what the page shows already.
    assert changed == {2: 61.0, 3: None, 6: 10.0}
    assert encoded == '{"2": 61.0, "6": 10.0, "3": null}'
    assert diffs.between(old, new)[0] is changed  # the second page reuses the first page's work
    assert diffs.between(dict(old), new)[0] == changed and diffs.between(dict(old), new)[0] is not changed
    full, _ = diffs.between(None, new)
    assert full == new
    assert diffs.between(new, new)[0] == {}


@pytest.mark.django_db(transaction=True)
def test_consumer_rejects_anonymous_users():
    async def scenario():
        ws = _communicator(None)
        connected, code = await ws.connect()
        await ws.disconnect()
        return connected, code

    assert async_to_sync(scenario)() == (False, 4401)


# --- access ------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_page_and_dash_endpoints_need_a_login(client, django_user_model):
    page = client.get(reverse("racks"))
    assert page.status_code == 302 and page["Location"].startswith("/login/")
    assert_dash_app_refuses_anonymous(client, "heatmap")

    personas.signed_in(personas.operator("op"), client)
    page = client.get(reverse("racks"))
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="react-entry-point"' in html and "DashRenderer" in html  # the app is embedded, not framed
    assert "DJANGO_PLOTLY_DASH" not in html  # the middleware filled both placeholders
    assert client.get("/django_plotly_dash/app/heatmap/_dash-layout").status_code == 200


@pytest.mark.django_db
def test_layout_memo_follows_inventory_changes(floor):
    assert _cell(rack_grid(), "GPU-n2-0") == (3, 9)
    Node.objects.filter(hostname="n2").update(u_position=5)  # moved up four U
    assert _cell(rack_grid(), "GPU-n2-0") == (3, 5)
    Gpu.objects.create(node=Node.objects.get(hostname="n2"), index=1, uuid="GPU-n2-1")
    assert "GPU-n2-1" in rack_grid()["gpus"]["uuid"]
