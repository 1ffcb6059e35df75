"""The search box: hostnames, GPU UUIDs and serials, job ids and keys, tenants, and their ranking."""

from __future__ import annotations

from pathlib import Path

import pytest

from telemetry.models import Job, JobState, Node
from telemetry.selectors import search
from telemetry.topology import do_import_topology, load_topology_file

pytestmark = pytest.mark.django_db

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
GPU_0001_0 = "GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa"  # gpu-0001 index 0, serial 1650124031592


@pytest.fixture
def cluster():
    do_import_topology(load_topology_file(FIXTURES / "good.yaml"))


def _job(external_id: str, account: str = "ml-research", state: str = JobState.RUNNING, source: str = "slurm"):
    return Job.objects.create(source=source, external_id=external_id, name=f"run-{external_id}", user="alice",
                              account=account, state=state)


def _hits(q: str, **kw) -> list[tuple[str, str, str]]:
    return [(h["kind"], h["key"], h["match"]) for h in search(q, **kw)]


def test_blank_queries_find_nothing(cluster):
    assert search("") == [] and search("   \t") == [] and search(None) == []


def test_hostname_prefix_is_case_insensitive(cluster):
    assert _hits("GPU-000") == [("node", f"gpu-000{i}", "prefix") for i in (1, 2, 3)]
    assert _hits("Gpu-0001") == [("node", "gpu-0001", "exact")]


def test_hostname_fragment_matches_after_prefixes(cluster):
    Node.objects.create(hostname="login-0001")
    assert _hits("0001") == [("node", "gb-0001", "contains"), ("node", "gpu-0001", "contains"),
                             ("node", "login-0001", "contains")]


def test_mixed_case_hostname_is_still_found_and_ranked_as_prefix(cluster):
    Node.objects.create(hostname="GPU-0009")
    assert ("node", "GPU-0009", "prefix") in _hits("gpu-000")


def test_node_hit_says_where_it_is(cluster):
    hit = search("gpu-0001")[0]
    assert hit == {"kind": "node", "key": "gpu-0001", "label": "gpu-0001", "match": "exact",
                   "detail": "rack r01-01 · 4 GPUs · active"}


def test_gpu_uuid_with_or_without_prefix(cluster):
    assert _hits("ee7954ec") == [("gpu", GPU_0001_0, "prefix")]
    assert _hits("GPU-EE7954EC-DA95") == [("gpu", GPU_0001_0, "prefix")]
    assert _hits(GPU_0001_0) == [("gpu", GPU_0001_0, "exact")]
    assert _hits(GPU_0001_0[4:]) == [("gpu", GPU_0001_0, "exact")]
    assert search("ee7954ec")[0]["detail"] == "gpu-0001 GPU 0 · NVIDIA H100 80GB HBM3 · serial 1650124031592"


def test_gpu_serial_exact_or_prefix(cluster):
    assert _hits("1650124031592") == [("gpu", GPU_0001_0, "exact")]
    assert {key for _, key, match in _hits("165012403") if match == "prefix"} == {
        GPU_0001_0, "GPU-afe9f2ed-9dd0-572c-3cd8-b42b58b3bc99"}
    assert _hits("165") == []  # too short for a serial prefix


def test_job_by_id_prefix_and_key():
    _job("4242")
    _job("42421")
    _job("4242", source="k8s")
    _job("7")
    assert _hits("4242") == [("job", "k8s:4242", "exact"), ("job", "slurm:4242", "exact"),
                             ("job", "slurm:42421", "prefix")]
    assert _hits("slurm:4242") == [("job", "slurm:4242", "exact")]
    assert _hits("SLURM:4242") == [("job", "slurm:4242", "exact")]
    assert _hits("lsf:4242") == [] and _hits("slurm:") == []
    hit = search("slurm:7")[0]
    assert (hit["label"], hit["detail"]) == ("slurm:7 run-7", "alice · ml-research · Running")


def test_tenant_is_an_exact_case_insensitive_account_with_job_counts():
    _job("1")
    _job("2", state=JobState.PENDING)
    _job("3", state=JobState.COMPLETED)
    _job("4", account="vision")
    hits = search("ML-Research")
    assert [(h["kind"], h["key"]) for h in hits] == [("tenant", "ml-research")]
    assert (hits[0]["jobs"], hits[0]["running"], hits[0]["pending"]) == (3, 1, 1)
    assert hits[0]["detail"] == "3 jobs · 1 running · 1 pending"
    assert search("ml-res") == []  # tenants match exactly only


def test_exact_matches_come_before_prefixes_before_fragments(cluster):
    Node.objects.create(hostname="gb-0001-bmc")
    Node.objects.create(hostname="old-gb-0001")
    _job("gb-0001")
    assert _hits("gb-0001") == [
        ("node", "gb-0001", "exact"), ("job", "slurm:gb-0001", "exact"),
        ("node", "gb-0001-bmc", "prefix"), ("node", "old-gb-0001", "contains"),
    ]


def test_limit_caps_the_answer(cluster):
    assert len(search("gpu", limit=2)) == 2
    assert search("gpu", limit=0) == []


def test_an_empty_inventory_finds_nothing():
    assert search("gpu-0001") == [] and search("GPU-ee7954ec") == [] and search("slurm:1") == []


def test_wildcards_in_the_query_are_literal(cluster):
    assert search("gpu%") == [] and search("gpu_0001") == []
