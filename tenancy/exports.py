"""Invoice and usage exports: CSV and JSON with a stable column order and Decimals as strings.

Exports never choose what a caller may see: an invoice comes from `Invoice.objects.visible_to(who)` in the
view, and `usage_csv` narrows with `visible_to` itself (tenancy.scoping), so an export cannot leak.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime
from decimal import Decimal

from django.db.models import Sum

from telemetry.models import Job
from tenancy.models import Invoice, UsageHour

INVOICE_COLUMNS = (
    "invoice", "tenant", "period_start", "period_end", "state", "showback", "currency", "line", "kind", "job_key",
    "gpu_model", "mig_profile", "qos", "rate_card", "description", "quantity", "unit", "unit_price", "amount",
    "corrects", "reason",
)
LINE_FIELDS = ("id", "kind", "job_key", "gpu_model", "mig_profile", "qos", "rate_card__name", "description",
               "quantity", "unit", "unit_price", "amount", "corrects_id", "reason")
USAGE_COLUMNS = (
    "hour", "tenant", "job_key", "gpu_model", "mig_profile", "qos", "gpu_hours", "busy_hours", "idle_held_hours",
    "unmeasured_hours", "lost_hours", "failed_hours", "energy_gpu_kwh", "energy_node_kwh", "energy_facility_kwh",
)
USAGE_QUANTITIES = USAGE_COLUMNS[6:]
# A spreadsheet runs a cell that starts with one of these as a formula (=HYPERLINK(...), =cmd|'/C calc'!A0):
# text from outside (job ids, descriptions, correction reasons) gets a leading ' so it stays text (OWASP CSV
# injection). Numbers are written by _s and keep their sign.
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def _s(value) -> str:
    """Decimals and datetimes as exact strings; None as empty."""
    if value is None:
        return ""
    if isinstance(value, Decimal):
        return f"{value:f}"
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _cell(value) -> str:
    """A CSV cell: text neutralised against formula injection, anything else as _s writes it."""
    if isinstance(value, str):
        return "'" + value if value.startswith(FORMULA_PREFIXES) else value
    return _s(value)


def _lines(invoice: Invoice) -> list[dict]:
    """The invoice's lines in id order (the order they were written: by job, then kind)."""
    return list(invoice.lines.order_by("id").values(*LINE_FIELDS))


def invoice_totals(invoice: Invoice) -> dict:
    """Total and lines per kind, summed from the lines (equal to invoice.total, which is kept from them)."""
    by_kind = {row["kind"]: row["s"] for row in invoice.lines.values("kind").annotate(s=Sum("amount")).order_by("kind")}
    return {"amount": sum(by_kind.values(), Decimal("0.00")), "by_kind": by_kind, "lines": invoice.lines.count()}


def invoice_dict(invoice: Invoice) -> dict:
    """The invoice, its lines and totals as plain JSON-ready data (Decimals as strings)."""
    lines = [{"line": r["id"], "kind": r["kind"], "job_key": r["job_key"], "gpu_model": r["gpu_model"],
              "mig_profile": r["mig_profile"], "qos": r["qos"], "rate_card": r["rate_card__name"] or "",
              "description": r["description"], "quantity": _s(r["quantity"]), "unit": r["unit"],
              "unit_price": _s(r["unit_price"]), "amount": _s(r["amount"]), "corrects": r["corrects_id"],
              "reason": r["reason"]} for r in _lines(invoice)]
    totals = invoice_totals(invoice)
    return {
        "invoice": {"number": invoice.number, "tenant": invoice.tenant.slug, "period_start": _s(invoice.period_start),
                    "period_end": _s(invoice.period_end), "state": invoice.state, "showback": invoice.showback,
                    "currency": invoice.currency, "total": _s(invoice.total),
                    "finalized_at": _s(invoice.finalized_at) or None, "finalized_by": invoice.finalized_by},
        "lines": lines,
        "totals": {"amount": _s(totals["amount"]), "lines": totals["lines"],
                   "by_kind": {k: _s(v) for k, v in totals["by_kind"].items()}},
    }


def invoice_json(invoice: Invoice) -> str:
    """The invoice as JSON: {"invoice": {...}, "lines": [...], "totals": {...}}."""
    return json.dumps(invoice_dict(invoice), indent=1)


def invoice_csv(invoice: Invoice) -> str:
    """One row per line in INVOICE_COLUMNS order, then a `total` row whose amount is the invoice total."""
    head = [_cell(v) for v in (invoice.number, invoice.tenant.slug, invoice.period_start, invoice.period_end,
                               invoice.state, invoice.showback, invoice.currency)]
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(INVOICE_COLUMNS)
    for r in _lines(invoice):
        out.writerow(head + [_cell(v) for v in (
            r["id"], r["kind"], r["job_key"], r["gpu_model"], r["mig_profile"], r["qos"], r["rate_card__name"] or "",
            r["description"], r["quantity"], r["unit"], r["unit_price"], r["amount"], r["corrects_id"], r["reason"])])
    total = dict.fromkeys(INVOICE_COLUMNS[len(head):], "") | {"kind": "total", "amount": _s(invoice.total)}
    out.writerow(head + list(total.values()))
    return buf.getvalue()


def usage_rows(who, start: datetime, end: datetime, *, tenant=None) -> list[dict]:
    """UsageHour rows `who` may see in [start, end), optionally one tenant's, oldest first, with job keys."""
    qs = UsageHour.objects.visible_to(who).filter(hour__gte=start, hour__lt=end)
    if tenant is not None:
        qs = qs.filter(tenant=tenant)
    rows = list(qs.order_by("hour", "tenant__slug", "job_id", "gpu_model", "mig_profile", "qos")
                .values("hour", "tenant__slug", "job_id", "gpu_model", "mig_profile", "qos", *USAGE_QUANTITIES))
    ids = sorted({r["job_id"] for r in rows})
    keys = {}
    for i in range(0, len(ids), 10000):
        keys.update({pk: f"{src}:{ext}" for pk, src, ext in
                     Job.objects.filter(id__in=ids[i:i + 10000]).values_list("id", "source", "external_id")})
    for r in rows:
        r["tenant"] = r.pop("tenant__slug") or ""
        job_id = r.pop("job_id")
        r["job_key"] = keys.get(job_id, f"job:{job_id}")
    return rows


def usage_csv(who, start: datetime, end: datetime, *, tenant=None) -> str:
    """Hourly usage `who` may see, one row per hour x job x model x profile x QoS, in USAGE_COLUMNS order."""
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(USAGE_COLUMNS)
    for r in usage_rows(who, start, end, tenant=tenant):
        out.writerow([_cell(r[c]) for c in USAGE_COLUMNS])
    return buf.getvalue()
