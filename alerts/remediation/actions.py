"""Remediation writes: request an action (in a mode), approve it, reject it. Each in one transaction, audited.

Modes, at request:
- suggest: recorded as suggested; an operator may approve it later;
- approval: awaiting an operator's approval;
- auto: approved at once, executed after commit (alerts.tasks.execute_action);
- shadow: a dry run: the guard rails are evaluated and the commands the backend would run are recorded in
  result["would_run"]; nothing runs, and the action ends as shadowed.
Guard rails (alerts.remediation.guards) are evaluated under the per-kind lock at request, at approval and again
before execution; a blocked action records which rail and the numbers in `blocked_reason`.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, datetime

from django.db import transaction
from django.utils import timezone

from alerts.models import TARGET_KIND, ActionKind, ActionMode, ActionState, Alert, Playbook, RemediationAction
from alerts.remediation.backends import get_backend
from alerts.remediation.backends.base import BackendError
from alerts.remediation.guards import Target, blocked_reason, lock_kind, resolve_target
from anomaly.models import ModelStatus, ModelVersion
from core.audit import actor_name, do_audit
from core.queue import enqueue
from telemetry.models import Job
from telemetry.selectors.inventory import latest_gpu_rows

logger = logging.getLogger(__name__)

OPEN_STATES = (ActionState.SUGGESTED, ActionState.AWAITING, ActionState.APPROVED, ActionState.RUNNING)
MODE_STATE = {ActionMode.SUGGEST: ActionState.SUGGESTED, ActionMode.APPROVAL: ActionState.AWAITING,
              ActionMode.AUTO: ActionState.APPROVED, ActionMode.SHADOW: ActionState.SHADOWED}
APPROVABLE = (ActionState.SUGGESTED, ActionState.AWAITING, ActionState.BLOCKED)
REJECTABLE = (ActionState.SUGGESTED, ActionState.AWAITING, ActionState.BLOCKED, ActionState.APPROVED)
HEALTH_FIELDS = ("gpu_util", "gpu_temp", "memory_temp", "power_w", "power_limit_w", "ecc_dbe_vol", "xid",
                 "throttle_reasons", "row_remap_failure", "row_remap_pending")


class ActionError(Exception):
    """A request the action cannot take: `code` is "invalid" (bad input) or "conflict" (wrong state)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def idempotency_key(kind: str, target_key: str, *, alert: Alert | None, mode: str, requested_by: str,
                    now: datetime) -> str:
    """Same alert, kind and target give the same key (so one action); a request without an alert is its own."""
    if alert is not None:
        key = f"alert:{alert.pk}:{kind}:{target_key}" + (":shadow" if mode == ActionMode.SHADOW else "")
    else:
        key = f"manual:{kind}:{target_key}:{mode}:{requested_by}:{now.isoformat()}"
    return key if len(key) <= 200 else f"sha256:{hashlib.sha256(key.encode()).hexdigest()}"


def _validate(kind: str, target_key: str, mode: str, params: dict) -> None:
    if kind not in ActionKind.values:
        raise ActionError("invalid", f"unknown action kind {kind!r}; use one of {', '.join(ActionKind.values)}")
    if mode not in ActionMode.values:
        raise ActionError("invalid", f"unknown mode {mode!r}; use one of {', '.join(ActionMode.values)}")
    if not target_key or len(target_key) > 200:
        raise ActionError("invalid", "target_key must be 1 to 200 characters")
    watts = params.get("watts")
    if kind == ActionKind.POWER_CAP and (isinstance(watts, bool) or not isinstance(watts, int | float) or watts <= 0):
        raise ActionError("invalid", "a power cap needs params.watts, a positive number")
    if kind == ActionKind.TICKET and not isinstance(params.get("channel"), str):
        raise ActionError("invalid", "a ticket needs params.channel, the name of the channel to open it on")


@transaction.atomic
def do_request_action(kind: str, target_key: str, *, mode: str, reason: str, evidence: dict, requested_by: str,
                      alert: Alert | None = None, playbook: Playbook | None = None, params: dict | None = None,
                      now: datetime | None = None) -> RemediationAction:
    """Record a remediation request in `mode` (see the module docstring) and return it.

    1. Under the kind's guard-rail lock, an action with the same idempotency key is returned as it is; so is an
       open action of the same kind on the same target (a second alert about one node asks for the same drain).
    2. The guard rails decide blocked or not; the evidence (alert, the target's latest metrics, the active model
       versions) is recorded with the request. `was_created` on the returned row says whether it is new.
    """
    params, now = dict(params or {}), now or timezone.now()
    _validate(kind, target_key, mode, params)
    lock_kind(kind)
    existing = _existing(kind, target_key, alert=alert, mode=mode, requested_by=requested_by, now=now)
    if existing is not None:
        existing.was_created = False
        return existing
    target = resolve_target(kind, target_key)
    action = RemediationAction(
        kind=kind, mode=mode, target_kind=TARGET_KIND[kind], target_key=target_key, params=params, reason=reason,
        evidence=collect_evidence(target, alert, evidence), alert=alert, playbook=playbook,
        idempotency_key=idempotency_key(kind, target_key, alert=alert, mode=mode, requested_by=requested_by,
                                        now=now),
        requested_by=requested_by[:150], created_at=now)
    action.blocked_reason = blocked_reason(kind, target, now=now, shadow=mode == ActionMode.SHADOW)
    _decide(action, now)
    action.save()
    do_audit(requested_by, "action.request", "action", action.pk, reason=reason, outcome=action.state,
             detail=_audit_detail(action), at=now)
    if action.state == ActionState.APPROVED:
        _enqueue_execution(action.pk)
    action.was_created = True
    return action


def _existing(kind: str, target_key: str, *, alert, mode, requested_by, now) -> RemediationAction | None:
    key = idempotency_key(kind, target_key, alert=alert, mode=mode, requested_by=requested_by, now=now)
    found = RemediationAction.objects.filter(idempotency_key=key).first()
    if found is None and mode != ActionMode.SHADOW:
        found = (RemediationAction.objects.filter(kind=kind, target_key=target_key, state__in=OPEN_STATES)
                 .order_by("created_at").first())
    return found


def _decide(action: RemediationAction, now: datetime) -> None:
    """State from mode and guard rails; a shadow action records what it would have run instead of running."""
    if action.mode == ActionMode.SHADOW:
        action.state, action.decided_at = ActionState.SHADOWED, now
        action.result = {"would_run": [] if action.blocked_reason else _plan(action),
                         "guard": {"passed": not action.blocked_reason, "reason": action.blocked_reason}}
        return
    if action.blocked_reason:
        action.state = ActionState.BLOCKED
        return
    action.state = MODE_STATE[action.mode]
    if action.state == ActionState.APPROVED:
        action.decided_at = now


def _plan(action: RemediationAction) -> list[str]:
    try:
        return get_backend(action.kind).plan(action)
    except BackendError as exc:
        return [f"(cannot plan: {exc})"]


@transaction.atomic
def do_approve_action(action_id: int, user, *, now: datetime | None = None) -> RemediationAction:
    """Approve a suggested, awaiting or blocked action: the guard rails are checked again (the fleet may have
    changed since the request); it is approved and queued for execution, or blocked with the reason.
    Approving an action already approved, running or done returns it unchanged."""
    now = now or timezone.now()
    action = _locked(action_id)
    if action.state in (ActionState.APPROVED, ActionState.RUNNING, ActionState.SUCCEEDED):
        return action
    if action.state not in APPROVABLE:
        raise ActionError("conflict", f"action #{action.pk} is {action.state}; it can no longer be approved")
    action.blocked_reason = blocked_reason(action.kind, resolve_target(action.kind, action.target_key), now=now,
                                           exclude_id=action.pk)
    action.state = ActionState.BLOCKED if action.blocked_reason else ActionState.APPROVED
    action.decided_by, action.decided_at = _user(user), now
    action.save(update_fields=["state", "blocked_reason", "decided_by", "decided_at"])
    do_audit(actor_name(user), "action.approve", "action", action.pk, reason=action.blocked_reason,
             outcome=action.state, detail=_audit_detail(action), at=now)
    if action.state == ActionState.APPROVED:
        _enqueue_execution(action.pk)
    return action


@transaction.atomic
def do_reject_action(action_id: int, user, reason: str, *, now: datetime | None = None) -> RemediationAction:
    """Reject an action that has not started; rejecting a rejected action again changes nothing."""
    now = now or timezone.now()
    action = _locked(action_id)
    if action.state == ActionState.REJECTED:
        return action
    if action.state not in REJECTABLE:
        raise ActionError("conflict", f"action #{action.pk} is {action.state}; it can no longer be rejected")
    action.state, action.decided_by, action.decided_at = ActionState.REJECTED, _user(user), now
    action.save(update_fields=["state", "decided_by", "decided_at"])
    do_audit(actor_name(user), "action.reject", "action", action.pk, reason=reason, outcome=action.state,
             detail=_audit_detail(action), at=now)
    return action


def _locked(action_id: int) -> RemediationAction:
    """The action, locked, after its kind's guard-rail lock (the order every decision takes them in)."""
    kind = RemediationAction.objects.filter(pk=action_id).values_list("kind", flat=True).first()
    if kind is None:
        raise RemediationAction.DoesNotExist(f"no remediation action #{action_id}")
    lock_kind(kind)
    return RemediationAction.objects.select_for_update().get(pk=action_id)


def _user(user):
    return user if getattr(user, "pk", None) else None


def _enqueue_execution(action_id: int) -> None:
    transaction.on_commit(lambda: enqueue("alerts.tasks.execute_action", action_id))


def _audit_detail(action: RemediationAction) -> dict:
    detail = {"kind": action.kind, "target": action.target_key, "mode": action.mode, "alert_id": action.alert_id,
              "playbook": action.playbook.name if action.playbook_id else None}
    if action.blocked_reason:
        detail["blocked_reason"] = action.blocked_reason
    return detail


# --- Evidence --------------------------------------------------------------------------------------------

def collect_evidence(target: Target, alert: Alert | None, given: dict | None) -> dict:
    """What justified the request: the caller's evidence, the alert, the target's latest metrics and the
    model versions that were active (so a decision can be traced to the model that raised it)."""
    evidence = dict(given or {})
    if alert is not None:
        evidence["alert"] = {"id": alert.pk, "name": alert.name, "labels": alert.labels, "value": alert.value,
                             "severity": alert.severity, "starts_at": _iso(alert.starts_at)}
    evidence["target"] = _target_facts(target)
    evidence["metrics"] = _latest_metrics(target)
    evidence["models"] = _active_models()
    return evidence


def _iso(moment: datetime | None) -> str | None:
    return moment.astimezone(UTC).isoformat() if moment else None


def _target_facts(target: Target) -> dict:
    facts: dict = {"kind": target.kind, "key": target.key, "known": target.node is not None}
    if target.node is not None:
        facts.update(node=target.node.hostname, node_state=target.node.state)
    if target.gpu is not None:
        facts["gpu_index"] = target.gpu.index
    if target.kind == "job":
        source, _, external = target.key.partition(":")
        job = Job.objects.filter(source=source, external_id=external).first()
        facts.update(known=job is not None, job_state=job.state if job else None)
    return facts


def _latest_metrics(target: Target) -> dict:
    """{gpu uuid: last-value row} of the target GPU, or of every GPU of the target node."""
    gpus = [target.gpu] if target.gpu else list(target.node.gpus.all()) if target.node else []
    rows = latest_gpu_rows([g.pk for g in gpus], HEALTH_FIELDS)
    out = {}
    for gpu in gpus:
        row = rows.get(gpu.pk)
        if row is not None:
            out[gpu.uuid] = {"index": gpu.index, **{k: _iso(v) if k == "time" else v for k, v in row.items()}}
    return out


def _active_models() -> dict:
    versions = ModelVersion.objects.filter(status=ModelStatus.ACTIVE).only("kind", "version", "promoted_at")
    return {v.kind: {"id": v.pk, "version": v.version, "promoted_at": _iso(v.promoted_at)} for v in versions}
