"""The agent end to end: fake NVML (shaped from a real H200), the real sysfs InfiniBand tree and a
real kernel log, collected into one batch and pushed to a real daphne."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.db import connection

from telemetry.actions import do_create_collector_token
from telemetry.agent.pusher import Pusher
from telemetry.agent.runner import collect_batch, discover
from telemetry.models import GpuEvent
from tests.agent.fake_nvml import h200_from_capture, make_nvml

pytestmark = pytest.mark.django_db(transaction=True)


def _ib_root(shared_data: Path) -> Path:
    return next(p.parent for p in (shared_data / "fabric/gpud-sysfs-infiniband").rglob("mlx5_0") if p.is_dir())


def test_one_tick_delivers_gpus_ports_and_kernel_xids(asgi_server, shared_data, tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("6,1,100,-;boot noise from before the agent started\n")
    gpu = h200_from_capture()
    gpu.bus_id = "00000000:9B:00.0"  # where the captured Xid 119 lines point
    src = discover("h200-node", ib_root=_ib_root(shared_data), kmsg_path=str(kmsg), nvml_module=make_nvml([gpu]))
    log = (shared_data / "traces/gpud-kernel-logs/dmesg-with-xid-119.log").read_text()
    with kmsg.open("a") as f:
        f.write(log)
    batch, problems = collect_batch(src)
    assert problems == []
    assert len(batch["gpus"]) == 1 and len(batch["ports"]) >= 8 and batch["events"]
    token = do_create_collector_token("agent-h200-node")
    assert Pusher(asgi_server.url, token, tmp_path / "spool").push(batch)
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM telemetry_port_sample")
        assert cur.fetchone()[0] == len(batch["ports"])
        cur.execute("SELECT power_w FROM telemetry_gpu_sample")
        assert cur.fetchone()[0] == pytest.approx(gpu.power_mw / 1000)
    ev = GpuEvent.objects.get()
    assert (ev.kind, ev.code, ev.count) == ("xid", 119, len(batch["events"]))


def test_agent_command_without_nvml_or_server_spools_and_exits(tmp_path):
    """`python -m telemetry.agent --once` on a machine with no GPU and no server: it runs, spools, exits 0."""
    env = {**os.environ, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run(
        [sys.executable, "-m", "telemetry.agent", "--server", "http://127.0.0.1:9", "--token", "t", "--once",
         "--spool", str(tmp_path), "--kmsg", "", "--infiniband", str(tmp_path / "none")],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "nvml unavailable" in proc.stderr
    assert "django" not in proc.stderr.lower()


def test_gpu_falling_off_the_bus_becomes_an_event_with_its_last_known_uuid(tmp_path):
    gpus = [h200_from_capture()]
    src = discover("h200-node", ib_root=tmp_path / "none", kmsg_path=None, nvml_module=make_nvml(gpus))
    first, _ = collect_batch(src)
    assert len(first["gpus"]) == 1 and "events" not in first
    gpus[0].lost = True
    second, problems = collect_batch(src)
    assert "gpus" not in second
    assert second["events"] == [{"host": "h200-node", "gpu_uuid": gpus[0].uuid, "kind": "fallen_off_bus",
                                 "code": 79, "source": "nvml", "message": "NVML: GPU is lost"}]


def test_agent_reports_its_health_and_the_server_keeps_the_newest(asgi_server, tmp_path):
    from telemetry.agent.runner import run
    from telemetry.models import AgentStatus

    token = do_create_collector_token("agent-health")
    src = discover("health-node", ib_root=tmp_path / "none", kmsg_path=None,
                   nvml_module=make_nvml([h200_from_capture()]))
    pusher = Pusher(asgi_server.url, token, tmp_path / "spool")
    run(src, pusher, interval=0.01, ticks=2)
    status = AgentStatus.objects.get(hostname="health-node")
    assert status.collector == "agent-health"
    assert status.health["sent_batches"] == 1 and status.health["sources"]["nvml"] is True  # 1 sent before the 2nd


def test_batch_the_agent_built_on_a_real_h200_is_accepted_by_ingest(client):
    """The fixture was produced by collect_batch() with the real NVML on a lent H200."""
    from telemetry.fields import KINDS

    fixture = Path(__file__).resolve().parents[1] / "fixtures/device/nvidia-h200/agent-batch.json"
    batch = json.loads(fixture.read_text())
    assert set(batch["gpus"][0]["fields"]) <= set(KINDS["gpu"].by_name)
    token = do_create_collector_token("h200-capture")
    batch["time"] = datetime.now(UTC).isoformat()  # the capture is older than raw retention allows
    resp = client.post("/api/v1/ingest", data=json.dumps(batch), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {token}")
    assert resp.status_code == 200, resp.content
    assert resp.json()["rejected"] == 0 and resp.json()["accepted"] == len(batch["gpus"][0]["fields"])
