"""The node agent: power cap, lifting a cap and GPU reset, as AgentCommand rows the agent fetches and answers.

1. `run` queues one AgentCommand for the GPU's node (GPU index and UUID in its params), expiring after
   settings.AGENT_COMMAND_TTL, and returns at once: the action stays running.
2. The agent polls GET /api/v1/agent/commands?host=<hostname> (`executor.do_poll_agent_commands`: its queued
   commands, oldest first, marked sent), runs nvidia-smi and posts {"ok", "rc", "output", "readback"} to
   /api/v1/agent/commands/<id>/result (`executor.do_record_agent_result`), which finishes the action
   (`executor.finish_agent_action`) in the same transaction.
3. A command not fetched within the TTL, or fetched and not answered within another TTL, expires
   (`expire_agent_commands`, run on every poll and by the executor's follow-up task); its action fails.
Verification is the agent's read-back: the power limit nvidia-smi reports after the change, or the reset's exit.
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from alerts.models import ActionKind, ActionState, AgentCommand, AgentCommandState, RemediationAction
from alerts.remediation.backends.base import BackendError, Outcome, command
from core.api import ApiError, ErrorCode
from telemetry.models import Gpu

POWER_TOLERANCE_W = 1.0  # nvidia-smi reports limits to two decimals; a driver may round a requested cap


class AgentResultError(ApiError):
    """A result the channel refuses: HTTP `status`, stable `code`, and a message naming the field."""

    def __init__(self, status: int, code: ErrorCode | str, message: str, where: str = ""):
        super().__init__(status, code, message, where=where)


def describe_command(hostname: str, kind: str, params: dict) -> str:
    """The nvidia-smi line the agent runs for a command, as shown in plans and results."""
    index = params.get("index")
    if kind == ActionKind.GPU_RESET:
        return f"{hostname}: nvidia-smi -i {index} -r"
    watts = params.get("watts")
    return f"{hostname}: nvidia-smi -i {index} -pl {watts if watts is not None else '<default limit>'}"


class AgentBackend:
    """Queues commands for the node agent; the agent's report finishes the action."""

    name = "agent"
    asynchronous = True

    def _gpu(self, action: RemediationAction) -> Gpu:
        gpu = Gpu.objects.select_related("node").filter(uuid=action.target_key).first()
        if gpu is None or gpu.index is None:
            raise BackendError(f"GPU {action.target_key} is not in the inventory with an index")
        return gpu

    def _params(self, action: RemediationAction, gpu: Gpu) -> dict:
        params = {"index": gpu.index, "uuid": gpu.uuid}
        if action.kind in (ActionKind.POWER_CAP, ActionKind.POWER_UNCAP) and action.params.get("watts") is not None:
            params["watts"] = action.params["watts"]
        return params

    def plan(self, action: RemediationAction) -> list[str]:
        gpu = self._gpu(action)
        return [describe_command(gpu.node.hostname, action.kind, self._params(action, gpu))]

    @transaction.atomic
    def run(self, action: RemediationAction) -> Outcome:
        gpu, now = self._gpu(action), timezone.now()
        cmd = action.agent_commands.filter(state__in=(AgentCommandState.QUEUED, AgentCommandState.SENT)).first()
        if cmd is None:
            cmd = AgentCommand.objects.create(
                hostname=gpu.node.hostname, action=action, command=action.kind, params=self._params(action, gpu),
                created_at=now, expires_at=now + settings.AGENT_COMMAND_TTL)
        rows = [command(describe_command(cmd.hostname, cmd.command, cmd.params), rc=None, agent_command=cmd.pk,
                        state=cmd.state)]
        RemediationAction.objects.filter(pk=action.pk, state=ActionState.RUNNING).update(
            result={"commands": rows, "pending": True})
        return Outcome(rows, pending=True)

    def verify(self, action: RemediationAction) -> tuple[bool | None, dict]:
        checks = [verify_command(c) for c in action.agent_commands.order_by("id")]
        if not checks:
            return False, {"check": "agent read-back", "error": "no agent command"}
        return all(ok for ok, _ in checks), {"check": "agent read-back", "commands": [d for _, d in checks]}


def verify_command(cmd: AgentCommand) -> tuple[bool, dict]:
    """Whether the agent's report shows the command took effect."""
    result, detail = cmd.result or {}, {"agent_command": cmd.pk, "state": cmd.state}
    if cmd.state != AgentCommandState.DONE or result.get("ok") is not True:
        return False, detail
    readback = result.get("readback") or {}
    detail["readback"] = readback
    if cmd.command == ActionKind.GPU_RESET:
        return True, detail
    want = cmd.params.get("watts")
    if want is None:
        want = readback.get("default_limit_w")
    got = readback.get("power_limit_w")
    detail["expected_w"] = want
    ok = isinstance(got, int | float) and isinstance(want, int | float) and abs(got - want) <= POWER_TOLERANCE_W
    return ok, detail


# --- The command channel: the executor's agent actions call these ------------------------------------------

def expire_agent_commands(now: datetime, *, hostname: str | None = None) -> list[int]:
    """Expire commands never fetched before `expires_at`, or fetched and unanswered for a TTL; returns the ids of
    their actions, which the caller finishes in the same transaction (`executor.do_expire_agent_commands`)."""
    stale = (Q(state=AgentCommandState.QUEUED, expires_at__lte=now)
             | Q(state=AgentCommandState.SENT, sent_at__lte=now - settings.AGENT_COMMAND_TTL))
    qs = AgentCommand.objects.select_for_update(skip_locked=True).filter(stale)
    expired = list(qs.filter(hostname=hostname) if hostname else qs)
    for cmd in expired:
        was = "fetched but never answered" if cmd.state == AgentCommandState.SENT else "never fetched"
        cmd.state, cmd.finished_at = AgentCommandState.EXPIRED, now
        cmd.result = {**cmd.result, "error": f"expired: {was} by the agent on {cmd.hostname}"}
    AgentCommand.objects.bulk_update(expired, ["state", "finished_at", "result"])
    return sorted({c.action_id for c in expired if c.action_id})


def parse_agent_result(payload: object) -> dict:
    """The agent's report of one command, checked field by field (AgentResultError names the field)."""
    if not isinstance(payload, dict):
        raise AgentResultError(400, "malformed", "expected a JSON object", "$")
    if not isinstance(payload.get("ok"), bool):
        raise AgentResultError(400, "malformed", "ok must be true or false", "$.ok")
    rc, readback = payload.get("rc"), payload.get("readback") or {}
    if rc is not None and (isinstance(rc, bool) or not isinstance(rc, int)):
        raise AgentResultError(400, "malformed", "rc must be an integer", "$.rc")
    if not isinstance(readback, dict) or not all(
            isinstance(v, int | float | type(None)) and not isinstance(v, bool) for v in readback.values()):
        raise AgentResultError(400, "malformed", "readback must be an object of numbers", "$.readback")
    return {"ok": payload["ok"], "rc": rc, "output": str(payload.get("output", ""))[-4000:], "readback": readback}


