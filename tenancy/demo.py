"""Demo tenants for `./dev up`: two organisations whose teams own the simulator's Slurm accounts, their
quotas, a default rate card and three tenant logins. `install_demo()` is idempotent: rerunning it puts
the same rows back (and resets a demo login's password when it differs) and never duplicates anything.

The simulator (telemetry.simulator.jobs.KIND_META) submits every job under one of five Slurm accounts;
each becomes a team of the same name, so its jobs, usage and invoices belong to that team.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.db import transaction

from telemetry.simulator.topology import GPU_MODEL
from tenancy.models import (
    AccountKind,
    BillingMode,
    Membership,
    Quota,
    RateCard,
    RatePrice,
    Role,
    Tenant,
    TenantAccount,
    TenantKind,
)

# slug: (name, parent slug or None); organisations first, so a team's parent exists when it is created.
TENANTS: dict[str, tuple[str, str | None]] = {
    "acme": ("Acme AI", None),
    "helix": ("Helix Science", None),
    "llm-core": ("LLM Core", "acme"),
    "applied-ml": ("Applied ML", "acme"),
    "serving": ("Serving", "acme"),
    "research": ("Research", "acme"),
    "hpc-science": ("HPC Science", "helix"),
}
# team slug: (guaranteed, borrowable) whole GPUs of the simulator's model (2,048 in the default fleet).
QUOTAS: dict[str, tuple[float, float]] = {
    "llm-core": (768, 256), "applied-ml": (256, 128), "serving": (256, 64), "research": (64, 64),
    "hpc-science": (256, 128),
}
# Price per GPU-hour by priority class; "low" is preemptible and gets the card's discount on top.
PRICES = {"high": Decimal("4.20"), "normal": Decimal("3.20"), "low": Decimal("3.20")}
PREEMPTIBLE_DISCOUNT = Decimal("0.40")
PRICE_PER_KWH = Decimal("0.15")
IDLE_HELD_PRICE = Decimal("0.80")
DEFAULT_CARD = "Default GPU rates"


@dataclass(frozen=True)
class DemoUser:
    """A demo login and the role it holds in one tenant."""

    username: str
    tenant: str
    role: str

    @property
    def description(self) -> str:
        return f"{Role(self.role).label.lower()} of {TENANTS[self.tenant][0]}"


USERS = (
    DemoUser("acme-admin", "acme", Role.TENANT_ADMIN),
    DemoUser("llm-dev", "llm-core", Role.MEMBER),
    DemoUser("helix-viewer", "helix", Role.VIEWER),
)


def month_start(now: datetime) -> datetime:
    """Midnight UTC on the first day of `now`'s month."""
    return now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


@transaction.atomic
def install_demo(passwords: dict[str, str], *, now: datetime) -> dict:
    """Create or restore the demo tenants, accounts, quotas, rate card and logins (one transaction).

    `passwords` maps each demo username to its password (from files under var/); `now` dates the rate
    card when none exists yet. Returns {"tenants", "card", "users": [(DemoUser, created)]}.
    """
    missing = [u.username for u in USERS if u.username not in passwords]
    if missing:
        raise ValueError(f"no password given for {', '.join(missing)}")
    tenants = _tenants()
    for slug, (guaranteed, borrowable) in QUOTAS.items():
        Quota.objects.update_or_create(tenant=tenants[slug], gpu_model=GPU_MODEL, mig_profile="",
                                       defaults={"guaranteed": guaranteed, "borrowable": borrowable})
    card = _rate_card(now)
    users = [(u, _user(u, passwords[u.username], tenants[u.tenant])) for u in USERS]
    return {"tenants": tenants, "card": card, "users": users}


def _tenants() -> dict[str, Tenant]:
    """The organisations and teams, each team mapped to the Slurm account of its own name."""
    out: dict[str, Tenant] = {}
    for slug, (name, parent) in TENANTS.items():
        kind = TenantKind.TEAM if parent else TenantKind.ORGANISATION
        tenant, _ = Tenant.objects.update_or_create(slug=slug, defaults={
            "name": name, "kind": kind, "parent": out.get(parent)})
        tenant.full_clean()
        out[slug] = tenant
        if parent:
            TenantAccount.objects.update_or_create(kind=AccountKind.SLURM, name=slug, defaults={"tenant": tenant})
    # Research shows cost without being billed for it (showback), so the demo shows both modes.
    Tenant.objects.filter(slug="research").update(billing_mode=BillingMode.SHOWBACK)
    return out


def _rate_card(now: datetime) -> RateCard:
    """The default card; an existing one is kept (its prices restored), else one from this month's start."""
    card = RateCard.objects.filter(tenant__isnull=True, name=DEFAULT_CARD).order_by("effective_from").first()
    if card is None:
        card = RateCard.objects.create(name=DEFAULT_CARD, tenant=None, effective_from=month_start(now))
    card.price_per_kwh = PRICE_PER_KWH
    card.idle_held_price_per_gpu_hour = IDLE_HELD_PRICE
    card.preemptible_qos = ["low"]
    card.preemptible_discount = PREEMPTIBLE_DISCOUNT
    card.save()
    for qos, price in PRICES.items():
        RatePrice.objects.update_or_create(card=card, gpu_model=GPU_MODEL, mig_profile="", priority_class=qos,
                                           defaults={"price_per_gpu_hour": price})
    return card


def _user(spec: DemoUser, password: str, tenant: Tenant) -> bool:
    """The login with exactly one role, in its tenant; True when it was created."""
    user, created = get_user_model().objects.get_or_create(username=spec.username)
    if created or not user.check_password(password) or user.is_staff or user.is_superuser:
        user.set_password(password)
        user.is_staff = user.is_superuser = False
        user.save()
    Membership.objects.filter(user=user).exclude(tenant=tenant).delete()
    Membership.objects.update_or_create(user=user, tenant=tenant, defaults={"role": spec.role})
    return created
