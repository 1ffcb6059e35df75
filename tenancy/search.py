"""The search box's tenants: by name, slug or scheduler account (Slurm account, Kubernetes namespace).

`find_tenants(q, who, limit)` returns hits shaped like telemetry's (`telemetry.selectors.search`):
{"kind": "tenant", "key": slug, "label", "detail", "match", "state", "tenant"}, exact before prefix
before fragment, then by name, each with its running and pending jobs counted. `who` sees only what
tenancy.scoping lets it see: an operator every tenant, a tenant's user its own (and their teams).
"""

from __future__ import annotations

from django.db.models import Count, Q

from telemetry.models import Job, JobState
from telemetry.selectors.search import TIERS, tiered
from tenancy.models import Tenant, TenantAccount


def find_tenants(q: str, who, limit: int) -> list[dict]:
    """Tenants whose name or slug, or one of whose accounts, holds `q`; best match first.

    Tenants and their accounts are small tables (one row per customer team): the case-insensitive
    LIKEs scan them. The job counts read job_state_start_idx (state = running or pending).
    """
    accounts = tiered(TenantAccount.objects.visible_to(who), ("name",), q).order_by("tier", "name")[:limit]
    named = tiered(Tenant.objects.visible_to(who), ("name", "slug"), q).order_by("tier", "name")[:limit]
    best: dict[int, int] = {}
    for tenant_id, tier in [*accounts.values_list("tenant_id", "tier"), *named.values_list("id", "tier")]:
        best[tenant_id] = min(tier, best.get(tenant_id, tier))
    tenants = sorted(Tenant.objects.filter(id__in=list(best)).select_related("parent").prefetch_related("accounts"),
                     key=lambda t: (best[t.id], t.name))[:limit]
    counts = _active_jobs(tenants)
    return [_hit(t, TIERS[best[t.id]], counts) for t in tenants]


def _active_jobs(tenants: list[Tenant]) -> dict[tuple[str, str], dict]:
    """{(source, account): {"running", "pending"}} over the tenants' accounts, in one query."""
    accounts = Q(pk__in=[])
    for t in tenants:
        for a in t.accounts.all():
            accounts |= Q(source=a.kind, account=a.name)
    rows = (Job.objects.filter(accounts, state__in=(JobState.RUNNING, JobState.PENDING)).values("source", "account")
            .annotate(running=Count("id", filter=Q(state=JobState.RUNNING)),
                      pending=Count("id", filter=Q(state=JobState.PENDING))))
    return {(r["source"], r["account"]): r for r in rows}


def _hit(t: Tenant, match: str, counts: dict) -> dict:
    accounts = sorted(t.accounts.all(), key=lambda a: (a.kind, a.name))
    running = sum(counts.get((a.kind, a.name), {}).get("running", 0) for a in accounts)
    pending = sum(counts.get((a.kind, a.name), {}).get("pending", 0) for a in accounts)
    return {"kind": "tenant", "key": t.slug, "label": t.name, "match": match, "tenant": t.slug,
            "state": "running" if running else "idle",
            "detail": " · ".join(filter(None, [
                t.get_kind_display(), f"in {t.parent.name}" if t.parent_id else "",
                ", ".join(f"{a.kind}:{a.name}" for a in accounts), f"{running} running", f"{pending} pending"]))}
