"""The node agent's command channel (collector token), used by telemetry.agent.commands:

    GET  /api/v1/agent/commands?host=<hostname>   -> {"commands": [{"id", "command", "params", "expires_at"}]}
         the host's queued commands, oldest first, now marked sent (a command is handed out once);
    POST /api/v1/agent/commands/<id>/result        {"ok": true, "rc": 0, "output": "...",
                                                    "readback": {"power_limit_w": 500.0}}
         -> {"id", "state"}; 404 unknown command, 410 expired (its action has failed), 400 malformed.
"""

from __future__ import annotations

import json

from asgiref.sync import sync_to_async
from django.db import DatabaseError, DataError, close_old_connections
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from alerts.remediation.backends.agent import AgentResultError, do_poll_agent_commands, do_record_agent_result
from telemetry.api.auth import AuthError, authenticate_collector
from tenancy.access import collector_endpoint

MAX_RESULT_BYTES = 64 * 1024
MAX_HOSTNAME = 253  # AgentCommand.hostname


def _error(status: int, code: str, message: str, where: str = "", headers: dict | None = None) -> JsonResponse:
    body = {"code": code, "message": message, **({"where": where} if where else {})}
    resp = JsonResponse({"error": body}, status=status)
    for key, value in (headers or {}).items():
        resp[key] = value
    return resp


def _guarded(handler):
    """Authenticate the collector, map errors to the API's error shape, and release the thread's connection."""

    def run(request: HttpRequest, *args) -> JsonResponse:
        close_old_connections()
        try:
            authenticate_collector(request.headers.get("Authorization"))
            return handler(request, *args)
        except AuthError as exc:
            return _error(exc.status, exc.code, exc.message)
        except AgentResultError as exc:
            return _error(exc.status, exc.code, exc.message, exc.where)
        except DataError as exc:  # a value PostgreSQL cannot store (a NUL character in the output); nothing written
            return _error(400, "malformed", f"a value cannot be stored: {str(exc).splitlines()[0]}", "$")
        except DatabaseError:
            return _error(503, "unavailable", "the database is unavailable; retry", headers={"Retry-After": "5"})
        finally:
            close_old_connections()

    return run


def _poll(request: HttpRequest) -> JsonResponse:
    host = request.GET.get("host", "").strip()
    if not host:
        return _error(400, "malformed", "host is required: ?host=<this node's hostname>", "host")
    if len(host) > MAX_HOSTNAME or "\x00" in host:
        return _error(400, "malformed", f"host must be a hostname of at most {MAX_HOSTNAME} characters", "host")
    commands = do_poll_agent_commands(host)
    return JsonResponse({"commands": [
        {"id": c.pk, "command": c.command, "params": c.params, "expires_at": c.expires_at.isoformat()}
        for c in commands]})


def _result(request: HttpRequest, command_id: int) -> JsonResponse:
    if len(request.body) > MAX_RESULT_BYTES:
        return _error(413, "too_large", f"a result is at most {MAX_RESULT_BYTES} bytes")
    try:
        payload = json.loads(request.body or b"null")
    except ValueError as exc:
        return _error(400, "malformed", f"not JSON: {exc}", "$")
    cmd = do_record_agent_result(command_id, payload)
    return JsonResponse({"id": cmd.pk, "state": cmd.state})


@collector_endpoint
@csrf_exempt
async def poll_commands(request: HttpRequest) -> JsonResponse:
    """GET /api/v1/agent/commands?host=NAME — see the module docstring."""
    if request.method != "GET":
        resp = _error(405, "method_not_allowed", "use GET")
        resp["Allow"] = "GET"
        return resp
    return await sync_to_async(_guarded(_poll), thread_sensitive=False)(request)


@collector_endpoint
@csrf_exempt
async def command_result(request: HttpRequest, command_id: int) -> JsonResponse:
    """POST /api/v1/agent/commands/<id>/result — see the module docstring."""
    if request.method != "POST":
        resp = _error(405, "method_not_allowed", "use POST")
        resp["Allow"] = "POST"
        return resp
    return await sync_to_async(_guarded(_result), thread_sensitive=False)(request, command_id)
