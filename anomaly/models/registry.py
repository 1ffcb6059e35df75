"""The model registry: every trained version with what it was trained on and how it scored."""

from __future__ import annotations

from django.db import models


class ModelKind(models.TextChoices):
    """What a model does; each kind has at most one active version."""

    COHORT = "cohort", "Cohort anomaly model (IsolationForest per GPU model)"
    FAILURE = "failure", "GPU failure prediction"
    SURVIVAL = "survival", "Fleet survival analysis (Kaplan-Meier and Cox)"


class ModelStatus(models.TextChoices):
    """Where a version stands in its lifecycle."""

    CANDIDATE = "candidate", "Candidate"
    ACTIVE = "active", "Active"
    RETIRED = "retired", "Retired"
    REJECTED = "rejected", "Rejected"

    @classmethod
    def colour(cls, value: str) -> str:
        return {"candidate": "#3b82f6", "active": "#16a34a", "retired": "#6b7280", "rejected": "#d64545"}[value]


class ModelVersion(models.Model):
    """One trained version of a model: parameters, window, features, metrics and artefact."""

    kind = models.CharField(max_length=16, choices=ModelKind.choices)
    version = models.PositiveIntegerField(help_text="1, 2, ... per kind")
    status = models.CharField(max_length=12, choices=ModelStatus.choices, default=ModelStatus.CANDIDATE)
    created_at = models.DateTimeField()
    promoted_at = models.DateTimeField(null=True, blank=True)
    params = models.JSONField(default=dict, help_text="Estimator parameters, as passed")
    features = models.JSONField(default=list, help_text="Feature names, in column order")
    train_start = models.DateTimeField(null=True, blank=True)
    train_end = models.DateTimeField(null=True, blank=True)
    metrics = models.JSONField(default=dict, help_text="Holdout metrics; `primary` names the one promotion compares")
    artefact = models.BinaryField(help_text="joblib dump of the fitted estimator")
    artefact_sha256 = models.CharField(max_length=64)
    note = models.TextField(blank=True, help_text="Why it was promoted, rejected or rolled back")

    class Meta:
        db_table = "anomaly_model_version"
        constraints = [
            models.UniqueConstraint(fields=["kind", "version"], name="model_version_unique",
                                    violation_error_message="That version number is already taken for this kind."),
            # Scoring loads "the active version of kind K"; two would make it ambiguous.
            models.UniqueConstraint(fields=["kind"], condition=models.Q(status="active"),
                                    name="model_version_one_active",
                                    violation_error_message="Only one version of a kind may be active."),
        ]

    def __str__(self) -> str:
        return f"{self.kind} v{self.version} ({self.status})"

    @property
    def primary_metric(self) -> float | None:
        name = self.metrics.get("primary")
        value = self.metrics.get(name) if name else None
        return float(value) if value is not None else None
