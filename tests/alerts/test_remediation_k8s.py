"""The Kubernetes remediation backend, through the official client, against the local mock API server: cordon and
evict, uncordon, requeue by pod deletion, each verified by reading the API back."""

from __future__ import annotations

import pytest

from alerts.remediation.actions import do_approve_action, do_request_action
from alerts.remediation.executor import execute
from telemetry.models import Job, Node
from tests.alerts.remediation_helpers import build_fleet
from tests.k8s.mock_apiserver import MockApiServer, gpu_pod

pytestmark = pytest.mark.django_db

NODE = "gpu-node-00"


@pytest.fixture
def apiserver(settings):
    with MockApiServer() as server:
        settings.REMEDIATION_BACKEND, settings.K8S_API_URL, settings.K8S_TOKEN = "kubernetes", server.url, "t0ken"
        yield server


def _run(kind: str, target: str = NODE):
    action = do_request_action(kind, target, mode="approval", reason="XID 79 on GPU 3", evidence={},
                               requested_by="olivia")
    do_approve_action(action.pk, None)
    outcome = execute(action.pk)
    action.refresh_from_db()
    return outcome, action


def _writes(server: MockApiServer) -> list[tuple[str, str]]:
    return [(method, path) for method, path, _ in server.writes]


def test_drain_cordons_and_evicts_the_gpu_pods_only(apiserver):
    build_fleet(1)
    apiserver.add_node(NODE)
    apiserver.add_pod(gpu_pod("train-0", "u-train-0", node=NODE, limits={"nvidia.com/gpu": "4"}))
    apiserver.add_pod(gpu_pod("infer", "u-infer", node=NODE, limits={"nvidia.com/mig-1g.10gb": "1"}))
    apiserver.add_pod(gpu_pod("web", "u-web", node=NODE, limits={"cpu": "1"}))
    exporter = gpu_pod("dcgm-exporter-x", "u-dcgm", node=NODE, namespace="gpu-operator")
    exporter["metadata"]["ownerReferences"] = [{"kind": "DaemonSet", "name": "dcgm-exporter", "uid": "ds"}]
    apiserver.add_pod(exporter)
    apiserver.add_pod(gpu_pod("elsewhere", "u-else", node="gpu-node-09"))

    outcome, action = _run("drain")

    assert outcome == "succeeded" and action.verified is True and action.backend == "kubernetes"
    assert apiserver.nodes[NODE]["spec"]["unschedulable"] is True
    assert sorted(name for _, name in apiserver.pods) == ["dcgm-exporter-x", "elsewhere", "web"]
    assert _writes(apiserver) == [
        ("PATCH", f"/api/v1/nodes/{NODE}"),
        ("POST", "/api/v1/namespaces/ml-team/pods/train-0/eviction"),
        ("POST", "/api/v1/namespaces/ml-team/pods/infer/eviction"),
    ]
    eviction = apiserver.writes[1][2]
    assert (eviction["metadata"]["name"], eviction["metadata"]["namespace"]) == ("train-0", "ml-team")
    assert [c["rc"] for c in action.result["commands"]] == [200, 201, 201]
    assert action.result["verification"] == {"check": "node cordoned and GPU pods gone", "unschedulable": True,
                                             "gpu_pods_left": []}
    assert Node.objects.get(hostname=NODE).state == "drained"
    assert {q["authorization"] for _, q in apiserver.requests if "method" in q} == {"Bearer t0ken"}


def test_drain_refused_by_a_disruption_budget_fails_verification(apiserver):
    build_fleet(1)
    apiserver.add_node(NODE)
    apiserver.add_pod(gpu_pod("train-0", "u-train-0", node=NODE))
    apiserver.pdb_protected.add(("ml-team", "train-0"))

    outcome, action = _run("drain")

    assert outcome == "failed" and action.verified is False
    assert action.result["commands"][1]["rc"] == 429 and "disruption budget" in action.result["commands"][1]["output"]
    assert action.result["verification"]["gpu_pods_left"] == ["ml-team/train-0"]
    assert Node.objects.get(hostname=NODE).state == "active"  # the inventory only follows a verified drain


def test_resume_uncordons_the_node(apiserver):
    build_fleet(1)
    Node.objects.filter(hostname=NODE).update(state="drained")
    apiserver.add_node(NODE, unschedulable=True)

    outcome, action = _run("resume")

    assert outcome == "succeeded" and action.verified is True
    assert apiserver.nodes[NODE]["spec"]["unschedulable"] is False
    assert Node.objects.get(hostname=NODE).state == "active"


def test_requeue_deletes_the_jobs_pod_and_a_rerun_changes_nothing(apiserver):
    Job.objects.create(source="k8s", external_id="u-train-0", name="train-0", account="ml-team", state="running")
    apiserver.add_pod(gpu_pod("train-0", "u-train-0", node=NODE))

    outcome, action = _run("requeue", "k8s:u-train-0")

    assert outcome == "succeeded" and action.verified is True
    assert apiserver.pods == {}
    assert _writes(apiserver) == [("DELETE", "/api/v1/namespaces/ml-team/pods/train-0")]
    assert execute(action.pk).startswith("nothing to do") and len(apiserver.writes) == 1


def test_unknown_node_fails_with_the_api_answer(apiserver):
    outcome, action = _run("drain", "gpu-node-77")
    assert outcome == "failed: Kubernetes API: 404 Not Found" and action.state == "failed"
    assert action.result["commands"][-1]["rc"] == 404
