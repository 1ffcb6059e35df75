"""Silences, maintenance windows and inhibition rules: what mutes an alert's notifications."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

MATCH_OPS = ("=", "!=", "=~", "!~")


def validate_matchers(matchers: object, field: str = "matchers") -> None:
    """Matchers are a list of {"name", "value", "op"} with op one of = != =~ !~ (Alertmanager's)."""
    if not isinstance(matchers, list):
        raise ValidationError({field: "must be a list of {name, value, op}"})
    for i, m in enumerate(matchers):
        if not isinstance(m, dict) or not isinstance(m.get("name"), str) or not isinstance(m.get("value"), str):
            raise ValidationError({field: f"matcher {i}: needs string 'name' and 'value'"})
        if m.get("op", "=") not in MATCH_OPS:
            raise ValidationError({field: f"matcher {i}: op {m.get('op')!r} is not one of {', '.join(MATCH_OPS)}"})


class SilenceKind(models.TextChoices):
    """A silence mutes matching alerts; a maintenance window also blocks remediation on its targets."""

    SILENCE = "silence", "Silence"
    MAINTENANCE = "maintenance", "Maintenance window"


class Silence(models.Model):
    """Mutes notifications of alerts whose labels match, from `starts_at` until `ends_at`."""

    kind = models.CharField(max_length=12, choices=SilenceKind.choices, default=SilenceKind.SILENCE)
    matchers = models.JSONField(default=list)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    author = models.CharField(max_length=150)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="silences")
    comment = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    expired_at = models.DateTimeField(null=True, blank=True, help_text="Ended early by hand")

    class Meta:
        ordering = ["-starts_at"]
        constraints = [
            models.CheckConstraint(condition=models.Q(ends_at__gt=models.F("starts_at")),
                                   name="silence_ends_after_start",
                                   violation_error_message="a silence must end after it starts"),
        ]
        indexes = [
            # Active silences at a time: starts_at <= t < ends_at.
            models.Index(fields=["ends_at", "starts_at"], name="silence_active"),
        ]

    def clean(self) -> None:
        validate_matchers(self.matchers)
        if not self.matchers:
            raise ValidationError({"matchers": "a silence needs at least one matcher (it would mute everything)"})
        if self.ends_at and self.starts_at and self.ends_at <= self.starts_at:
            raise ValidationError({"ends_at": "must be after starts_at"})


class InhibitRule(models.Model):
    """While a source alert fires, target alerts sharing the `equal` labels are muted (Alertmanager's)."""

    name = models.CharField(max_length=100, unique=True)
    source_matchers = models.JSONField(default=list)
    target_matchers = models.JSONField(default=list)
    equal = models.JSONField(default=list, help_text="Labels that must be equal on source and target")
    enabled = models.BooleanField(default=True)

    def clean(self) -> None:
        validate_matchers(self.source_matchers, "source_matchers")
        validate_matchers(self.target_matchers, "target_matchers")
        if not isinstance(self.equal, list) or not all(isinstance(x, str) for x in self.equal):
            raise ValidationError({"equal": "must be a list of label names"})
