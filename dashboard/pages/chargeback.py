"""Chargeback, for operators: every tenant's usage and cost in a billing period, fair share, quotas against
live use, and the invoices with their generate / finalize / correct buttons and exports.

The period is a calendar month (`?period=YYYY-MM`, this month by default). Every change is a POST with
CSRF that calls one tenancy action (billing's do_generate_invoice, do_finalize_invoice, do_correct_line,
run_invoices; the billing mode setter) and redirects back with its outcome as a message.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal

from django import forms
from django.contrib import messages
from django.core.exceptions import ObjectDoesNotExist, ValidationError
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST, require_safe

from dashboard.pages import portal
from tenancy import actions, selectors
from tenancy.access import operator_required
from tenancy.billing import BillingError, do_correct_line, do_finalize_invoice, do_generate_invoice, run_invoices
from tenancy.exports import usage_csv
from tenancy.models import BillingMode, Invoice, InvoiceState, Tenant

PERIOD_RE = re.compile(r"^(\d{4})-(\d{2})$")
PERIODS_SHOWN = 6


class CorrectionForm(forms.Form):
    """A credit (negative) or debit (positive) against a line of a final invoice."""

    amount = forms.DecimalField(max_digits=14, decimal_places=2, help_text="Negative: a credit; positive: a debit")
    reason = forms.CharField(max_length=500)


# --- Periods -------------------------------------------------------------------------------------------

def _add_month(t: datetime) -> datetime:
    return t.replace(year=t.year + t.month // 12, month=t.month % 12 + 1)


def parse_period(text: str | None, at: datetime) -> tuple[datetime, datetime]:
    """[first of the month, first of the next) for "YYYY-MM"; this month when empty or malformed."""
    m = PERIOD_RE.match(text or "")
    if m and 1 <= int(m[2]) <= 12 and 2000 <= int(m[1]) <= 2100:
        start = datetime(int(m[1]), int(m[2]), 1, tzinfo=UTC)
    else:
        start = portal.month_start(at)
    return start, _add_month(start)


def recent_periods(at: datetime) -> list[str]:
    """This month and the PERIODS_SHOWN - 1 before it, newest first, as "YYYY-MM"."""
    out, t = [], portal.month_start(at)
    for _ in range(PERIODS_SHOWN):
        out.append(f"{t:%Y-%m}")
        t = (t.replace(day=1) - portal.DAY).replace(day=1)
    return out


def _page(period_start: datetime) -> str:
    return f"{reverse('chargeback')}?period={period_start:%Y-%m}"


# --- Reads ---------------------------------------------------------------------------------------------

def tenant_rows(user, start: datetime, end: datetime) -> tuple[list[dict], Decimal]:
    """Every tenant with its usage, cost and invoice for the period (an organisation's row adds up its teams),
    and the GPU-hours of jobs whose account maps to no tenant."""
    until = min(end, portal.floor_hour(portal.now()))
    rows = selectors.usage_summary(user, start, until, by=("tenant",)) if until > start else []
    usage = {r["tenant"]: r for r in rows}
    invoices = {i.tenant_id: i for i in selectors.invoices(user, period_start=start)}
    tenants = selectors.visible_tenants(user)
    rows = {t.id: _tenant_row(t, usage.get(t.slug), invoices.get(t.id), start, until) for t in tenants}
    for t in tenants:
        if t.parent_id in rows:
            _roll_up(rows[t.parent_id], rows[t.id])
    ordered = sorted(rows.values(), key=lambda r: (r["org_name"], r["is_team"], r["tenant"].name))
    for r in ordered:
        r["cost_text"] = portal.money(r["cost"], r["tenant"].currency) if not r["cost_error"] else "no rate card"
    return ordered, usage[None]["gpu_hours"] if None in usage else Decimal(0)


# The columns of a tenant's hours, which add up to its GPU-hours (failed hours are part of lost).
HOUR_SPLIT = ("gpu_hours", "busy_hours", "idle_held_hours", "unmeasured_hours", "lost_hours")


def _tenant_row(t: Tenant, use: dict | None, inv: Invoice | None, start: datetime, until: datetime) -> dict:
    cost, why = portal.priced_total(t, start, until) if use else (Decimal("0.00"), "")
    use = use or {}
    num = {k: use.get(k, Decimal(0)) for k in HOUR_SPLIT}
    return {"tenant": t, "org_name": (t.parent or t).name, "is_team": t.parent_id is not None, **num,
            "kwh": use.get("energy_kwh", Decimal(0)), "cost": cost, "cost_error": why, "has_usage": bool(use),
            "invoice": portal.invoice_row(inv, "/chargeback") if inv else None}


def _roll_up(org: dict, team: dict) -> None:
    for k in (*HOUR_SPLIT, "kwh"):
        org[k] += team[k]
    if team["cost"] is None or org["cost"] is None:
        org["cost"] = None
    else:
        org["cost"] += team["cost"]
    org["cost_error"] = org["cost_error"] or team["cost_error"]


def fair_share_rows(user, at: datetime) -> list[dict]:
    """Entitlement against actual share per tenant, over the last 7 and 30 days side by side."""
    week = {r["tenant"]: r for r in selectors.fair_share(user, 7, now=at)}
    rows = []
    for m in selectors.fair_share(user, 30, now=at):
        w = week.get(m["tenant"], {})
        rows.append({"tenant": m["tenant"], "name": m["tenant_name"],
                     "entitlement_text": _share(m["entitlement_share"]),
                     "actual_7_text": _share(w.get("actual_share")), "over_7": w.get("over_share", False),
                     "actual_30_text": _share(m["actual_share"]), "over_30": m["over_share"]})
    return rows


def _share(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def quota_rows(user, start: datetime, end: datetime) -> list[dict]:
    """Quotas against live use with the period's preemptions, over-quota first."""
    preempted = {r["tenant"]: r for r in selectors.preemption_counts(user, start, end)}
    rows = [{**r, "preemptions": preempted.get(r["tenant"], {})} for r in portal.quota_rows(user)]
    return sorted(rows, key=lambda r: (not r.get("over_quota"), str(r["tenant"])))


# --- Pages ---------------------------------------------------------------------------------------------

@operator_required
@require_safe
def chargeback(request):
    """All tenants' usage and cost for a period, fair share, quotas, and the invoices with their actions."""
    at = portal.now()
    start, end = parse_period(request.GET.get("period"), at)
    invoices = selectors.invoices(request.user, period_start=start)
    tenants, unmapped = tenant_rows(request.user, start, end)
    return render(request, "chargeback/chargeback.html", {
        "period": f"{start:%Y-%m}", "period_start": start, "period_end": end, "periods": recent_periods(at),
        "tenants": tenants, "unmapped_hours": unmapped, "fair_share": fair_share_rows(request.user, at),
        "quotas": quota_rows(request.user, start, end),
        "invoices": [portal.invoice_row(i, "/chargeback") for i in invoices],
        "period_over": end <= at, "tab": "chargeback"})


def _invoice(user, number: str) -> Invoice:
    inv = selectors.invoice(user, number)
    if inv is None:
        raise Http404("No such invoice.")
    return inv


@operator_required
@require_safe
def invoice_detail(request, number: str):
    """One invoice with every line, the correction form for a final invoice's lines, and its exports."""
    inv = _invoice(request.user, number)
    corrections = inv.lines.filter(corrects__isnull=False).count()
    return render(request, "chargeback/invoice.html", {
        "invoice": portal.invoice_row(inv, "/chargeback"), "lines": portal.invoice_lines(inv), "form": CorrectionForm(),
        "is_final": inv.state == InvoiceState.FINAL, "corrections": corrections, "currency": inv.currency,
        "back": _page(inv.period_start)})


@operator_required
@require_safe
def invoice_export(request, number: str, fmt: str):
    """An invoice as CSV or JSON."""
    return portal.export_response(_invoice(request.user, number), fmt)


@operator_required
@require_safe
def usage_export(request):
    """Every tenant's hourly usage in the period as CSV."""
    start, end = parse_period(request.GET.get("period"), portal.now())
    response = HttpResponse(usage_csv(request.user, start, end), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="usage-{start:%Y-%m}.csv"'
    return response


# --- Changes -------------------------------------------------------------------------------------------

def _attempt(request, call: Callable, done: str | Callable) -> bool:
    """Run one action; its refusal becomes an error message on the page, not a 500."""
    try:
        result = call()
    except ObjectDoesNotExist as exc:
        raise Http404(str(exc)) from exc
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return False
    except BillingError as exc:
        messages.error(request, str(exc))
        return False
    messages.success(request, done if not callable(done) else done(result))
    return True


@operator_required
@require_POST
def generate(request):
    """Generate (or recompute) the drafts of one tenant (`tenant`=slug) or of every tenant for the period."""
    at = portal.now()
    start, end = parse_period(request.POST.get("period"), at)
    slug = request.POST.get("tenant", "")
    if slug:
        tenant, _ = selectors.tenant_by_slug(request.user, slug)
        if tenant is None:
            raise Http404("No such tenant.")
        _attempt(request, lambda: do_generate_invoice(tenant, start, end, now=at),
                 lambda inv: f"Draft {inv.number} for {tenant.name}: {portal.money(inv.total, inv.currency)}.")
    else:
        _attempt(request, lambda: run_invoices(start, end, now=at), _run_summary)
    return redirect(_page(start))


def _run_summary(out: dict) -> str:
    text = f"{out['invoices']} draft(s) generated for {out['tenants']} tenant(s)"
    if out["already_final"]:
        text += f"; already final: {', '.join(out['already_final'])}"
    if out["errors"]:
        text += "; refused: " + "; ".join(f"{k}: {v}" for k, v in out["errors"].items())
    return text + "."


@operator_required
@require_POST
def finalize(request, number: str):
    """Make a draft final (numbered and immutable)."""
    inv = _invoice(request.user, number)
    done = []
    _attempt(request, lambda: done.append(do_finalize_invoice(inv.id, request.user, now=portal.now())) or done[0],
             lambda final: f"Invoice {final.number} is final: {portal.money(final.total, final.currency)}.")
    if request.POST.get("next") == "invoice":  # back to the invoice, under its final number when it got one
        return redirect("chargeback-invoice", number=done[0].number if done else inv.number)
    return redirect(_page(inv.period_start))


@operator_required
@require_POST
def correct_line(request, line_id: int):
    """A credit or debit against a final invoice's line; it lands on the tenant's next draft."""

    line = selectors.invoice_line(request.user, line_id)
    if line is None:
        raise Http404("No such invoice line.")
    form = CorrectionForm(request.POST)
    if not form.is_valid():
        messages.error(request, "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items()))
    else:
        d = form.cleaned_data
        _attempt(request, lambda: do_correct_line(line.id, d["amount"], d["reason"], request.user),
                 lambda new: f"{new.get_kind_display()} of {portal.money(new.amount, line.invoice.currency)} "
                             f"posted to {new.invoice.number}.")
    return redirect("chargeback-invoice", number=line.invoice.number)


@operator_required
@require_POST
def billing_mode(request, slug: str):
    """Bill the tenant (invoice) or only show its cost (showback); drafts follow at their next generation."""
    tenant, _ = selectors.tenant_by_slug(request.user, slug)
    if tenant is None:
        raise Http404("No such tenant.")
    mode = request.POST.get("mode", "")
    if mode not in BillingMode.values:
        messages.error(request, f"Billing mode {mode!r} is not one of {', '.join(BillingMode.values)}.")
    else:
        _attempt(request, lambda: actions.do_set_billing_mode(tenant, mode, actor=request.user),
                 f"{tenant.name} is now on {BillingMode(mode).label.lower()}.")
    return redirect(_page(parse_period(request.POST.get("period"), portal.now())[0]))
