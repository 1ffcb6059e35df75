"""Pod and Node mapping (pure), the pod sync action against the real database, and the Alibaba node import."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
import yaml

from telemetry.k8s.actions import do_import_k8s_nodes, do_sync_k8s_pods
from telemetry.k8s.pods import is_gpu_pod, job_from_pod, mig_share, nodes_from_k8s
from telemetry.models import Allocation, Gpu, Job, JobStateChange, Node
from tests.conftest import FIXED_NOW
from tests.k8s.mock_apiserver import gpu_pod

NOW = FIXED_NOW


def _t(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def _disruption(reason: str, at: str = "2026-11-30T11:00:00Z") -> dict:
    return {"type": "DisruptionTarget", "status": "True", "reason": reason, "lastTransitionTime": at,
            "message": "Kubernetes ended the pod"}


# --- mapping -------------------------------------------------------------------------------------
def test_pending_pod_maps_to_pending_without_start():
    job = job_from_pod(gpu_pod("train", "u-1", phase="Pending", node=""), NOW)
    assert (job.state, job.start, job.end, job.node) == ("pending", None, None, "")
    assert job.submit == _t("2026-11-30T10:00:00Z") and job.gpu_count == 1


def test_running_pod_maps_to_running_with_start_and_namespace():
    job = job_from_pod(gpu_pod("train", "u-1", limits={"nvidia.com/gpu": "4"}), NOW)
    assert (job.state, job.namespace, job.priority_class, job.priority) == ("running", "ml-team", "gpu-batch", 1000)
    assert job.start == _t("2026-11-30T10:01:00Z") and job.end is None
    assert [(c.index, c.fraction, c.index_known) for c in job.gpus] == [(i, 1.0, False) for i in range(4)]


def test_succeeded_pod_maps_to_completed_ending_at_container_finish():
    pod = gpu_pod("train", "u-1", phase="Succeeded", finished="2026-11-30T11:30:00Z")
    job = job_from_pod(pod, NOW)
    assert (job.state, job.end) == ("completed", _t("2026-11-30T11:30:00Z"))


def test_failed_pod_maps_to_failed_with_exit_reason():
    pod = gpu_pod("train", "u-1", phase="Failed", finished="2026-11-30T10:30:00Z", exit_code=137)
    job = job_from_pod(pod, NOW)
    assert (job.state, job.reason, job.end) == ("failed", "Error (exit 137)", _t("2026-11-30T10:30:00Z"))


def test_evicted_pod_maps_to_preempted():
    # What the kubelet writes when node pressure evicts a pod: phase Failed, reason Evicted, no container end.
    pod = gpu_pod("train", "u-1", phase="Failed", reason="Evicted",
                  conditions=[_disruption("TerminationByKubelet", "2026-11-30T11:05:00Z")])
    job = job_from_pod(pod, NOW)
    assert (job.state, job.reason, job.end) == ("preempted", "Evicted", _t("2026-11-30T11:05:00Z"))


def test_preempted_pod_maps_to_preempted_and_keeps_gpus_until_containers_stop():
    pod = gpu_pod("train", "u-1", deletion="2026-11-30T11:00:30Z", conditions=[_disruption("PreemptionByScheduler")])
    job = job_from_pod(pod, NOW)
    assert (job.state, job.reason, job.end) == ("preempted", "PreemptionByScheduler", None)


def test_deleted_pod_maps_to_cancelled():
    job = job_from_pod(gpu_pod("train", "u-1", deletion="2026-11-30T11:00:30Z"), NOW)
    assert (job.state, job.end) == ("cancelled", None)  # terminating: still holds its GPUs
    gone = job_from_pod(gpu_pod("train", "u-1"), NOW, gone=True)
    assert (gone.state, gone.end) == ("cancelled", NOW)


def test_deadline_exceeded_pod_maps_to_timeout():
    pod = gpu_pod("train", "u-1", phase="Failed", reason="DeadlineExceeded", finished="2026-11-30T11:00:00Z")
    assert job_from_pod(pod, NOW).state == "timeout"


def test_mig_request_counts_profile_share():
    pod = gpu_pod("infer", "u-1", limits={"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-3g.40gb": "1"})
    job = job_from_pod(pod, NOW)
    assert job.gpu_count == pytest.approx(4 / 7)
    assert sorted(c.fraction for c in job.gpus) == pytest.approx([1 / 7, 3 / 7])
    assert mig_share("nvidia.com/mig-2g.12gb") == 0.5  # A30: four slices per GPU
    assert mig_share("nvidia.com/mig-7g.80gb") == 1.0


def test_whole_gpu_request_counts_limits_across_containers_and_init():
    pod = gpu_pod("train", "u-1", limits={"nvidia.com/gpu": "2"})
    pod["spec"]["containers"].append({"name": "sidecar", "resources": {"limits": {"nvidia.com/gpu": "1"}}})
    pod["spec"]["initContainers"] = [{"name": "warmup", "resources": {"requests": {"nvidia.com/gpu": "8"}}}]
    assert job_from_pod(pod, NOW).gpu_count == 8  # init containers run alone: the larger of the two counts


def test_device_annotation_gives_gpu_indexes():
    pod = gpu_pod("train", "u-1", limits={"nvidia.com/gpu": "2"}, annotations={"volcano.sh/gpu-index": "3,5"})
    assert [(c.index, c.index_known) for c in job_from_pod(pod, NOW).gpus] == [(3, True), (5, True)]


def test_non_gpu_pod_is_ignored():
    pod = gpu_pod("web", "u-9", limits={"cpu": "2", "memory": "1Gi"})
    assert not is_gpu_pod(pod)
    assert is_gpu_pod(gpu_pod("infer", "u-2", limits={"nvidia.com/mig-1g.10gb": "1"}))
    assert not is_gpu_pod(gpu_pod("zero", "u-3", limits={"nvidia.com/gpu": "0"}))


# --- sync ----------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_sync_creates_jobs_and_allocations():
    counts = do_sync_k8s_pods([gpu_pod("train", "u-1", limits={"nvidia.com/gpu": "2"}),
                               gpu_pod("queued", "u-2", phase="Pending", node="")], NOW)
    assert (counts["created"], counts["allocations_opened"]) == (2, 2)
    job = Job.objects.get(source="k8s", external_id="u-1")
    assert (job.state, job.account, job.qos, job.gpu_count, job.node_count) == ("running", "ml-team", "gpu-batch", 2, 1)
    rows = list(Allocation.objects.filter(job=job).order_by("gpu_index").values_list("gpu_index", "start", "end"))
    assert rows == [(0, _t("2026-11-30T10:01:00Z"), None), (1, _t("2026-11-30T10:01:00Z"), None)]
    node = Node.objects.get(hostname="gpu-node-01")
    assert node.rack_id is None  # registered unplaced
    assert list(JobStateChange.objects.filter(job=job).values_list("state", flat=True)) == ["pending", "running"]
    assert not Allocation.objects.filter(job__external_id="u-2").exists()


@pytest.mark.django_db
def test_sync_links_known_gpu_at_index():
    node = Node.objects.create(hostname="gpu-node-01")
    gpu = Gpu.objects.create(uuid="GPU-ca8f98c8-e647-af32-3402-a255bc380664", node=node, index=0)
    do_sync_k8s_pods([gpu_pod("train", "u-1")], NOW)
    assert Allocation.objects.get(job__external_id="u-1").gpu_id == gpu.pk


@pytest.mark.django_db
def test_resync_same_pods_changes_nothing():
    pods = [gpu_pod("train", "u-1", limits={"nvidia.com/gpu": "2"}),
            gpu_pod("done", "u-2", phase="Failed", reason="Evicted"),
            gpu_pod("mig", "u-3", limits={"nvidia.com/mig-1g.10gb": "1"}, phase="Succeeded",
                    finished="2026-11-30T10:40:00Z")]
    do_sync_k8s_pods(pods, NOW)
    snapshot = (list(Job.objects.values().order_by("id")), list(Allocation.objects.values().order_by("id")),
                list(JobStateChange.objects.values().order_by("id")))
    again = do_sync_k8s_pods(pods, datetime(2026, 11, 30, 13, 0, tzinfo=UTC))
    assert again["unchanged"] == 3 and again["created"] == again["updated"] == 0
    assert sum(again[k] for k in ("state_changes", "allocations_opened", "allocations_closed")) == 0
    jobs = list(Job.objects.values().order_by("id"))
    assert [{**j, "updated": None} for j in jobs] == [{**j, "updated": None} for j in snapshot[0]]
    assert list(Allocation.objects.values().order_by("id")) == snapshot[1]
    assert list(JobStateChange.objects.values().order_by("id")) == snapshot[2]


@pytest.mark.django_db
def test_finished_pod_closes_allocations_at_container_finish():
    do_sync_k8s_pods([gpu_pod("train", "u-1", limits={"nvidia.com/gpu": "2"})], NOW)
    done = gpu_pod("train", "u-1", limits={"nvidia.com/gpu": "2"}, phase="Succeeded",
                   finished="2026-11-30T11:45:00Z")
    counts = do_sync_k8s_pods([done], NOW)
    assert (counts["updated"], counts["allocations_closed"], counts["state_changes"]) == (1, 2, 1)
    ends = set(Allocation.objects.filter(job__external_id="u-1").values_list("end", flat=True))
    assert ends == {_t("2026-11-30T11:45:00Z")}
    job = Job.objects.get(external_id="u-1")
    assert (job.state, job.end_time) == ("completed", _t("2026-11-30T11:45:00Z"))


@pytest.mark.django_db
def test_preemption_counts_and_records_history():
    do_sync_k8s_pods([gpu_pod("train", "u-1")], NOW)
    evicted = gpu_pod("train", "u-1", phase="Failed", reason="Preempted",
                      conditions=[_disruption("PreemptionByScheduler", "2026-11-30T11:10:00Z")])
    do_sync_k8s_pods([evicted], NOW)
    job = Job.objects.get(external_id="u-1")
    assert (job.state, job.preempt_count, job.end_time) == ("preempted", 1, _t("2026-11-30T11:10:00Z"))
    last = JobStateChange.objects.filter(job=job).last()
    assert (last.state, last.reason, last.time) == ("preempted", "Preempted", _t("2026-11-30T11:10:00Z"))


@pytest.mark.django_db
def test_complete_list_cancels_vanished_pods():
    do_sync_k8s_pods([gpu_pod("train", "u-1"), gpu_pod("other", "u-2")], NOW, complete=True)
    counts = do_sync_k8s_pods([gpu_pod("other", "u-2")], NOW, complete=True)
    assert (counts["vanished"], counts["allocations_closed"]) == (1, 1)
    job = Job.objects.get(external_id="u-1")
    assert (job.state, job.end_time) == ("cancelled", NOW)


# --- nodes ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def alibaba_nodes_text(shared_data) -> str:
    return (shared_data / "k8s/alibaba-openb-nodes/openb_node_list_gpu_node.yaml").read_text()


@pytest.fixture(scope="module")
def alibaba_nodes(alibaba_nodes_text) -> list[dict]:
    # The C loader when PyYAML has it: the pure-Python one takes seconds over 1,213 documents.
    return list(yaml.load_all(alibaba_nodes_text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))


def test_alibaba_node_facts_match_raw_file(alibaba_nodes, alibaba_nodes_text):
    facts = nodes_from_k8s(alibaba_nodes)
    # Count from the raw text, independently of the parser: each Node lists gpu-count under capacity and
    # again under allocatable, so every second match is a capacity.
    raw_counts = [int(n) for n in re.findall(r"alibabacloud.com/gpu-count: '(\d+)'", alibaba_nodes_text)][1::2]
    assert len(facts) == 1213 == alibaba_nodes_text.count("kind: Node")
    assert sum(f.gpu_count for f in facts) == sum(raw_counts)
    assert {f.gpu_model for f in facts} == set(re.findall(r"gpu-card-model: (\S+)", alibaba_nodes_text))
    assert all(f.gpu_milli == f.gpu_count * 1000 for f in facts)


@pytest.mark.django_db
def test_alibaba_node_import_registers_1213_unplaced_nodes(alibaba_nodes, alibaba_nodes_text):
    facts = nodes_from_k8s(alibaba_nodes)
    counts = do_import_k8s_nodes(facts)
    assert counts["created"] == Node.objects.count() == 1213
    assert counts["gpus"] == sum(int(n) for n in re.findall(r"gpu-count: '(\d+)'", alibaba_nodes_text)) // 2
    assert not Node.objects.filter(rack__isnull=False).exists()
    assert Node.objects.get(hostname="openb-node-0000").system_model == "P100"
    again = do_import_k8s_nodes(facts)
    assert (again["created"], again["updated"], again["unchanged"]) == (0, 0, 1213)
