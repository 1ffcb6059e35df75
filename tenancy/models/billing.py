"""Rate cards with effective dates, and invoices (draft, then final and immutable; corrections are new lines)."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models

from core.scoping import ScopedQuerySet

MONEY = {"max_digits": 14, "decimal_places": 2}
PRICE = {"max_digits": 14, "decimal_places": 6}
QTY = {"max_digits": 20, "decimal_places": 6}


class RateCard(models.Model):
    """Prices in force from `effective_from` until the next card's start; a tenant's own card beats the default."""

    objects = ScopedQuerySet.as_manager()  # .visible_to(user): tenant scoping (core.scoping, rules in tenancy.scoping)

    name = models.CharField(max_length=100)
    tenant = models.ForeignKey("tenancy.Tenant", null=True, blank=True, on_delete=models.PROTECT,
                               related_name="rate_cards", help_text="Empty: the default card for every tenant")
    effective_from = models.DateTimeField()
    currency = models.CharField(max_length=3, default="USD")
    price_per_kwh = models.DecimalField(**PRICE, default=0)
    idle_held_price_per_gpu_hour = models.DecimalField(**PRICE, null=True, blank=True,
                                                       help_text="Optional extra charge for idle-held hours")
    preemptible_qos = models.JSONField(default=list, blank=True, help_text="QoS classes that are preemptible/spot")
    preemptible_discount = models.DecimalField(max_digits=5, decimal_places=4, default=0,
                                               help_text="0..1 off the GPU-hour price for preemptible work")

    class Meta:
        ordering = ["-effective_from"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "effective_from"], name="rate_card_tenant_from",
                                    nulls_distinct=False,
                                    violation_error_message="a card already starts at this time for this tenant"),
        ]

    def __str__(self) -> str:
        return f"{self.name} (from {self.effective_from:%Y-%m-%d})"

    def clean(self) -> None:
        if not 0 <= self.preemptible_discount <= 1:
            raise ValidationError({"preemptible_discount": "a discount is between 0 and 1"})


class RatePrice(models.Model):
    """Price per GPU-hour for a GPU model, MIG profile and priority class (empty fields match anything)."""

    objects = ScopedQuerySet.as_manager()  # .visible_to(user): tenant scoping (core.scoping, rules in tenancy.scoping)

    card = models.ForeignKey(RateCard, on_delete=models.CASCADE, related_name="prices")
    gpu_model = models.CharField(max_length=128, blank=True)
    mig_profile = models.CharField(max_length=32, blank=True)
    priority_class = models.CharField(max_length=64, blank=True)
    price_per_gpu_hour = models.DecimalField(**PRICE)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["card", "gpu_model", "mig_profile", "priority_class"],
                                    name="rate_price_unique", violation_error_message="this price is already set"),
        ]


class InvoiceState(models.TextChoices):
    """A draft can be recomputed; a final invoice never changes (the database refuses)."""

    DRAFT = "draft", "Draft"
    FINAL = "final", "Final"


class Invoice(models.Model):
    """A tenant's bill (or showback statement) for one billing period."""

    objects = ScopedQuerySet.as_manager()  # .visible_to(user): tenant scoping (core.scoping, rules in tenancy.scoping)

    tenant = models.ForeignKey("tenancy.Tenant", on_delete=models.PROTECT, related_name="invoices")
    number = models.CharField(max_length=40, unique=True)
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    state = models.CharField(max_length=6, choices=InvoiceState.choices, default=InvoiceState.DRAFT)
    showback = models.BooleanField(default=False, help_text="Shows cost without billing it")
    currency = models.CharField(max_length=3, default="USD")
    total = models.DecimalField(**MONEY, default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    finalized_at = models.DateTimeField(null=True, blank=True)
    finalized_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["-period_start", "tenant_id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "period_start"], name="invoice_tenant_period",
                                    violation_error_message="this tenant already has an invoice for this period"),
            models.CheckConstraint(condition=models.Q(period_end__gt=models.F("period_start")),
                                   name="invoice_period_positive",
                                   violation_error_message="a billing period ends after it starts"),
        ]

    def __str__(self) -> str:
        return self.number


class LineKind(models.TextChoices):
    """What a line charges (or credits)."""

    GPU_TIME = "gpu_time", "GPU time"
    IDLE_HELD = "idle_held", "Idle-held GPU time"
    ENERGY = "energy", "Energy"
    DISCOUNT = "discount", "Preemptible discount"
    FAILED = "failed", "GPU failure"
    CREDIT = "credit", "Credit (correction)"
    DEBIT = "debit", "Debit (correction)"


class InvoiceLine(models.Model):
    """One charge, traced to its job; corrections to a final invoice are credit/debit lines on a later one."""

    objects = ScopedQuerySet.as_manager()  # .visible_to(user): tenant scoping (core.scoping, rules in tenancy.scoping)

    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    kind = models.CharField(max_length=10, choices=LineKind.choices)
    description = models.CharField(max_length=300)
    job = models.ForeignKey("telemetry.Job", null=True, blank=True, on_delete=models.DO_NOTHING,
                            db_constraint=False, related_name="invoice_lines")
    job_key = models.CharField(max_length=160, blank=True, help_text="source:external id, kept if the job is pruned")
    gpu_model = models.CharField(max_length=128, blank=True)
    mig_profile = models.CharField(max_length=32, blank=True)
    qos = models.CharField(max_length=64, blank=True)
    rate_card = models.ForeignKey(RateCard, null=True, blank=True, on_delete=models.PROTECT, related_name="lines")
    quantity = models.DecimalField(**QTY)
    unit = models.CharField(max_length=12, help_text="gpu_hour or kwh")
    unit_price = models.DecimalField(**PRICE)
    amount = models.DecimalField(**MONEY)
    corrects = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="corrections")
    reason = models.TextField(blank=True, help_text="Why a correction was made")

    class Meta:
        indexes = [
            # An invoice's lines by job (the invoice page and exports).
            models.Index(fields=["invoice", "job_key"], name="invoice_line_job"),
        ]
