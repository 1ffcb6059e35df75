"""The pod watcher end to end: the official `kubernetes` client against a scripted local API server, writing
to the real database through `do_sync_k8s_pods`."""

from __future__ import annotations

import io

import pytest
import yaml
from django.core.management import call_command
from kubernetes import client

from telemetry.k8s.watch import PodWatcher, Progress, make_core_api
from telemetry.models import Allocation, Job, JobStateChange
from tests.conftest import FIXED_NOW
from tests.k8s.mock_apiserver import MockApiServer, gone_event, gpu_pod


@pytest.fixture
def apiserver():
    with MockApiServer() as server:
        yield server


def _watcher(server: MockApiServer, progress: list[Progress], namespace: str | None = None) -> PodWatcher:
    core = make_core_api(client.Configuration(host=server.url))
    return PodWatcher(core, namespace=namespace, watch_timeout_s=5, on_progress=progress.append,
                      clock=lambda: FIXED_NOW)


def _watch_versions(server: MockApiServer) -> list[str]:
    return [q.get("resourceVersion", "") for _, q in server.requests if q.get("watch")]


@pytest.mark.django_db
def test_watcher_list_watch_and_relist_leads_to_right_rows(apiserver):
    web = gpu_pod("web", "u-web", limits={"cpu": "1"}, resource_version="90")
    old = gpu_pod("old", "u-old", resource_version="95")
    apiserver.add_list([web, old], "100")
    train = gpu_pod("train", "u-train", phase="Pending", node="", resource_version="101",
                    limits={"nvidia.com/gpu": "2"})
    running = gpu_pod("train", "u-train", resource_version="102", limits={"nvidia.com/gpu": "2"})
    done = gpu_pod("train", "u-train", phase="Succeeded", finished="2026-11-30T11:20:00Z",
                   resource_version="103", limits={"nvidia.com/gpu": "2"})
    apiserver.add_watch([("ADDED", train), ("MODIFIED", running), ("MODIFIED", web), ("DELETED", done),
                         gone_event("103")])
    # The re-list after 410 no longer has "old": it was deleted while the watch history was lost.
    mig = gpu_pod("infer", "u-mig", node="gpu-node-02", limits={"nvidia.com/mig-1g.10gb": "1"},
                  resource_version="150")
    apiserver.add_list([web, mig], "200")
    apiserver.add_watch([])

    progress: list[Progress] = []
    _watcher(apiserver, progress).run(max_watches=2)

    assert [p.kind for p in progress] == ["list", "event", "event", "event", "expired", "list", "closed"]
    assert _watch_versions(apiserver) == ["100", "200"]  # resumed from each list's resourceVersion
    assert not Job.objects.filter(external_id="u-web").exists()

    train_job = Job.objects.get(source="k8s", external_id="u-train")
    assert (train_job.state, train_job.gpu_count) == ("completed", 2)
    assert list(JobStateChange.objects.filter(job=train_job).values_list("state", flat=True)) == [
        "pending", "running", "completed"]
    ends = set(Allocation.objects.filter(job=train_job).values_list("end", flat=True))
    assert len(ends) == 1 and ends.pop() == train_job.end_time

    old_job = Job.objects.get(external_id="u-old")
    assert (old_job.state, old_job.end_time) == ("cancelled", FIXED_NOW)
    assert not Allocation.objects.filter(job=old_job, end__isnull=True).exists()

    mig_alloc = Allocation.objects.get(job__external_id="u-mig")
    assert (mig_alloc.node.hostname, mig_alloc.fraction, mig_alloc.end) == ("gpu-node-02", pytest.approx(1 / 7), None)


@pytest.mark.django_db
def test_watcher_deleted_running_pod_is_cancelled(apiserver):
    pod = gpu_pod("train", "u-1", resource_version="11")
    apiserver.add_list([pod], "10")
    apiserver.add_watch([("DELETED", pod)])  # force-deleted: no deletionTimestamp, containers still running
    _watcher(apiserver, [], namespace="ml-team").run(max_watches=1)
    assert {path for path, _ in apiserver.requests} == {"/api/v1/namespaces/ml-team/pods"}
    job = Job.objects.get(external_id="u-1")
    assert (job.state, job.end_time) == ("cancelled", FIXED_NOW)
    assert list(Allocation.objects.filter(job=job).values_list("end", flat=True)) == [FIXED_NOW]


@pytest.mark.django_db
def test_watcher_unreachable_server_retries_without_raising():
    progress: list[Progress] = []
    core = make_core_api(client.Configuration(host="http://127.0.0.1:9"))  # discard port: nothing listens
    watcher = PodWatcher(core, on_progress=progress.append, clock=lambda: FIXED_NOW)
    watcher.stop_event.wait = lambda timeout: False  # no real back-off sleeps in a test
    watcher.run(max_watches=2)
    assert [p.kind for p in progress] == ["error", "error"]


@pytest.mark.django_db
def test_watch_kubernetes_command_once_syncs_from_kubeconfig(apiserver, tmp_path):
    apiserver.add_list([gpu_pod("train", "u-1", limits={"nvidia.com/gpu": "8"})], "7")
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "mock",
        "clusters": [{"name": "mock", "cluster": {"server": apiserver.url}}],
        "users": [{"name": "ops", "user": {"token": "not-a-secret"}}],
        "contexts": [{"name": "mock", "context": {"cluster": "mock", "user": "ops"}}],
    }))
    out = io.StringIO()
    call_command("watch_kubernetes", "--kubeconfig", str(kubeconfig), "--once", stdout=out)
    assert "[list] 1 GPU pods of 1 (rv 7): created 1, state changes 2, allocations opened 8" in out.getvalue()
    assert Job.objects.get(external_id="u-1").gpu_count == 8
