"""Quotas: what a tenant is guaranteed and may borrow, per GPU model and MIG profile."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models

from core.scoping import ScopedQuerySet


class Quota(models.Model):
    """Guaranteed and borrowable GPUs of one model (and MIG profile; empty = whole GPUs) for a tenant."""

    objects = ScopedQuerySet.as_manager()  # .visible_to(user): tenant scoping (core.scoping, rules in tenancy.scoping)

    tenant = models.ForeignKey("tenancy.Tenant", on_delete=models.CASCADE, related_name="quotas")
    gpu_model = models.CharField(max_length=128, blank=True, help_text="Empty: any model")
    mig_profile = models.CharField(max_length=32, blank=True, help_text="Empty: whole GPUs")
    guaranteed = models.FloatField(help_text="GPUs (a MIG slice counts by its share of the GPU)")
    borrowable = models.FloatField(default=0, help_text="GPUs beyond the guarantee, preemptible")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "gpu_model", "mig_profile"], name="quota_unique",
                                    violation_error_message="one quota per tenant, GPU model and MIG profile"),
        ]

    def clean(self) -> None:
        if self.guaranteed < 0 or self.borrowable < 0:
            raise ValidationError({"guaranteed": "quotas are not negative"})
