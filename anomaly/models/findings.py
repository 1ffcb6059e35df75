"""What the detectors and the failure model found: anomaly and risk events, and current scores."""

from __future__ import annotations

from django.contrib.postgres.indexes import GinIndex
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
    """One stretch of time in which the detectors found one root cause abnormal (an event).

    Findings that share a cause (the GPUs of one host, the ports of one leaf switch and the ports cabled
    to it, one rack, one job) are one event; each detector's finding on each entity is a member, with
    its own first and last minute (`anomaly.grouping`). `kind`, the entity, the score and the
    explanation are those of the worst moment's finding.
    """

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
    group_key = models.CharField(max_length=200, default="", help_text=(
        'The cause it stands for, e.g. "fleet|leaf:leaf-r4-01", "fleet|host:gpu-0012"'))
    members = models.JSONField(default=list, help_text=(
        "[{kind, entity_kind, entity_id, host, first_seen, last_seen, score, last_score, summary, "
        "signals: [[field, deviation], ...]}], one per detector and entity"))
    member_count = models.PositiveIntegerField(default=1, help_text="Distinct entities among the members")

    class Meta:
        db_table = "anomaly_anomaly"
        constraints = [
            # The writer extends the open event of a cause instead of adding one per minute or per entity.
            models.UniqueConstraint(fields=["group_key"], condition=models.Q(ended_at=None),
                                    name="anomaly_one_open_per_group",
                                    violation_error_message="This cause already has an open anomaly event."),
        ]
        indexes = [
            # The fleet's newest anomalies and the history page: ORDER BY started_at DESC LIMIT n.
            models.Index(fields=["-started_at"], name="anomaly_started_idx"),
            # An entity's page: WHERE entity_kind = %s AND entity_id = %s ORDER BY started_at DESC.
            models.Index(fields=["entity_kind", "entity_id", "-started_at"], name="anomaly_entity_idx"),
            # An entity's page, for the events it is a member of: WHERE members @> '[{"entity_kind": ...}]'.
            GinIndex(fields=["members"], name="anomaly_members_idx", opclasses=["jsonb_path_ops"]),
        ]

    def save(self, *args, **kwargs) -> None:
        # An event written one by one (by hand, an import, a test) and not by the grouping writer stands for
        # its own detector and entity, as every event did before grouping (the migration's rule too).
        if not self.group_key:
            self.group_key = f"legacy|{self.kind}|{self.entity_kind}:{self.entity_id}"
        super().save(*args, **kwargs)

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
