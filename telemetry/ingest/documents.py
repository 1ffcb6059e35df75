"""Parsing a whole ingest document, JSON or NDJSON, into a `Batch` (the records' rules are in `schema`;
the columnar form of a collection in `columnar`, fault events in `events`)."""

from __future__ import annotations

import json

from telemetry.fields import KINDS
from telemetry.ingest.columnar import add_columns
from telemetry.ingest.events import add_event
from telemetry.ingest.schema import (
    COLLECTION_KEYS,
    IDENTITY_LENGTHS,
    Batch,
    BatchError,
    TimeParser,
    add_record,
    loads_json,
    path_key,
    short_repr,
    storable_text_problem,
)


def parse_json(body: bytes, times: TimeParser) -> Batch:
    """A JSON batch: {"time": ..., "gpus": [...], "migs": [...], "ports": [...], "power": [...]}."""
    doc = loads_json(body, "")
    if not isinstance(doc, dict):
        raise BatchError("$", f"the batch must be a JSON object, got {type(doc).__name__}")
    unknown = set(doc) - set(COLLECTION_KEYS) - {"time", "collector", "events", "agent"}
    if unknown:
        raise BatchError(
            f"$.{path_key(sorted(unknown)[0])}",
            f"unknown key (expected one of time, {', '.join(COLLECTION_KEYS)}, events, agent)",
        )
    default_time = doc.get("time")
    if default_time is not None:
        times.parse(default_time, "$.time")
    batch = Batch()
    for key, kind in COLLECTION_KEYS.items():
        recs = doc.get(key) or []
        if isinstance(recs, dict):
            add_columns(batch, kind, recs, f"$.{key}", times, default_time)
            continue
        if not isinstance(recs, list):
            raise BatchError(
                f"$.{key}", f"must be a list of records or an object of columns, got {type(recs).__name__}"
            )
        for i, rec in enumerate(recs):
            add_record(batch, kind, rec, f"$.{key}[{i}]", times, default_time)
    _add_events(batch, doc.get("events"), times, default_time)
    batch.agent = _agent(doc.get("agent"))
    return batch


def _agent(raw) -> dict | None:
    """The agent's self-report: {"host": str, ...health counters}; kept small and JSON-only."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("host"), str) or not raw["host"].strip():
        raise BatchError("$.agent", "must be an object with a non-empty 'host'")
    problem = storable_text_problem(raw["host"], IDENTITY_LENGTHS["host"])
    if problem:
        raise BatchError("$.agent.host", problem)
    try:
        # Stored as jsonb: no NaN/Infinity, no lone surrogates, no NUL (PostgreSQL refuses all three).
        text = json.dumps(raw, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")
    except (ValueError, UnicodeEncodeError) as exc:
        raise BatchError("$.agent", f"not storable as JSON: {exc}"[:200]) from exc
    if "\x00" in text or "\\u0000" in text:
        raise BatchError("$.agent", "contains a NUL character")
    if len(text) > 16_384:
        raise BatchError("$.agent", "the agent report is larger than 16 KiB")
    return raw


def _add_events(batch: Batch, events, times: TimeParser, default_time, where: str | None = None) -> None:
    if events is None:
        return
    if not isinstance(events, list):
        raise BatchError("$.events", f"must be a list of events, got {type(events).__name__}")
    for i, rec in enumerate(events):
        add_event(batch, rec, where or f"$.events[{i}]", times, default_time)


def parse_ndjson(body: bytes, times: TimeParser) -> Batch:
    """NDJSON: one record per line, each with "kind": gpu | mig | port | power."""
    batch = Batch()
    for lineno, line in enumerate(body.split(b"\n"), start=1):
        if not line.strip():
            continue
        rec = loads_json(line, f"line {lineno}")
        if not isinstance(rec, dict):
            raise BatchError(f"line {lineno}", f"each line must be a JSON object, got {type(rec).__name__}")
        kind = rec.get("kind")
        if kind == "event":  # {"kind": "event", "event": {...}}: a fault event has a kind of its own
            _add_events(batch, [rec.get("event")], times, None, where=f"line {lineno}.event")
            continue
        if not isinstance(kind, str) or kind not in KINDS:
            raise BatchError(f"line {lineno}.kind",
                             f"must be one of {', '.join(KINDS)} or event, got {short_repr(kind)}")
        add_record(batch, kind, rec, f"line {lineno}", times, None)
    return batch
