"""The node agent's command channel (collector token), used by telemetry.agent.commands:

    GET  /api/v1/agent/commands?host=<hostname>   -> {"commands": [{"id", "command", "params", "expires_at"}]}
         the host's queued commands, oldest first, now marked sent (a command is handed out once);
    POST /api/v1/agent/commands/<id>/result        {"ok": true, "rc": 0, "output": "...",
                                                    "readback": {"power_limit_w": 500.0}}
         -> {"id", "state"}; 404 unknown command, 410 expired (its action has failed), 400 malformed.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from alerts.remediation.executor import do_poll_agent_commands, do_record_agent_result
from core.api import ApiError, ErrorCode, collector_endpoint, json_edge, method_not_allowed, read_json
from telemetry.api.auth import authenticate_collector

MAX_RESULT_BYTES = 64 * 1024
MAX_HOSTNAME = 253  # AgentCommand.hostname


def _guarded(handler):
    """Authenticate the collector, answer errors through the API's one edge, and release the thread's connection."""

    @json_edge
    def run(request: HttpRequest, *args) -> JsonResponse:
        close_old_connections()
        try:
            authenticate_collector(request.headers.get("Authorization"))
            return handler(request, *args)
        finally:
            close_old_connections()

    return run


def _poll(request: HttpRequest) -> JsonResponse:
    host = request.GET.get("host", "").strip()
    if not host:
        raise ApiError(400, ErrorCode.INVALID, "host is required: ?host=<this node's hostname>", where="host")
    if len(host) > MAX_HOSTNAME or "\x00" in host:
        raise ApiError(400, ErrorCode.INVALID, f"host must be a hostname of at most {MAX_HOSTNAME} characters",
                       where="host")
    commands = do_poll_agent_commands(host)
    return JsonResponse({"commands": [
        {"id": c.pk, "command": c.command, "params": c.params, "expires_at": c.expires_at.isoformat()}
        for c in commands]})


def _result(request: HttpRequest, command_id: int) -> JsonResponse:
    if len(request.body) > MAX_RESULT_BYTES:
        raise ApiError(413, ErrorCode.TOO_LARGE, f"a result is at most {MAX_RESULT_BYTES} bytes")
    payload = read_json(request.body or b"null", want=None, where="$")
    cmd = do_record_agent_result(command_id, payload)
    return JsonResponse({"id": cmd.pk, "state": cmd.state})


@collector_endpoint
@csrf_exempt
async def poll_commands(request: HttpRequest) -> JsonResponse:
    """GET /api/v1/agent/commands?host=NAME — see the module docstring."""
    if request.method != "GET":
        return method_not_allowed(request, ("GET",)).response()
    return await sync_to_async(_guarded(_poll), thread_sensitive=False)(request)


@collector_endpoint
@csrf_exempt
async def command_result(request: HttpRequest, command_id: int) -> JsonResponse:
    """POST /api/v1/agent/commands/<id>/result — see the module docstring."""
    if request.method != "POST":
        return method_not_allowed(request, ("POST",)).response()
    return await sync_to_async(_guarded(_result), thread_sensitive=False)(request, command_id)
