"""Channels, the routing tree, alert groups and the notification outbox with every delivery attempt."""

from __future__ import annotations

from django.db import models


class ChannelKind(models.TextChoices):
    """A transport registered in alerts.transports."""

    SLACK = "slack", "Slack"
    TEAMS = "teams", "Microsoft Teams"
    PAGERDUTY = "pagerduty", "PagerDuty"
    OPSGENIE = "opsgenie", "Opsgenie"
    WEBHOOK = "webhook", "Signed webhook"
    EMAIL = "email", "Email"


class Channel(models.Model):
    """Where notifications go. `config` holds the kind's settings (url, routing key, recipients)."""

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=12, choices=ChannelKind.choices)
    config = models.JSONField(default=dict, blank=True)
    secret = models.CharField(max_length=200, blank=True,
                              help_text="HMAC secret (webhook), API key (Opsgenie) or routing key (PagerDuty)")
    enabled = models.BooleanField(default=True)
    disabled_reason = models.TextField(blank=True, help_text="Why delivery was switched off (a permanent error)")
    disabled_at = models.DateTimeField(null=True, blank=True)
    last_ok_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class Route(models.Model):
    """A node of the routing tree (Alertmanager's route): matchers pick alerts, children refine them."""

    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")
    name = models.CharField(max_length=100, unique=True)
    position = models.PositiveIntegerField(default=0, help_text="Order among siblings; the first match wins")
    matchers = models.JSONField(default=list, blank=True, help_text="Label matchers; a tenant is the label 'tenant'")
    continue_matching = models.BooleanField(default=False, help_text="Also try the next siblings after a match")
    group_by = models.JSONField(default=list, blank=True, help_text="Label names; ['...'] groups by every label")
    group_wait_s = models.PositiveIntegerField(default=30)
    group_interval_s = models.PositiveIntegerField(default=300)
    repeat_interval_s = models.PositiveIntegerField(default=4 * 3600)
    channels = models.ManyToManyField(Channel, blank=True, related_name="routes")
    escalate_after_s = models.PositiveIntegerField(null=True, blank=True,
                                                   help_text="Escalate when no one acknowledges within this")
    escalation_channels = models.ManyToManyField(Channel, blank=True, related_name="escalation_routes")

    class Meta:
        ordering = ["parent_id", "position", "id"]

    def __str__(self) -> str:
        return self.name


class AlertGroup(models.Model):
    """The alerts one route batches together (same values of its group_by labels), and when it last sent."""

    route = models.ForeignKey(Route, on_delete=models.CASCADE, related_name="groups")
    key = models.CharField(max_length=500, help_text="The group_by label values")
    labels = models.JSONField(default=dict)
    created_at = models.DateTimeField()
    next_flush_at = models.DateTimeField(null=True, blank=True, help_text="When the group is due to notify")
    last_notified_at = models.DateTimeField(null=True, blank=True)
    notified_state = models.JSONField(default=dict, blank=True, help_text="fingerprint -> state last sent")
    escalated_at = models.DateTimeField(null=True, blank=True)
    alerts = models.ManyToManyField("alerts.Alert", blank=True, related_name="groups")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["route", "key"], name="alert_group_route_key",
                                    violation_error_message="a route has one group per key"),
        ]
        indexes = [
            # The flush sweep: groups that are due.
            models.Index(fields=["next_flush_at"], name="alert_group_due"),
        ]


class NotificationStatus(models.TextChoices):
    """The outbox row's delivery state."""

    PENDING = "pending", "Pending"
    SENDING = "sending", "Sending"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed"

    @classmethod
    def colour(cls, value: str) -> str:
        return {"pending": "#6b7280", "sending": "#3b82f6", "delivered": "#2e9d5b", "failed": "#d64545"}[value]


class NotificationEvent(models.TextChoices):
    """What a notification tells the provider."""

    TRIGGER = "trigger", "Trigger"
    ACKNOWLEDGE = "acknowledge", "Acknowledge"
    RESOLVE = "resolve", "Resolve"
    ESCALATE = "escalate", "Escalation"
    TEST = "test", "Test"


class Notification(models.Model):
    """One message to one channel: written in the transaction that decided it (outbox), then delivered.

    `dedup_key` is sent to providers that deduplicate (PagerDuty dedup_key, Opsgenie alias, the webhook's
    delivery id), so a redelivery after a crash never opens a second incident.
    """

    channel = models.ForeignKey(Channel, on_delete=models.PROTECT, related_name="notifications")
    group = models.ForeignKey(AlertGroup, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="notifications")
    alerts = models.ManyToManyField("alerts.Alert", blank=True, related_name="notifications")
    event = models.CharField(max_length=12, choices=NotificationEvent.choices)
    status = models.CharField(max_length=10, choices=NotificationStatus.choices, default=NotificationStatus.PENDING)
    dedup_key = models.CharField(max_length=255)
    payload = models.JSONField(default=dict, help_text="What the transport renders from (alerts, group, links)")
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True, help_text="Set when a worker takes the row")
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        indexes = [
            # The outbox sweep: rows still to deliver (pending, or sending with a stale claim).
            models.Index(fields=["status", "next_attempt_at"], name="notification_due"),
            # The history search: notifications newest first.
            models.Index(fields=["-created_at"], name="notification_created"),
        ]


class DeliveryAttempt(models.Model):
    """One try at delivering a notification: the request body sent and the provider's answer."""

    notification = models.ForeignKey(Notification, on_delete=models.CASCADE, related_name="attempt_log")
    number = models.PositiveSmallIntegerField()
    started_at = models.DateTimeField()
    duration_ms = models.FloatField(default=0)
    request = models.JSONField(default=dict, help_text="URL, headers without secrets, body")
    status_code = models.IntegerField(null=True, blank=True)
    response = models.TextField(blank=True)
    error = models.TextField(blank=True)
    outcome = models.CharField(max_length=10, help_text="ok, retry or permanent")

    class Meta:
        ordering = ["notification_id", "number"]
