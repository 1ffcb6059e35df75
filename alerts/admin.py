"""Admin for the alerts app: where routes, channels, inhibition rules, playbooks and guard rails are edited.

Alerts, their events and notifications are records of what happened: viewable, never edited here. The audit
log is append-only (the database refuses UPDATE and DELETE), so its admin offers no add, change or delete.
"""

from __future__ import annotations

from django.contrib import admin

from alerts.forms import ChannelForm
from alerts.models import (
    AgentCommand,
    Alert,
    AlertEvent,
    AlertGroup,
    Channel,
    DeliveryAttempt,
    GuardRail,
    InhibitRule,
    Notification,
    Playbook,
    RemediationAction,
    Route,
    Rule,
    Silence,
)
from core.models import AuditEntry


class ReadOnlyAdmin(admin.ModelAdmin):
    """A record of what happened: listed and viewable, never added, changed or deleted by hand."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Rule)
class RuleAdmin(admin.ModelAdmin):
    """Rules are also edited on the Rules page, which audits every change."""

    list_display = ("name", "kind", "entity", "metric", "op", "threshold", "severity", "enabled")
    list_filter = ("kind", "severity", "enabled")
    search_fields = ("name", "metric")


@admin.register(Channel)
class ChannelAdmin(admin.ModelAdmin):
    """Notification channels (the Channels page tests and re-enables them)."""

    form = ChannelForm  # the URL guard checks a channel's address when it is saved here, too
    list_display = ("name", "kind", "enabled", "disabled_reason", "last_ok_at")
    list_filter = ("kind", "enabled")
    search_fields = ("name",)


@admin.register(Route)
class RouteAdmin(admin.ModelAdmin):
    """The routing tree, one node per row; the Routing page draws it."""

    list_display = ("name", "parent", "position", "continue_matching", "group_wait_s", "group_interval_s",
                    "repeat_interval_s", "escalate_after_s")
    filter_horizontal = ("channels", "escalation_channels")
    search_fields = ("name",)


@admin.register(InhibitRule)
class InhibitRuleAdmin(admin.ModelAdmin):
    """Inhibition rules."""

    list_display = ("name", "enabled")


@admin.register(Silence)
class SilenceAdmin(admin.ModelAdmin):
    """Silences; create and expire them on the Silences page, which audits both."""

    list_display = ("id", "kind", "author", "starts_at", "ends_at", "expired_at", "comment")
    list_filter = ("kind",)


@admin.register(Playbook)
class PlaybookAdmin(admin.ModelAdmin):
    """Playbooks: which fault leads to which action, in which mode."""

    list_display = ("name", "action", "mode", "enabled")
    list_filter = ("action", "mode", "enabled")


@admin.register(GuardRail)
class GuardRailAdmin(admin.ModelAdmin):
    """Blast-radius caps and cooldowns."""

    list_display = ("action", "scope", "max_count", "max_fraction", "window_s", "enabled")


@admin.register(Alert)
class AlertAdmin(ReadOnlyAdmin):
    """Alerts, viewable only (acknowledge them on the Alerts page)."""

    list_display = ("id", "name", "state", "severity", "entity_key", "starts_at", "ends_at")
    list_filter = ("state", "severity", "source")
    search_fields = ("name", "entity_key", "fingerprint")


@admin.register(AlertEvent)
class AlertEventAdmin(ReadOnlyAdmin):
    """Alert state changes, viewable only."""

    list_display = ("time", "alert", "kind", "actor", "note")
    list_filter = ("kind",)


@admin.register(AlertGroup)
class AlertGroupAdmin(ReadOnlyAdmin):
    """Alert groups, viewable only."""

    list_display = ("route", "key", "next_flush_at", "last_notified_at", "escalated_at")


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    """The outbox, viewable only."""

    list_display = ("id", "channel", "event", "status", "attempts", "created_at", "delivered_at")
    list_filter = ("status", "event")


@admin.register(DeliveryAttempt)
class DeliveryAttemptAdmin(ReadOnlyAdmin):
    """Delivery attempts, viewable only."""

    list_display = ("notification", "number", "outcome", "status_code", "duration_ms", "started_at")
    list_filter = ("outcome",)


@admin.register(RemediationAction)
class RemediationActionAdmin(ReadOnlyAdmin):
    """Remediation actions, viewable only (approve or reject them on the Remediation page)."""

    list_display = ("id", "kind", "target_key", "mode", "state", "requested_by", "decided_by", "created_at")
    list_filter = ("kind", "mode", "state")
    search_fields = ("target_key", "reason")


@admin.register(AgentCommand)
class AgentCommandAdmin(ReadOnlyAdmin):
    """Node agent commands, viewable only."""

    list_display = ("id", "hostname", "command", "state", "created_at", "finished_at")
    list_filter = ("command", "state")


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    """The audit log: append-only, so no add, change or delete, not even for a superuser."""

    list_display = ("time", "actor", "verb", "object_kind", "object_id", "outcome")
    list_filter = ("verb", "object_kind")
    search_fields = ("actor", "verb", "object_id", "reason")
    date_hierarchy = "time"
    actions = None  # no bulk "delete selected"
