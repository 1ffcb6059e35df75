"""Running an approved remediation action, verifying it, and recording both (result, audit).

`execute(action_id)` is what the Celery task `alerts.tasks.execute_action` calls; it is safe to run twice:

1. Claim, under the kind's guard-rail lock: only an approved action runs. A running one is left alone unless it
   started more than RUNNING_STALE_AFTER ago (its worker died mid-run): then it runs again, which the backends
   allow (a drain of a draining node is success). Anything finished is a no-op. Before a first run the guard
   rails are checked once more; a block ends the action as blocked. The claim commits state running and an
   audit entry before anything touches the outside world.
2. Run the backend (scheduler backend from settings.REMEDIATION_BACKEND, the node agent, the ticket webhook).
3. Verify by reading the world back, and record commands, outputs and the verification in `result`; state
   succeeded or failed, `verified`, `finished_at`, audit entries action.execute and action.verify.
   A verified drain or resume also sets the inventory node state, so the fleet page and the rails agree.
An agent action stops after 2 (commands queued): it finishes when the agent posts its results
(`finish_agent_action`), or fails when its commands expire; a follow-up task checks after the TTL.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from alerts.models import ActionKind, ActionState, AgentCommand, AgentCommandState, RemediationAction
from alerts.remediation.backends import get_backend
from alerts.remediation.backends.agent import (
    AgentResultError,
    describe_command,
    expire_agent_commands,
    parse_agent_result,
)
from alerts.remediation.backends.base import Backend, BackendError
from alerts.remediation.guards import blocked_reason, lock_kind, resolve_target
from core.audit import do_audit
from core.queue import enqueue
from telemetry.actions import do_set_node_state

logger = logging.getLogger(__name__)

RUNNING_STALE_AFTER = timedelta(minutes=15)
NODE_STATE_AFTER = {ActionKind.DRAIN: "drained", ActionKind.RESUME: "active"}
ACTOR = "system:remediation"


def execute(action_id: int, *, now: datetime | None = None) -> str:
    """Run one action if it is due (see the module docstring); returns what happened, in words."""
    now = now or timezone.now()
    claim = _claim(action_id, now)
    if isinstance(claim, str):
        return check_agent_action(action_id, now) if claim == "agent" else claim
    action, backend = claim
    try:
        outcome = backend.run(action)
    except BackendError as exc:
        return _finish(action.pk, verified=None, result={"commands": exc.commands}, error=str(exc))
    except Exception as exc:  # an unexpected failure still ends the action, recorded, instead of leaving it running
        logger.exception("remediation action %s: %s backend failed", action.pk, backend.name)
        return _finish(action.pk, verified=None, result={"commands": []}, error=f"{type(exc).__name__}: {exc}")
    if outcome.pending:
        _schedule_agent_check(action.pk)
        return "waiting for the agent"
    verified, check = backend.verify(action)
    return _finish(action.pk, verified=verified, result={"commands": outcome.commands, **outcome.detail,
                                                         "verification": check})


@transaction.atomic
def _claim(action_id: int, now: datetime) -> tuple[RemediationAction, Backend] | str:
    kind = RemediationAction.objects.filter(pk=action_id).values_list("kind", flat=True).first()
    if kind is None:
        return f"no action #{action_id}"
    lock_kind(kind)
    action = RemediationAction.objects.select_for_update().get(pk=action_id)
    if action.state == ActionState.RUNNING and action.backend == "agent":
        return "agent"
    stale = action.state == ActionState.RUNNING and action.started_at < now - RUNNING_STALE_AFTER
    if action.state != ActionState.APPROVED and not stale:
        return f"nothing to do: action #{action.pk} is {action.state}"
    if not stale:
        reason = blocked_reason(kind, resolve_target(kind, action.target_key), now=now, exclude_id=action.pk)
        if reason:
            action.state, action.blocked_reason = ActionState.BLOCKED, reason
            action.save(update_fields=["state", "blocked_reason"])
            do_audit(ACTOR, "action.execute", "action", action.pk, reason=reason, outcome="blocked", at=now)
            return f"blocked: {reason}"
    backend = get_backend(kind)
    action.state, action.started_at, action.backend = ActionState.RUNNING, now, backend.name
    action.save(update_fields=["state", "started_at", "backend"])
    do_audit(ACTOR, "action.execute", "action", action.pk, outcome="retried" if stale else "started",
             detail={"backend": backend.name, "commands": _plan(backend, action)}, at=now)
    return action, backend


def _plan(backend: Backend, action: RemediationAction) -> list[str]:
    try:
        return backend.plan(action)
    except BackendError as exc:
        return [f"(cannot plan: {exc})"]


@transaction.atomic
def _finish(action_id: int, *, verified: bool | None, result: dict, error: str = "") -> str:
    action = RemediationAction.objects.select_for_update().get(pk=action_id)
    if action.state != ActionState.RUNNING:
        return f"already {action.state}"
    return _complete(action, verified=verified, result=result, error=error, now=timezone.now())


def _complete(action: RemediationAction, *, verified: bool | None, result: dict, error: str, now: datetime) -> str:
    """Record the outcome of a locked, running action. `verified` None means not knowable yet (a queued ticket):
    success unless an error says otherwise."""
    failed = bool(error) or verified is False
    action.state = ActionState.FAILED if failed else ActionState.SUCCEEDED
    action.verified, action.finished_at = verified, now
    action.result = {**result, **({"error": error} if error else {})}
    action.save(update_fields=["state", "verified", "finished_at", "result"])
    if verified and action.kind in NODE_STATE_AFTER:
        do_set_node_state(action.target_key, NODE_STATE_AFTER[action.kind])
    commands = [c.get("cmd") for c in result.get("commands", [])]
    do_audit(ACTOR, "action.execute", "action", action.pk, reason=error, outcome=action.state,
             detail={"backend": action.backend, "commands": commands}, at=now)
    check = result.get("verification") or {}
    do_audit(ACTOR, "action.verify", "action", action.pk, outcome={True: "verified", False: "not verified",
                                                                   None: "unknown"}[verified],
             detail=check if isinstance(check, dict) else {"check": check}, at=now)
    return f"{action.state}: {error}" if error else action.state


# --- Agent actions: finished by the agent's report, or by expiry --------------------------------------------

def _schedule_agent_check(action_id: int) -> None:
    grace = settings.AGENT_COMMAND_TTL + timedelta(seconds=30)
    transaction.on_commit(lambda: enqueue("alerts.tasks.execute_action", action_id, countdown=grace.total_seconds()))


def check_agent_action(action_id: int, now: datetime) -> str:
    """Expire commands the agent never fetched or answered, then finish the action if nothing is outstanding."""
    do_expire_agent_commands(now)
    outcome = finish_agent_action(action_id, now=now)
    if outcome.startswith("already "):  # the expiry above (or the agent's report) has just finished it
        action = RemediationAction.objects.get(pk=action_id)
        error = action.result.get("error")
        return f"{action.state}: {error}" if error else action.state
    return outcome


@transaction.atomic
def finish_agent_action(action_id: int, *, now: datetime | None = None) -> str:
    """Verify and finish a running agent action once every command of it has an answer (or expired)."""
    action = RemediationAction.objects.select_for_update().get(pk=action_id)
    if action.state != ActionState.RUNNING:
        return f"already {action.state}"
    commands = list(action.agent_commands.order_by("id"))
    if not commands or any(c.state in (AgentCommandState.QUEUED, AgentCommandState.SENT) for c in commands):
        return "waiting for the agent"
    verified, check = get_backend(action.kind, "agent").verify(action)
    errors = [f"#{c.pk} {c.state}: {c.result.get('error') or c.result.get('output', '')}".strip()
              for c in commands if c.state != AgentCommandState.DONE]
    result = {**action.result, "commands": [_agent_row(c) for c in commands], "verification": check}
    return _complete(action, verified=verified, result=result, error="; ".join(errors), now=now or timezone.now())


def _agent_row(cmd) -> dict:
    return {"cmd": describe_command(cmd.hostname, cmd.command, cmd.params), "agent_command": cmd.pk,
            "state": cmd.state, "rc": cmd.result.get("rc"), "output": str(cmd.result.get("output", ""))[-2000:],
            "readback": cmd.result.get("readback")}


# --- The agent's command channel (alerts.api.agent calls these) ---------------------------------------------

@transaction.atomic
def do_poll_agent_commands(hostname: str, *, now: datetime | None = None) -> list[AgentCommand]:
    """The host's queued, unexpired commands, oldest first, marked sent. Two polls at once never both get one."""
    now = now or timezone.now()
    do_expire_agent_commands(now, hostname=hostname)
    commands = list(AgentCommand.objects.select_for_update(skip_locked=True)
                    .filter(hostname=hostname, state=AgentCommandState.QUEUED, expires_at__gt=now)
                    .order_by("created_at", "id"))
    for cmd in commands:
        cmd.state, cmd.sent_at = AgentCommandState.SENT, now
    AgentCommand.objects.bulk_update(commands, ["state", "sent_at"])
    return commands


@transaction.atomic
def do_expire_agent_commands(now: datetime, *, hostname: str | None = None) -> int:
    """Expire the agent commands past their TTL (`expire_agent_commands`) and finish their actions, which fail;
    returns how many actions were finished."""
    actions = expire_agent_commands(now, hostname=hostname)
    for action_id in actions:
        finish_agent_action(action_id, now=now)
    return len(actions)


@transaction.atomic
def do_record_agent_result(command_id: int, payload: object, *, now: datetime | None = None) -> AgentCommand:
    """Store the agent's report of one command and finish its action. A repeated report (the agent retried a
    post whose answer it lost) returns the command unchanged; a report for an expired command is refused."""
    now = now or timezone.now()
    result = parse_agent_result(payload)
    cmd = AgentCommand.objects.select_for_update().filter(pk=command_id).first()
    if cmd is None:
        raise AgentResultError(404, "not_found", f"no agent command #{command_id}")
    if cmd.state in (AgentCommandState.DONE, AgentCommandState.FAILED):
        return cmd
    if cmd.state == AgentCommandState.EXPIRED:
        raise AgentResultError(410, "expired", f"agent command #{command_id} expired; its action has failed")
    cmd.state = AgentCommandState.DONE if result["ok"] else AgentCommandState.FAILED
    cmd.result, cmd.finished_at = result, now
    cmd.save(update_fields=["state", "result", "finished_at"])
    if cmd.action_id:
        finish_agent_action(cmd.action_id, now=now)
    return cmd
