"""Tenant scoping, in one place: who may see which rows.

Every view, API endpoint, websocket group and export narrows its querysets with `visible(qs, who)` (or the
`.visible_to(who)` queryset method, which calls it) and never filters by tenant by hand. `who` is a user or
an API token. Operators see everything; everyone else sees their tenants (and the teams and projects under
an organisation they belong to) and nothing of any other tenant. Models this module does not know are
operator-only: an unknown model scopes to nothing, so a new endpoint cannot leak by default.

What belongs to a tenant:
- jobs whose Slurm account / Kubernetes namespace maps to it (TenantAccount); their allocations;
- GPUs and nodes while one of its jobs holds them (the portal's health view);
- alerts labelled `tenant=<slug>`; usage rows, invoices, quotas, its own rate cards and tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import models
from django.db.models import Q

from telemetry.models import Allocation
from tenancy.models import ApiToken, Membership, Tenant, TenantAccount

ROLE_ORDER = {"viewer": 0, "member": 1, "tenant_admin": 2}


@dataclass(frozen=True)
class Scope:
    """What one user or token may see: everything (operator) or a set of tenants with a role in each."""

    operator: bool = False
    roles: dict[int, str] = field(default_factory=dict)  # tenant id -> role (descendants inherit)
    slugs: frozenset[str] = frozenset()
    accounts: frozenset[tuple[str, str]] = frozenset()  # (kind, name)
    read_only: bool = False

    @property
    def tenant_ids(self) -> frozenset[int]:
        return frozenset(self.roles)

    def role_in(self, tenant_id: int) -> str | None:
        return "operator" if self.operator else self.roles.get(tenant_id)

    def can(self, tenant_id: int, at_least: str) -> bool:
        """Operator, or a role in the tenant at least as strong as `at_least` (viewer < member < tenant_admin)."""
        if self.operator:
            return True
        role = self.roles.get(tenant_id)
        return role is not None and ROLE_ORDER[role] >= ROLE_ORDER[at_least] and not (
            self.read_only and at_least != "viewer")


NOBODY = Scope()


def _expand(roles: dict[int, str]) -> dict[int, str]:
    """A role in an organisation applies to its teams and projects too (the stronger role wins)."""
    out = dict(roles)
    for child_id, parent_id in Tenant.objects.filter(parent_id__in=list(roles)).values_list("id", "parent_id"):
        inherited = roles[parent_id]
        if child_id not in out or ROLE_ORDER[inherited] > ROLE_ORDER[out[child_id]]:
            out[child_id] = inherited
    return out


def _build(roles: dict[int, str], *, read_only: bool = False) -> Scope:
    roles = _expand(roles)
    slugs = frozenset(Tenant.objects.filter(id__in=list(roles)).values_list("slug", flat=True))
    accounts = frozenset(TenantAccount.objects.filter(tenant_id__in=list(roles)).values_list("kind", "name"))
    return Scope(roles=roles, slugs=slugs, accounts=accounts, read_only=read_only)


def scope_for(who) -> Scope:
    """The scope of a user or an ApiToken (memoised on the object for the request)."""
    cached = getattr(who, "_bw_scope", None)
    if cached is not None:
        return cached
    scope = _compute(who)
    try:
        who._bw_scope = scope
    except AttributeError:  # AnonymousUser and friends may refuse attributes; nothing to cache then
        pass
    return scope


def _compute(who) -> Scope:
    if who is None:
        return NOBODY
    if isinstance(who, ApiToken):
        if who.tenant_id is None:
            return Scope(operator=True, read_only=who.read_only)
        return _build({who.tenant_id: "member" if not who.read_only else "viewer"}, read_only=who.read_only)
    if not getattr(who, "is_authenticated", False) or not getattr(who, "is_active", True):
        return NOBODY
    if who.is_superuser or who.is_staff:
        return Scope(operator=True)
    rows = list(Membership.objects.filter(user=who).values_list("tenant_id", "role"))
    if any(role == "operator" for _, role in rows):
        return Scope(operator=True)
    return _build({tid: role for tid, role in rows if tid is not None})


def is_operator(who) -> bool:
    return scope_for(who).operator


def _accounts_q(scope: Scope, prefix: str = "") -> Q:
    """Jobs whose scheduler account maps to the scope's tenants (Slurm accounts for slurm jobs, namespaces for k8s)."""
    q = Q(pk__in=[])
    for kind, name in scope.accounts:
        q |= Q(**{f"{prefix}source": kind, f"{prefix}account": name})
    return q


def visible(qs: models.QuerySet, who) -> models.QuerySet:
    """`qs` narrowed to what `who` may see."""
    scope = scope_for(who)
    if scope.operator:
        return qs
    rule = _RULES.get(qs.model._meta.label)
    return rule(qs, scope) if rule else qs.none()


def _held_gpu_ids(scope: Scope) -> models.QuerySet:
    return Allocation.objects.filter(_accounts_q(scope, "job__"), end__isnull=True).values("gpu_id")


def _held_node_ids(scope: Scope) -> models.QuerySet:
    return Allocation.objects.filter(_accounts_q(scope, "job__"), end__isnull=True).values("node_id")


_RULES = {
    "tenancy.Tenant": lambda qs, s: qs.filter(id__in=s.tenant_ids),
    "tenancy.TenantAccount": lambda qs, s: qs.filter(tenant_id__in=s.tenant_ids),
    "tenancy.Membership": lambda qs, s: qs.filter(tenant_id__in=s.tenant_ids),
    "tenancy.ApiToken": lambda qs, s: qs.filter(tenant_id__in=[t for t in s.tenant_ids if s.can(t, "tenant_admin")]),
    "tenancy.Quota": lambda qs, s: qs.filter(tenant_id__in=s.tenant_ids),
    "tenancy.UsageHour": lambda qs, s: qs.filter(tenant_id__in=s.tenant_ids),
    "tenancy.Invoice": lambda qs, s: qs.filter(tenant_id__in=s.tenant_ids),
    "tenancy.InvoiceLine": lambda qs, s: qs.filter(invoice__tenant_id__in=s.tenant_ids),
    "tenancy.RateCard": lambda qs, s: qs.filter(Q(tenant__isnull=True) | Q(tenant_id__in=s.tenant_ids)),
    "tenancy.RatePrice": lambda qs, s: qs.filter(Q(card__tenant__isnull=True) | Q(card__tenant_id__in=s.tenant_ids)),
    "telemetry.Job": lambda qs, s: qs.filter(_accounts_q(s)),
    "telemetry.Allocation": lambda qs, s: qs.filter(_accounts_q(s, "job__")),
    "telemetry.JobStateChange": lambda qs, s: qs.filter(_accounts_q(s, "job__")),
    "telemetry.Gpu": lambda qs, s: qs.filter(id__in=_held_gpu_ids(s)),
    "telemetry.Node": lambda qs, s: qs.filter(id__in=_held_node_ids(s)),
    "alerts.Alert": lambda qs, s: qs.filter(labels__tenant__in=list(s.slugs)),
    "alerts.AlertEvent": lambda qs, s: qs.filter(alert__labels__tenant__in=list(s.slugs)),
}
