"""What the detectors and the failure model found: anomaly and risk events, and current scores."""

from __future__ import annotations

from django.db import models


class AnomalyKind(models.TextChoices):
    """Which detector raised an anomaly; `failure_risk` rows are the failure model's risk events."""

    BASELINE = "baseline", "Against its own baseline"
    COHORT = "cohort", "Against its cohort model"
    PEER_NODE = "peer_node", "Against the GPUs in its node"
    PEER_JOB = "peer_job", "Against the GPUs in its job"
    PEER_LEAF = "peer_leaf", "Against the links on its leaf"
    RACK_POWER = "rack_power", "Rack power against its cap"
    STRAGGLER = "straggler", "Straggling rank"
    DIVERGENCE = "divergence", "Training divergence"
    FAILURE_RISK = "failure_risk", "Failure risk"

    @classmethod
    def colour(cls, value: str) -> str:
        return {"failure_risk": "#8b0000", "straggler": "#e07b00", "divergence": "#d64545"}.get(value, "#7c3aed")


class Anomaly(models.Model):
    """One stretch of time in which one detector found one entity abnormal (an event)."""

    kind = models.CharField(max_length=16, choices=AnomalyKind.choices)
    entity_kind = models.CharField(max_length=8, help_text="gpu, port, rack, job or rank")
    entity_id = models.CharField(max_length=128, help_text="GPU UUID, port id, rack name, job key, job key#rank")
    host = models.CharField(max_length=253, blank=True, help_text="The node, where there is one (for grouping)")
    started_at = models.DateTimeField()
    last_seen = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    score = models.FloatField(help_text="Peak score while open; for failure_risk, the probability")
    last_score = models.FloatField()
    summary = models.CharField(max_length=300, help_text='e.g. "memory temperature +6.2σ vs peers"')
    contributions = models.JSONField(
        default=list, help_text="[{field, label, value, expected, deviation, basis}], largest |deviation| first")
    model_version = models.ForeignKey("anomaly.ModelVersion", on_delete=models.SET_NULL, null=True, blank=True,
                                      related_name="anomalies")

    class Meta:
        db_table = "anomaly_anomaly"
        constraints = [
            # The writer extends the open event of (kind, entity) instead of adding one per minute.
            models.UniqueConstraint(fields=["kind", "entity_kind", "entity_id"], condition=models.Q(ended_at=None),
                                    name="anomaly_one_open_per_entity",
                                    violation_error_message="This entity already has an open anomaly of this kind."),
        ]
        indexes = [
            # The fleet's newest anomalies and the history page: ORDER BY started_at DESC LIMIT n.
            models.Index(fields=["-started_at"], name="anomaly_started_idx"),
            # An entity's page: WHERE entity_kind = %s AND entity_id = %s ORDER BY started_at DESC.
            models.Index(fields=["entity_kind", "entity_id", "-started_at"], name="anomaly_entity_idx"),
        ]

    @property
    def is_open(self) -> bool:
        return self.ended_at is None

    def __str__(self) -> str:
        return f"{self.kind} {self.entity_kind} {self.entity_id}: {self.summary}"


class EntityScore(models.Model):
    """The newest anomaly score and failure risk of one entity, for heatmaps and the overview."""

    entity_kind = models.CharField(max_length=8)
    entity_id = models.CharField(max_length=128)
    pk = models.CompositePrimaryKey("entity_kind", "entity_id")
    anomaly_score = models.FloatField(null=True, help_text="0..1, the largest of the detectors' scores")
    anomaly_at = models.DateTimeField(null=True)
    failure_risk = models.FloatField(null=True, help_text="Calibrated probability of failure within the horizon")
    risk_at = models.DateTimeField(null=True)
    risk_version = models.PositiveIntegerField(null=True, help_text="The failure model version that scored it")

    class Meta:
        db_table = "anomaly_entity_score"
        indexes = [
            # The overview's GPUs most at risk: ORDER BY failure_risk DESC LIMIT n.
            models.Index(fields=["-failure_risk"], name="entity_score_risk_idx",
                         condition=models.Q(failure_risk__isnull=False)),
        ]
