"""Inbound alerts: Prometheus Alertmanager webhook payloads (version 4), authenticated by a collector token.

Point an Alertmanager receiver at it:

    receivers:
      - name: breakwater
        webhook_configs:
          - url: https://breakwater.example/api/v1/alerts/alertmanager
            http_config: {authorization: {credentials: <collector token>}}
"""

from __future__ import annotations

import logging

from django.db import DataError
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from alerts.alertmanager import PayloadError, parse_webhook
from alerts.lifecycle import do_apply_alertmanager
from core.api import ApiError, ErrorCode, collector_endpoint, json_edge, method_not_allowed, read_json
from telemetry.api.auth import authenticate_collector

log = logging.getLogger(__name__)


def _nul_path(value, path: str) -> str | None:
    """The path of the first key or string holding a NUL character, or None."""
    if isinstance(value, str):
        return path if "\x00" in value else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        sub = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else str(key)
        if isinstance(key, str) and "\x00" in key:
            return sub
        found = _nul_path(item, sub)
        if found is not None:
            return found
    return None


@collector_endpoint
@csrf_exempt
@json_edge
def alertmanager_webhook(request: HttpRequest) -> JsonResponse:
    """POST an Alertmanager webhook: firing alerts fire or merge, resolved ones resolve; 400 names the field."""
    if request.method != "POST":
        raise method_not_allowed(request, ("POST",))
    token = authenticate_collector(request.headers.get("Authorization"))
    payload = read_json(request.body, want=None, where="(body)")
    nul = _nul_path(payload, "")
    if nul is not None:  # PostgreSQL stores no NUL character, in text or in JSON
        where = nul or "(body)"
        raise ApiError(400, ErrorCode.BAD_PAYLOAD, f"{where}: contains a NUL character", where=where)
    try:
        changed = do_apply_alertmanager(*parse_webhook(payload), timezone.now())
    except PayloadError as exc:
        raise ApiError(400, ErrorCode.BAD_PAYLOAD, str(exc), where=exc.path) from exc
    except DataError as exc:  # a value past a column's size (an alertname over 200 characters); nothing written
        raise ApiError(400, ErrorCode.BAD_PAYLOAD, f"a value does not fit: {str(exc).splitlines()[0]}",
                       where="(body)") from exc
    alerts = len(payload["alerts"])
    log.info("alertmanager webhook from %s: %d alert(s), %d changed", token.name, alerts, len(changed))
    return JsonResponse({"status": "ok", "received": alerts, "changed": changed})
