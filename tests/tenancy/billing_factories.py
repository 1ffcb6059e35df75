"""Small builders for the billing and export tests: tenants, jobs, rate cards and hourly usage rows.

Usage rows are written directly (metering has its own tests): each helper call lays one job's usage
over consecutive clock hours.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from telemetry.models import Job
from tenancy.models import RateCard, RatePrice, Tenant, TenantAccount, UsageHour

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


def at(month: int, day: int, hour: int = 0) -> datetime:
    """A UTC instant in 2026."""
    return datetime(2026, month, day, hour, tzinfo=UTC)


OCT = (at(10, 1), at(11, 1))
NOV = (at(11, 1), at(12, 1))


def tenant(slug: str, *, showback: bool = False, parent: Tenant | None = None) -> Tenant:
    """An organisation (or a team under `parent`) with one Slurm account named after it."""
    t = Tenant.objects.create(name=slug.title(), slug=slug, kind="team" if parent else "organisation", parent=parent,
                              billing_mode="showback" if showback else "invoice")
    TenantAccount.objects.create(tenant=t, kind="slurm", name=f"{slug}-acct")
    return t


def job(owner: Tenant, external_id: str, *, qos: str = "normal") -> Job:
    """A Slurm job charged to the tenant's account."""
    return Job.objects.create(source="slurm", external_id=external_id, account=f"{owner.slug}-acct", qos=qos,
                              state="completed")


def card(name: str, effective_from: datetime, prices: dict[tuple[str, str, str], str], *, owner=None,
         kwh: str = "0", idle: str | None = None, preemptible=(), discount: str = "0") -> RateCard:
    """A rate card with its prices: {(gpu_model, mig_profile, priority_class): price per GPU-hour}."""
    c = RateCard.objects.create(name=name, tenant=owner, effective_from=effective_from, price_per_kwh=Decimal(kwh),
                                idle_held_price_per_gpu_hour=Decimal(idle) if idle is not None else None,
                                preemptible_qos=list(preemptible), preemptible_discount=Decimal(discount))
    for (model, profile, klass), price in prices.items():
        RatePrice.objects.create(card=c, gpu_model=model, mig_profile=profile, priority_class=klass,
                                 price_per_gpu_hour=Decimal(price))
    return c


def usage(owner: Tenant, j: Job, start: datetime, hours: int, *, model: str = H100, profile: str = "",
          qos: str | None = None, gpu_hours: str = "1", idle: str = "0", gpu_kwh: str = "0", node_kwh: str = "0",
          facility_kwh: str = "0") -> list[UsageHour]:
    """`hours` consecutive UsageHour rows from `start`, each with the given per-hour quantities."""
    rows = [UsageHour(hour=start + timedelta(hours=h), tenant=owner, job=j, gpu_model=model, mig_profile=profile,
                      qos=j.qos if qos is None else qos, gpu_hours=Decimal(gpu_hours),
                      busy_hours=Decimal(gpu_hours) - Decimal(idle), idle_held_hours=Decimal(idle),
                      energy_gpu_kwh=Decimal(gpu_kwh), energy_node_kwh=Decimal(node_kwh),
                      energy_facility_kwh=Decimal(facility_kwh)) for h in range(hours)]
    return UsageHour.objects.bulk_create(rows)
