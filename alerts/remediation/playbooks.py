"""Playbooks: from a firing alert to the remediation its fault class calls for, requested in the playbook's mode.

A playbook answers an alert when any of these holds:
- the alert's XID code (label `xid`, or the value of an XID rule's alert) is in `xid_codes`;
- that code's catalogue action (telemetry.xid; Xid 154 carries its own in the message) is in `xid_actions`,
  or the alert carries an `xid_action` label that is;
- the alert's name is in `alert_names`.
The target comes from the alert's labels: `node` for a drain or resume, `gpu` for a power cap, reset or ticket,
`job` for a requeue. An alert without that label gets no action from the playbook.
"""

from __future__ import annotations

import logging

from alerts.models import TARGET_KIND, Alert, AlertState, Playbook, RuleKind
from alerts.remediation.actions import ActionError, do_request_action
from telemetry.xid import describe, effective_action

logger = logging.getLogger(__name__)


def alert_xid(alert: Alert) -> int | None:
    """The XID code an alert is about: its `xid` label, else the value of an XID rule's alert."""
    raw = alert.labels.get("xid")
    if raw is None and alert.rule_id and alert.rule.kind == RuleKind.XID and alert.value is not None:
        raw = alert.value
    try:
        return int(float(raw)) if raw is not None else None
    except (TypeError, ValueError):
        return None


def xid_action_of(alert: Alert, code: int | None) -> str | None:
    """The catalogue action for the alert's fault: its `xid_action` label, else the catalogue's for the code."""
    if alert.labels.get("xid_action"):
        return alert.labels["xid_action"]
    if code is None:
        return None
    message = alert.annotations.get("message", "") if isinstance(alert.annotations, dict) else ""
    return effective_action(code, message) if message else describe(code).action


def playbook_matches(playbook: Playbook, alert: Alert) -> bool:
    """Whether `playbook` answers `alert` (see the module docstring)."""
    code = alert_xid(alert)
    if code is not None and code in playbook.xid_codes:
        return True
    if playbook.xid_actions and xid_action_of(alert, code) in playbook.xid_actions:
        return True
    return alert.name in playbook.alert_names


def target_of(playbook: Playbook, alert: Alert) -> str | None:
    """The playbook action's target, from the alert's labels."""
    return alert.labels.get(TARGET_KIND[playbook.action]) or None


def run_playbooks_for_alerts(alert_ids: list[int]) -> int:
    """Request the actions of every enabled playbook matching each firing alert; returns how many are new.

    Each request is its own transaction (a bad one never undoes the others) and idempotent: running this twice
    for the same alerts creates nothing the second time.
    """
    playbooks = list(Playbook.objects.filter(enabled=True))
    created = 0
    for alert in Alert.objects.filter(pk__in=alert_ids, state=AlertState.FIRING).select_related("rule"):
        for playbook in playbooks:
            if playbook_matches(playbook, alert):
                created += _request(playbook, alert)
    return created


def _request(playbook: Playbook, alert: Alert) -> int:
    target = target_of(playbook, alert)
    if not target:
        logger.info("playbook %s: alert %s has no %s label; no action", playbook.name, alert.pk,
                    TARGET_KIND[playbook.action])
        return 0
    entity = alert.entity_key or target
    try:
        action = do_request_action(
            playbook.action, target, mode=playbook.mode, reason=f"{playbook.name}: {alert.name} on {entity}",
            evidence={"playbook": playbook.name, "xid": alert_xid(alert)}, requested_by=f"playbook:{playbook.name}",
            alert=alert, playbook=playbook, params=playbook.params)
    except ActionError as exc:
        logger.warning("playbook %s on alert %s: %s", playbook.name, alert.pk, exc.message)
        return 0
    return int(action.was_created)
