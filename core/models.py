"""Models every app writes to: the audit log."""

from __future__ import annotations

from django.db import models


class AuditEntry(models.Model):
    """Append-only: who did what, when, why, and the outcome. A trigger refuses UPDATE and DELETE.

    Its table keeps the name it was created with (alerts_auditentry, alerts migrations 0002-0003 guard it):
    every app records its changes here, so the model lives in core.
    """

    time = models.DateTimeField()
    actor = models.CharField(max_length=150, help_text="Username, or system:<component>")
    verb = models.CharField(max_length=40, help_text="e.g. action.approve, rule.create, silence.expire")
    object_kind = models.CharField(max_length=40)
    object_id = models.CharField(max_length=200)
    reason = models.TextField(blank=True)
    outcome = models.CharField(max_length=40, blank=True)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        db_table = "alerts_auditentry"
        ordering = ["-time", "-id"]
        indexes = [
            # The audit page: newest first, optionally for one object.
            models.Index(fields=["-time"], name="audit_time"),
            models.Index(fields=["object_kind", "object_id"], name="audit_object"),
        ]
