"""GPU and node drill-downs and the allocation ledger."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from telemetry.fields import GPU_FIELDS
from telemetry.models import SAMPLE_MODELS, Allocation, Gpu, Job, JobState, Node, NodeState
from telemetry.selectors import allocation_history, gpu_detail, node_detail
from telemetry.topology import do_import_topology, load_topology_file
from tests.conftest import FIXED_NOW

pytestmark = pytest.mark.django_db

NOW = FIXED_NOW
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
GPU_0001_2 = "GPU-167d8376-ee13-fca4-938a-a05167c43cdc"  # gpu-0001, index 2, in MIG mode
LATEST = SAMPLE_MODELS["gpu"]["latest"]


@pytest.fixture
def cluster():
    do_import_topology(load_topology_file(FIXTURES / "good.yaml"))


def _job(external_id: str, **kw) -> Job:
    return Job.objects.create(source="slurm", external_id=external_id, name=f"run-{external_id}", user="alice",
                              account="ml", state=kw.pop("state", JobState.RUNNING), **kw)


def _hold(job: Job, host: str, indexes: list[int], start, end=None) -> None:
    node = Node.objects.get(hostname=host)
    for i in indexes:
        Allocation.objects.create(job=job, node=node, gpu=Gpu.objects.filter(node=node, index=i).first(),
                                  gpu_index=i, start=start, end=end)


# --- GPU -----------------------------------------------------------------------------------------

def test_gpu_detail_places_and_describes_the_gpu(cluster):
    d = gpu_detail(GPU_0001_2, now=NOW)
    assert (d["index"], d["serial"], d["pci_bus_id"], d["mig_mode"]) == (2, "1650124047722", "00000000:4C:00.0", True)
    assert d["model"] == "NVIDIA H100 80GB HBM3"
    assert d["node"]["hostname"] == "gpu-0001"
    assert d["location"] == {"site": "dc1", "hall": "hall-a", "row": "row-01", "rack": "r01-01", "u_position": 2,
                             "u_height": 8, "nvlink_domain": "nvd-gpu-0001", "nvlink_domain_kind": "node"}
    assert [(m["gi_id"], m["ci_id"], m["profile"]) for m in d["mig_instances"]] == [(1, 0, "3g.40gb"),
                                                                                   (2, 0, "3g.40gb")]
    assert gpu_detail(GPU_0001_2[4:], now=NOW)["uuid"] == GPU_0001_2
    assert gpu_detail(" gpu-" + GPU_0001_2[4:], now=NOW)["uuid"] == GPU_0001_2


def test_gpu_detail_has_latest_values_and_every_plottable_field(cluster):
    gpu = Gpu.objects.get(uuid=GPU_0001_2)
    LATEST.objects.create(gpu_id=gpu.id, time=NOW - timedelta(seconds=30), gpu_util=55.0, power_w=410.0,
                          ecc_dbe_vol=1)
    d = gpu_detail(GPU_0001_2, now=NOW)
    latest = {v["name"]: v for v in d["latest"]}
    assert len(d["latest"]) == len(GPU_FIELDS) == len(d["fields"])
    assert latest["gpu_util"] == {"name": "gpu_util", "label": "GPU utilization", "unit": "%", "kind": "gauge",
                                  "value": 55.0, "time": (NOW - timedelta(seconds=30)).isoformat()}
    assert latest["gpu_temp"]["value"] is None
    assert d["fields"][0] == {"name": "gpu_util", "label": "GPU utilization", "unit": "%", "kind": "gauge"}
    assert {f["kind"] for f in d["fields"]} == {"gauge", "counter", "state"}
    assert d["health"] == "failed"  # a volatile double-bit ECC error
    json.dumps(d)


def test_gpu_detail_shows_the_current_allocation(cluster):
    old = _job("1", state=JobState.COMPLETED)
    _hold(old, "gpu-0001", [2], NOW - timedelta(hours=5), NOW - timedelta(hours=4))
    current = _job("2")
    _hold(current, "gpu-0001", [2], NOW - timedelta(hours=1))
    alloc = gpu_detail(GPU_0001_2, now=NOW)["allocation"]
    assert (alloc["key"], alloc["name"], alloc["account"], alloc["tenant"]) == ("slurm:2", "run-2", "ml", "ml")


def test_a_gpu_never_sampled_or_held_has_no_values(cluster):
    d = gpu_detail(GPU_0001_2, now=NOW)
    assert d["allocation"] is None and d["allocations"] == [] and d["sample_time"] is None
    assert all(v["value"] is None and v["time"] is None for v in d["latest"])
    assert d["health"] == "stale"


def test_unknown_gpu_is_none(cluster):
    assert gpu_detail("GPU-00000000-0000-0000-0000-000000000000", now=NOW) is None


def test_an_unplaced_gpu_has_no_location():
    node = Node.objects.create(hostname="stray")
    Gpu.objects.create(uuid="GPU-stray-0", node=node, index=0)
    d = gpu_detail("GPU-stray-0", now=NOW)
    assert d["location"]["rack"] is None and d["location"]["site"] is None and d["health"] == "stale"


# --- Node ----------------------------------------------------------------------------------------

def test_node_detail_lists_gpus_ports_power_and_jobs(cluster):
    gpus = {g.index: g for g in Gpu.objects.filter(node__hostname="gpu-0001")}
    LATEST.objects.create(gpu_id=gpus[0].id, time=NOW - timedelta(seconds=5), gpu_util=99.0, gpu_temp=60.0,
                          power_w=650.0)
    job = _job("9")
    _hold(job, "gpu-0001", [0, 1], NOW - timedelta(hours=1))
    d = node_detail("gpu-0001", now=NOW)
    assert (d["state"], d["system_model"], d["location"]["rack"], d["location"]["u_position"]) == (
        "active", "DGX H100", "r01-01", 2)
    assert [(g["index"], g["gpu_util"], g["gpu_temp"], g["power_w"], g["health"]) for g in d["gpus"]] == [
        (0, 99.0, 60.0, 650.0, "ok"), (1, None, None, None, "stale"), (2, None, None, None, "stale"),
        (3, None, None, None, "stale")]
    assert d["health"] == "stale"
    assert [(p["name"], p["rail"], p["guid"], p["peer"]) for p in d["ports"]] == [
        ("mlx5_0/1", 0, "0xa288c2fffee3142a", {"switch": "leaf-01", "role": "leaf", "port": "p1"}),
        ("mlx5_1/1", 1, "0xa288c2fffee313fa", {"switch": "leaf-01", "role": "leaf", "port": "p2"})]
    assert [(p["name"], p["kind"], p["via"], p["upstream"]) for p in d["power_devices"]] == [
        ("psu-gpu-0001-1", "psu", "node", "pdu-r01-01-a"),
        ("loop-hall-a-1", "cooling_loop", "rack", None), ("pdu-r01-01-a", "pdu", "rack", None)]
    assert [(j["key"], j["gpu_indexes"], j["tenant"]) for j in d["jobs"]] == [("slurm:9", [0, 1], "ml")]
    json.dumps(d)


def test_a_port_cabled_as_the_far_end_still_finds_its_switch(cluster):
    # good.yaml cables gpu-0002 as the second end of its link.
    assert node_detail("gpu-0002", now=NOW)["ports"][0]["peer"] == {"switch": "leaf-01", "role": "leaf", "port": "p3"}


def test_a_node_without_gpus_ports_or_jobs(cluster):
    d = node_detail("gb-0002", now=NOW)
    assert (d["gpus"], d["ports"], d["jobs"], d["health"]) == ([], [], [], "ok")
    assert [(p["name"], p["via"]) for p in d["power_devices"]] == [("shelf-r02-01", "node"), ("loop-hall-a-1", "rack")]


def test_a_drained_node_is_drained_whatever_its_gpus_say(cluster):
    Node.objects.filter(hostname="gpu-0003").update(state=NodeState.DRAINED)
    d = node_detail("gpu-0003", now=NOW)
    assert d["health"] == "drained" and d["gpus"][0]["health"] == "drained"


def test_unknown_and_unplaced_nodes():
    assert node_detail("nope", now=NOW) is None
    Node.objects.create(hostname="stray")
    d = node_detail("stray", now=NOW)
    # Placement is not health: a stray node with nothing on it has nothing wrong either.
    assert d["placed"] is False and d["health"] == "ok" and d["power_devices"] == []


# --- Allocation history --------------------------------------------------------------------------

def test_gpu_history_is_newest_first_with_durations(cluster):
    gpu = Gpu.objects.get(uuid=GPU_0001_2)
    first, second = _job("1", state=JobState.COMPLETED), _job("2")
    _hold(first, "gpu-0001", [2], NOW - timedelta(hours=5), NOW - timedelta(hours=3))
    _hold(second, "gpu-0001", [2], NOW - timedelta(minutes=30))
    rows = allocation_history(gpu_id=gpu.id, now=NOW)
    assert [(r["key"], r["open"], r["duration_s"], r["gpu_indexes"]) for r in rows] == [
        ("slurm:2", True, 1800.0, [2]), ("slurm:1", False, 7200.0, [2])]
    assert (rows[1]["end"], rows[1]["user"], rows[1]["tenant"], rows[1]["host"]) == (
        (NOW - timedelta(hours=3)).isoformat(), "alice", "ml", "gpu-0001")


def test_node_history_groups_a_jobs_gpus(cluster):
    node = Node.objects.get(hostname="gpu-0001")
    a, b = _job("1", state=JobState.COMPLETED), _job("2")
    _hold(a, "gpu-0001", [3, 0, 1], NOW - timedelta(hours=5), NOW - timedelta(hours=4))
    _hold(b, "gpu-0001", [2], NOW - timedelta(hours=1))
    _hold(b, "gpu-0002", [0], NOW - timedelta(hours=1))
    rows = allocation_history(node_id=node.id, now=NOW)
    assert [(r["key"], r["gpu_indexes"]) for r in rows] == [("slurm:2", [2]), ("slurm:1", [0, 1, 3])]
    assert len(allocation_history(node_id=node.id, limit=1, now=NOW)) == 1


def test_history_of_an_idle_gpu_is_empty_and_needs_a_subject(cluster):
    assert allocation_history(gpu_id=Gpu.objects.get(uuid=GPU_0001_2).id, now=NOW) == []
    with pytest.raises(ValueError):
        allocation_history()
