"""Kubernetes, through the official client (as `telemetry.k8s.watch` uses it) at settings.K8S_API_URL.

- drain: cordon (PATCH the node: spec.unschedulable true), then evict (policy/v1 Eviction) every evictable GPU
  pod on the node: asking for a GPU, not finished, not already terminating, not a DaemonSet's or a mirror pod.
  An eviction refused with 429 (a PodDisruptionBudget) is recorded, not forced; verification then fails.
- resume: uncordon (spec.unschedulable false).
- requeue: delete the job's pod (job key `k8s:<pod uid>`; namespace and name from the jobs table, else found by
  listing) so its controller starts a fresh one. A pod already gone is success.

Verification: drain: the node is unschedulable and no evictable GPU pod is left on it; resume: schedulable;
requeue: no pod of that UID is left running (gone, replaced, or being deleted).
"""

from __future__ import annotations

import json

from django.conf import settings
from kubernetes import client
from kubernetes.client.rest import ApiException

from alerts.models import ActionKind, RemediationAction
from alerts.remediation.backends.base import BackendError, Outcome, command, job_id
from telemetry.k8s.pods import is_gpu_pod
from telemetry.models import Job

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


def make_core_api() -> client.CoreV1Api:
    """A CoreV1Api for the configured API server, with the bearer token when one is set."""
    if not settings.K8S_API_URL:
        raise BackendError("K8S_API_URL is not set: the kubernetes backend has no API server")
    cfg = client.Configuration(host=settings.K8S_API_URL)
    if settings.K8S_TOKEN:
        cfg.api_key = {"BearerToken": settings.K8S_TOKEN}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
    return client.CoreV1Api(client.ApiClient(cfg))


def evictable(pod: dict) -> bool:
    """A GPU pod that a drain must move: running or pending, not terminating, not node-bound by design."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    if any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or []):
        return False
    return MIRROR_ANNOTATION not in (meta.get("annotations") or {}) and is_gpu_pod(pod)


def _json(response) -> dict:
    return json.loads(response.data)


class KubernetesBackend:
    """Cordon and evict, uncordon, and pod deletion through the Kubernetes API."""

    name = "kubernetes"
    asynchronous = False

    def __init__(self, core: client.CoreV1Api | None = None) -> None:
        self._core = core

    @property
    def core(self) -> client.CoreV1Api:
        if self._core is None:
            self._core = make_core_api()
        return self._core

    def plan(self, action: RemediationAction) -> list[str]:
        node = action.target_key
        if action.kind == ActionKind.DRAIN:
            return [f"PATCH /api/v1/nodes/{node} spec.unschedulable=true",
                    f"POST pods/<name>/eviction for each evictable GPU pod on {node}"]
        if action.kind == ActionKind.RESUME:
            return [f"PATCH /api/v1/nodes/{node} spec.unschedulable=false"]
        if action.kind == ActionKind.REQUEUE:
            return [f"DELETE the pod of job {action.target_key}"]
        raise BackendError(f"the kubernetes backend cannot {action.kind}")

    def run(self, action: RemediationAction) -> Outcome:
        done: list[dict] = []
        try:
            if action.kind in (ActionKind.DRAIN, ActionKind.RESUME):
                self._cordon(action.target_key, action.kind == ActionKind.DRAIN, done)
                if action.kind == ActionKind.DRAIN:
                    for pod in self._gpu_pods(action.target_key):
                        self._evict(pod, done)
            elif action.kind == ActionKind.REQUEUE:
                self._delete_pod(action.target_key, done)
            else:
                self.plan(action)
        except ApiException as exc:
            raise BackendError(f"Kubernetes API: {exc.status} {exc.reason}",
                               [*done, command("(failed call)", rc=exc.status, output=str(exc.body or ""))]) from exc
        return Outcome(done)

    def verify(self, action: RemediationAction) -> tuple[bool | None, dict]:
        try:
            if action.kind == ActionKind.REQUEUE:
                left = self._pod_left(action.target_key)
                return left is None, {"check": "pod of the job", "pod_left": left}
            node = _json(self.core.read_node(action.target_key, _preload_content=False))
            cordoned = bool((node.get("spec") or {}).get("unschedulable"))
            if action.kind == ActionKind.RESUME:
                return not cordoned, {"check": "node spec.unschedulable", "unschedulable": cordoned}
            left = [f"{p['metadata'].get('namespace')}/{p['metadata']['name']}"
                    for p in self._gpu_pods(action.target_key)]
            return cordoned and not left, {"check": "node cordoned and GPU pods gone", "unschedulable": cordoned,
                                           "gpu_pods_left": left}
        except ApiException as exc:
            return False, {"check": "Kubernetes API read-back", "error": f"{exc.status} {exc.reason}"}

    def _cordon(self, node: str, cordon: bool, done: list[dict]) -> None:
        self.core.patch_node(node, {"spec": {"unschedulable": cordon}}, _preload_content=False)
        done.append(command(f"PATCH /api/v1/nodes/{node} spec.unschedulable={str(cordon).lower()}", rc=200))

    def _gpu_pods(self, node: str) -> list[dict]:
        listed = _json(self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}",
                                                              _preload_content=False))
        return [p for p in listed.get("items") or [] if evictable(p)]

    def _evict(self, pod: dict, done: list[dict]) -> None:
        name, namespace = pod["metadata"]["name"], pod["metadata"].get("namespace", "default")
        cmd = f"POST /api/v1/namespaces/{namespace}/pods/{name}/eviction"
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
        try:
            resp = self.core.create_namespaced_pod_eviction(name, namespace, body, _preload_content=False)
            done.append(command(cmd, rc=resp.status))
        except ApiException as exc:
            if exc.status not in (404, 429):  # gone already; refused by a PodDisruptionBudget: both recorded
                raise
            done.append(command(cmd, rc=exc.status, output=str(exc.body or exc.reason)))

    def _locate(self, target_key: str) -> tuple[str, str] | None:
        """(namespace, name) of the job's pod, from the jobs table or else by listing every pod."""
        uid = job_id(target_key)
        job = Job.objects.filter(source=Job.Source.KUBERNETES, external_id=uid).first()
        if job is not None and job.name:
            return job.account or "default", job.name
        for pod in _json(self.core.list_pod_for_all_namespaces(_preload_content=False)).get("items") or []:
            if pod["metadata"].get("uid") == uid:
                return pod["metadata"].get("namespace", "default"), pod["metadata"]["name"]
        return None

    def _delete_pod(self, target_key: str, done: list[dict]) -> None:
        where = self._locate(target_key)
        if where is None:
            raise BackendError(f"no pod with UID {job_id(target_key)} (and no job row naming it)", done)
        namespace, name = where
        cmd = f"DELETE /api/v1/namespaces/{namespace}/pods/{name}"
        try:
            resp = self.core.delete_namespaced_pod(name, namespace, _preload_content=False)
            done.append(command(cmd, rc=resp.status))
        except ApiException as exc:
            if exc.status != 404:
                raise
            done.append(command(cmd, rc=404, skipped="pod already gone"))

    def _pod_left(self, target_key: str) -> str | None:
        """The pod of that UID if it still runs (not deleted, not being deleted), as namespace/name."""
        where = self._locate(target_key)
        if where is None:
            return None
        try:
            pod = _json(self.core.read_namespaced_pod(where[1], where[0], _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        meta = pod.get("metadata") or {}
        if meta.get("uid") != job_id(target_key) or meta.get("deletionTimestamp"):
            return None
        return f"{where[0]}/{where[1]}"
