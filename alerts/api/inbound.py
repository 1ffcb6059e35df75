"""Inbound alerts: Prometheus Alertmanager webhook payloads (version 4), authenticated by a collector token.

Point an Alertmanager receiver at it:

    receivers:
      - name: breakwater
        webhook_configs:
          - url: https://breakwater.example/api/v1/alerts/alertmanager
            http_config: {authorization: {credentials: <collector token>}}
"""

from __future__ import annotations

import json
import logging

from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, DataError
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from alerts.alertmanager import PayloadError
from alerts.lifecycle import do_ingest_alertmanager
from telemetry.api.auth import AuthError, authenticate_collector
from tenancy.access import collector_endpoint

log = logging.getLogger(__name__)


def _error(status: int, code: str, message: str, **extra) -> JsonResponse:
    resp = JsonResponse({"error": {"code": code, "message": message, **extra}}, status=status)
    if status == 401:
        resp["WWW-Authenticate"] = 'Bearer realm="breakwater-alerts"'
    return resp


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
def alertmanager_webhook(request: HttpRequest) -> JsonResponse:
    """POST an Alertmanager webhook: firing alerts fire or merge, resolved ones resolve; 400 names the field."""
    if request.method != "POST":
        resp = _error(405, "method_not_allowed", "POST an Alertmanager webhook payload")
        resp["Allow"] = "POST"
        return resp
    try:
        token = authenticate_collector(request.headers.get("Authorization"))
        payload = json.loads(request.body)
    except AuthError as exc:
        return _error(exc.status, exc.code, exc.message)
    except RequestDataTooBig:
        return _error(413, "too_large", "the payload exceeds the request size limit")
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        return _error(400, "bad_json", f"(body): not valid JSON: {exc}", where="(body)")
    nul = _nul_path(payload, "")
    if nul is not None:  # PostgreSQL stores no NUL character, in text or in JSON
        return _error(400, "bad_payload", f"{nul or '(body)'}: contains a NUL character", where=nul or "(body)")
    try:
        changed = do_ingest_alertmanager(payload, timezone.now())
    except PayloadError as exc:
        return _error(400, "bad_payload", str(exc), where=exc.path)
    except DataError as exc:  # a value past a column's size (an alertname over 200 characters); nothing written
        return _error(400, "bad_payload", f"a value does not fit: {str(exc).splitlines()[0]}", where="(body)")
    except DatabaseError:
        log.warning("alertmanager webhook not stored: the database is unavailable")
        resp = _error(503, "unavailable", "the database is unavailable; retry")
        resp["Retry-After"] = "5"
        return resp
    alerts = len(payload["alerts"])
    log.info("alertmanager webhook from %s: %d alert(s), %d changed", token.name, alerts, len(changed))
    return JsonResponse({"status": "ok", "received": alerts, "changed": changed})
