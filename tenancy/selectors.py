"""Reads for metering, quotas and fair share.

Every function that shows usage takes `who` (a user or an ApiToken) and narrows its rows through
`tenancy.scoping` (`.visible_to(who)`), never by filtering on a tenant by hand: an operator sees every tenant,
anyone else only their tenants (and the teams and projects of an organisation they belong to). Rows name their
tenant by slug under "tenant" (None for usage of jobs whose account maps to no tenant, which only operators
see), with "tenant_id" and "tenant_name" beside it. Hours and kWh are Decimals, exact sums of `UsageHour`.

`tenants_for` is the one unscoped read here: the alert evaluator labels alerts with it, before anyone looks.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db import connection
from django.db.models import Count, OuterRef, Q, Subquery, Sum
from django.db.models.functions import TruncDay
from django.utils import timezone

from anomaly.selectors import members_between, straggling_ranks
from telemetry.health import FAILING_EVENT_KINDS, RESET_OR_RMA_XIDS
from telemetry.models import Allocation, Gpu, GpuEvent, Job, JobState, JobStateChange, MigInstance, Node
from telemetry.xid import describe
from tenancy.metering import floor_hour
from tenancy.models import Invoice, InvoiceLine, MeteringWatermark, Quota, Tenant, TenantAccount, UsageHour

SUMS = ("gpu_hours", "busy_hours", "idle_held_hours", "unmeasured_hours", "lost_hours", "failed_hours",
        "energy_gpu_kwh", "energy_node_kwh", "energy_facility_kwh")
HARDWARE_EVENTS = 200  # the most faults one list shows, newest first
# Fault kinds that carry no XID code, explained by the catalogue entry of the XID that reports the same fault.
KIND_XID = {"fallen_off_bus": 79, "ecc_dbe": 48, "row_remap_failure": 64, "nvlink_errors": 74}
GROUPS = {"tenant": "tenant_id", "job": "job_id", "gpu_model": "gpu_model", "mig_profile": "mig_profile",
          "qos": "qos", "day": "day"}
ZERO = Decimal(0)
DAY = timedelta(days=1)


def _check_range(start: datetime, end: datetime) -> None:
    if start.tzinfo is None or end.tzinfo is None:
        raise ValueError("start and end must be timezone-aware (UTC)")
    if end < start:
        raise ValueError(f"empty range: {start.isoformat()} is after {end.isoformat()}")


def _usage(who, start: datetime, end: datetime):
    _check_range(start, end)
    return UsageHour.objects.visible_to(who).filter(hour__gte=start, hour__lt=end)


def _tenant_names(ids) -> dict[int, tuple[str, str]]:
    return {t.id: (t.slug, t.name) for t in Tenant.objects.filter(id__in=[i for i in ids if i is not None])}


def _name_tenant(row: dict, names: dict[int, tuple[str, str]]) -> dict:
    slug, name = names.get(row.get("tenant_id"), (None, None))
    return {**row, "tenant": slug, "tenant_name": name}


def _job_info(ids) -> dict[int, dict]:
    """Key, name, account, QoS and state of jobs by id (a pruned job keeps its usage but loses its name)."""
    fields = ("id", "source", "external_id", "name", "account", "qos", "state")
    return {j["id"]: {"job_key": f"{j['source']}:{j['external_id']}", "name": j["name"], "account": j["account"],
                      "qos": j["qos"], "state": j["state"]}
            for j in Job.objects.filter(id__in=list(ids)).values(*fields)}


def _with_energy(row: dict) -> dict:
    row = {**row, **{k: row.get(k) or ZERO for k in SUMS}}
    row["energy_kwh"] = row["energy_gpu_kwh"] + row["energy_node_kwh"] + row["energy_facility_kwh"]
    return row


# --- Usage ---------------------------------------------------------------------------------------------------

def usage_summary(who, start: datetime, end: datetime, by: tuple[str, ...] = ("tenant",)) -> list[dict]:
    """Metered usage in [start, end), grouped by any of tenant, job, gpu_model, mig_profile, qos and day (UTC).

    Each row: the group keys ("tenant" slug + "tenant_id" + "tenant_name"; "job_id" + "job_key" + "job_name";
    "day" as the UTC midnight), the sums gpu_hours, busy_hours, idle_held_hours, lost_hours (busy + idle-held +
    lost = gpu_hours), energy_gpu_kwh, energy_node_kwh, energy_facility_kwh, and their total energy_kwh.
    Raises ValueError for an unknown group or a naive range.
    """
    unknown = [b for b in by if b not in GROUPS]
    if unknown:
        raise ValueError(f"cannot group usage by {unknown}; use any of {', '.join(GROUPS)}")
    qs = _usage(who, start, end)
    if "day" in by:
        qs = qs.annotate(day=TruncDay("hour", tzinfo=UTC))
    keys = [GROUPS[b] for b in by]
    if not keys:  # one total row (values() without fields would group by every column)
        return [_with_energy(qs.aggregate(**{f: Sum(f) for f in SUMS}))]
    rows = [_with_energy(r) for r in qs.values(*keys).annotate(**{f: Sum(f) for f in SUMS}).order_by(*keys)]
    if "tenant" in by:
        names = _tenant_names({r["tenant_id"] for r in rows})
        rows = [_name_tenant(r, names) for r in rows]
    if "job" in by:
        jobs = _job_info({r["job_id"] for r in rows})
        rows = [{**r, "job_key": jobs.get(r["job_id"], {}).get("job_key", f"job:{r['job_id']}"),
                 "job_name": jobs.get(r["job_id"], {}).get("name", "")} for r in rows]
    return rows


def _stragglers(job_keys: set[str], start: datetime, end: datetime) -> dict[str, list[str]]:
    """Job key -> ranks flagged as stragglers at some time in [start, end)."""
    ranks = straggling_ranks(members_between("straggler", start, end))
    return {k: v for k, v in ranks.items() if k in job_keys}


def _pct(part: Decimal, whole: Decimal) -> float:
    return float(100 * part / whole) if whole else 0.0


def job_efficiency(who, start: datetime, end: datetime, *, limit: int = 500) -> list[dict]:
    """Per job in [start, end), most GPU-hours first: busy against idle-held (and lost) hours, and stragglers.

    Each row: job_id, job_key, name, account, qos, state, tenant, the usage sums, busy_pct / idle_pct / lost_pct
    of gpu_hours, stragglers (how many ranks were flagged slow in the window) and straggler_ranks.
    """
    qs = _usage(who, start, end).values("job_id", "tenant_id").annotate(**{f: Sum(f) for f in SUMS})
    rows = [_with_energy(r) for r in qs.order_by("-gpu_hours", "job_id")[:limit]]
    jobs, names = _job_info({r["job_id"] for r in rows}), _tenant_names({r["tenant_id"] for r in rows})
    slow = _stragglers({j["job_key"] for j in jobs.values()}, start, end)
    out = []
    for r in rows:
        info = jobs.get(r["job_id"], {"job_key": f"job:{r['job_id']}", "name": "", "account": "", "qos": "",
                                      "state": ""})
        g = r["gpu_hours"]
        ranks = slow.get(info["job_key"], [])
        out.append({**_name_tenant(r, names), **info, "busy_pct": _pct(r["busy_hours"], g),
                    "idle_pct": _pct(r["idle_held_hours"], g), "lost_pct": _pct(r["lost_hours"], g),
                    "unmeasured_pct": _pct(r["unmeasured_hours"], g),
                    "stragglers": len(ranks), "straggler_ranks": ranks})
    return out


class WasteLine(dict):
    """One line of the waste report; str() is its sentence."""

    def __str__(self) -> str:
        return self["text"]


def _span(start: datetime, end: datetime) -> str:
    days = round((end - start) / DAY, 2)
    return {1: "in the last 24 hours", 7: "last week", 30: "in the last 30 days"}.get(
        days, f"between {start:%Y-%m-%d %H:%M} and {end:%Y-%m-%d %H:%M} UTC")


def waste_report(who, start: datetime, end: datetime, *, min_hours: float = 1.0, limit: int = 10) -> list[WasteLine]:
    """Where GPU time was wasted in [start, end): idle-held and lost hours per job, largest first.

    Each line: kind ("idle_held" or "lost"), hours, job_id, job_key, job_name, tenant and text, e.g.
    "312 idle-held GPU-hours last week in job train-llm (slurm:4711)". Lines under `min_hours` are left out.
    """
    rows = _usage(who, start, end).values("job_id", "tenant_id").annotate(
        idle=Sum("idle_held_hours"), lost=Sum("lost_hours"))
    span, lines = _span(start, end), []
    for kind, field, what in (("idle_held", "idle", "idle-held GPU-hours"),
                              ("lost", "lost", "GPU-hours of preempted or lost work")):
        for r in rows.filter(**{f"{field}__gte": Decimal(str(min_hours))}).order_by(f"-{field}")[:limit]:
            lines.append((kind, r, r[field], what))
    lines.sort(key=lambda x: -x[2])
    jobs = _job_info({r["job_id"] for _, r, _, _ in lines})
    names = _tenant_names({r["tenant_id"] for _, r, _, _ in lines})
    out = []
    for kind, r, hours, what in lines[:limit]:
        info = jobs.get(r["job_id"], {"job_key": f"job:{r['job_id']}", "name": ""})
        label = f"{info['name']} ({info['job_key']})" if info["name"] else info["job_key"]
        out.append(WasteLine(kind=kind, hours=hours, job_id=r["job_id"], job_key=info["job_key"],
                             job_name=info["name"], tenant=names.get(r["tenant_id"], (None,))[0],
                             text=f"{hours:,.0f} {what} {span} in job {label}"))
    return out


# --- Hardware events ---------------------------------------------------------------------------------------

def job_hardware_events(who, start: datetime, end: datetime, *, limit: int = HARDWARE_EVENTS) -> list[dict]:
    """GPU faults that touched the jobs `who` may see, while the job held the GPU, open at some time in
    [start, end); newest first. Only the GPUs of `who`'s own ledger rows are looked at, so another tenant's
    faults never show (scoping: Allocation.visible_to).

    Each row: job_id, job_key, job_name, host, node_id, gpu_uuid, gpu_index, kind, kind_label, code (XID; 0 for
    other kinds), title and meaning (telemetry.xid's catalogue), severity, failed (the fault fails the GPU:
    its job's hours after first_seen are billed as failed), first_seen, last_seen, count, cleared_at.
    """
    _check_range(start, end)
    held = list(Allocation.objects.visible_to(who).filter(gpu__isnull=False, start__lt=end)
                .filter(Q(end__isnull=True) | Q(end__gt=start))
                .values_list("job_id", "gpu_id", "start", "end"))
    by_gpu: dict[int, list[tuple[int, datetime, datetime | None]]] = defaultdict(list)
    for job_id, gpu_id, a_start, a_end in held:
        by_gpu[gpu_id].append((job_id, a_start, a_end))
    events = (GpuEvent.objects.filter(gpu_id__in=list(by_gpu), first_seen__lt=end)
              .filter(Q(cleared_at__isnull=True) | Q(cleared_at__gt=start))
              .select_related("gpu__node").order_by("-first_seen"))
    out, seen = [], set()
    for ev in events:
        for job_id, a_start, a_end in by_gpu[ev.gpu_id]:
            touched = (a_end is None or ev.first_seen < a_end) and (ev.cleared_at is None or ev.cleared_at > a_start)
            if touched and (ev.event_id, job_id) not in seen:
                seen.add((ev.event_id, job_id))
                out.append(_event_row(ev, job_id))
        if len(out) >= limit:
            break
    jobs = _job_info({r["job_id"] for r in out})
    for r in out[:limit]:
        info = jobs.get(r["job_id"], {})
        r.update(job_key=info.get("job_key", f"job:{r['job_id']}"), job_name=info.get("name", ""))
    return out[:limit]


def _event_row(ev: GpuEvent, job_id: int) -> dict:
    info = describe(ev.code if ev.kind == "xid" else KIND_XID.get(ev.kind, 0))
    failed = ev.kind in FAILING_EVENT_KINDS or (ev.kind == "xid" and ev.code in RESET_OR_RMA_XIDS)
    return {"job_id": job_id, "host": ev.gpu.node.hostname, "node_id": ev.gpu.node_id, "gpu_uuid": ev.gpu.uuid,
            "gpu_index": ev.gpu.index, "kind": ev.kind, "kind_label": ev.get_kind_display(), "code": ev.code,
            "title": info.name if info.known else ev.get_kind_display(), "meaning": info.meaning,
            "severity": info.severity, "failed": failed, "first_seen": ev.first_seen, "last_seen": ev.last_seen,
            "count": ev.count, "cleared_at": ev.cleared_at}


# --- Quotas, preemptions, fair share -------------------------------------------------------------------------

# Open ledger rows of the given tenants' jobs: GPUs held now per tenant, GPU model and MIG profile (a MIG slice
# or a shared GPU counts by its fraction). The model as metering names it (the GPU's, by id or by node and index,
# else the node's system model).
_LIVE_SQL = f"""
SELECT ta.tenant_id, coalesce(nullif(g.model, ''), nullif(gi.model, ''), n.system_model) AS gpu_model,
    coalesce(mi.profile, '') AS mig_profile, sum(a.fraction) AS gpus, count(DISTINCT a.job_id) AS jobs
FROM {Allocation._meta.db_table} a
JOIN {Job._meta.db_table} j ON j.id = a.job_id
JOIN {TenantAccount._meta.db_table} ta ON ta.kind = j.source AND ta.name = j.account
JOIN {Node._meta.db_table} n ON n.id = a.node_id
LEFT JOIN {Gpu._meta.db_table} g ON g.id = a.gpu_id
LEFT JOIN LATERAL (SELECT x.model FROM {Gpu._meta.db_table} x WHERE a.gpu_id IS NULL AND x.node_id = a.node_id
                   AND x.index = a.gpu_index ORDER BY x.id DESC LIMIT 1) gi ON true
LEFT JOIN {MigInstance._meta.db_table} mi ON mi.id = a.mig_instance_id
WHERE a."end" IS NULL AND ta.tenant_id = ANY(%s)
GROUP BY 1, 2, 3
"""


def _live(tenant_ids: list[int]) -> list[tuple[int, str, str, float, int]]:
    with connection.cursor() as cur:
        cur.execute(_LIVE_SQL, [tenant_ids])
        return cur.fetchall()


def _members(tenants: dict[int, Tenant]) -> dict[int, set[int]]:
    """Tenant id -> itself and, for an organisation, its visible teams and projects (whose jobs it covers)."""
    out = {tid: {tid} for tid in tenants}
    for t in tenants.values():
        if t.parent_id in out:
            out[t.parent_id].add(t.id)
    return out


def quota_usage(who) -> list[dict]:
    """Live allocated GPUs against each quota, per tenant, GPU model and MIG profile; then usage under no quota.

    A quota with an empty model covers every model; an empty profile means whole (or shared) GPUs. An
    organisation's quota covers its teams' and projects' jobs too. Each row: tenant, tenant_id, tenant_name,
    gpu_model, mig_profile, guaranteed, borrowable, allocated (GPUs now), jobs, has_quota, borrowing
    (allocated > guaranteed: running on borrowed, preemptible capacity) and over_quota (allocated > guaranteed
    + borrowable). Usage that no quota covers comes last with guaranteed = borrowable = 0 and over_quota False.
    """
    tenants = {t.id: t for t in Tenant.objects.visible_to(who)}
    live = _live(list(tenants))
    members = _members(tenants)
    covered: set[int] = set()
    rows = []
    for q in Quota.objects.visible_to(who).order_by("tenant__name", "gpu_model", "mig_profile"):
        mine = members.get(q.tenant_id, {q.tenant_id})
        hits = [i for i, (tid, model, profile, _, _) in enumerate(live)
                if tid in mine and profile == q.mig_profile and (not q.gpu_model or model == q.gpu_model)]
        covered.update(hits)
        rows.append(_quota_row(tenants[q.tenant_id], q.gpu_model, q.mig_profile, q.guaranteed, q.borrowable,
                               [live[i] for i in hits], has_quota=True))
    for i, row in enumerate(live):
        if i not in covered:
            rows.append(_quota_row(tenants[row[0]], row[1], row[2], 0.0, 0.0, [row], has_quota=False))
    return rows


def _quota_row(tenant: Tenant, model: str, profile: str, guaranteed: float, borrowable: float, live: list,
               *, has_quota: bool) -> dict:
    allocated = round(sum(r[3] for r in live), 6)
    return {"tenant": tenant.slug, "tenant_id": tenant.id, "tenant_name": tenant.name, "gpu_model": model,
            "mig_profile": profile, "guaranteed": guaranteed, "borrowable": borrowable, "allocated": allocated,
            "jobs": sum(r[4] for r in live), "has_quota": has_quota, "borrowing": allocated > guaranteed,
            "over_quota": has_quota and allocated > guaranteed + borrowable}


def _account_tenant() -> Subquery:
    return Subquery(TenantAccount.objects.filter(kind=OuterRef("job__source"), name=OuterRef("job__account"))
                    .values("tenant_id")[:1])


def preemption_counts(who, start: datetime, end: datetime) -> list[dict]:
    """Per tenant, jobs preempted and lost to node failures in [start, end) (from the jobs' state history).

    Each row: tenant, tenant_id, tenant_name, preemptions (state changes into preempted), jobs_preempted
    (distinct jobs) and node_failures.
    """
    _check_range(start, end)
    qs = (JobStateChange.objects.visible_to(who)
          .filter(time__gte=start, time__lt=end, state__in=["preempted", "node_fail"])
          .annotate(tenant_id=_account_tenant()).values("tenant_id")
          .annotate(preemptions=Count("id", filter=Q(state="preempted")),
                    jobs_preempted=Count("job_id", filter=Q(state="preempted"), distinct=True),
                    node_failures=Count("id", filter=Q(state="node_fail")))
          .order_by("tenant_id"))
    rows = list(qs)
    names = _tenant_names({r["tenant_id"] for r in rows})
    return [_name_tenant(r, names) for r in rows]


def _cluster_gpus() -> float:
    """The cluster's size in GPUs: the inventory's, else (no inventory yet) all guarantees together."""
    count = Gpu.objects.count()
    if count:
        return float(count)
    return float(Quota.objects.aggregate(g=Sum("guaranteed"))["g"] or 0)


def fair_share(who, days: int, *, now: datetime | None = None) -> list[dict]:
    """Entitlement against actual use over the last `days` complete days of hours, per tenant.

    entitlement_share = the tenant's guaranteed GPUs / the cluster's GPUs; actual_share = its GPU-hours /
    the cluster's GPU-hours in the window (GPUs x hours). Both are shares of the whole cluster, so a tenant
    learns nothing of another tenant's use. An organisation counts its teams' and projects' usage, and their
    guarantees when it holds none itself. Each row: tenant, tenant_id, tenant_name, days, guaranteed,
    gpu_hours, entitlement_share, actual_share, ratio (actual / entitlement) and over_share.
    """
    if days <= 0:
        raise ValueError(f"days must be positive, got {days}")
    end = floor_hour(now or timezone.now())
    start = end - days * DAY
    tenants = {t.id: t for t in Tenant.objects.visible_to(who)}
    members = _members(tenants)
    own = defaultdict(float)
    for tid, g in Quota.objects.visible_to(who).values_list("tenant_id", "guaranteed"):
        own[tid] += g
    used = dict(_usage(who, start, end).exclude(tenant_id=None).values("tenant_id")
                .annotate(h=Sum("gpu_hours")).values_list("tenant_id", "h"))
    gpus = _cluster_gpus()
    capacity = Decimal(str(gpus)) * days * 24
    rows = []
    for tid, t in sorted(tenants.items(), key=lambda kv: kv[1].name):
        guaranteed = own[tid] or sum(own[m] for m in members[tid] if m != tid)
        hours = sum((used.get(m) or ZERO for m in members[tid]), ZERO)
        entitled = guaranteed / gpus if gpus else None
        actual = float(hours / capacity) if capacity else None
        rows.append({"tenant": t.slug, "tenant_id": tid, "tenant_name": t.name, "days": days,
                     "guaranteed": guaranteed, "gpu_hours": hours, "entitlement_share": entitled,
                     "actual_share": actual, "ratio": actual / entitled if entitled and actual is not None else None,
                     "over_share": bool(entitled is not None and actual is not None and actual > entitled)})
    return rows


# --- Alert labels --------------------------------------------------------------------------------------------

_JOB_TENANTS_SQL = f"""
SELECT j.source || ':' || j.external_id, t.slug
FROM {Job._meta.db_table} j
JOIN {TenantAccount._meta.db_table} ta ON ta.kind = j.source AND ta.name = j.account
JOIN {Tenant._meta.db_table} t ON t.id = ta.tenant_id
WHERE (j.source, j.external_id) IN (SELECT * FROM unnest(%s::text[], %s::text[]))
"""

# The GPUs (or nodes) held at `at` by jobs of exactly one tenant; a job whose account maps to no tenant counts
# as a holder of its own, so a GPU shared with an unmapped job is nobody's.
_HELD_TENANTS_SQL = """
SELECT a.{column}, min(t.slug)
FROM {alloc} a
JOIN {job} j ON j.id = a.job_id
LEFT JOIN {account} ta ON ta.kind = j.source AND ta.name = j.account
LEFT JOIN {tenant} t ON t.id = ta.tenant_id
WHERE a.{column} = ANY(%s) AND a.start <= %s AND (a."end" IS NULL OR a."end" > %s)
GROUP BY a.{column}
HAVING count(DISTINCT coalesce(ta.tenant_id, -j.id)) = 1 AND min(ta.tenant_id) IS NOT NULL
"""


def _held_sql(column: str) -> str:
    return _HELD_TENANTS_SQL.format(column=column, alloc=Allocation._meta.db_table, job=Job._meta.db_table,
                                    account=TenantAccount._meta.db_table, tenant=Tenant._meta.db_table)


def tenants_for(kind: str, refs, at: datetime) -> dict:
    """The tenant slug of each entity, where exactly one tenant's jobs hold it at `at`; one query.

    kind "job": refs are job keys ("source:external_id"), labelled through their account; "gpu" / "node":
    inventory ids, labelled when every job holding the GPU (or any GPU of the node) at `at` belongs to the
    same tenant. Other kinds (racks, ports) belong to nobody: {}.
    """
    refs = list(refs)
    if not refs or kind not in ("job", "gpu", "node"):
        return {}
    if kind == "job":
        pairs = [str(r).partition(":") for r in refs]
        sql, params = _JOB_TENANTS_SQL, [[p[0] for p in pairs], [p[2] for p in pairs]]
    else:
        sql, params = _held_sql("gpu_id" if kind == "gpu" else "node_id"), [refs, at, at]
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return dict(cur.fetchall())


# --- The tenant portal's reads: tenants, invoices, the GPUs a tenant holds -----------------------------------

def visible_tenants(who) -> list[Tenant]:
    """Every tenant `who` sees, by name, with its parent (an organisation) at hand."""
    return list(Tenant.objects.visible_to(who).select_related("parent").order_by("name"))


def tenant_by_slug(who, slug: str) -> tuple[Tenant | None, bool]:
    """(the tenant called `slug` if `who` sees it, whether a tenant of that slug exists at all): a page tells
    "no such tenant" (404) from "not yours" (403)."""
    tenant = Tenant.objects.visible_to(who).filter(slug=slug).first()
    return tenant, tenant is not None or Tenant.objects.filter(slug=slug).exists()


def child_tenants(who, tenant: Tenant) -> list[Tenant]:
    """The teams and projects directly under `tenant` that `who` sees, by name."""
    return list(Tenant.objects.visible_to(who).filter(parent=tenant).order_by("name"))


def tenants_with_usage(who, start: datetime, end: datetime) -> list[Tenant]:
    """The tenants `who` sees that have metered usage in [start, end), by name."""
    ids = UsageHour.objects.visible_to(who).filter(hour__gte=start, hour__lt=end).values("tenant_id")
    return list(Tenant.objects.visible_to(who).filter(id__in=ids).order_by("name"))


def invoices(who, *, period_start: datetime | None = None, limit: int | None = None) -> list[Invoice]:
    """The invoices and showback statements `who` sees (of the period that starts at `period_start` only, when
    given), newest period first, then by tenant name."""
    qs = Invoice.objects.visible_to(who).select_related("tenant").order_by("-period_start", "tenant__name")
    if period_start is not None:
        qs = qs.filter(period_start=period_start)
    return list(qs[:limit] if limit else qs)


def invoice(who, number: str) -> Invoice | None:
    """The invoice numbered `number`, if `who` sees it."""
    return Invoice.objects.visible_to(who).select_related("tenant").filter(number=number).first()


def invoice_line(who, line_id: int) -> InvoiceLine | None:
    """The invoice line `line_id` with its invoice, if `who` sees it."""
    return InvoiceLine.objects.visible_to(who).select_related("invoice").filter(pk=line_id).first()


def period_invoice(who, tenant: Tenant, period_start: datetime) -> Invoice | None:
    """`tenant`'s invoice (or draft) for the period that starts at `period_start`, if `who` sees it."""
    return Invoice.objects.visible_to(who).filter(tenant=tenant, period_start=period_start).first()


def metered_until() -> datetime | None:
    """Where metering stands: usage is metered per clock hour, once the hour has ended."""
    return MeteringWatermark.objects.filter(name="usage").values_list("metered_until", flat=True).first()


def held_allocations(who, at: datetime, recent_failures: timedelta) -> list[Allocation]:
    """The GPU allocations of `who`'s running jobs, and of its jobs the hardware ended (failed or node failure)
    in the last `recent_failures`, with job and node, by job, host and GPU index."""
    ended_by_failure = Q(job__state__in=(JobState.FAILED, JobState.NODE_FAIL), end__gte=at - recent_failures)
    return list(Allocation.objects.visible_to(who).filter(gpu__isnull=False)
                .filter(Q(end__isnull=True) | ended_by_failure)
                .select_related("job", "gpu__node").order_by("job_id", "gpu__node__hostname", "gpu_index"))


def open_fault_labels(gpu_ids) -> dict[int, list[str]]:
    """GPU id -> its open (uncleared) faults, as "XID 79" or the fault kind's name."""
    out: dict[int, list[str]] = {}
    for ev in GpuEvent.objects.filter(gpu_id__in=list(gpu_ids), cleared_at__isnull=True):
        out.setdefault(ev.gpu_id, []).append(f"XID {ev.code}" if ev.kind == "xid" else ev.get_kind_display())
    return out
