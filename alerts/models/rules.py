"""Alert rules and the alert lifecycle: what is watched, what fired, and every change of state."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from core.scoping import ScopedQuerySet


class Severity(models.TextChoices):
    """How loud an alert is; routing usually pages on critical only."""

    CRITICAL = "critical", "Critical"
    WARNING = "warning", "Warning"
    INFO = "info", "Info"

    @classmethod
    def colour(cls, value: str) -> str:
        return {"critical": "#d64545", "warning": "#e0a100", "info": "#3b82f6"}.get(value, "#6b7280")


class RuleKind(models.TextChoices):
    """What a rule watches."""

    THRESHOLD = "threshold", "Metric threshold"
    RATE = "rate", "Counter rate"
    XID = "xid", "Fault events by XID class"
    ANOMALY = "anomaly", "Anomaly score"
    RISK = "risk", "Failure risk"
    JOB = "job", "Job straggler or divergence"
    NODE_DOWN = "node_down", "Node stopped reporting"


class EntityKind(models.TextChoices):
    """The kind of thing an alert is about."""

    GPU = "gpu", "GPU"
    NODE = "node", "Node"
    PORT = "port", "Port"
    RACK = "rack", "Rack"
    JOB = "job", "Job"
    EXTERNAL = "external", "External"


class Op(models.TextChoices):
    """Comparison of a value against a rule's threshold."""

    GT = ">", ">"
    GE = ">=", ">="
    LT = "<", "<"
    LE = "<=", "<="


class Rule(models.Model):
    """One alerting rule; `labels` are added to every alert it raises."""

    name = models.CharField(max_length=100, unique=True, help_text="Becomes the alert's alertname label")
    kind = models.CharField(max_length=16, choices=RuleKind.choices)
    entity = models.CharField(max_length=8, choices=EntityKind.choices, default=EntityKind.GPU)
    metric = models.CharField(max_length=64, blank=True,
                              help_text="Field for threshold/rate rules; 'straggler' or 'divergence' for job rules")
    op = models.CharField(max_length=2, choices=Op.choices, default=Op.GT)
    threshold = models.FloatField(null=True, blank=True)
    for_seconds = models.PositiveIntegerField(default=0, help_text="The condition must hold this long")
    window_seconds = models.PositiveIntegerField(default=300, help_text="Rate window for counter rules")
    xid_codes = models.JSONField(default=list, blank=True, help_text="XID codes, e.g. [48, 79]")
    xid_actions = models.JSONField(default=list, blank=True,
                                   help_text="XID catalogue action classes, e.g. ['drain_node', 'rma']")
    severity = models.CharField(max_length=8, choices=Severity.choices, default=Severity.WARNING)
    labels = models.JSONField(default=dict, blank=True)
    summary = models.CharField(max_length=300, blank=True, help_text="Template: {entity}, {value}, {threshold}")
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="alert_rules")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        needs_metric = {RuleKind.THRESHOLD, RuleKind.RATE, RuleKind.JOB}
        if self.kind in needs_metric and not self.metric:
            raise ValidationError({"metric": f"a {self.kind} rule needs a metric"})
        needs_threshold = {RuleKind.THRESHOLD, RuleKind.RATE, RuleKind.ANOMALY, RuleKind.RISK}
        if self.kind in needs_threshold and self.threshold is None:
            raise ValidationError({"threshold": f"a {self.kind} rule needs a threshold"})
        if self.kind == RuleKind.XID and not (self.xid_codes or self.xid_actions):
            raise ValidationError({"xid_codes": "an xid rule needs XID codes or catalogue action classes"})
        if not isinstance(self.labels, dict) or not all(isinstance(v, str) for v in self.labels.values()):
            raise ValidationError({"labels": "labels must be an object of string values"})


class RulePending(models.Model):
    """A rule's condition that holds but has not yet held for `for_seconds` (Prometheus' 'pending')."""

    rule = models.ForeignKey(Rule, on_delete=models.CASCADE, related_name="pending")
    fingerprint = models.CharField(max_length=64)
    since = models.DateTimeField()
    value = models.FloatField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["rule", "fingerprint"], name="rule_pending_unique",
                                    violation_error_message="a condition is pending once per rule and entity"),
        ]


class AlertState(models.TextChoices):
    """An alert's lifecycle."""

    FIRING = "firing", "Firing"
    ACKNOWLEDGED = "acknowledged", "Acknowledged"
    RESOLVED = "resolved", "Resolved"

    @classmethod
    def colour(cls, value: str) -> str:
        return {"firing": "#d64545", "acknowledged": "#e0a100", "resolved": "#2e9d5b"}.get(value, "#6b7280")


class AlertSource(models.TextChoices):
    """Where an alert came from."""

    RULE = "rule", "Breakwater rule"
    ALERTMANAGER = "alertmanager", "Prometheus Alertmanager"
    API = "api", "API"


class Alert(models.Model):
    """One alert: a fingerprint (hash of its labels) in a state; a re-sighting merges into it."""

    objects = ScopedQuerySet.as_manager()  # .visible_to(user): tenant scoping (core.scoping, rules in tenancy.scoping)

    fingerprint = models.CharField(max_length=64)
    rule = models.ForeignKey(Rule, null=True, blank=True, on_delete=models.SET_NULL, related_name="alerts")
    source = models.CharField(max_length=16, choices=AlertSource.choices, default=AlertSource.RULE)
    name = models.CharField(max_length=200, help_text="alertname")
    state = models.CharField(max_length=16, choices=AlertState.choices, default=AlertState.FIRING)
    severity = models.CharField(max_length=8, choices=Severity.choices, default=Severity.WARNING)
    labels = models.JSONField(default=dict)
    annotations = models.JSONField(default=dict, blank=True)
    entity_kind = models.CharField(max_length=8, choices=EntityKind.choices, default=EntityKind.EXTERNAL)
    entity_key = models.CharField(max_length=200, blank=True, help_text="GPU UUID, hostname, port id, job key")
    value = models.FloatField(null=True, blank=True)
    starts_at = models.DateTimeField()
    last_seen = models.DateTimeField()
    ends_at = models.DateTimeField(null=True, blank=True)
    occurrences = models.PositiveIntegerField(default=1, help_text="Sightings merged into this alert")
    acked_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="acked_alerts")
    acked_at = models.DateTimeField(null=True, blank=True)
    silenced_by = models.ForeignKey("alerts.Silence", null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="silenced_alerts")
    inhibited_by = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="inhibits")

    class Meta:
        constraints = [
            # Duplicates merge: one open alert per fingerprint (the lifecycle upserts against this).
            models.UniqueConstraint(fields=["fingerprint"], condition=~models.Q(state="resolved"),
                                    name="alert_one_open_per_fingerprint",
                                    violation_error_message="an open alert with this fingerprint exists"),
        ]
        indexes = [
            # The alert list: open alerts newest first, and the history search by time.
            models.Index(fields=["state", "-starts_at"], name="alert_state_starts"),
            # An entity's alerts on the GPU, node, port and job pages.
            models.Index(fields=["entity_kind", "entity_key", "-starts_at"], name="alert_entity"),
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.entity_key} ({self.state})"

    @property
    def is_open(self) -> bool:
        return self.state != AlertState.RESOLVED

    @property
    def muted(self) -> bool:
        return self.silenced_by_id is not None or self.inhibited_by_id is not None


class AlertEventKind(models.TextChoices):
    """A recorded change to an alert."""

    FIRED = "fired", "Fired"
    MERGED = "merged", "Duplicate merged"
    ACKNOWLEDGED = "acknowledged", "Acknowledged"
    UNACKNOWLEDGED = "unacknowledged", "Acknowledgement withdrawn"
    RESOLVED = "resolved", "Resolved"
    SILENCED = "silenced", "Silenced"
    INHIBITED = "inhibited", "Inhibited"
    UNMUTED = "unmuted", "No longer muted"
    ESCALATED = "escalated", "Escalated"
    NOTIFIED = "notified", "Notification sent"


class AlertEvent(models.Model):
    """One change of an alert's state, kept for ever (Alertmanager forgets these)."""

    objects = ScopedQuerySet.as_manager()  # .visible_to(user): tenant scoping (core.scoping, rules in tenancy.scoping)

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="events")
    time = models.DateTimeField()
    kind = models.CharField(max_length=16, choices=AlertEventKind.choices)
    actor = models.CharField(max_length=150, blank=True, help_text="Username, or system:<component>")
    note = models.TextField(blank=True)
    value = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["time", "id"]
        indexes = [
            # The history search: changes in a time range, newest first.
            models.Index(fields=["-time"], name="alert_event_time"),
        ]
