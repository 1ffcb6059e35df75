"""The one health model (telemetry.health): events, latest values and their age, scheduler state.

Inventory goes in through the ORM, last values with plain SQL as ingest writes them; the end-to-end
tests post real samples and kernel-log events through the ingest API and read the state back.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection

from telemetry import health
from telemetry.actions import do_create_collector_token
from telemetry.fields import KINDS
from telemetry.models import Allocation, Gpu, GpuEvent, Job, Node, NodeState, Port
from telemetry.selectors.inventory import gpu_tile
from telemetry.selectors.racks import heatmap_values
from tests.conftest import FIXED_NOW
from tests.dashboard.test_fleet_page import HEALTHY, make_gpu, make_node, write_latest

NOW = FIXED_NOW


@pytest.fixture(autouse=True)
def _limits(settings):
    settings.STALE_AFTER = timedelta(seconds=180)
    settings.STALE_GRACE = timedelta(seconds=5)


def set_interval(gpu: Gpu, seconds: float) -> None:
    with connection.cursor() as cur:
        cur.execute(f"UPDATE {KINDS['gpu'].latest_table} SET interval_s = %s WHERE gpu_id = %s", [seconds, gpu.id])


def open_event(gpu: Gpu, kind: str, code: int = 0, *, at=NOW - timedelta(seconds=3), cleared=None) -> GpuEvent:
    return GpuEvent.objects.create(gpu=gpu, kind=kind, code=code, first_seen=at, last_seen=at, source="kmsg",
                                   cleared_at=cleared)


def state(gpu: Gpu, now=NOW) -> health.Health:
    return health.gpu_health([gpu.id], now=now)[gpu.id]


# --- GPU rules -----------------------------------------------------------------------------------

@pytest.mark.django_db
def test_fallen_off_bus_event_fails_the_gpu_at_once_with_its_reason_and_time():
    gpu = make_gpu(**HEALTHY, time=NOW - timedelta(seconds=2))  # its last sample is still fresh
    at = NOW - timedelta(seconds=1)
    open_event(gpu, "fallen_off_bus", 79, at=at)

    h = state(gpu)

    assert (h.state, h.reason, h.since) == ("failed", "fault_event", at)
    assert h.detail == "XID 79: GPU has fallen off the bus"


@pytest.mark.django_db
@pytest.mark.parametrize(("kind", "code", "expected"), [
    ("xid", 79, "failed"), ("xid", 48, "failed"), ("ecc_dbe", 0, "failed"), ("row_remap_failure", 0, "failed"),
    ("xid", 13, "ok"),  # an application fault says nothing about the hardware
    ("xid", 31, "ok"),
    ("nvlink_errors", 0, "degraded"),
])
def test_open_events_decide_by_kind_and_code(kind, code, expected):
    gpu = make_gpu(**HEALTHY)
    open_event(gpu, kind, code)

    assert state(gpu).state == expected


@pytest.mark.django_db
def test_a_cleared_event_no_longer_fails_the_gpu():
    gpu = make_gpu(**HEALTHY)
    open_event(gpu, "xid", 79, cleared=NOW - timedelta(seconds=1))

    assert state(gpu).state == "ok"


@pytest.mark.django_db
def test_silence_is_stale_after_two_intervals_plus_grace():
    gpu = make_gpu(**HEALTHY, time=NOW - timedelta(seconds=24))
    set_interval(gpu, 10)
    assert state(gpu).state == "ok"  # 24 s ≤ 2 × 10 s + 5 s

    write_latest(gpu, **HEALTHY, time=NOW - timedelta(seconds=26))
    set_interval(gpu, 10)
    h = state(gpu)
    assert (h.state, h.detail, h.fresh) == ("stale", "no data for 26 s", False)
    assert h.since == NOW - timedelta(seconds=26)


@pytest.mark.django_db
def test_slow_sources_wait_longer_but_never_past_the_cap():
    slow = make_gpu(**HEALTHY, time=NOW - timedelta(seconds=100))
    set_interval(slow, 60)  # a 1-minute scrape: stale after 125 s
    capped = make_gpu(**HEALTHY, time=NOW - timedelta(seconds=181))
    set_interval(capped, 300)  # a 5-minute source still turns stale at the 180-s cap
    unknown = make_gpu(**HEALTHY, time=NOW - timedelta(seconds=179))  # no second sample yet: the cap

    assert [state(g).state for g in (slow, capped, unknown)] == ["ok", "stale", "ok"]


@pytest.mark.django_db
def test_node_down_fails_its_gpus_and_drain_is_draining_until_jobs_leave():
    down = make_gpu(make_node(state=NodeState.DOWN), **HEALTHY)
    drained_node = make_node(state=NodeState.DRAINED)
    drained = make_gpu(drained_node, **HEALTHY)
    job = Job.objects.create(source="slurm", external_id="42", name="train", account="acme", user="u",
                             state="running", submit_time=NOW - timedelta(hours=1))
    Allocation.objects.create(job=job, node=drained_node, gpu=drained, gpu_index=0, start=NOW - timedelta(hours=1))

    assert (state(down).state, state(down).reason) == ("failed", "node_down")
    assert state(drained).state == "draining"
    assert health.node_health([drained_node.id], now=NOW)[drained_node.id].state == "draining"

    Allocation.objects.update(end=NOW - timedelta(minutes=1))
    assert state(drained).state == "drained"


@pytest.mark.django_db
def test_node_names_its_worst_gpu():
    node = make_node()
    make_gpu(node, **HEALTHY)
    bad = make_gpu(node, **HEALTHY)
    open_event(bad, "xid", 79)

    h = health.node_health([node.id], now=NOW)[node.id]

    assert h.state == "failed"
    assert h.detail == "GPU 1: XID 79: GPU has fallen off the bus"


@pytest.mark.django_db
def test_a_tile_never_shows_stale_values_as_current():
    gpu = make_gpu(**{**HEALTHY, "gpu_util": 93.2}, time=NOW - timedelta(minutes=10))
    h = state(gpu)
    tile = gpu_tile({"gpu_util": 93.2, "time": NOW - timedelta(minutes=10)}, h)

    assert tile["gpu_util"] is None and tile["health"] == "stale"
    assert tile["health_detail"] == "no data for 10 min"


@pytest.mark.django_db
def test_heatmap_blanks_a_dead_gpu_and_its_health_metric_says_failed():
    alive = make_gpu(**{**HEALTHY, "gpu_util": 50.0})
    dead = make_gpu(**{**HEALTHY, "gpu_util": 93.2})
    open_event(dead, "fallen_off_bus", 79)

    util = heatmap_values("gpu_util", now=NOW)
    states = heatmap_values("health", now=NOW)

    assert util["values"] == {alive.id: 50.0}
    assert states["categories"][states["values"][dead.id]] == "Failed"
    assert states["categories"][states["values"][alive.id]] == "OK"


# --- ports, racks, fleet ----------------------------------------------------------------------------

def write_port(port: Port, *, time=NOW, **fields) -> None:
    cols = ["port_id", "time", *fields]
    with connection.cursor() as cur:
        cur.execute(f"INSERT INTO {KINDS['port'].latest_table} ({', '.join(cols)}) VALUES "
                    f"({', '.join(['%s'] * len(cols))})", [port.id, time, *fields.values()])


@pytest.mark.django_db
def test_port_rules():
    node = make_node()
    ports = [Port.objects.create(node=node, name=f"mlx5_{i}", speed_gbps=400) for i in range(4)]
    write_port(ports[0], link_state=4, link_speed_gbps=400)
    write_port(ports[1], link_state=1, link_speed_gbps=400)
    write_port(ports[2], link_state=4, link_speed_gbps=200)
    # ports[3] never reported

    got = health.port_health([p.id for p in ports], now=NOW)

    assert [got[p.id].state for p in ports] == ["ok", "failed", "degraded", "stale"]
    assert got[ports[2].id].detail == "link at 200 of 400 Gb/s"
    # The fleet-wide reads that want only what is not OK filter in the database, with the same verdicts.
    not_ok = health.port_health(now=NOW, not_ok=True)
    assert not_ok == {pid: h for pid, h in health.port_health(now=NOW).items() if h.state != "ok"}
    assert set(not_ok) == {p.id for p in ports[1:]}


def test_rack_state_is_failed_or_stale_only_when_every_node_is():
    assert health.rack_state_from(["failed", "failed"]) == "failed"
    assert health.rack_state_from(["stale", "stale"]) == "stale"
    assert health.rack_state_from(["ok", "failed"]) == "degraded"
    assert health.rack_state_from(["ok", "drained"]) == "ok"
    assert health.rack_state_from([]) == "ok"


@pytest.mark.django_db
def test_fleet_counts_agree_with_per_entity_states():
    node = make_node()
    gpus = [make_gpu(node, **HEALTHY) for _ in range(3)]
    open_event(gpus[0], "xid", 79)
    write_latest(gpus[1], **HEALTHY, time=NOW - timedelta(minutes=5))
    make_gpu(make_node(), **HEALTHY)

    counts = health.fleet_counts(now=NOW)
    per_gpu = health.gpu_health(now=NOW)

    assert counts["gpus"] == {"failed": 1, "stale": 1, "ok": 2}
    assert sorted(h.state for h in per_gpu.values()) == sorted(counts["gpus"].elements())
    assert counts["nodes"] == {"failed": 1, "ok": 1}
    assert counts["racks"] == {"failed": 1, "ok": 1}


# --- end to end through ingest ------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_ingest_learns_the_interval_and_a_kmsg_xid_79_fails_the_gpu(client, monkeypatch):
    from telemetry.api import views

    monkeypatch.setattr(views, "_times", lambda: views.TimeParser(NOW, timedelta(minutes=5), timedelta(days=7)))
    token = do_create_collector_token("health-test")

    def post(body):
        resp = client.post("/api/v1/ingest", data=json.dumps(body), content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {token}")
        assert resp.status_code in (200, 202), resp.content

    def sample(t):
        return {"host": "node-h", "uuid": "GPU-h", "pci_bus_id": "00000000:9B:00.0", "time": t.isoformat(),
                "fields": {"gpu_util": 90.0}}

    t0 = NOW - timedelta(seconds=40)
    post({"gpus": [sample(t0)]})
    post({"gpus": [sample(t0 + timedelta(seconds=10))]})
    gpu = Gpu.objects.get(uuid="GPU-h")
    with connection.cursor() as cur:
        cur.execute(f"SELECT interval_s FROM {KINDS['gpu'].latest_table} WHERE gpu_id = %s", [gpu.id])
        assert cur.fetchone()[0] == pytest.approx(10.0)

    # 30 s after its last sample at a 10-s interval: no data.
    assert state(gpu, NOW).state == "stale"

    post({"events": [{"host": "node-h", "pci_bus_id": "00000000:9B:00.0", "kind": "xid", "code": 79,
                      "message": "NVRM: Xid (PCI:0000:9b:00): 79, GPU has fallen off the bus.",
                      "time": (NOW - timedelta(seconds=1)).isoformat(), "source": "kmsg"}]})
    h = state(gpu, NOW)
    assert (h.state, h.reason) == ("failed", "fault_event")


@pytest.mark.django_db
def test_health_api_counts_match_the_lists(admin_client):
    node = make_node()
    dead = make_gpu(node, **HEALTHY)
    make_gpu(node, **HEALTHY)
    open_event(dead, "fallen_off_bus", 79, at=FIXED_NOW)

    body = admin_client.get("/api/v1/health?kind=gpus&state=failed").json()

    assert body["counts"]["gpus"]["failed"] == 1 == body["total"] == len(body["items"])
    assert body["items"][0]["uuid"] == dead.uuid and body["items"][0]["state"] == "failed"
    assert admin_client.get("/api/v1/health?kind=racks").status_code == 400
    assert admin_client.get("/api/v1/health?state=broken").json()["error"]["where"] == "state"


@pytest.mark.django_db
def test_live_pages_are_pushed_when_a_gpu_goes_silent_without_any_ingest(monkeypatch, settings):
    from telemetry import live

    settings.CHANNEL_LAYERS = {**settings.CHANNEL_LAYERS, "default": {
        **settings.CHANNEL_LAYERS["default"],
        "CONFIG": {**settings.CHANNEL_LAYERS["default"].get("CONFIG", {}), "prefix": "bw-test-health-digest"}}}
    sent = []
    monkeypatch.setattr(live, "publish_fleet_summary", lambda: sent.append(1) or True)
    gpu = make_gpu(**HEALTHY, time=NOW - timedelta(seconds=5))
    set_interval(gpu, 10)
    live._redis.delete("bw-test-health-digest:" + live.HEALTH_DIGEST_SUFFIX)

    assert live.publish_on_health_change(now=NOW) is True  # first look
    assert live.publish_on_health_change(now=NOW + timedelta(seconds=10)) is False  # 15 s: still OK
    assert live.publish_on_health_change(now=NOW + timedelta(seconds=22)) is True  # 27 s > 2 × 10 + 5: no data
    assert live.publish_on_health_change(now=NOW + timedelta(seconds=24)) is False
    assert len(sent) == 2

    # While ingest holds a summary slot, the pages have just had (or are about to get) every state: no look.
    live._redis.set(live._throttle_key(), b"busy", px=5000)
    monkeypatch.setattr(live.health, "gpu_states", lambda **kw: pytest.fail("looked while a slot was held"))
    try:
        assert live.publish_on_health_change(now=NOW + timedelta(seconds=60)) is False
    finally:
        live._redis.delete(live._throttle_key())
    assert len(sent) == 2


@pytest.mark.django_db
def test_fabric_and_node_pages_list_a_slow_port_as_degraded(admin_client):
    from django.utils import timezone

    node = make_node()
    slow = Port.objects.create(node=node, name="mlx5_4/1", speed_gbps=400)
    fine = Port.objects.create(node=node, name="mlx5_5/1", speed_gbps=400)
    write_port(slow, time=timezone.now(), link_state=4, link_speed_gbps=200)
    write_port(fine, time=timezone.now(), link_state=4, link_speed_gbps=400)

    fabric = admin_client.get("/fabric/").content.decode()
    node_page = admin_client.get(f"/nodes/{node.hostname}/").content.decode()

    row = fabric[fabric.index(f"{node.hostname}:mlx5_4/1"):]
    assert 'data-health="degraded"' in row[:600] and "link at 200 of 400 Gb/s" in row[:600]
    assert f"{node.hostname}:mlx5_5/1" not in fabric  # OK ports are not listed
    assert node_page.count('data-health="degraded"') == 1 and node_page.count('data-health="ok"') >= 1


@pytest.mark.django_db
def test_fleet_counts_in_sql_agree_with_the_python_node_and_rack_rules():
    from collections import Counter

    rack_nodes = [make_node() for _ in range(3)]
    ok_gpu, dead, silent = (make_gpu(rack_nodes[0], **HEALTHY), make_gpu(rack_nodes[1], **HEALTHY),
                            make_gpu(rack_nodes[2], **HEALTHY, time=NOW - timedelta(minutes=10)))
    open_event(dead, "xid", 79)
    make_gpu(make_node(state=NodeState.DOWN), **HEALTHY)
    drained = make_node(state=NodeState.DRAINED)
    make_gpu(drained, **HEALTHY)
    make_node()  # no GPUs
    make_gpu(make_node(placed=False), **{**HEALTHY, "gpu_temp": 90.0})

    counts = health.fleet_counts(now=NOW)
    nodes = health.node_health(now=NOW)

    assert counts["nodes"] == Counter(h.state for h in nodes.values())
    assert counts["gpus"] == Counter(h.state for h in health.gpu_health(now=NOW).values())
    racks: dict = {}
    for node in Node.objects.filter(rack__isnull=False):
        racks.setdefault(node.rack_id, []).append(nodes[node.id].state)
    assert counts["racks"] == Counter(health.rack_state_from(v) for v in racks.values())
    assert set(counts["failed_gpu_ids"]) == {g for g, h in health.gpu_health(now=NOW).items() if h.state == "failed"}
    assert ok_gpu.id not in counts["failed_gpu_ids"] and silent.id not in counts["failed_gpu_ids"]


@pytest.mark.django_db
def test_fleet_states_carry_the_newest_values_they_were_decided_on():
    alive = make_gpu(**{**HEALTHY, "gpu_util": 50.0})
    dead = make_gpu(**{**HEALTHY, "gpu_util": 93.2})
    open_event(dead, "fallen_off_bus", 79)

    rows = {row[0]: row for row in health.gpu_states(now=NOW, fields=("gpu_util", "gpu_temp"))}

    assert rows[alive.id][3:] == ("ok", True, 50.0, HEALTHY["gpu_temp"])
    assert rows[dead.id][3:5] == ("failed", True) and rows[dead.id][5] == pytest.approx(93.2)
    assert sorted(row[:5] for row in rows.values()) == sorted(health.gpu_states(now=NOW))
    with pytest.raises(ValueError, match="unknown gpu field"):
        health.gpu_states(now=NOW, fields=("gpu_util; DROP TABLE x",))
