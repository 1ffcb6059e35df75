"""GPU fault events: explicit (agent kernel log) and read off samples; deduplicated; cleared by reset."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection

from telemetry.actions import do_create_collector_token
from telemetry.agent.kernel_log import parse_kernel_log
from telemetry.models import Gpu, GpuEvent
from tests.conftest import FIXED_NOW

pytestmark = pytest.mark.django_db(transaction=True)
T0 = FIXED_NOW


@pytest.fixture(autouse=True)
def _fixed_clock(monkeypatch):
    from telemetry.api import views

    monkeypatch.setattr(views, "_times", lambda: views.TimeParser(T0, timedelta(minutes=5), timedelta(days=7)))


@pytest.fixture
def post(client):
    token = do_create_collector_token("events-test")

    def _post(body):
        return client.post("/api/v1/ingest", data=json.dumps(body), content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {token}")

    return _post


def _gpu(uuid, t, host="node-a", bus="00000000:9B:00.0", **fields):
    return {"host": host, "uuid": uuid, "pci_bus_id": bus, "time": t.isoformat(), "fields": fields}


def _events():
    return list(GpuEvent.objects.order_by("first_seen").values_list("kind", "code", "count", "cleared_at"))


def test_xid_gauge_change_opens_event_and_repeat_does_not(post):
    post({"gpus": [_gpu("GPU-1", T0, xid=0)]})
    post({"gpus": [_gpu("GPU-1", T0 + timedelta(seconds=10), xid=79)]})
    post({"gpus": [_gpu("GPU-1", T0 + timedelta(seconds=20), xid=79)]})  # the gauge keeps its last value
    assert _events() == [("xid", 79, 1, None)]


def test_only_the_commit_that_opens_a_fault_event_reports_it_as_new(post):
    """The alert rules are asked at once (unpaced) for a new fault, and paced for everything else."""
    from telemetry.signals import fleet_changed

    seen = []

    def record(sender, new_faults=0, **kwargs):
        seen.append(new_faults)

    fleet_changed.connect(record, weak=False, dispatch_uid="test-new-faults")
    try:
        post({"gpus": [_gpu("GPU-1", T0, xid=0)]})
        post({"gpus": [_gpu("GPU-1", T0 + timedelta(seconds=10), xid=79)]})
        post({"gpus": [_gpu("GPU-1", T0 + timedelta(seconds=20), xid=79)]})
    finally:
        fleet_changed.disconnect(dispatch_uid="test-new-faults")
    assert seen == [0, 1, 0]


def test_dbe_growth_counts_and_reset_clears(post):
    post({"gpus": [_gpu("GPU-1", T0, ecc_dbe_vol=0, energy_mj=5000)]})
    post({"gpus": [_gpu("GPU-1", T0 + timedelta(seconds=10), ecc_dbe_vol=2, energy_mj=6000)]})
    post({"gpus": [_gpu("GPU-1", T0 + timedelta(seconds=20), ecc_dbe_vol=3, energy_mj=7000)]})
    assert _events() == [("ecc_dbe", 0, 3, None)]
    resp = post({"gpus": [_gpu("GPU-1", T0 + timedelta(seconds=30), ecc_dbe_vol=0, energy_mj=10)]})
    assert resp.json()["events"]["cleared"] == 1
    (kind, code, count, cleared_at), = _events()
    assert cleared_at == T0 + timedelta(seconds=30)


def test_row_remap_failure_opens_event(post):
    post({"gpus": [_gpu("GPU-1", T0, row_remap_failure=0)]})
    post({"gpus": [_gpu("GPU-1", T0 + timedelta(seconds=10), row_remap_failure=1)]})
    assert _events() == [("row_remap_failure", 0, 1, None)]


def test_kernel_log_xids_from_the_real_capture_dedupe_by_code(post, shared_data):
    log = (shared_data / "traces/gpud-kernel-logs/dmesg-with-xid-119.log").read_text()
    parsed = parse_kernel_log(log).events
    bus = parsed[0]["pci_bus_id"]
    post({"gpus": [_gpu("GPU-1", T0, bus=bus.lower().replace("00000000:", "0000:"), gpu_util=1.0)]})
    events = [{"host": "node-a", "pci_bus_id": e["pci_bus_id"], "kind": "xid", "code": e["xid"],
               "message": e["message"], "time": (T0 + timedelta(seconds=i)).isoformat(), "source": "kmsg"}
              for i, e in enumerate(parsed)]
    resp = post({"events": events})
    assert resp.status_code == 200, resp.content
    assert _events() == [("xid", 119, len(parsed), None)]
    ev = GpuEvent.objects.get()
    assert ev.gpu == Gpu.objects.get(uuid="GPU-1") and ev.last_seen == T0 + timedelta(seconds=len(parsed) - 1)


def test_event_for_unknown_bus_is_rejected_and_counted(post):
    post({"gpus": [_gpu("GPU-1", T0, gpu_util=1.0)]})
    resp = post({"events": [{"host": "node-a", "pci_bus_id": "0000:01:00.0", "kind": "xid", "code": 48,
                             "time": T0.isoformat()}]})
    assert resp.json()["rejected"] == 1 and "no GPU with PCI bus id" in resp.json()["rejections"][0]["reason"]
    assert not GpuEvent.objects.exists()


def test_bad_event_kind_is_400_and_nothing_written(post):
    resp = post({"gpus": [_gpu("GPU-1", T0, gpu_util=1.0)],
                 "events": [{"host": "node-a", "gpu_uuid": "GPU-1", "kind": "meltdown"}]})
    assert resp.status_code == 400 and resp.json()["error"]["where"] == "$.events[0].kind"
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM telemetry_gpu_sample")
        assert cur.fetchone() == (0,)


def test_event_api_lists_with_meaning_and_action(post, admin_client):
    post({"gpus": [_gpu("GPU-1", T0, xid=48)]})
    data = admin_client.get("/api/v1/events?open=1").json()
    (ev,) = data["events"]
    assert ev["gpu_uuid"] == "GPU-1" and ev["code"] == 48 and ev["action"] == "reset_gpu"
    assert "ECC" in ev["meaning"] or "ecc" in ev["meaning"].lower()


def test_event_api_needs_login(client):
    assert client.get("/api/v1/events").status_code == 401


def test_nvlink_error_growth_opens_event_but_a_baseline_does_not(post):
    post({"gpus": [_gpu("GPU-1", T0, nvlink_crc_flit_errors=7, nvlink_replay_errors=3)]})
    assert _events() == []  # the first sight is a baseline
    post({"gpus": [_gpu("GPU-1", T0 + timedelta(seconds=10), nvlink_crc_flit_errors=9, nvlink_replay_errors=4)]})
    post({"gpus": [_gpu("GPU-1", T0 + timedelta(seconds=20), nvlink_crc_flit_errors=19, nvlink_replay_errors=4)]})
    assert _events() == [("nvlink_errors", 0, 13, None)]


def test_garbled_bus_id_is_rejected_per_event_not_a_server_error(post):
    post({"gpus": [_gpu("GPU-1", T0, gpu_util=1.0)]})
    resp = post({"events": [{"host": "node-a", "pci_bus_id": "zz:not:a-bus", "kind": "xid", "code": 13,
                             "time": T0.isoformat()}]})
    assert resp.status_code == 200 and resp.json()["rejected"] == 1


def test_bus_ids_match_across_domain_width_and_case():
    from telemetry.ingest.entities import _bus_key

    assert _bus_key("0000:9b:00") == _bus_key("00000000:9B:00.0") == _bus_key("9b:00.0")
    assert _bus_key("00000000:9B:00.0") != _bus_key("00000000:9C:00.0")
