"""The tenant portal: a tenant's own jobs, usage against quota, costs and invoices, alerts and GPU health.

/portal/ picks the tenant (a user may belong to several); every other page is /portal/<slug>/...:
the overview (daily usage and cost charts, where money is wasted, quota, month-to-date spend), jobs with
their efficiency, invoices (list, detail, CSV/JSON export), and alerts with the health of the GPUs the
tenant's running jobs hold.

What a page shows is decided in one place, tenancy.scoping: each page reads through `visible_to` (or a
tenancy selector that does) with the caller narrowed to the tenant of the URL (`TenantView`). Narrowing
only ever takes away: a member of a team never sees its sibling teams, an organisation's member sees the
organisation and its teams, and a slug the caller holds no role in is a 403.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import wraps

from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_safe

from alerts import selectors as alert_selectors
from dashboard.pages.alerts import display_alert
from telemetry import health as health_model
from telemetry.selectors.inventory import gpu_tile, job_key, latest_gpu_rows
from tenancy import exports, selectors
from tenancy.access import forbidden_page, tenant_member_required
from tenancy.billing import LOST_RULES, UNMEASURED_RULE, BillingError, add_month, load_cards, price_usage, statement
from tenancy.exports import usage_csv
from tenancy.models import Invoice, Role, Tenant
from tenancy.scoping import Scope, scope_for

DAY = timedelta(days=1)
CHART_DAYS = 30
WASTE_DAYS = 7
JOB_WINDOWS = {"1": 1, "7": 7, "30": 30}
GPU_ROWS = 200  # the GPU table lists this many of the tenant's GPUs at most (the worst first)
# Health states a tenant should look at (unplaced only means the inventory lacks the GPU's rack).


def now() -> datetime:
    """The pages' clock (tests pin it)."""
    return timezone.now()


def floor_hour(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def floor_day(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def month_start(t: datetime) -> datetime:
    return floor_day(t).replace(day=1)


# --- Who sees what ---------------------------------------------------------------------------------------

class TenantView:
    """The caller narrowed to one tenant and the teams under it: what that tenant's portal pages show.

    tenancy.scoping reads a caller's scope from `_bw_scope` when it is set, so `visible_to(view)` and
    every tenancy selector given this object see the tenant's rows only, through the same rules.
    """

    def __init__(self, user, tenant: Tenant, role: str):
        from tenancy.scoping import _build  # the scope builder itself, so the narrowing follows its rules

        caller = scope_for(user)
        self.user, self.tenant, self.role = user, tenant, role
        # An operator reads a tenant's portal as that tenant's viewer would.
        self._bw_scope: Scope = _build({tenant.id: role if role in (Role.TENANT_ADMIN, Role.MEMBER) else "viewer"},
                                       read_only=caller.read_only)
        self.is_authenticated = True
        self.is_active = True

    def __str__(self) -> str:
        return f"{self.user} as {self.tenant.slug}"


def root_tenants(user) -> list[Tenant]:
    """The tenants `user` holds a role in directly or through an organisation, without their teams
    (a team is listed only when its organisation is not)."""
    tenants = selectors.visible_tenants(user)
    ids = {t.id for t in tenants}
    return [t for t in tenants if t.parent_id not in ids]


def tenant_page(view):
    """A /portal/<slug>/ page: signed in with a role somewhere (tenancy.access), and a role in this tenant.

    An unknown slug is a 404; a tenant the caller holds no role in is a 403. The view gets the
    `TenantView` instead of the slug.
    """

    @wraps(view)
    def wrapper(request, slug: str, *args, **kwargs):
        tenant, exists = selectors.tenant_by_slug(request.user, slug)
        if tenant is None:
            if not exists:
                raise Http404("No such tenant.")
            return forbidden_page(request, "This tenant's portal is for its own members.")
        role = scope_for(request.user).role_in(tenant.id)
        return view(request, TenantView(request.user, tenant, role), *args, **kwargs)

    return tenant_member_required(require_safe(wrapper))


def _frame(request, view: TenantView, tab: str, **context) -> dict:
    """What every portal page needs: the tenant, its place in the hierarchy, the tabs and the caller."""
    tenant = view.tenant
    return {"tenant": tenant, "parent": tenant.parent if tenant.parent_id else None,
            "children": selectors.child_tenants(view, tenant),
            "role": Role(view.role).label if view.role in Role.values else view.role,
            "operator": scope_for(request.user).operator, "tab": tab, **context}


# --- Display shaping -------------------------------------------------------------------------------------

def money(amount: Decimal | float | None, currency: str = "USD") -> str:
    """"$1,234.56", "€12.00", "-$3.10"; "—" for None."""
    if amount is None:
        return "—"
    symbol = {"USD": "$", "EUR": "€", "GBP": "£"}.get(currency)
    text = f"{abs(Decimal(amount)):,.2f}"
    sign = "-" if Decimal(amount) < 0 else ""
    return f"{sign}{symbol}{text}" if symbol else f"{sign}{text} {currency}"


def hours(value) -> str:
    """GPU-hours as read at a glance: "1,234", "12.5", "0.25"."""
    if value is None:
        return "—"
    x = float(value)
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}" if abs(x) < 1 else f"{x:,.1f}"


def invoice_row(inv: Invoice, base: str) -> dict:
    """An invoice as the lists show it, with its links under `base` (/portal/<slug> or /chargeback)."""
    return {"id": inv.id, "number": inv.number, "tenant": inv.tenant, "state": inv.state, "showback": inv.showback,
            "period": f"{inv.period_start:%Y-%m-%d} – {(inv.period_end - timedelta(seconds=1)):%Y-%m-%d}",
            "period_start": inv.period_start, "total": money(inv.total, inv.currency), "total_value": inv.total,
            "finalized": inv.finalized_at, "finalized_by": inv.finalized_by,
            "url": f"{base}/invoices/{inv.number}/", "csv_url": f"{base}/invoices/{inv.number}.csv",
            "json_url": f"{base}/invoices/{inv.number}.json"}


def invoice_lines(inv: Invoice) -> list[dict]:
    """The invoice's lines in order, amounts as money."""
    rows = []
    for line in inv.lines.select_related("rate_card").order_by("id"):
        rows.append({"id": line.id, "kind": line.kind, "kind_label": line.get_kind_display(),
                     "description": line.description, "job_key": line.job_key, "qos": line.qos,
                     "gpu_model": line.gpu_model, "mig_profile": line.mig_profile, "quantity": line.quantity,
                     "unit": line.unit, "unit_price": line.unit_price, "amount": money(line.amount, inv.currency),
                     "negative": line.amount < 0, "corrects_id": line.corrects_id, "reason": line.reason})
    return rows


def export_response(inv: Invoice, fmt: str) -> HttpResponse:
    """The invoice as a CSV or JSON download (tenancy.exports)."""
    body, ctype = ((exports.invoice_csv(inv), "text/csv; charset=utf-8") if fmt == "csv"
                   else (exports.invoice_json(inv), "application/json"))
    response = HttpResponse(body, content_type=ctype)
    response["Content-Disposition"] = f'attachment; filename="{inv.number}.{fmt}"'
    return response


# --- Reads -----------------------------------------------------------------------------------------------

def priced_total(tenant: Tenant, start: datetime, end: datetime, book=None) -> tuple[Decimal | None, str]:
    """What the tenant's usage in [start, end) costs at its rate cards: (amount, "") or (None, why not)."""
    if end <= start:
        return Decimal("0.00"), ""
    try:
        return sum((ln.amount for ln in price_usage(tenant, start, end, book=book)), Decimal("0.00")), ""
    except BillingError as exc:
        return None, str(exc)


def daily_cost(view, days: list[datetime], end: datetime) -> tuple[list[float | None], list[str]]:
    """Cost per day of `days` (UTC midnights, the last one cut at `end`) over every tenant in view."""
    totals: list[Decimal | None] = [Decimal(0)] * len(days)
    problems: list[str] = []
    for tenant in selectors.tenants_with_usage(view, days[0], end):
        book = load_cards(tenant)
        for i, day in enumerate(days):
            amount, why = priced_total(tenant, day, min(day + DAY, end), book)
            if amount is None:
                totals[i] = None
                problems.append(why)
            elif totals[i] is not None:
                totals[i] += amount
    return [None if x is None else float(x) for x in totals], sorted(set(problems))


def usage_by_day(view, start: datetime, end: datetime) -> list[dict]:
    """Daily GPU-hours (busy, idle-held, lost) and energy in [start, end), from tenancy.selectors.usage_summary."""
    rows = selectors.usage_summary(view, start, end, by=("day",))
    return sorted(rows, key=lambda r: r["day"])


def chart_data(view, at: datetime) -> dict:
    """The overview's two charts: GPU-hours per day split three ways, and cost per day, last CHART_DAYS days."""
    first = floor_day(at) - (CHART_DAYS - 1) * DAY
    days = [first + i * DAY for i in range(CHART_DAYS)]
    end = floor_hour(at)
    by_day = {_day_key(r["day"]): r for r in usage_by_day(view, first, end)}
    cost, problems = daily_cost(view, days, end)

    def series(key: str) -> list[float]:
        return [float(by_day.get(d.date().isoformat(), {}).get(key) or 0) for d in days]

    return {"days": [d.date().isoformat() for d in days], "busy": series("busy_hours"),
            "idle_held": series("idle_held_hours"), "unmeasured": series("unmeasured_hours"),
            "lost": series("lost_hours"), "cost": cost,
            "currency": view.tenant.currency, "cost_problems": problems}


def _day_key(day) -> str:
    return (day.date() if isinstance(day, datetime) else day).isoformat()


def waste_lines(view, at: datetime) -> list[dict]:
    """Where the tenant wastes money, the last WASTE_DAYS days: "312 idle-held GPU-hours last week in job X",
    each with what those hours cost at the rate card in force."""
    end = floor_hour(at)
    start = end - WASTE_DAYS * DAY
    lines = selectors.waste_report(view, start, end)
    costs = _waste_costs(view, start, end, {ln["job_id"] for ln in lines})
    return [{"text": str(ln), "kind": ln["kind"], "job_key": ln["job_key"],
             "cost_text": _cost_text(costs.get((ln["job_id"], ln["kind"])), view.tenant.currency)} for ln in lines]


def _cost_text(amount: Decimal | None, currency: str) -> str:
    return f"≈ {money(amount, currency)}" if amount else ""


def _waste_costs(view, start: datetime, end: datetime, job_ids: set[int]) -> dict[tuple[int, str], Decimal]:
    """{(job id, "idle_held" | "lost"): what those hours cost} at each tenant's card in force at `end`."""
    rows = [r for r in selectors.usage_summary(view, start, end, by=("tenant", "job", "gpu_model", "mig_profile",
                                                                       "qos")) if r["job_id"] in job_ids]
    books, out = {}, {}
    tenants = {t.slug: t for t in selectors.visible_tenants(view)}
    for r in rows:
        tenant = tenants.get(r["tenant"])
        book = books.setdefault(r["tenant"], load_cards(tenant) if tenant else None)
        card = book.card_at(end - timedelta(hours=1)) if book else None
        if card is None:
            continue
        try:
            price = book.price(card, r["gpu_model"], r["mig_profile"], r["qos"])
        except BillingError:
            continue
        if r["qos"] in (card.preemptible_qos or []):
            price *= 1 - card.preemptible_discount
        idle = r["idle_held_hours"] * (price + (card.idle_held_price_per_gpu_hour or 0))
        for kind, amount in (("idle_held", idle), ("lost", r["lost_hours"] * price)):
            out[(r["job_id"], kind)] = out.get((r["job_id"], kind), Decimal(0)) + amount
    return out


def quota_rows(view) -> list[dict]:
    """Live allocated GPUs against guaranteed and borrowable, with the bar widths the page draws."""
    rows = []
    for r in selectors.quota_usage(view):
        limit = float(r["guaranteed"]) + float(r["borrowable"])
        used = float(r["allocated"])
        rows.append({**r, "used_pct": min(100.0, 100 * used / limit) if limit else 0.0,
                     "guaranteed_pct": 100 * float(r["guaranteed"]) / limit if limit else 0.0})
    return rows


def job_rows(view, start: datetime, end: datetime) -> list[dict]:
    """The tenant's jobs in [start, end) with busy, idle-held and lost hours (tenancy.selectors.job_efficiency)."""
    rows = []
    for r in selectors.job_efficiency(view, start, end):
        ranks = r.get("straggler_ranks") or []
        rows.append({**r, "gpu_hours_text": hours(r["gpu_hours"]), "busy_text": hours(r["busy_hours"]),
                     "idle_text": hours(r["idle_held_hours"]), "lost_text": hours(r["lost_hours"]),
                     "unmeasured_text": hours(r["unmeasured_hours"]), "failed_text": hours(r["failed_hours"]),
                     "stragglers_text": (f"{len(ranks)} rank{'s' if len(ranks) != 1 else ''}: {', '.join(ranks[:8])}"
                                         + ("…" if len(ranks) > 8 else "")) if ranks else ""})
    return rows


# A job the hardware ended stays on the tenant's GPU list this long, so the failure that ended it is seen.
RECENT_FAILURES = timedelta(hours=1)


def gpu_health_rows(view, at: datetime) -> dict:
    """The GPUs the tenant's running jobs hold, and those of its jobs that the hardware ended in the last
    RECENT_FAILURES (failed or node failure): per job (count, utilisation, temperature, power, health) and the
    GPUs themselves, unhealthy and faulted ones first, with their open faults."""
    allocs = selectors.held_allocations(view, at, RECENT_FAILURES)
    latest = latest_gpu_rows(a.gpu_id for a in allocs)
    healths = health_model.gpu_health([a.gpu_id for a in allocs], now=at)
    faults = selectors.open_fault_labels(a.gpu_id for a in allocs)
    gpus, jobs = [], {}
    for a in allocs:
        node, tile = a.gpu.node, gpu_tile(latest.get(a.gpu_id), healths[a.gpu_id])
        gpu = {"uuid": a.gpu.uuid, "host": node.hostname, "index": a.gpu_index, "job": job_key(a.job.source,
               a.job.external_id), "job_name": a.job.name, "util": tile["gpu_util"], "temp": tile["gpu_temp"],
               "power": tile["power_w"], **{k: v for k, v in tile.items() if k.startswith("health") or k == "fresh"},
               "faults": faults.get(a.gpu_id, []), "fraction": a.fraction}
        gpus.append(gpu)
        _add_to_job(jobs.setdefault(gpu["job"], {"job": gpu["job"], "name": a.job.name, "gpus": 0, "util": [],
                                                  "temp": [], "power": 0.0, "unhealthy": 0, "faults": 0}), gpu)
    gpus.sort(key=lambda g: (not g["faults"], health_model.RANK[g["health"]], g["job"], g["host"], g["index"]))
    return {"jobs": [_job_health(j) for j in jobs.values()], "gpus": gpus[:GPU_ROWS], "total": len(gpus),
            "unhealthy": sum(g["health"] != "ok" for g in gpus), "faulted": sum(bool(g["faults"]) for g in gpus)}


def _add_to_job(job: dict, gpu: dict) -> None:
    job["gpus"] += 1
    for key in ("util", "temp"):
        if gpu[key] is not None:
            job[key].append(gpu[key])
    job["power"] += gpu["power"] or 0.0
    job["unhealthy"] += gpu["health"] != "ok"
    job["faults"] += len(gpu["faults"])


def _job_health(job: dict) -> dict:
    return {**job, "util": sum(job["util"]) / len(job["util"]) if job["util"] else None,
            "temp": max(job["temp"]) if job["temp"] else None, "power_kw": job["power"] / 1000}


# Remediation states that are something the operators did (or are doing), not a suggestion or a dry run.
DONE_STATES = ("awaiting", "approved", "running", "succeeded", "failed")
# How long after a fault cleared an action on its node or GPU still counts as an answer to it (a resume).
AFTER_CLEAR = timedelta(hours=1)


def hardware_events(view, start: datetime, end: datetime) -> list[dict]:
    """The GPU faults that touched the tenant's own jobs in [start, end) (tenancy.selectors, scoped), each with
    what the operators did about it: remediation actions on its node, GPU or job from the fault's first sighting
    until an hour after it cleared, shown by kind, state and time only (their reasons may name other tenants)."""
    rows = selectors.job_hardware_events(view, start, end)
    if not rows:
        return []
    keys = (("node", "host"), ("gpu", "gpu_uuid"), ("job", "job_key"))
    targets = {kind: {r[key] for r in rows} for kind, key in keys}
    actions = alert_selectors.actions_on(targets, DONE_STATES, min(r["first_seen"] for r in rows))
    for r in rows:
        until = (r["cleared_at"] or end) + AFTER_CLEAR
        keys = {("node", r["host"]), ("gpu", r["gpu_uuid"]), ("job", r["job_key"])}
        r["actions"] = [{"kind": a.kind, "label": a.get_kind_display(), "state": a.get_state_display(),
                         "at": a.created_at} for a in actions
                        if (a.target_kind, a.target_key) in keys and r["first_seen"] <= a.created_at <= until]
        r["label"] = f"XID {r['code']}" if r["kind"] == "xid" else r["kind_label"]
    return rows


def tenant_alerts(view, at: datetime) -> dict:
    """The tenant's open alerts, and those resolved in the last WASTE_DAYS days (labelled tenant=<slug>)."""
    alerts = alert_selectors.scoped_alerts(view, at - WASTE_DAYS * DAY)
    return {which: [display_alert(r, at) for r in rows] for which, rows in alerts.items()}


# --- Pages -----------------------------------------------------------------------------------------------

@tenant_member_required
@require_safe
def portal_home(request):
    """Where a tenant's user lands: their tenant's portal, or a choice when they belong to several."""
    scope = scope_for(request.user)
    tenants = selectors.visible_tenants(request.user) if scope.operator else root_tenants(request.user)
    if len(tenants) == 1 and not scope.operator:
        return redirect("portal", slug=tenants[0].slug)
    return render(request, "portal/choose.html", {"tenants": tenants, "operator": scope.operator})


@tenant_page
def portal(request, view: TenantView):
    """A tenant's overview: usage and cost per day, waste, quota, this month's spend, the latest invoices."""
    at = now()
    return render(request, "portal/overview.html", _frame(request, view, "overview", **{
        "charts": chart_data(view, at), "waste": waste_lines(view, at), "quotas": quota_rows(view),
        **month_spent(view, at), **week_totals(view, at), "metered_until": selectors.metered_until(),
        "invoices": [invoice_row(i, _base(view)) for i in selectors.invoices(view, limit=5)],
        "open_alerts": tenant_alerts(view, at)["open"],
        "usage_csv": f"{_base(view)}/usage.csv?days={CHART_DAYS}"}))


def _statement_total(tenant: Tenant, start: datetime, end: datetime) -> Decimal | None:
    try:
        return statement(tenant, start, end).total
    except BillingError:
        return None


def month_spent(view, at: datetime) -> dict:
    """This month so far: the total of the tenant's draft invoice for the month, computed by the function that
    writes the draft (tenancy.billing.statement), so the two agree to the cent. Teams and projects under an
    organisation have invoices of their own, summed apart. None where some usage cannot be priced."""
    start = month_start(at)
    end = add_month(start)
    own = _statement_total(view.tenant, start, end)
    teams = [_statement_total(t, start, end) for t in selectors.tenants_with_usage(view, start, at)
             if t.id != view.tenant.id]
    draft = selectors.period_invoice(view, view.tenant, start)
    return {"spent": None if own is None else money(own, view.tenant.currency),
            "spent_teams": (None if None in teams else money(sum(teams, Decimal(0)), view.tenant.currency))
            if teams else "", "draft": invoice_row(draft, _base(view)) if draft else None}


def week_totals(view, at: datetime) -> dict:
    """GPU-hours of the last 7 days and the idle-held share of them, as the overview's cards show them."""
    end = floor_hour(at)
    rows = selectors.usage_summary(view, end - WASTE_DAYS * DAY, end, by=("tenant",))
    total = sum((r["gpu_hours"] for r in rows), Decimal(0))
    idle = sum((r["idle_held_hours"] for r in rows), Decimal(0))
    return {"week_hours": hours(total), "idle_share": f"{100 * idle / total:.0f}%" if total else "—"}


def _base(view: TenantView) -> str:
    return reverse("portal", args=[view.tenant.slug]).rstrip("/")


@tenant_page
def portal_jobs(request, view: TenantView):
    """The tenant's jobs in a window (?days=1|7|30) with busy against idle-held hours and stragglers."""
    days = request.GET.get("days", "7")
    if days not in JOB_WINDOWS:
        days = "7"
    at = now()
    start = at - JOB_WINDOWS[days] * DAY
    rows, events = job_rows(view, start, at), hardware_events(view, start, at)
    faults: dict[int, list[str]] = {}
    for e in events:
        faults.setdefault(e["job_id"], []).append(e["label"])
    for r in rows:
        r["faults"] = sorted(set(faults.get(r["job_id"], [])))
    return render(request, "portal/jobs.html", _frame(request, view, "jobs", jobs=rows, days=days,
                                                      windows=list(JOB_WINDOWS), events=events))


@tenant_page
def portal_invoices(request, view: TenantView):
    """Every invoice and showback statement of the tenant (and its teams), newest period first."""
    return render(request, "portal/invoices.html", _frame(
        request, view, "invoices", invoices=[invoice_row(i, _base(view)) for i in selectors.invoices(view)]))


def _invoice(view, number: str) -> Invoice:
    inv = selectors.invoice(view, number)
    if inv is None:
        raise Http404("No such invoice.")
    return inv


@tenant_page
def portal_invoice(request, view: TenantView, number: str):
    """One invoice: its lines, each traced to a job, and its exports."""
    inv = _invoice(view, number)
    return render(request, "portal/invoice.html", _frame(
        request, view, "invoices", invoice=invoice_row(inv, _base(view)), lines=invoice_lines(inv),
        currency=inv.currency, rules={"unmeasured": UNMEASURED_RULE, "lost": LOST_RULES[inv.tenant.lost_hours_policy],
                                      "policy": inv.tenant.get_lost_hours_policy_display()}))


@tenant_page
def portal_invoice_export(request, view: TenantView, number: str, fmt: str):
    """An invoice as CSV or JSON."""
    return export_response(_invoice(view, number), fmt)


@tenant_page
def portal_usage_csv(request, view: TenantView):
    """The tenant's hourly usage of the last ?days= days (at most 92) as CSV."""
    days = request.GET.get("days", "30")
    days = min(int(days), 92) if days.isdigit() and int(days) > 0 else 30
    end = floor_hour(now())
    response = HttpResponse(usage_csv(view, end - days * DAY, end), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="usage-{view.tenant.slug}-{days}d.csv"'
    return response


@tenant_page
def portal_health(request, view: TenantView):
    """The tenant's alerts, and the health of the GPUs its running jobs hold."""
    at = now()
    return render(request, "portal/health.html", _frame(
        request, view, "health", alerts=tenant_alerts(view, at), health=gpu_health_rows(view, at),
        events=hardware_events(view, at - WASTE_DAYS * DAY, at)))

