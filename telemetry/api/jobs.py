"""POST /api/v1/jobs — a scheduler pushes a snapshot of its jobs and their GPU allocations (docs/jobs.md).

    {"source": "slurm", "jobs": [{"job_id": "4242", "name": "sft-chat", "user": "alee", "account": "applied-ml",
      "partition": "gpu", "qos": "normal", "priority": 10512, "state": "RUNNING",
      "submit": "2026-11-30T11:58:02Z", "start": "2026-11-30T12:00:00Z", "end": null,
      "nodes": ["gpu-0001"], "gpus": 8, "restart_count": 0,
      "allocations": [{"node": "gpu-0001", "gpu_indexes": [0, 1, 2, 3, 4, 5, 6, 7],
                       "start": "2026-11-30T12:00:00Z", "end": null}]}]}

The whole body is checked before anything is written; the first problem is answered with 400 naming its
path and value (``jobs[3].start: not an ISO 8601 time with a zone: '2026-13-01'``). A valid snapshot goes
through the action Slurm polling uses (`telemetry.slurm.sync.do_sync_slurm`), so both paths write jobs, state
history and the allocation ledger the same way, and a snapshot sent twice changes nothing the second time.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from core.api import collector_endpoint, json_edge
from telemetry.api.auth import authenticate_collector
from telemetry.api.views import _body, _method_guard
from telemetry.ingest.schema import BatchError, loads_json, storable_text_problem
from telemetry.models import JobState
from telemetry.slurm import parse
from telemetry.slurm.sync import ENDED, STATES, do_sync_slurm

SOURCES = ("slurm",)  # Kubernetes reports through its own watcher (telemetry.k8s)
MAX_JOBS = 50_000
TEXTS = {"name": 256, "user": 128, "account": 128, "partition": 128, "qos": 64}  # the Job columns' lengths
JOB_KEYS = frozenset({"job_id", *TEXTS, "priority", "state", "submit", "start", "end", "nodes", "node_count",
                      "gpus", "restart_count", "allocations"})
ALLOCATION_KEYS = frozenset({"node", "gpu_indexes", "start", "end"})
MAX_GPU_INDEX = 255
MAX_HOSTNAME = 253
BIGINT = 2**63 - 1


# --- values ----------------------------------------------------------------------------------------
def _object(raw, where: str, keys: frozenset[str]) -> dict:
    if not isinstance(raw, dict):
        raise BatchError(where, f"must be an object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - keys)
    if unknown:
        raise BatchError(f"{where}.{unknown[0]}" if where else unknown[0], "unknown key")
    return raw


def _text(raw, where: str, limit: int, *, required: bool = False) -> str:
    if raw is None and not required:
        return ""
    if not isinstance(raw, str) or (required and not raw.strip()):
        raise BatchError(where, f"must be a {'non-empty ' if required else ''}string, got {raw!r}")
    problem = storable_text_problem(raw, limit)  # too long, NUL, lone surrogate: PostgreSQL would refuse it
    if problem:
        raise BatchError(where, problem)
    return raw.strip()


def _int(raw, where: str, *, low: int = 0, high: int = BIGINT, optional: bool = False) -> int | None:
    if raw is None and optional:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        bounds = "" if low < 0 else f" ≥ {low}" if high == BIGINT else f" from {low} to {high}"
        raise BatchError(where, f"must be an integer{bounds}{' or null' if optional else ''}, got {raw!r}")
    return raw


def _time(raw, where: str, *, optional: bool = True) -> datetime | None:
    if raw is None and optional:
        return None
    if isinstance(raw, str):
        try:
            t = datetime.fromisoformat(raw)
            if t.tzinfo is not None:
                return t.astimezone(UTC)
        except (ValueError, OverflowError):
            pass
    raise BatchError(where, f"not an ISO 8601 time with a zone: {raw!r}")


def _state(raw, where: str) -> str:
    try:
        if isinstance(raw, str):
            return parse.normalize_state(raw)[0]
    except parse.SlurmParseError:
        pass
    raise BatchError(where, f"not a Slurm job state (PENDING, RUNNING, COMPLETED, …): {raw!r}")


def _hosts(raw, where: str) -> list[str]:
    if not isinstance(raw, list):
        raise BatchError(where, f"must be a list of host names, got {raw!r}")
    hosts, seen = [], set()
    for k, h in enumerate(raw):
        hosts.append(_text(h, f"{where}[{k}]", MAX_HOSTNAME, required=True))
        if hosts[-1] in seen:
            raise BatchError(f"{where}[{k}]", f"{h!r} is listed twice")
        seen.add(hosts[-1])
    return hosts


# --- records ---------------------------------------------------------------------------------------
def _allocation(raw, where: str, job_id: str, nodes: list[str]) -> parse.Allocation:
    rec = _object(raw, where, ALLOCATION_KEYS)
    node = _text(rec.get("node"), f"{where}.node", MAX_HOSTNAME, required=True)
    if node not in nodes:
        raise BatchError(f"{where}.node", f"{node!r} is not one of the job's nodes {nodes!r}")
    indexes = rec.get("gpu_indexes")
    if not isinstance(indexes, list) or not indexes:
        raise BatchError(f"{where}.gpu_indexes", f"must be a non-empty list of GPU indexes, got {indexes!r}")
    for k, i in enumerate(indexes):
        _int(i, f"{where}.gpu_indexes[{k}]", high=MAX_GPU_INDEX)
        if i in indexes[:k]:
            raise BatchError(f"{where}.gpu_indexes[{k}]", f"GPU {i} is listed twice")
    start = _time(rec.get("start"), f"{where}.start", optional=False)
    end = _time(rec.get("end"), f"{where}.end")
    if end is not None and end < start:
        raise BatchError(f"{where}.end", f"{rec['end']!r} is before the allocation's start {rec['start']!r}")
    return parse.Allocation(job_id, node, sorted(indexes), start, end)


def _times(rec: dict, where: str, state: str) -> tuple[datetime | None, ...]:
    submit, start, end = (_time(rec.get(k), f"{where}.{k}") for k in ("submit", "start", "end"))
    kind = STATES.get(state, JobState.UNKNOWN)
    if kind == JobState.PENDING:
        return submit, None, None  # Slurm fills these with its estimates while a job waits
    if kind == JobState.RUNNING:
        end = None  # the time limit, not an end
        if start is None:  # (an ended job may never have started: cancelled while pending)
            raise BatchError(f"{where}.start", f"a {state} job needs its start time, got None")
    if end is None and kind in ENDED:
        raise BatchError(f"{where}.end", f"a {state} job needs its end time, got None")
    if submit and start and start < submit:
        raise BatchError(f"{where}.start", f"{rec['start']!r} is before the submit time {rec['submit']!r}")
    if start and end and end < start:
        raise BatchError(f"{where}.end", f"{rec['end']!r} is before the start {rec['start']!r}")
    return submit, start, end


def _job(raw, where: str) -> tuple[parse.Job, list[parse.Allocation]]:
    rec = _object(raw, where, JOB_KEYS)
    job_id = _text(rec.get("job_id"), f"{where}.job_id", 128, required=True)
    texts = {k: _text(rec.get(k), f"{where}.{k}", n) for k, n in TEXTS.items()}
    state = _state(rec.get("state"), f"{where}.state")
    submit, start, end = _times(rec, where, state)
    nodes = _hosts(rec.get("nodes", []), f"{where}.nodes")
    gpus = _int(rec.get("gpus", 0), f"{where}.gpus", high=1_000_000)
    node_count = _int(rec.get("node_count", len(nodes)), f"{where}.node_count", high=1_000_000)
    allocations = rec.get("allocations", [])
    if not isinstance(allocations, list):
        raise BatchError(f"{where}.allocations", f"must be a list, got {allocations!r}"[:300])
    if allocations and start is None:
        raise BatchError(f"{where}.allocations", f"a {state} job that has not started holds no GPUs, "
                         f"got {len(allocations)} allocation(s)")
    allocs = [_allocation(a, f"{where}.allocations[{k}]", job_id, nodes) for k, a in enumerate(allocations)]
    job = parse.Job(
        job_id=job_id, raw_job_id=_raw_id(job_id), **texts,
        priority=_int(rec.get("priority"), f"{where}.priority", low=-BIGINT - 1, optional=True),
        state=state, submit=submit, start=start, end=end, nodes=nodes, node_count=node_count,
        gpu_count=gpus, gpus_requested=gpus, requeue=None,
        restart_count=_int(rec.get("restart_count"), f"{where}.restart_count", optional=True),
        preempted=state == "PREEMPTED",
    )
    return job, allocs


def _raw_id(job_id: str) -> int:
    """The job id's leading number (Slurm's raw id), for ordering; 0 when it has none or it overflows bigint."""
    digits = re.search(r"\d+", job_id)
    value = int(digits.group()[:19]) if digits else 0
    return value if value <= BIGINT else 0


def parse_snapshot(doc) -> tuple[list[parse.Job], list[parse.Allocation]]:
    """Every job and allocation of a snapshot, or BatchError naming the first problem."""
    rec = _object(doc, "", frozenset({"source", "jobs", "complete"}))
    if not isinstance(rec.get("complete", False), bool):
        raise BatchError("complete", f"must be true or false, got {rec['complete']!r}"[:200])
    if rec.get("source") not in SOURCES:
        accepted = ", ".join(map(repr, SOURCES))
        raise BatchError("source", f"only {accepted} is accepted for now, got {rec.get('source')!r}")
    raw = rec.get("jobs")
    if not isinstance(raw, list):
        raise BatchError("jobs", f"must be a list of jobs, got {raw!r}"[:200])
    if len(raw) > MAX_JOBS:
        raise BatchError("jobs", f"at most {MAX_JOBS} jobs per snapshot, got {len(raw)}")
    jobs, allocations, seen = [], [], {}
    for k, item in enumerate(raw):
        job, allocs = _job(item, f"jobs[{k}]")
        if job.job_id in seen:
            raise BatchError(f"jobs[{k}].job_id", f"{job.job_id!r} is already at jobs[{seen[job.job_id]}]")
        seen[job.job_id] = k
        jobs.append(job)
        allocations += allocs
    return jobs, allocations


# --- the view --------------------------------------------------------------------------------------
@json_edge
def _handle(request: HttpRequest) -> JsonResponse:
    # A worker thread: check the connection before (a DB restart may have broken it) and after.
    close_old_connections()
    try:
        authenticate_collector(request.headers.get("Authorization"))
        doc = loads_json(_body(request), "")
        jobs, allocations = parse_snapshot(doc)
        result = do_sync_slurm(jobs, allocations, now=datetime.now(UTC), complete=doc.get("complete") is True)
    finally:
        close_old_connections()
    return JsonResponse(result)


@collector_endpoint
@csrf_exempt
async def ingest_jobs(request: HttpRequest) -> JsonResponse:
    """POST /api/v1/jobs — see the module docstring."""
    return _method_guard(request) or await sync_to_async(_handle, thread_sensitive=False)(request)
