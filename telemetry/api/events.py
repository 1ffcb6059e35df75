"""Read API for GPU fault events (operators and operator tokens: fault events are cluster-wide)."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from core.api import ApiError, ErrorCode, api_view
from telemetry.selectors import gpu_events


@api_view(operator=True)
def list_events(request: HttpRequest) -> JsonResponse:
    """GET /api/v1/events[?gpu=UUID&kind=xid&open=1&limit=100] — newest first."""
    try:
        limit = min(1000, max(1, int(request.GET.get("limit", "100"))))
    except ValueError:
        raise ApiError(400, ErrorCode.INVALID, "limit must be an integer", where="limit") from None
    events = gpu_events(gpu_uuid=request.GET.get("gpu") or None, kind=request.GET.get("kind") or None,
                        open_only=request.GET.get("open") in ("1", "true"), limit=limit)
    return JsonResponse({"events": events})
