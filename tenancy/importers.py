"""Import the Alibaba GPU cluster trace (clusterdata cluster-trace-gpu-v2023, "openb") as Kubernetes jobs.

The pod list (`openb_pod_list_*.csv`) gives per pod: num_gpu, gpu_milli (thousandths of each GPU it shares),
qos, pod_phase and creation / scheduled / deletion times in seconds from the trace's start. Each pod becomes a
`Job` (source k8s, keyed "<trace>/<pod name>", in one namespace) with one `Allocation` per GPU it holds, its
fraction gpu_milli / 1000, from scheduled_time to deletion_time. What the trace leaves out, and what we do:

- Pods never scheduled (no scheduled_time: still Pending at the end of the trace) and pods without GPUs
  (num_gpu 0, the CPU-only pods) hold no GPU time: they are skipped and counted.
- Pods still Running at the end of the trace have deletion_time = the trace's end: their ledger rows close
  there (the trace observed nothing after it) and the job keeps state running.
- The trace records no node binding. Pods are placed first-fit, in scheduling order, onto the trace's own
  GPU nodes (`openb_node_list_gpu_node.csv`: name, GPU count, model), a shared GPU taking pods while their
  gpu_milli fits in 1000; a multi-GPU pod takes whole GPUs of one node. GPU models in the metered usage come
  from this placement, not from the trace. A pod that fits nowhere is skipped and counted (none do in the
  published files).
- QoS classes map onto priority-class names (`QOS_CLASSES`).
"""

from __future__ import annotations

import csv
import heapq
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from django.db import transaction

from telemetry.models import Allocation, Gpu, Job, JobState, JobStateChange, Node

QOS_CLASSES = {"LS": "latency-sensitive", "BE": "best-effort", "Burstable": "burstable", "Guaranteed": "guaranteed"}
PHASES = {"Running": JobState.RUNNING, "Succeeded": JobState.COMPLETED, "Failed": JobState.FAILED}
MILLI = 1000


@dataclass(frozen=True)
class Pod:
    """One GPU pod of the trace, as the importer uses it."""

    name: str
    num_gpu: int
    gpu_milli: int
    qos: str
    phase: str
    created: int
    scheduled: int
    deleted: int


@dataclass
class TraceNode:
    """A GPU node of the trace and what is left on each of its GPUs (in milli-GPUs) during placement."""

    name: str
    model: str
    free: list[int]


def read_pods(path: Path) -> tuple[list[Pod], Counter]:
    """The pods that held GPUs, and counts of those skipped (never scheduled, no GPU)."""
    pods, skipped = [], Counter()
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            if not row["scheduled_time"]:
                skipped["never_scheduled"] += 1
            elif int(row["num_gpu"]) == 0 or int(row["gpu_milli"]) == 0:
                skipped["no_gpu"] += 1
            else:
                pods.append(Pod(row["name"], int(row["num_gpu"]), int(row["gpu_milli"]), row["qos"],
                                row["pod_phase"], int(row["creation_time"]), int(row["scheduled_time"]),
                                int(row["deletion_time"])))
    return pods, skipped


def read_nodes(path: Path) -> list[TraceNode]:
    """The trace's GPU nodes, in file order (the order first-fit tries them)."""
    with open(path, newline="") as fh:
        return [TraceNode(r["sn"], r["model"], [MILLI] * int(r["gpu"])) for r in csv.DictReader(fh) if int(r["gpu"])]


def _fit(node: TraceNode, pod: Pod) -> list[int] | None:
    slots = [i for i, free in enumerate(node.free) if free >= pod.gpu_milli][:pod.num_gpu]
    return slots if len(slots) == pod.num_gpu else None


def place(pods: list[Pod], nodes: list[TraceNode]) -> dict[str, tuple[int, list[int]]]:
    """Pod name -> (node number, GPU indexes): first fit in scheduling order, releasing at deletion."""
    events = [(p.scheduled, 1, i) for i, p in enumerate(pods)] + [(p.deleted, 0, i) for i, p in enumerate(pods)]
    heapq.heapify(events)  # releases (0) before placements (1) at the same second
    where: dict[str, tuple[int, list[int]]] = {}
    while events:
        _, placing, i = heapq.heappop(events)
        pod = pods[i]
        if not placing:
            for g in where.get(pod.name, (0, []))[1]:
                nodes[where[pod.name][0]].free[g] += pod.gpu_milli
            continue
        for n, node in enumerate(nodes):
            slots = _fit(node, pod)
            if slots is not None:
                for g in slots:
                    node.free[g] -= pod.gpu_milli
                where[pod.name] = (n, slots)
                break
    return where


def _inventory(nodes: list[TraceNode], prefix: str) -> tuple[list[Node], dict[tuple[int, int], Gpu]]:
    """The trace's nodes and GPUs in the inventory (unplaced), created once and reused by later imports."""
    names = [f"{prefix}{n.name}" for n in nodes]
    Node.objects.bulk_create([Node(hostname=h, system_model=n.model) for h, n in zip(names, nodes, strict=True)],
                             ignore_conflicts=True)
    rows = {n.hostname: n for n in Node.objects.filter(hostname__in=names)}
    ordered = [rows[h] for h in names]
    Gpu.objects.bulk_create([Gpu(uuid=f"{node.hostname}-gpu{i}", node=node, index=i, model=tn.model)
                             for node, tn in zip(ordered, nodes, strict=True) for i in range(len(tn.free))],
                            ignore_conflicts=True)
    gpus = {(g.node_id, g.index): g for g in Gpu.objects.filter(node__in=ordered)}
    return ordered, gpus


@transaction.atomic
def do_import_alibaba_pods(pod_csv: Path, node_csv: Path, *, origin: datetime, namespace: str = "openb",
                           node_prefix: str = "") -> Counter:
    """Import one pod list as k8s jobs and ledger rows; returns counts (jobs, allocations, skipped kinds).

    `origin` is the instant the trace's second 0 maps to. Jobs are keyed "<file's trace name>/<pod name>", so
    the default and gpushare40 lists (which reuse pod names) can sit side by side. Importing a list twice
    fails on the jobs' unique key, and the transaction leaves nothing behind.
    """
    if origin.tzinfo is None:
        raise ValueError("origin must be timezone-aware (UTC)")
    trace = Path(pod_csv).stem.removeprefix("openb_pod_list_")
    pods, counts = read_pods(Path(pod_csv))
    trace_nodes = read_nodes(Path(node_csv))
    where = place(pods, [TraceNode(n.name, n.model, list(n.free)) for n in trace_nodes])
    nodes, gpus = _inventory(trace_nodes, node_prefix)
    placed = [p for p in pods if p.name in where]
    counts["unplaceable"] = len(pods) - len(placed)

    def at(seconds: int) -> datetime:
        return origin + timedelta(seconds=seconds)

    jobs = Job.objects.bulk_create([Job(
        source=Job.Source.KUBERNETES, external_id=f"{trace}/{p.name}", name=p.name, account=namespace,
        qos=QOS_CLASSES.get(p.qos, p.qos.lower()), state=PHASES.get(p.phase, JobState.UNKNOWN),
        submit_time=at(p.created), start_time=at(p.scheduled),
        end_time=None if p.phase == "Running" else at(p.deleted), node_count=1,
        gpu_count=p.num_gpu * p.gpu_milli / MILLI) for p in placed])
    allocations = []
    for job, p in zip(jobs, placed, strict=True):
        node = nodes[where[p.name][0]]
        allocations += [Allocation(job=job, node=node, gpu=gpus[(node.id, g)], gpu_index=g,
                                   fraction=p.gpu_milli / MILLI, start=at(p.scheduled), end=at(p.deleted))
                        for g in where[p.name][1]]
    Allocation.objects.bulk_create(allocations, batch_size=5000)
    JobStateChange.objects.bulk_create(_history(jobs, placed, at), batch_size=5000)
    counts.update(jobs=len(jobs), allocations=len(allocations))
    return counts


def _history(jobs: list[Job], pods: list[Pod], at) -> list[JobStateChange]:
    """Submitted, scheduled, and (for finished pods) finished: the states the trace records times for."""
    rows = []
    for job, p in zip(jobs, pods, strict=True):
        rows += [JobStateChange(job=job, time=at(p.created), state=JobState.PENDING),
                 JobStateChange(job=job, time=at(p.scheduled), state=JobState.RUNNING)]
        if p.phase != "Running":
            rows.append(JobStateChange(job=job, time=at(p.deleted), state=job.state))
    return rows
