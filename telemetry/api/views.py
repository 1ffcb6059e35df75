"""Ingest API: JSON / NDJSON batches and Prometheus exposition pushes.

Views are async so that a slow batch never blocks the event loop of the ASGI server; the
parse-validate-write work runs in a worker thread (not the single thread Django uses for sync
views), so several collectors are served at once. Before that work starts, the admission gate
(telemetry.api.admission) may refuse the request with 429 + Retry-After: the body is then
never decoded or parsed, so an overload is shed at the cost of a few microseconds a request.
"""

from __future__ import annotations

import zlib
from datetime import UTC, datetime

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import close_old_connections
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from core.api import ApiError, ErrorCode, collector_endpoint, json_edge, method_not_allowed
from telemetry.api.admission import admit
from telemetry.api.auth import authenticate_collector
from telemetry.ingest.arrow import CONTENT_TYPE as ARROW_TYPE
from telemetry.ingest.arrow import parse_arrow
from telemetry.ingest.documents import parse_json, parse_ndjson
from telemetry.ingest.exposition import parse_dcgm_exposition
from telemetry.ingest.schema import TimeParser
from telemetry.ingest.writer import write_batch

JSON_TYPES = {"application/json", ""}
NDJSON_TYPES = {"application/x-ndjson", "application/ndjson", "application/jsonl", "application/x-jsonlines"}


def _body(request: HttpRequest) -> bytes:
    limit = settings.INGEST_MAX_BODY_BYTES
    length = request.META.get("CONTENT_LENGTH") or "0"
    if length.isdigit() and int(length) > limit:
        raise ApiError(413, ErrorCode.TOO_LARGE, f"body of {length} bytes exceeds the {limit}-byte limit")
    try:
        raw = request.body
    except RequestDataTooBig as exc:
        raise ApiError(413, ErrorCode.TOO_LARGE, f"body exceeds the {limit}-byte limit") from exc
    encoding = request.headers.get("Content-Encoding", "identity").lower().strip()
    if encoding in ("identity", ""):
        return raw
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise ApiError(415, ErrorCode.BAD_ENCODING, f"Content-Encoding {encoding!r} is not supported (use gzip)")
    return _inflate(raw, encoding, limit)


def _inflate(raw: bytes, encoding: str, limit: int) -> bytes:
    # Bounded decompression: a small gzip bomb must not expand past the body limit in memory.
    wbits = 16 + zlib.MAX_WBITS if encoding != "deflate" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise ApiError(400, ErrorCode.BAD_ENCODING, f"body is not valid {encoding}: {exc}") from exc
    if len(out) > limit or inflater.unconsumed_tail:
        raise ApiError(413, ErrorCode.TOO_LARGE, f"decompressed body exceeds the {limit}-byte limit")
    return out


def _times() -> TimeParser:
    return TimeParser(datetime.now(UTC), settings.INGEST_MAX_FUTURE_SKEW, settings.RETENTION["raw"])


@json_edge
def _ingest(request: HttpRequest, fmt: str) -> JsonResponse:
    # This runs in a worker thread, where Django's request signals do not manage the
    # connection: check it before (a DB restart may have broken it) and after (max age).
    close_old_connections()
    try:
        token = authenticate_collector(request.headers.get("Authorization"))
        body = _body(request)
        batch, extra = _parse(request, fmt, body, token.name)
        result = write_batch(batch, collector=token.name, fmt=fmt, body_bytes=len(body))
    finally:
        close_old_connections()
    return JsonResponse({**result.as_json(), **extra})


def _parse(request: HttpRequest, fmt: str, body: bytes, collector: str):
    times = _times()
    if fmt == "prometheus":
        host = request.GET.get("host") or None
        batch, blanks = parse_dcgm_exposition(body, times, host)
        return batch, {"blanks": blanks}
    ctype = (request.content_type or "").lower()
    if ctype in NDJSON_TYPES:
        return parse_ndjson(body, times), {}
    if ctype in JSON_TYPES:
        return parse_json(body, times), {}
    if ctype == ARROW_TYPE:
        return parse_arrow(body, times), {}
    raise ApiError(
        415,
        ErrorCode.BAD_CONTENT_TYPE,
        f"Content-Type {ctype!r} is not accepted (application/json, application/x-ndjson or {ARROW_TYPE})",
    )


async def _admitted(request: HttpRequest, fmt: str) -> JsonResponse:
    try:
        return await admit(request.headers.get("Authorization"), _ingest, request, fmt)
    except ApiError as exc:  # admission's Refused: 429 with Retry-After
        return exc.response()


def _method_guard(request: HttpRequest) -> JsonResponse | None:
    return method_not_allowed(request, ("POST",)).response() if request.method != "POST" else None


@collector_endpoint
@csrf_exempt
async def ingest_json(request: HttpRequest) -> JsonResponse:
    """POST /api/v1/ingest — a JSON, NDJSON or Arrow IPC batch (see docs/ingest.md)."""
    return _method_guard(request) or await _admitted(request, "json")


@collector_endpoint
@csrf_exempt
async def ingest_prometheus(request: HttpRequest) -> JsonResponse:
    """POST /api/v1/ingest/prometheus[?host=NAME] — text exposition as dcgm-exporter emits it."""
    return _method_guard(request) or await _admitted(request, "prometheus")
