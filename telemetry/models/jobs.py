"""Jobs from the schedulers (Slurm, Kubernetes), their allocation ledger, and training metrics.

Series carry no job or tenant labels: the ledger says which job held which GPU when, and queries
join it to telemetry at read time (ARCHITECTURE.md).
"""

from __future__ import annotations

from django.db import models

from core.scoping import ScopedQuerySet


class JobState(models.TextChoices):
    """A job's state, normalised across schedulers; colours for the UI."""

    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    PREEMPTED = "preempted", "Preempted"
    TIMEOUT = "timeout", "Timed out"
    NODE_FAIL = "node_fail", "Node failure"
    UNKNOWN = "unknown", "Unknown"

    @classmethod
    def colour(cls, value: str) -> str:
        return {"pending": "#8e6cc4", "running": "#2e9d5b", "completed": "#6c7a89", "failed": "#d64545",
                "cancelled": "#b0b7bf", "preempted": "#e0a100", "timeout": "#e07b00", "node_fail": "#8b0000",
                "unknown": "#b0b7bf"}[value]


class Job(models.Model):
    """A scheduler job (Slurm job or Kubernetes pod), keyed by its scheduler's own id."""

    objects = ScopedQuerySet.as_manager()  # .visible_to(user): tenant scoping (core.scoping, rules in tenancy.scoping)

    class Source(models.TextChoices):
        SLURM = "slurm", "Slurm"
        KUBERNETES = "k8s", "Kubernetes"

    source = models.CharField(max_length=8, choices=Source.choices)
    external_id = models.CharField(max_length=128, help_text="Slurm job id (array/het suffix kept) or pod UID")
    name = models.CharField(max_length=256, blank=True)
    user = models.CharField(max_length=128, blank=True)
    account = models.CharField(max_length=128, blank=True, help_text="Slurm account or Kubernetes namespace")
    partition = models.CharField(max_length=128, blank=True)
    qos = models.CharField(max_length=64, blank=True, help_text="Slurm QoS or Kubernetes priority class")
    priority = models.BigIntegerField(null=True, blank=True)
    state = models.CharField(max_length=12, choices=JobState.choices, default=JobState.UNKNOWN)
    submit_time = models.DateTimeField(null=True, blank=True)
    start_time = models.DateTimeField(null=True, blank=True)
    end_time = models.DateTimeField(null=True, blank=True)
    node_count = models.IntegerField(default=0)
    gpu_count = models.FloatField(default=0, help_text="Fractional for shared GPUs (gpu_milli / 1000)")
    requeue_count = models.IntegerField(default=0)
    preempt_count = models.IntegerField(default=0)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["source", "external_id"], name="job_unique_per_source",
                                    violation_error_message="This scheduler already has a job with this id."),
        ]
        indexes = [
            # The job list: WHERE state = 'running' ORDER BY start_time DESC.
            models.Index(fields=["state", "-start_time"], name="job_state_start_idx"),
            # Per-account listings and chargeback: WHERE account = %s AND end_time >= %s.
            models.Index(fields=["account", "end_time"], name="job_account_end_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.source}:{self.external_id} {self.name}"


class Allocation(models.Model):
    """The attribution ledger: job ↔ node ↔ GPU over [start, end). Open while end is null."""

    objects = ScopedQuerySet.as_manager()  # .visible_to(user): tenant scoping (core.scoping, rules in tenancy.scoping)

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="allocations")
    node = models.ForeignKey("telemetry.Node", on_delete=models.PROTECT, related_name="allocations")
    gpu = models.ForeignKey("telemetry.Gpu", on_delete=models.PROTECT, null=True, blank=True,
                            related_name="allocations", help_text="Null until the GPU at that index is known")
    gpu_index = models.PositiveSmallIntegerField()
    mig_instance = models.ForeignKey("telemetry.MigInstance", on_delete=models.PROTECT, null=True, blank=True,
                                     related_name="allocations")
    fraction = models.FloatField(default=1.0, help_text="Share of the GPU: a MIG slice or a fractional GPU")
    start = models.DateTimeField()
    end = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "node", "gpu_index", "start"], name="allocation_unique",
                                    violation_error_message="This allocation is already recorded."),
            models.CheckConstraint(condition=models.Q(end__isnull=True) | models.Q(end__gte=models.F("start")),
                                   name="allocation_ends_after_start",
                                   violation_error_message="An allocation cannot end before it starts."),
        ]
        indexes = [
            # "Who used this GPU when": WHERE gpu_id = %s AND start < %s AND (end IS NULL OR end > %s).
            models.Index(fields=["gpu", "start"], name="allocation_gpu_start_idx"),
            # Jobs on a node at a time (drain impact): WHERE node_id = %s AND end IS NULL.
            models.Index(fields=["node", "end"], name="allocation_node_end_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.job} on {self.node_id}:{self.gpu_index}"


class JobStateChange(models.Model):
    """A job's state history: preemptions, requeues, completion."""

    objects = ScopedQuerySet.as_manager()  # .visible_to(user): tenant scoping (core.scoping, rules in tenancy.scoping)

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="history")
    time = models.DateTimeField()
    state = models.CharField(max_length=12, choices=JobState.choices)
    reason = models.CharField(max_length=256, blank=True)

    class Meta:
        ordering = ["job_id", "time"]
        constraints = [
            models.UniqueConstraint(fields=["job", "time", "state"], name="job_state_change_unique",
                                    violation_error_message="This state change is already recorded."),
        ]


class TrainingStep(models.Model):
    """One training step of one rank, as the job reported it (hypertable on time)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="steps", db_constraint=False)
    rank = models.IntegerField()
    time = models.DateTimeField()
    pk = models.CompositePrimaryKey("job", "rank", "time")
    step = models.BigIntegerField()
    step_time_s = models.FloatField(null=True)
    # This rank's forward and backward, without the time it waited in collectives: in a synchronous
    # job every rank's step time is the same, and only this tells a slow rank from its peers.
    compute_time_s = models.FloatField(null=True)
    loss = models.FloatField(null=True)
    grad_norm = models.FloatField(null=True)
    tokens_per_s = models.FloatField(null=True)
    nan_count = models.IntegerField(default=0)
    inf_count = models.IntegerField(default=0)

    class Meta:
        db_table = "telemetry_training_step"
