"""The search box's telemetry half: every kind found by every form of query, ranked, with its health."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest

from telemetry.models import Gpu, GpuEvent, Job, JobState, Node, Port, Rack, Switch
from telemetry.selectors.search import MAX_QUERY, search
from telemetry.topology import do_import_topology, load_topology_file
from tests.conftest import FIXED_NOW

pytestmark = pytest.mark.django_db

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
GPU_0001_0 = "GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa"  # gpu-0001 index 0, serial 1650124031592
GPU_0001_1 = "GPU-47daa2ad-a218-6286-252b-af45f0dfaf00"  # serial 1650124008135
GPU_0001_2 = "GPU-167d8376-ee13-fca4-938a-a05167c43cdc"  # serial 1650124047722


@pytest.fixture
def cluster():
    do_import_topology(load_topology_file(FIXTURES / "good.yaml"))


def _job(external_id: str, *, name: str = "", user: str = "alice", state: str = JobState.RUNNING,
         source: str = "slurm") -> Job:
    return Job.objects.create(source=source, external_id=external_id, name=name or f"run-{external_id}", user=user,
                              account="ml-research", state=state)


def _find(q: str, **kw) -> dict:
    return search(q, now=FIXED_NOW, **kw)


def _hits(q: str, kind: str, **kw) -> list[tuple[str, str]]:
    return [(h["key"], h["match"]) for h in _find(q, **kw).get(kind, {}).get("hits", [])]


def _fail(uuid: str) -> None:
    """An open XID 79: the health model calls the GPU failed."""
    GpuEvent.objects.create(gpu=Gpu.objects.get(uuid=uuid), kind="fallen_off_bus", code=79, source="kmsg",
                            first_seen=FIXED_NOW - timedelta(minutes=5), last_seen=FIXED_NOW - timedelta(minutes=5))


# --- Nodes and racks -----------------------------------------------------------------------------

def test_hostname_exact_prefix_and_fragment_case_insensitive(cluster):
    assert _hits("GPU-0001", "node") == [("gpu-0001", "exact")]
    assert _hits("Gpu-000", "node") == [(f"gpu-000{i}", "prefix") for i in (1, 2, 3)]
    Node.objects.create(hostname="login-0001")
    assert _hits("0001", "node") == [("gb-0001", "contains"), ("gpu-0001", "contains"), ("login-0001", "contains")]


def test_node_hit_says_where_it_is_and_its_health(cluster):
    hit = _find("gpu-0001")["node"]["hits"][0]
    assert hit["detail"] == "rack r01-01 · 4 GPUs · active"
    assert (hit["state"], hit["state_detail"]) == ("stale", "no data yet")  # it never reported


def test_rack_by_name_prefix_and_fragment(cluster):
    assert _hits("r01-01", "rack") == [("r01-01", "exact")]
    assert _hits("R01", "rack") == [("r01-01", "prefix"), ("r01-02", "prefix")]
    assert _hits("1-0", "rack") == [("r01-01", "contains"), ("r01-02", "contains")]
    hit = _find("r01-01")["rack"]["hits"][0]
    assert hit["detail"] == "hall hall-a row row-01 · 2 nodes" and hit["state"] == "stale"


# --- GPUs ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("q", ["gpu-0001 gpu 2", "gpu-0001 gpu2", "GPU-0001 GPU 2", "gpu-0001/2", "gpu-0001:2",
                               "gpu-0001 2", "gpu-0001#2"])
def test_gpu_by_host_and_index(cluster, q):
    assert _hits(q, "gpu") == [(GPU_0001_2, "exact")]


def test_gpu_by_partial_host_and_index(cluster):
    assert _hits("0003/0", "gpu") == [("GPU-4ef109e9-e925-4834-2b85-0771b4ef696c", "contains")]
    assert _hits("gpu-0001/9", "gpu") == []


def test_gpu_uuid_with_or_without_prefix(cluster):
    assert _hits("ee7954ec", "gpu") == [(GPU_0001_0, "prefix")]
    assert _hits("GPU-EE7954EC-DA95", "gpu") == [(GPU_0001_0, "prefix")]
    assert _hits(GPU_0001_0, "gpu") == [(GPU_0001_0, "exact")]
    assert _hits(GPU_0001_0[4:], "gpu") == [(GPU_0001_0, "exact")]
    hit = _find("ee7954ec")["gpu"]["hits"][0]
    assert hit["label"] == "gpu-0001 GPU 0"
    assert hit["detail"] == f"{GPU_0001_0} · NVIDIA H100 80GB HBM3 · serial 1650124031592"


def test_gpu_serial_exact_or_prefix(cluster):
    assert _hits("1650124031592", "gpu") == [(GPU_0001_0, "exact")]
    assert {k for k, m in _hits("165012403", "gpu") if m == "prefix"} == {
        GPU_0001_0, "GPU-afe9f2ed-9dd0-572c-3cd8-b42b58b3bc99"}
    assert _hits("165", "gpu") == []  # too short for a serial prefix


def test_failed_gpu_shows_failed_and_ranks_first_in_its_tier(cluster):
    _fail(GPU_0001_1)
    hits = _find("1650124")["gpu"]["hits"]
    assert [h["match"] for h in hits] == ["prefix"] * 4
    assert (hits[0]["key"], hits[0]["state"], hits[0]["state_detail"]) == (
        GPU_0001_1, "failed", "XID 79: GPU has fallen off the bus")
    assert {h["state"] for h in hits[1:]} == {"stale"}
    nodes = _find("gpu-000")["node"]["hits"]
    assert [(h["key"], h["state"]) for h in nodes] == [
        ("gpu-0001", "failed"), ("gpu-0002", "stale"), ("gpu-0003", "stale")]


# --- Jobs ----------------------------------------------------------------------------------------

def test_job_by_id_prefix_and_key():
    _job("4242")
    _job("42421")
    _job("4242", source="k8s")
    assert _hits("4242", "job") == [("k8s:4242", "exact"), ("slurm:4242", "exact"), ("slurm:42421", "prefix")]
    assert _hits("slurm:4242", "job") == [("slurm:4242", "exact")]
    assert _hits("SLURM:4242", "job") == [("slurm:4242", "exact")]
    assert _hits("lsf:4242", "job") == [] and _hits("slurm:", "job") == []


def test_kubernetes_pod_by_uid_prefix():
    _job("3f2c9a10-5b7e-4d2a-9c61-0e8f4b7a2d11", source="k8s", name="train-llama")
    assert _hits("3f2c9a10", "job") == [("k8s:3f2c9a10-5b7e-4d2a-9c61-0e8f4b7a2d11", "prefix")]
    assert _hits("k8s:3f2c9a10-5b7e-4d2a-9c61-0e8f4b7a2d11", "job")[0][1] == "exact"


def test_job_by_name_and_by_user():
    _job("1", name="llama-70b-pretrain", user="bob")
    _job("2", name="Llama-eval", user="carol")
    _job("3", name="resnet", user="llama-ops")
    assert _hits("llama-eval", "job") == [("slurm:2", "exact")]
    assert _hits("LLAMA", "job") == [("slurm:3", "prefix"), ("slurm:2", "prefix"), ("slurm:1", "prefix")]
    assert _hits("70b", "job") == [("slurm:1", "contains")]
    assert _hits("carol", "job") == [("slurm:2", "exact")]
    hit = _find("carol")["job"]["hits"][0]
    assert (hit["label"], hit["detail"], hit["state"]) == ("slurm:2 Llama-eval", "carol · ml-research · Running",
                                                           "running")


def test_running_and_pending_jobs_before_finished_then_newest():
    _job("10", name="sweep-a", state=JobState.COMPLETED)
    _job("11", name="sweep-b", state=JobState.RUNNING)
    _job("12", name="sweep-c", state=JobState.FAILED)
    _job("13", name="sweep-d", state=JobState.PENDING)
    assert [k for k, _ in _hits("sweep", "job")] == ["slurm:13", "slurm:11", "slurm:12", "slurm:10"]


# --- Fabric --------------------------------------------------------------------------------------

def test_switch_by_name(cluster):
    assert _hits("leaf-01", "switch") == [("leaf-01", "exact")]
    assert _hits("SPINE", "switch") == [("spine-01", "prefix")]
    hit = _find("spine-01")["switch"]["hits"][0]
    assert hit["detail"] == "Spine · 4 ports" and hit["state"] == "stale"


def test_port_by_owner_and_name_bare_name_guid_and_lid(cluster):
    p8 = Port.objects.get(switch__name="leaf-01", name="p8")
    hca = Port.objects.get(node__hostname="gpu-0001", name="mlx5_0/1")
    hca2 = Port.objects.get(node__hostname="gpu-0002", name="mlx5_0/1")
    assert _hits("leaf-01/p8", "port") == [(str(p8.id), "exact")]
    assert _hits("LEAF-01:P8", "port") == [(str(p8.id), "exact")]
    assert (str(p8.id), "prefix") in _hits("leaf-01/", "port")
    assert _hits("gpu-0001/mlx5_0/1", "port") == [(str(hca.id), "exact")]
    assert sorted(_hits("mlx5_0/1", "port")) == sorted([(str(hca.id), "exact"), (str(hca2.id), "exact")])
    assert _hits("a288c2fffee3142a", "port") == [(str(hca.id), "exact")]
    assert _hits("0xA288C2FFFEE3142A", "port") == [(str(hca.id), "exact")]
    assert (str(hca.id), "prefix") in _hits("0xa288c2ff", "port")
    assert _hits("12", "port") == [(str(hca.id), "exact")]  # its LID
    hit = _find("gpu-0001/mlx5_0/1")["port"]["hits"][0]
    assert hit["label"] == "gpu-0001/mlx5_0/1" and hit["state"] == "stale"
    assert hit["detail"] == "HCA port · rail 0 · 0xa288c2fffee3142a · LID 12 · 400 Gb/s"


# --- Ranking, limits, scoping and bad input ------------------------------------------------------

def test_exact_before_prefix_before_fragment_within_a_kind(cluster):
    Node.objects.create(hostname="gb-0001-bmc")
    Node.objects.create(hostname="old-gb-0001")
    assert _hits("gb-0001", "node") == [("gb-0001", "exact"), ("gb-0001-bmc", "prefix"), ("old-gb-0001", "contains")]


def test_limit_caps_each_kind_and_says_there_is_more(cluster):
    found = _find("gpu", limit=2)
    assert len(found["node"]["hits"]) == 2 and found["node"]["more"] is True
    assert _find("gpu-0001", limit=5)["node"]["more"] is False
    assert _find("gpu", limit=0) == {}


def test_narrow_scopes_every_kind(cluster):
    def only_gpu_0002(qs):
        if qs.model is Node:
            return qs.filter(hostname="gpu-0002")
        return qs if qs.model is Gpu else qs.none()

    found = search("gpu-000", narrow=only_gpu_0002, now=FIXED_NOW)
    assert list(found) == ["node"] and [h["key"] for h in found["node"]["hits"]] == ["gpu-0002"]
    assert search("leaf-01", narrow=only_gpu_0002, now=FIXED_NOW) == {}
    assert Switch.objects.filter(name="leaf-01").exists() and Rack.objects.exists()


@pytest.mark.parametrize("q", ["", "   \t", None, "x" * (MAX_QUERY + 1), "gpu\x00-0001", "gpu\n0001"])
def test_blank_long_or_control_character_queries_find_nothing(cluster, q):
    assert search(q) == {}


@pytest.mark.parametrize("q", ["%", "gpu%", "gpu_0001", "'; DROP TABLE telemetry_node; --", "\\", "*", "🙂",
                               "x" * MAX_QUERY])
def test_garbage_is_literal_and_harmless(cluster, q):
    before = Node.objects.count()
    assert "node" not in _find(q)
    assert Node.objects.count() == before


def test_an_empty_inventory_finds_nothing():
    assert search("gpu-0001") == {} and search("GPU-ee7954ec") == {} and search("slurm:1") == {}


def test_a_2048_gpu_fleet_answers_in_milliseconds(capsys):
    """256 nodes of 8 GPUs with 2 HCA ports each, 50k jobs: the worst queries (fragments) stay fast."""
    nodes = Node.objects.bulk_create(Node(hostname=f"node-{i:04d}") for i in range(256))
    Gpu.objects.bulk_create(Gpu(node=n, index=g, uuid=f"GPU-{i:08x}-0000-0000-0000-{g:012x}", serial=f"{i:06d}{g}")
                            for i, n in enumerate(nodes) for g in range(8))
    Port.objects.bulk_create(Port(node=n, name=f"mlx5_{p}", lid=i * 2 + p + 1) for i, n in enumerate(nodes)
                             for p in range(2))
    Job.objects.bulk_create(Job(source="slurm", external_id=str(100000 + j), name=f"train-{j % 997}", user=f"u{j % 50}",
                                account="acct", state=JobState.COMPLETED) for j in range(50000))
    timings = {}
    for q in ("node-0227 gpu 7", "gpu-0227/7", "node-02", "0227", "train-99", "rain-4", "mlx5_1", "u7", "zzz"):
        start = time.perf_counter()
        _find(q, limit=50)
        timings[q] = (time.perf_counter() - start) * 1000
    assert _hits("node-0227 gpu 7", "gpu") == [("GPU-000000e3-0000-0000-0000-000000000007", "exact")]
    with capsys.disabled():
        print("\nsearch ms at 2,048 GPUs / 50k jobs:", {q: round(ms, 1) for q, ms in timings.items()})
    assert max(timings.values()) < 1000, timings
