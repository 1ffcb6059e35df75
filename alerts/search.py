"""Find anything: the search box's one answer, composed across telemetry, tenancy and alerts.

This sits in alerts because alerts is the lowest app that may import the other two (telemetry knows
nothing of tenants or alerts). `find_anything(q, who)` asks each for its kinds, every one scoped to
what `who` may see through tenancy.scoping (an operator: everything; a tenant's user: its tenants,
their jobs, the GPUs and nodes those jobs hold now, alerts labelled with its tenant; never switches,
ports, racks or anything of another tenant), and returns the kinds as groups, the best-matching
group first.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Case, IntegerField, Q, TextField, Value, When
from django.db.models.functions import Cast

from alerts.models import Alert, AlertState
from alerts.selectors import OPEN_STATES, SEVERITY_ORDER
from telemetry.models import Allocation
from telemetry.selectors.search import MIN_CONTAINS, TIERS, clean_query, search
from tenancy.models import TenantAccount
from tenancy.scoping import scope_for, visible
from tenancy.search import find_tenants

SEARCH_LIMIT = 50  # per kind
# When two kinds match equally well, the order the page lists them in.
KIND_ORDER = ("tenant", "job", "node", "gpu", "alert", "rack", "switch", "port")
LABEL_PAIR = "="  # "host=gpu-0001": an alert carrying exactly that label


def find_anything(q: str | None, who, limit: int = SEARCH_LIMIT, *, now: datetime | None = None) -> list[dict]:
    """[{"kind", "hits", "more"}] for every kind `q` names that `who` may see; [] for a blank query.

    Groups run by their best hit's match (exact, prefix, contains), ties in KIND_ORDER; each
    group holds at most `limit` hits and says whether there were more.
    """
    q = clean_query(q)
    if not q or limit <= 0:
        return []
    groups = search(q, limit, narrow=lambda qs: visible(qs, who), now=now)
    for kind, hits in (("tenant", find_tenants(q, who, limit + 1)), ("alert", find_alerts(q, who, limit + 1))):
        if hits:
            groups[kind] = {"hits": hits[:limit], "more": len(hits) > limit}
    if not scope_for(who).operator:
        _tenant_slugs(groups, who)
    ordered = sorted(groups.items(), key=lambda kv: (min(TIERS.index(h["match"]) for h in kv[1]["hits"]),
                                                     KIND_ORDER.index(kv[0])))
    return [{"kind": kind, **group} for kind, group in ordered]


def find_alerts(q: str, who, limit: int) -> list[dict]:
    """Alerts by name or rule (exact, prefix, fragment), entity (hostname, GPU UUID, job key), summary text
    or labels ("host=gpu-0001" exactly, else any label's text); open before resolved, then the most
    severe, newest first.

    alert_state_starts serves the open alerts; matching on text reads every alert kept (the history
    included), which the LIMIT does not shorten since the rows are sorted after matching.
    """
    tiers = [Q(name__iexact=q) | Q(rule__name__iexact=q) | Q(entity_key__iexact=q) | _label_pair(q),
             Q(name__istartswith=q) | Q(rule__name__istartswith=q) | Q(entity_key__istartswith=q)]
    if len(q) >= MIN_CONTAINS:
        tiers.append(Q(name__icontains=q) | Q(entity_key__icontains=q) | Q(annotations__summary__icontains=q)
                     | Q(labels_text__icontains=q))
    match = Q()
    for cond in tiers:
        match |= cond
    tier = Case(*[When(c, then=Value(i)) for i, c in enumerate(tiers)], default=Value(2), output_field=IntegerField())
    open_first = Case(When(state__in=OPEN_STATES, then=Value(0)), default=Value(1), output_field=IntegerField())
    severity = Case(*[When(severity=s, then=Value(i)) for s, i in SEVERITY_ORDER.items()], default=Value(9),
                    output_field=IntegerField())
    rows = (Alert.objects.visible_to(who).annotate(labels_text=Cast("labels", TextField())).filter(match)
            .annotate(tier=tier, open_first=open_first, severity_rank=severity)
            .order_by("tier", "open_first", "severity_rank", "-starts_at")[:limit])
    return [_alert_hit(a) for a in rows]


def _label_pair(q: str) -> Q:
    key, sep, value = q.partition(LABEL_PAIR)
    if not sep or not key.strip() or not value.strip():
        return Q(pk__in=[])
    return Q(labels__contains={key.strip(): value.strip()})


def _alert_hit(a: Alert) -> dict:
    summary = (a.annotations or {}).get("summary", "")
    return {"kind": "alert", "key": str(a.pk), "label": a.name, "match": TIERS[a.tier], "state": a.state,
            "tenant": (a.labels or {}).get("tenant"), "severity": a.severity,
            "detail": " · ".join(filter(None, [a.get_severity_display(), AlertState(a.state).label, a.entity_key,
                                               str(summary)[:160]]))}


def _tenant_slugs(groups: dict, who) -> None:
    """Give a tenant's user's job, GPU and node hits the slug of the tenant they belong to (its portal
    is where that user sees them): jobs by their account, GPUs and nodes by the job holding them now."""
    slugs = {(a.kind, a.name): a.tenant.slug for a in TenantAccount.objects.visible_to(who).select_related("tenant")}
    for hit in groups.get("job", {}).get("hits", []):
        hit["tenant"] = slugs.get((hit["source"], hit["account"]))
    held = groups.get("gpu", {}).get("hits", []) + groups.get("node", {}).get("hits", [])
    if not held:
        return
    keys = [h["key"] for h in held]
    allocs = visible(Allocation.objects.filter(end__isnull=True), who).filter(
        Q(gpu__uuid__in=keys) | Q(node__hostname__in=keys))
    owner: dict[str, str | None] = {}
    for uuid, host, source, account in allocs.values_list("gpu__uuid", "node__hostname", "job__source",
                                                          "job__account"):
        slug = slugs.get((source, account))
        owner.setdefault(uuid, slug)
        owner.setdefault(host, slug)
    for hit in held:
        hit["tenant"] = owner.get(hit["key"])

