"""Remediation: actions with modes and approvals, playbooks, guard rails, agent commands, and the audit log."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ActionKind(models.TextChoices):
    """What a remediation action does, and to what kind of target."""

    DRAIN = "drain", "Drain node"
    RESUME = "resume", "Resume node"
    REQUEUE = "requeue", "Requeue job"
    POWER_CAP = "power_cap", "Apply GPU power cap"
    POWER_UNCAP = "power_uncap", "Lift GPU power cap"
    GPU_RESET = "gpu_reset", "Reset GPU"
    TICKET = "ticket", "Open RMA / ticket"


TARGET_KIND = {"drain": "node", "resume": "node", "requeue": "job", "power_cap": "gpu", "power_uncap": "gpu",
               "gpu_reset": "gpu", "ticket": "gpu"}


class ActionMode(models.TextChoices):
    """How far an action goes on its own."""

    SUGGEST = "suggest", "Suggest only"
    APPROVAL = "approval", "Run after approval"
    AUTO = "auto", "Automatic"
    SHADOW = "shadow", "Shadow (dry run)"


class ActionState(models.TextChoices):
    """Where an action stands."""

    SUGGESTED = "suggested", "Suggested"
    AWAITING = "awaiting", "Awaiting approval"
    APPROVED = "approved", "Approved"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    REJECTED = "rejected", "Rejected"
    BLOCKED = "blocked", "Blocked by a guard rail"
    SHADOWED = "shadowed", "Recorded (shadow)"

    @classmethod
    def colour(cls, value: str) -> str:
        return {"suggested": "#6b7280", "awaiting": "#e0a100", "approved": "#3b82f6", "running": "#3b82f6",
                "succeeded": "#2e9d5b", "failed": "#d64545", "rejected": "#6b7280", "blocked": "#8e6cc4",
                "shadowed": "#94a3b8"}.get(value, "#6b7280")


class Playbook(models.Model):
    """Maps a fault class (XID codes or catalogue action classes, or an alert name) to a recommended action."""

    name = models.CharField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    xid_codes = models.JSONField(default=list, blank=True)
    xid_actions = models.JSONField(default=list, blank=True, help_text="XID catalogue actions, e.g. ['drain_node']")
    alert_names = models.JSONField(default=list, blank=True, help_text="Alert names (alertname) it answers")
    action = models.CharField(max_length=12, choices=ActionKind.choices)
    mode = models.CharField(max_length=8, choices=ActionMode.choices, default=ActionMode.SUGGEST)
    params = models.JSONField(default=dict, blank=True, help_text="e.g. {'watts': 500} for a power cap")
    enabled = models.BooleanField(default=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class GuardScope(models.TextChoices):
    """What a blast-radius cap counts over."""

    CLUSTER = "cluster", "Cluster"
    NVLINK_DOMAIN = "nvlink_domain", "NVLink domain"
    LEAF = "leaf", "Leaf switch"
    RACK = "rack", "Rack"
    TARGET = "target", "One target (cooldown)"


class GuardRail(models.Model):
    """A cap on one action kind: at most `max_count` targets, or `max_fraction` of the scope, per window."""

    action = models.CharField(max_length=12, choices=ActionKind.choices)
    scope = models.CharField(max_length=16, choices=GuardScope.choices)
    max_count = models.PositiveIntegerField(null=True, blank=True)
    max_fraction = models.FloatField(null=True, blank=True, help_text="0..1 of the scope's nodes")
    window_s = models.PositiveIntegerField(default=3600, help_text="Counting window; for 'target' the cooldown")
    enabled = models.BooleanField(default=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["action", "scope"], name="guard_rail_action_scope",
                                    violation_error_message="one guard rail per action and scope"),
        ]


class RemediationAction(models.Model):
    """One remediation, from suggestion to verified outcome, with the evidence that justified it."""

    kind = models.CharField(max_length=12, choices=ActionKind.choices)
    mode = models.CharField(max_length=8, choices=ActionMode.choices)
    state = models.CharField(max_length=10, choices=ActionState.choices)
    target_kind = models.CharField(max_length=8)
    target_key = models.CharField(max_length=200, help_text="Hostname, job key or GPU UUID")
    params = models.JSONField(default=dict, blank=True)
    reason = models.TextField()
    evidence = models.JSONField(default=dict, blank=True, help_text="Alert, metrics, model version")
    alert = models.ForeignKey("alerts.Alert", null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="actions")
    playbook = models.ForeignKey(Playbook, null=True, blank=True, on_delete=models.SET_NULL, related_name="actions")
    idempotency_key = models.CharField(max_length=200, unique=True)
    requested_by = models.CharField(max_length=150, help_text="Username, or playbook:<name>")
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="decided_actions")
    decided_at = models.DateTimeField(null=True, blank=True)
    backend = models.CharField(max_length=16, blank=True, help_text="slurm, kubernetes, agent, webhook, simulator")
    blocked_reason = models.TextField(blank=True)
    result = models.JSONField(default=dict, blank=True, help_text="Commands run, their output, the verification")
    verified = models.BooleanField(null=True)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # The approvals queue and the list by state.
            models.Index(fields=["state", "-created_at"], name="action_state"),
            # Guard rails: recent actions of a kind (blast radius) and on one target (cooldown).
            models.Index(fields=["kind", "target_key", "-created_at"], name="action_kind_target"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.target_key} ({self.state})"


class AgentCommandState(models.TextChoices):
    """A command queued for a node agent."""

    QUEUED = "queued", "Queued"
    SENT = "sent", "Sent to the agent"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"
    EXPIRED = "expired", "Expired"


class AgentCommand(models.Model):
    """A command for one node's agent (power cap, GPU reset), fetched by the agent and answered with a result."""

    hostname = models.CharField(max_length=253)
    action = models.ForeignKey(RemediationAction, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="agent_commands")
    command = models.CharField(max_length=16, help_text="power_cap, power_uncap, gpu_reset")
    params = models.JSONField(default=dict)
    state = models.CharField(max_length=8, choices=AgentCommandState.choices, default=AgentCommandState.QUEUED)
    created_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()
    result = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [
            # The agent's poll: its queued commands, oldest first.
            models.Index(fields=["hostname", "state", "created_at"], name="agent_command_poll"),
        ]
