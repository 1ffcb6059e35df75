"""Metered usage: GPU-hours, busy / idle-held / lost hours and energy, per hour, job, GPU model, MIG profile
and QoS class, computed from the allocation ledger and the rollups (series carry no job or tenant labels)."""

from __future__ import annotations

from django.db import models

from core.scoping import ScopedQuerySet

HOURS = {"max_digits": 20, "decimal_places": 6}


class UsageHour(models.Model):
    """One job's usage of one GPU model / MIG profile in one clock hour. Decimal, so sums are exact."""

    objects = ScopedQuerySet.as_manager()  # .visible_to(user): tenant scoping (core.scoping, rules in tenancy.scoping)

    hour = models.DateTimeField(help_text="Start of the clock hour (UTC)")
    tenant = models.ForeignKey("tenancy.Tenant", null=True, blank=True, on_delete=models.PROTECT,
                               related_name="usage", help_text="Empty: the job's account maps to no tenant")
    # No database constraint: usage is history and outlives pruned job rows.
    job = models.ForeignKey("telemetry.Job", on_delete=models.DO_NOTHING, db_constraint=False,
                            related_name="usage_hours")
    gpu_model = models.CharField(max_length=128, blank=True)
    mig_profile = models.CharField(max_length=32, blank=True, help_text="Empty: whole GPUs (or fractional shares)")
    qos = models.CharField(max_length=64, blank=True, help_text="Slurm QoS or Kubernetes priority class")
    gpu_hours = models.DecimalField(**HOURS, default=0, help_text="Allocated, weighted by MIG share or fraction")
    busy_hours = models.DecimalField(**HOURS, default=0)
    idle_held_hours = models.DecimalField(**HOURS, default=0, help_text="Allocated while GR activity < threshold")
    # db_default too: the bulk writers (COPY, INSERT ... SELECT) name only the columns they fill.
    unmeasured_hours = models.DecimalField(**HOURS, default=0, db_default=0,
                                           help_text="Allocated minutes with no activity reading: never busy")
    lost_hours = models.DecimalField(**HOURS, default=0, help_text="Work of runs that were preempted or lost")
    failed_hours = models.DecimalField(**HOURS, default=0, db_default=0,
                                       help_text="Part of lost_hours: after a fault failed the job's GPU")
    energy_gpu_kwh = models.DecimalField(**HOURS, default=0, help_text="From the GPUs' own energy counters")
    energy_node_kwh = models.DecimalField(**HOURS, default=0, help_text="The job's share of node overhead")
    energy_facility_kwh = models.DecimalField(**HOURS, default=0, help_text="(PUE - 1) x IT energy")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["hour", "job", "gpu_model", "mig_profile", "qos"],
                                    name="usage_hour_unique",
                                    violation_error_message="one usage row per hour, job, model, profile and QoS"),
        ]
        indexes = [
            # Invoices and the portal: a tenant's usage over a period.
            models.Index(fields=["tenant", "hour"], name="usage_tenant_hour"),
            # Reconciliation and the job page: one job's usage.
            models.Index(fields=["job", "hour"], name="usage_job_hour"),
        ]


class MeteringWatermark(models.Model):
    """How far metering has gone: every hour before `metered_until` is final unless the ledger changes."""

    name = models.CharField(max_length=32, unique=True)
    metered_until = models.DateTimeField()
    updated_at = models.DateTimeField(auto_now=True)
