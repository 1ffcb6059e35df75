"""Fault events in an ingest batch: what an agent saw in the kernel log or from NVML.

    "events": [{"host": "gpu-0001", "pci_bus_id": "00000000:18:00.0", "kind": "xid", "code": 79,
                "time": "2026-11-30T12:00:00Z", "message": "GPU has fallen off the bus.", "source": "kmsg"}]

A record names its GPU by `gpu_uuid`, or by `pci_bus_id` on `host` (the kernel log knows only
the bus id). Events are written in the same transaction as the batch's samples.
"""

from __future__ import annotations

from telemetry.ingest.schema import Batch, BatchError, TimeParser, storable_text_problem
from telemetry.models.events import GpuEventKind

KINDS = {k.value for k in GpuEventKind}
KEYS = {"host", "gpu_uuid", "pci_bus_id", "kind", "code", "time", "message", "source", "count"}
INT32_MAX = 2**31 - 1  # code and count are IntegerFields


def _str(rec: dict, key: str, where: str, *, required: bool = False, limit: int = 200) -> str | None:
    value = rec.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise BatchError(f"{where}.{key}", f"must be a non-empty string of at most {limit} characters, got {shown}")
    problem = storable_text_problem(value, limit)  # too long, NUL or a lone surrogate: PostgreSQL would refuse it
    if problem:
        raise BatchError(f"{where}.{key}", problem)
    return value.strip()


def _int(rec: dict, key: str, where: str, default: int, minimum: int) -> int:
    value = rec.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= INT32_MAX:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise BatchError(f"{where}.{key}", f"must be an integer from {minimum} to {INT32_MAX}, got {shown}")
    return value


def add_event(batch: Batch, rec, where: str, times: TimeParser, default_time) -> None:
    """Validate one event record and add it to the batch (future/too old: rejected and counted)."""
    if not isinstance(rec, dict):
        raise BatchError(where, f"an event must be an object, got {type(rec).__name__}")
    unknown = set(rec) - KEYS
    if unknown:
        raise BatchError(f"{where}.{sorted(unknown)[0][:80]}", "unknown key for an event")
    event = {
        "host": _str(rec, "host", where, required=True), "gpu_uuid": _str(rec, "gpu_uuid", where),
        "pci_bus_id": _str(rec, "pci_bus_id", where), "message": _str(rec, "message", where, limit=2000) or "",
        "source": _str(rec, "source", where, limit=32) or "api", "code": _int(rec, "code", where, 0, 0),
        "count": _int(rec, "count", where, 1, 1),
    }
    kind = rec.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise BatchError(f"{where}.kind", f"must be one of {', '.join(sorted(KINDS))}, got {kind!r}")
    if not event["gpu_uuid"] and not event["pci_bus_id"]:
        raise BatchError(where, "an event names its GPU by gpu_uuid or pci_bus_id")
    raw_time = rec.get("time", default_time)
    event["time"] = times.now if raw_time is None else times.parse(raw_time, f"{where}.time")
    problem = times.problem(event["time"])
    if problem:
        batch.reject(where, problem, 1)
        return
    batch.events.append({**event, "kind": kind, "where": where})
