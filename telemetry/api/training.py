"""POST /api/v1/training — per-rank training metrics from a running job (docs/training.md).

    {"job": "slurm:4242", "records": [{"rank": 0, "step": 100, "time": "2026-11-30T12:00:00Z",
      "step_time_s": 0.82, "compute_time_s": 0.64, "loss": 2.31, "grad_norm": 1.7, "tokens_per_s": 48000,
      "nan_count": 0, "inf_count": 0}]}

A job not seen from its scheduler yet is created as a placeholder that the scheduler sync fills in.
A NaN or infinite loss or grad norm is the signal a divergence detector needs, not bad input: it is
stored as missing with nan_count / inf_count raised, so charts stay plottable.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

import psycopg
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from core.api import collector_endpoint, json_edge
from telemetry import live
from telemetry.api.auth import authenticate_collector
from telemetry.api.views import _body, _method_guard
from telemetry.ingest.schema import BatchError, TimeParser, loads_json, storable_text_problem
from telemetry.models import Job

NUMBERS = ("step_time_s", "compute_time_s", "loss", "grad_norm", "tokens_per_s")
KEYS = {"rank", "step", "time", "nan_count", "inf_count", *NUMBERS}
INT_MAX, BIGINT_MAX = 2**31 - 1, 2**63 - 1
EXTERNAL_ID_LENGTH = 128  # Job.external_id


def _job_key(raw) -> tuple[str, str]:
    if not isinstance(raw, str) or ":" not in raw:
        raise BatchError("$.job", f"must be 'slurm:<job id>' or 'k8s:<pod uid>', got {raw!r}")
    source, _, external = raw.partition(":")
    if source not in Job.Source.values or not external.strip():
        raise BatchError("$.job", f"unknown scheduler {source!r} or empty id (slurm or k8s)")
    problem = storable_text_problem(external.strip(), EXTERNAL_ID_LENGTH)
    if problem:
        raise BatchError("$.job", f"the job id is {problem}")
    return source, external.strip()


def _record(rec, where: str, times: TimeParser) -> tuple:
    if not isinstance(rec, dict):
        raise BatchError(where, "a record must be an object")
    unknown = set(rec) - KEYS
    if unknown:
        raise BatchError(f"{where}.{sorted(unknown)[0]}", "unknown key")
    for key, high in (("rank", INT_MAX), ("step", BIGINT_MAX)):  # the columns' ranges (integer, bigint)
        if isinstance(rec.get(key), bool) or not isinstance(rec.get(key), int) or not 0 <= rec[key] <= high:
            raise BatchError(f"{where}.{key}", f"must be an integer from 0 to {high}, got {rec.get(key)!r}"[:300])
    t = times.now if rec.get("time") is None else times.parse(rec["time"], f"{where}.time")
    nan, inf = (_count(rec, k, where) for k in ("nan_count", "inf_count"))
    values = []
    for key in NUMBERS:
        v = rec.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise BatchError(f"{where}.{key}", f"must be a number, got {v!r}")
        if isinstance(v, int):  # the columns are float8; the batch goes in as one float array per column
            try:
                v = float(v)
            except OverflowError:
                raise BatchError(f"{where}.{key}", f"must fit a double-precision float, got {v!r}"[:300]) from None
        if v is not None and not math.isfinite(v):
            nan, inf = (nan + 1, inf) if math.isnan(v) else (nan, inf + 1)
            v = None
        values.append(v)
    return (rec["rank"], t, rec["step"], *values, nan, inf)


def _count(rec: dict, key: str, where: str) -> int:
    v = rec.get(key, 0)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= INT_MAX:
        raise BatchError(f"{where}.{key}", f"must be an integer from 0 to {INT_MAX}, got {v!r}"[:300])
    return v


# The job's row is named by id, source and external id together: an id remembered in this process (below) that
# no longer names that job (deleted meanwhile) inserts nothing, and the caller looks the job up again.
_INSERT_STEPS = (
    "INSERT INTO telemetry_training_step (job_id, rank, time, step, step_time_s, compute_time_s, loss, grad_norm, "
    "tokens_per_s, nan_count, inf_count) SELECT j.id, u.* FROM telemetry_job j CROSS JOIN unnest(%(rank)s::int4[], "
    "%(time)s::timestamptz[], %(step)s::int8[], %(step_time_s)s::float8[], %(compute_time_s)s::float8[], "
    "%(loss)s::float8[], "
    "%(grad_norm)s::float8[], %(tokens_per_s)s::float8[], %(nan_count)s::int4[], %(inf_count)s::int4[]) u "
    "WHERE j.id = %(job)s AND j.source = %(source)s AND j.external_id = %(external_id)s "
    "ON CONFLICT (job_id, rank, time) DO UPDATE SET step = EXCLUDED.step, step_time_s = EXCLUDED.step_time_s, "
    "compute_time_s = EXCLUDED.compute_time_s, "
    "loss = EXCLUDED.loss, grad_norm = EXCLUDED.grad_norm, tokens_per_s = EXCLUDED.tokens_per_s, "
    "nan_count = EXCLUDED.nan_count, inf_count = EXCLUDED.inf_count"
)
_COLUMNS = ("rank", "time", "step", *NUMBERS, "nan_count", "inf_count")
# (source, external id) → job id in this process. A running job posts its ranks every few seconds for hours; at
# 16k simulated GPUs that is ~100 requests a tick, a third of daphne's requests, and each looked its job up
# through the ORM first. Ids are never reused, and a stale entry only costs that lookup again (_INSERT_STEPS).
_JOB_IDS: dict[tuple[str, str], int] = {}
_JOB_IDS_MAX = 100_000


def _insert_steps(job_id: int, source: str, external_id: str, last: dict) -> bool:
    """One statement over column arrays, not one INSERT per rank: per-row statements were ~4 s of the database's
    every minute in the 16k soak. On the bare psycopg cursor (same transaction) the arrays are bound server-side:
    Django's cursor spells every value into the SQL text in Python, ~5 % of daphne's busy time in the 16k soak
    (py-spy, 2026-12-02). True when the job was there."""
    params = dict(zip(_COLUMNS, (list(col) for col in zip(*last.values(), strict=True)), strict=True))
    params.update(job=job_id, source=source, external_id=external_id)
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cur:
        cur.execute(_INSERT_STEPS, params)
        return cur.rowcount > 0


def do_record_training_steps(source: str, external_id: str, rows: list[tuple]) -> int:
    """Store steps for one job; re-sent steps replace themselves (key: job, rank, time)."""
    # Within a request the last record of a (rank, time) wins, as it did row by row (one statement cannot
    # update a row twice).
    last = {(row[0], row[1]): row for row in rows}
    key = (source, external_id)
    cached = _JOB_IDS.get(key)
    # The bare cursor's errors reach callers as Django's (a lost connection is the API's 503).
    with connection.wrap_database_errors, transaction.atomic():
        if cached is None or not last or not _insert_steps(cached, source, external_id, last):
            job, _ = Job.objects.get_or_create(source=source, external_id=external_id, defaults={"state": "running"})
            if len(_JOB_IDS) >= _JOB_IDS_MAX:
                _JOB_IDS.clear()
            _JOB_IDS[key] = job.id
            if last:
                _insert_steps(job.id, source, external_id, last)
        # Open job pages recompute their ranks on the next tick (after this commit).
        live.schedule_fleet_publish()
    return len(rows)


def parse_training(doc, times: TimeParser) -> tuple[str, str, list[tuple]]:
    """A training body (the module docstring's shape) validated: (scheduler, job id, rows for
    do_record_training_steps); BatchError naming the field at fault."""
    if not isinstance(doc, dict) or not isinstance(doc.get("records"), list):
        raise BatchError("$", "expected {\"job\": ..., \"records\": [...]}")
    source, external = _job_key(doc.get("job"))
    return source, external, [_record(r, f"$.records[{i}]", times) for i, r in enumerate(doc["records"])]


@json_edge
def _handle(request: HttpRequest) -> JsonResponse:
    close_old_connections()
    try:
        authenticate_collector(request.headers.get("Authorization"))
        times = TimeParser(datetime.now(UTC), settings.INGEST_MAX_FUTURE_SKEW, settings.RETENTION["raw"])
        source, external, rows = parse_training(loads_json(_body(request), ""), times)
        stored = do_record_training_steps(source, external, rows)
    finally:
        close_old_connections()
    return JsonResponse({"stored": stored})


@collector_endpoint
@csrf_exempt
async def ingest_training(request: HttpRequest) -> JsonResponse:
    """POST /api/v1/training — see the module docstring."""
    return _method_guard(request) or await sync_to_async(_handle, thread_sensitive=False)(request)
