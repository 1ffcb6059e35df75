"""How far each kind of scoring pass has got: the minute it last scored, and what that took."""

from __future__ import annotations

from django.db import models


class ScoringKind(models.TextChoices):
    """A part of the per-minute pass with a watermark of its own, so one that fails never holds up the other."""

    DETECTORS = "detectors", "Anomaly detectors"
    FAILURE_RISK = "failure_risk", "Failure risk"


class ScoringWatermark(models.Model):
    """The last minute one kind of scoring pass committed; the next pass starts a minute later."""

    kind = models.CharField(max_length=16, choices=ScoringKind.choices, unique=True)
    done_until = models.DateTimeField(help_text="The last minute scored (inclusive), on the minute")
    minutes_scored = models.PositiveBigIntegerField(
        default=0, help_text="Minutes committed so far, each once: a pass killed mid-minute counted nothing")
    minutes_skipped = models.PositiveBigIntegerField(
        default=0, help_text="Minutes never scored because the pass fell further behind than the catch-up cap")
    last_ms = models.FloatField(default=0, help_text="Wall time of the last minute scored")
    last_result = models.JSONField(default=dict, help_text="What the last minute recorded (counts, model version)")
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "anomaly_scoring_watermark"

    def __str__(self) -> str:
        return f"{self.kind} scored through {self.done_until:%Y-%m-%d %H:%M}"
