"""Pure mapping from Kubernetes objects to Breakwater facts: pod JSON → `JobIn` (a job and the GPUs it
holds), Node JSON → `NodeFacts` (inventory).

No Django imports: the watcher, the actions and the tests all call these on plain dicts, exactly as the API
server sends them (camelCase keys, RFC 3339 times).

What the pod object can and cannot tell us about GPUs:

* The count is exact: `nvidia.com/gpu` (whole GPUs, or time-sliced replicas, which look the same) and
  `nvidia.com/mig-<g>g.<mem>gb` (MIG slices under the device plugin's "mixed" strategy) in any container's
  limits or requests. A MIG slice counts as its share of compute slices: `<g>/7` on A100/H100/H200/B200
  (seven slices per GPU), `<g>/4` on the A30 profiles (1g.6gb, 2g.12gb, 4g.24gb), so
  `nvidia.com/mig-1g.10gb: 1` is 1/7 of a GPU. Under the "single" strategy MIG slices are advertised as
  `nvidia.com/gpu` and each counts as one whole GPU: the pod object does not say otherwise.
* The GPU *index* is not in the pod object. The device plugin picks devices at container creation and tells
  only the kubelet (the kubelet's PodResources socket on the node knows them; the API server never does).
  Where a scheduler writes the indexes into an annotation (Volcano's `volcano.sh/gpu-index: "0,2"`) we use it;
  otherwise the pod's devices are numbered 0..n-1 in request order, which gets the count per node right but
  not which physical GPU each one is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "GPU_INDEX_ANNOTATIONS", "GpuClaim", "JobIn", "NodeFacts", "gpu_requests", "is_gpu_pod", "job_from_pod",
    "mark_deleted", "mig_share", "node_from_k8s", "nodes_from_k8s", "parse_time",
]

WHOLE_GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
# Schedulers that pick GPU indexes themselves and record them on the pod ("0,2"). The NVIDIA device plugin
# writes none, so this list is short; add a key here when a cluster's scheduler records one.
GPU_INDEX_ANNOTATIONS = ("volcano.sh/gpu-index",)
# A30 MIG profiles split the GPU into 4 compute slices; every other MIG GPU (A100, H100, H200, B200) into 7.
A30_PROFILES = {"1g.6gb", "2g.12gb", "4g.24gb"}
_MIG_RE = re.compile(r"^(?P<g>\d+)g\.(?P<mem>\d+)gb")
# Reasons Kubernetes gives when it, not the workload, ended the pod to make room or save the node.
PREEMPT_REASONS = {"Preempted", "Evicted", "PreemptionByScheduler", "EvictionByEvictionAPI",
                   "TerminationByKubelet", "DeletionByTaintManager"}


@dataclass(frozen=True)
class GpuClaim:
    """One device a pod holds: a whole GPU (fraction 1) or a MIG slice, at an index that may be a guess."""

    index: int
    fraction: float
    resource: str
    index_known: bool


@dataclass(frozen=True)
class JobIn:
    """A GPU pod as a scheduler job; times are aware UTC, `end` is None while the pod still holds its GPUs."""

    uid: str
    name: str
    namespace: str
    priority_class: str
    priority: int | None
    state: str  # a telemetry.models.JobState value
    reason: str
    submit: datetime | None
    start: datetime | None
    end: datetime | None
    node: str  # spec.nodeName, "" until scheduled
    gpu_count: float
    gpus: list[GpuClaim] = field(default_factory=list)
    restarts: int = 0

    @property
    def finished(self) -> bool:
        return self.state in {"completed", "failed", "cancelled", "preempted", "timeout"}


@dataclass(frozen=True)
class NodeFacts:
    """What a Kubernetes Node object says about a GPU server."""

    hostname: str
    gpu_model: str
    gpu_count: int
    gpu_milli: int  # schedulable GPU capacity in thousandths (shared-GPU clusters schedule by milli-GPU)


def parse_time(value: str | None) -> datetime | None:
    """RFC 3339 as the API server writes it ("2026-11-30T12:00:00Z", with or without fractions)."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def mig_share(resource: str) -> float:
    """Share of one GPU that a MIG resource name stands for (see the module docstring)."""
    match = _MIG_RE.match(resource.removeprefix(MIG_PREFIX))
    if not match:
        raise ValueError(f"not a MIG resource name: {resource!r}")
    profile = f"{match['g']}g.{match['mem']}gb"
    return int(match["g"]) / (4 if profile in A30_PROFILES else 7)


def _is_gpu_resource(name: str) -> bool:
    return name == WHOLE_GPU or name.startswith(MIG_PREFIX)


def _container_gpus(container: dict) -> dict[str, int]:
    # Extended resources cannot be overcommitted, so limits and requests agree when both are set; a
    # container may give either one alone.
    resources = container.get("resources") or {}
    merged = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    return {k: int(v) for k, v in merged.items() if _is_gpu_resource(k) and int(v) > 0}


def gpu_requests(pod: dict) -> dict[str, int]:
    """GPU resources the pod holds, by name: the sum over its containers, or the largest init container's
    request if that is more (init containers run one at a time before the others, as the scheduler counts)."""
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for name, n in _container_gpus(container).items():
            total[name] = total.get(name, 0) + n
    for container in spec.get("initContainers") or []:
        for name, n in _container_gpus(container).items():
            total[name] = max(total.get(name, 0), n)
    return total


def is_gpu_pod(pod: dict) -> bool:
    """Does any container (init containers included) ask for a GPU or a MIG slice?"""
    return bool(gpu_requests(pod))


def _annotated_indexes(pod: dict) -> list[int] | None:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    for key in GPU_INDEX_ANNOTATIONS:
        raw = annotations.get(key)
        if raw:
            try:
                return [int(part) for part in raw.split(",") if part.strip()]
            except ValueError:
                return None  # a malformed annotation is no better than none: fall back to 0..n-1
    return None


def _claims(pod: dict) -> list[GpuClaim]:
    devices = []
    for name, n in sorted(gpu_requests(pod).items()):  # sorted: the guessed numbering is stable across syncs
        share = 1.0 if name == WHOLE_GPU else mig_share(name)
        devices.extend([(name, share)] * n)
    known = _annotated_indexes(pod)
    if known is not None and len(known) != len(devices):
        known = None
    # Without an annotation the device plugin's choice is invisible here (module docstring): number the
    # devices 0..n-1 so that each has its own ledger row.
    indexes = known if known is not None else list(range(len(devices)))
    return [GpuClaim(i, share, name, known is not None) for i, (name, share) in zip(indexes, devices, strict=True)]


def _condition(status: dict, kind: str) -> dict | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), None)


def _terminated(status: dict) -> list[dict]:
    return [(cs.get("state") or {}).get("terminated") or {} for cs in status.get("containerStatuses") or []]


def _state(pod: dict) -> tuple[str, str]:
    """(JobState value, reason) from phase, reason, conditions and deletion."""
    status, meta = pod.get("status") or {}, pod.get("metadata") or {}
    phase, reason = status.get("phase", "Unknown"), status.get("reason", "")
    disruption = _condition(status, "DisruptionTarget")
    disrupted = disruption.get("reason", "") if disruption and disruption.get("status") == "True" else ""
    # A pod that already succeeded keeps its success even if it is removed for room afterwards.
    if phase != "Succeeded" and (reason in PREEMPT_REASONS or (
            disrupted in PREEMPT_REASONS and (phase == "Failed" or meta.get("deletionTimestamp")))):
        return "preempted", reason or disrupted
    if phase == "Succeeded":
        return "completed", reason
    if phase == "Failed":
        # activeDeadlineSeconds ran out: the pod's own time limit, like a Slurm TIMEOUT.
        return ("timeout", reason) if reason == "DeadlineExceeded" else ("failed", reason or _exit_reason(status))
    if meta.get("deletionTimestamp"):
        return "cancelled", "Deleted"
    return {"Pending": "pending", "Running": "running"}.get(phase, "unknown"), reason


def _exit_reason(status: dict) -> str:
    failed = [t for t in _terminated(status) if t.get("exitCode")]
    return f"{failed[0].get('reason', 'Error')} (exit {failed[0]['exitCode']})" if failed else ""


def _end(pod: dict, state: str, gone: bool, now: datetime) -> datetime | None:
    """When the pod let go of its GPUs: the last container's finish, else the best time the API gives."""
    status, meta = pod.get("status") or {}, pod.get("metadata") or {}
    finished = [parse_time(t.get("finishedAt")) for t in _terminated(status)]
    running = any(not t for t in _terminated(status))
    if finished and all(finished) and not running and state != "running":
        return max(finished)
    terminal_phase = status.get("phase") in {"Succeeded", "Failed"}
    if not (gone or terminal_phase):
        return None  # still running, or terminating within its grace period: the GPUs are still held
    # Ready=False dates a terminal pod's end; a deleted pod may have been unready (crash-looping) long
    # before it let go of its GPUs, so only the disruption or the deletion dates that.
    for kind in ("DisruptionTarget", "Ready") if terminal_phase else ("DisruptionTarget",):
        cond = _condition(status, kind)
        if cond and cond.get("lastTransitionTime") and (kind == "DisruptionTarget" or cond.get("status") == "False"):
            return parse_time(cond["lastTransitionTime"])
    deleted = parse_time(meta.get("deletionTimestamp"))
    return min(deleted, now) if deleted else now


def mark_deleted(pod: dict, now: datetime) -> dict:
    """A pod from a DELETED watch event (or missing from a re-list) is gone; a force-deleted one carries no
    deletionTimestamp, so stamp `now` on a copy."""
    meta = dict(pod.get("metadata") or {})
    meta.setdefault("deletionTimestamp", now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return {**pod, "metadata": meta}


def job_from_pod(pod: dict, now: datetime, *, gone: bool = False) -> JobIn:
    """Map one pod (API server JSON) to a job and its GPU claims. `gone`: the API server no longer has it."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    state, reason = _state(pod)
    if gone and state in {"pending", "running", "unknown"}:
        state, reason = "cancelled", "Deleted"
    claims = _claims(pod)
    return JobIn(
        uid=meta["uid"], name=meta.get("name", ""), namespace=meta.get("namespace", ""),
        priority_class=spec.get("priorityClassName", ""), priority=spec.get("priority"),
        state=state, reason=reason[:256], submit=parse_time(meta.get("creationTimestamp")),
        start=parse_time(status.get("startTime")), end=_end(pod, state, gone, now),
        node=spec.get("nodeName", ""), gpu_count=round(sum(c.fraction for c in claims), 6), gpus=claims,
        restarts=sum(cs.get("restartCount", 0) for cs in status.get("containerStatuses") or []),
    )


# --- Nodes ----------------------------------------------------------------------------------------------
# Label and capacity keys, in order of preference: NVIDIA's GPU feature discovery, then Alibaba's scheduler
# (whose clusters share GPUs by milli-GPU and label the card model themselves).
MODEL_LABELS = ("nvidia.com/gpu.product", "alibabacloud.com/gpu-card-model")
COUNT_KEYS = (WHOLE_GPU, "alibabacloud.com/gpu-count")
MILLI_KEY = "alibabacloud.com/gpu-milli"


def _objects(list_json: Any) -> Iterable[dict]:
    if isinstance(list_json, dict):
        return list_json.get("items") or ([list_json] if list_json.get("kind") == "Node" else [])
    return [doc for doc in list_json or [] if doc]  # a multi-document YAML read with safe_load_all


def node_from_k8s(node: dict) -> NodeFacts:
    """Facts from one Node. The hostname is metadata.name, since that is what a pod's spec.nodeName names."""
    meta, status = node.get("metadata") or {}, node.get("status") or {}
    labels, capacity = meta.get("labels") or {}, status.get("capacity") or {}
    model = next((labels[k] for k in MODEL_LABELS if labels.get(k)), "")
    count = next((int(capacity[k]) for k in COUNT_KEYS if k in capacity), int(labels.get("nvidia.com/gpu.count", 0)))
    milli = int(capacity.get(MILLI_KEY, count * 1000))
    return NodeFacts(hostname=meta["name"], gpu_model=model, gpu_count=count, gpu_milli=milli)


def nodes_from_k8s(list_json: Any) -> list[NodeFacts]:
    """Facts for every Node in a NodeList (`kubectl get nodes -o json`) or a list of Node documents."""
    return [node_from_k8s(obj) for obj in _objects(list_json) if obj.get("kind", "Node") == "Node"]
