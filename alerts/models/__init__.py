"""Alerts app models, split by domain and re-exported."""

from alerts.models.remediation import (
    TARGET_KIND,
    ActionKind,
    ActionMode,
    ActionState,
    AgentCommand,
    AgentCommandState,
    GuardRail,
    GuardScope,
    Playbook,
    RemediationAction,
)
from alerts.models.routing import (
    AlertGroup,
    Channel,
    ChannelKind,
    DeliveryAttempt,
    Notification,
    NotificationEvent,
    NotificationStatus,
    Route,
)
from alerts.models.rules import (
    Alert,
    AlertEvent,
    AlertEventKind,
    AlertSource,
    AlertState,
    EntityKind,
    Op,
    Rule,
    RuleKind,
    RulePending,
    Severity,
)
from alerts.models.silences import MATCH_OPS, InhibitRule, Silence, SilenceKind, validate_matchers

__all__ = [
    "MATCH_OPS", "TARGET_KIND", "ActionKind", "ActionMode", "ActionState", "AgentCommand", "AgentCommandState",
    "Alert", "AlertEvent", "AlertEventKind", "AlertGroup", "AlertSource", "AlertState", "Channel",
    "ChannelKind", "DeliveryAttempt", "EntityKind", "GuardRail", "GuardScope", "InhibitRule", "Notification",
    "NotificationEvent", "NotificationStatus", "Op", "Playbook", "RemediationAction", "Route", "Rule", "RuleKind",
    "RulePending", "Severity", "Silence", "SilenceKind", "validate_matchers",
]
