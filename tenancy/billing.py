"""Chargeback: price metered usage with the rate card in force each hour, and keep invoices.

Pricing rules (docs/chargeback.md):
- Each UsageHour is priced with the card in force at the start of its hour: the tenant's own card if one
  has started by then, else the default card (tenant empty). A card change inside a period therefore
  splits a job's usage by hour, and the invoice gets one set of lines per card.
- A card's RatePrice rows match a GPU model, MIG profile and priority class; a blank field matches anything
  and the most specific row wins (most fields set; ties go to model, then profile, then class).
- Lines per job x model x profile x QoS x card: GPU time, the preemptible discount (negative), the GPU
  failure line (hours after a fault failed the GPU: credited or charged by the tenant's `lost_hours_policy`),
  the optional idle-held charge and energy (GPU + node + facility kWh, split shown in the description). Every
  amount is round_half_up(quantity x unit price) to the cent, per line; an invoice's total is the sum of its
  lines. `statement()` computes them; the draft invoice stores them and the portal shows their total.
- Unmeasured hours (no activity reading) are GPU time like any allocated hour: the GPU-time line names them
  and they are never counted busy, nor charged as idle-held (UNMEASURED_RULE).

Final invoices are immutable (database trigger, tenancy/migrations/0002); a correction is a credit or
debit line on the tenant's next draft, pointing at the line it corrects.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from django.db import transaction
from django.db.models import Q, Sum
from django.utils import timezone

from telemetry.models import Job
from tenancy.models import (
    BillingMode,
    Invoice,
    InvoiceLine,
    InvoiceState,
    LineKind,
    LostHoursPolicy,
    RateCard,
    RatePrice,
    Tenant,
    UsageHour,
)

log = logging.getLogger(__name__)

CENT = Decimal("0.01")
MICRO = Decimal("0.000001")
ZERO = Decimal(0)
CORRECTION_KINDS = (LineKind.CREDIT, LineKind.DEBIT)
USAGE_SUMS = ("gpu_hours", "idle_held_hours", "unmeasured_hours", "failed_hours", "energy_gpu_kwh",
              "energy_node_kwh", "energy_facility_kwh")
# The rules as tenants read them on their invoices (docs/chargeback.md says the same).
UNMEASURED_RULE = ("Unmeasured GPU-hours are hours your job held a GPU while no utilisation reading reached us "
                   "(before the GPU's first sample, or during a collector gap). They are billed at the GPU-hour "
                   "rate like any allocated hour, listed apart on the GPU time line, and never counted as busy "
                   "or charged as idle-held.")
LOST_RULES = {
    LostHoursPolicy.CREDIT: "GPU-hours after a hardware fault failed your job's GPU (fallen off the bus, double-bit "
                            "ECC, row-remap failure, or an XID that needs a reset or RMA), until the job ended or "
                            "was requeued, are credited: the GPU failure line gives them back at the price charged.",
    LostHoursPolicy.CHARGE: "GPU-hours after a hardware fault failed your job's GPU (fallen off the bus, double-bit "
                            "ECC, row-remap failure, or an XID that needs a reset or RMA), until the job ended or "
                            "was requeued, are charged as GPU time under your agreement; the GPU failure line "
                            "lists them at no extra charge.",
}


class BillingError(Exception):
    """A billing action was refused; the message says why and what to do instead."""


class InvoiceFinalError(BillingError):
    """The invoice is final: it cannot be regenerated or edited (corrections go on a later invoice)."""


def money(value: Decimal) -> Decimal:
    """Round to the cent, halves away from zero (ROUND_HALF_UP), as every line amount is."""
    return value.quantize(CENT, rounding=ROUND_HALF_UP)


def micro(value: Decimal) -> Decimal:
    """Round to the 6 decimal places that prices and quantities are stored with."""
    return value.quantize(MICRO, rounding=ROUND_HALF_UP)


# --- Rate cards ----------------------------------------------------------------------------------------------


@dataclass
class CardBook:
    """The cards that can apply to one tenant (its own and the defaults) and their prices, loaded once."""

    own: list[RateCard]
    default: list[RateCard]
    prices: dict[int, list[tuple[str, str, str, Decimal]]]
    _memo: dict = field(default_factory=dict)

    def card_at(self, hour: datetime) -> RateCard | None:
        """The card in force at `hour`: the tenant's newest started card, else the newest started default."""
        for cards in (self.own, self.default):
            starts = [c.effective_from for c in cards]
            i = bisect.bisect_right(starts, hour)
            if i:
                return cards[i - 1]
        return None

    def segments(self, start: datetime, end: datetime) -> list[tuple[RateCard | None, datetime, datetime]]:
        """[start, end) cut where the card in force changes: (card, from, to) in time order."""
        cuts = {start, end}
        for card in self.own + self.default:
            first_hour = _ceil_hour(card.effective_from)
            if start < first_hour < end:
                cuts.add(first_hour)
        points = sorted(cuts)
        out = []
        for a, b in zip(points, points[1:], strict=False):
            card = self.card_at(a)
            if out and out[-1][0] is card:
                out[-1] = (card, out[-1][1], b)
            else:
                out.append((card, a, b))
        return out

    def price(self, card: RateCard, gpu_model: str, mig_profile: str, qos: str) -> Decimal:
        """The most specific matching price per GPU-hour; BillingError if the card has none."""
        key = (card.id, gpu_model, mig_profile, qos)
        if key not in self._memo:
            self._memo[key] = _best_price(card, self.prices.get(card.id, []), gpu_model, mig_profile, qos)
        return self._memo[key]


def _ceil_hour(t: datetime) -> datetime:
    """The first clock hour at or after `t`: the first hour a card starting at `t` prices."""
    floor = t.replace(minute=0, second=0, microsecond=0)
    return floor if floor == t else floor + timedelta(hours=1)


def _best_price(card, rows, gpu_model: str, mig_profile: str, qos: str) -> Decimal:
    """The matching row with the most fields set (ties: model, then profile, then class)."""
    best, best_rank = None, None
    for model, profile, klass, price in rows:
        if model not in ("", gpu_model) or profile not in ("", mig_profile) or klass not in ("", qos):
            continue
        rank = (bool(model) + bool(profile) + bool(klass), bool(model), bool(profile), bool(klass))
        if best_rank is None or rank > best_rank:
            best, best_rank = price, rank
    if best is None:
        raise BillingError(f"rate card {card.name!r} has no price for model {gpu_model or '(any)'}, "
                           f"profile {mig_profile or '(whole GPU)'}, class {qos or '(none)'}: add a RatePrice "
                           "(blank fields match anything)")
    return best


def load_cards(tenant: Tenant | None) -> CardBook:
    """Every card that can apply to `tenant` (None: defaults only), oldest first, with its prices."""
    mine = Q(tenant__isnull=True) | (Q(tenant=tenant) if tenant else Q(pk__in=[]))
    cards = list(RateCard.objects.filter(mine).order_by("effective_from"))
    prices: dict[int, list] = {}
    for card_id, *row in RatePrice.objects.filter(card__in=cards).values_list(
            "card_id", "gpu_model", "mig_profile", "priority_class", "price_per_gpu_hour"):
        prices.setdefault(card_id, []).append(tuple(row))
    return CardBook(own=[c for c in cards if c.tenant_id is not None],
                    default=[c for c in cards if c.tenant_id is None], prices=prices)


# --- Pricing -------------------------------------------------------------------------------------------------


@dataclass
class PricedLine:
    """An invoice line before it is saved (InvoiceLine fields, minus the invoice)."""

    kind: str
    job_id: int | None
    gpu_model: str
    mig_profile: str
    qos: str
    card: RateCard | None
    quantity: Decimal
    unit: str
    unit_price: Decimal
    note: str = ""  # the part of the description after the job key
    job_key: str = ""

    @property
    def amount(self) -> Decimal:
        """quantity x unit price, rounded half up to the cent."""
        return money(self.quantity * self.unit_price)

    @property
    def description(self) -> str:
        """What the line charges, for whom and under which card (the invoice page and exports show it)."""
        parts = (self.gpu_model, self.mig_profile or "whole GPU", self.qos and f"qos {self.qos}")
        what = " ".join(x for x in parts if x)
        text = f"{LineKind(self.kind).label} · {self.job_key} · {what} · {self.card.name if self.card else ''}"
        return (text + (f" · {self.note}" if self.note else ""))[:300]


def _plain(value: Decimal) -> str:
    """A Decimal without trailing zeros or exponent (10.000000 -> 10)."""
    return f"{value.normalize():f}"


def lines_for_usage(key: tuple[int, str, str, str], sums: dict[str, Decimal], card: RateCard,
                    price: Decimal, *, policy: str = LostHoursPolicy.CREDIT) -> list[PricedLine]:
    """The lines for one job x model x profile x QoS under one card; `policy` prices failed hours. Pure, so
    bench/chargeback's raw-sample path prices its own quantities with exactly the same arithmetic."""
    job_id, model, profile, qos = key
    base = {"job_id": job_id, "gpu_model": model, "mig_profile": profile, "qos": qos, "card": card}
    gpu_hours, out = sums["gpu_hours"], []
    unmeasured, failed = sums.get("unmeasured_hours") or ZERO, sums.get("failed_hours") or ZERO
    if gpu_hours:
        note = f"{_plain(unmeasured)} of them unmeasured (no telemetry): billed as held, not as busy" \
            if unmeasured else ""
        out.append(PricedLine(LineKind.GPU_TIME, quantity=gpu_hours, unit="gpu_hour", unit_price=price, note=note,
                              **base))
        paid = price
        if qos and qos in (card.preemptible_qos or []) and card.preemptible_discount:
            pct = (card.preemptible_discount * 100).normalize()
            off = micro(price * card.preemptible_discount)
            paid = price - off
            out.append(PricedLine(LineKind.DISCOUNT, quantity=gpu_hours, unit="gpu_hour", unit_price=-off,
                                  note=f"{pct:f}% off preemptible work", **base))
        if failed:
            credit = policy == LostHoursPolicy.CREDIT
            out.append(PricedLine(LineKind.FAILED, quantity=failed, unit="gpu_hour",
                                  unit_price=-paid if credit else ZERO,
                                  note="after the GPU failed: " + ("credited" if credit else "charged as GPU time")
                                  + f" (policy: {policy})", **base))
    idle_price = card.idle_held_price_per_gpu_hour
    if idle_price and sums["idle_held_hours"]:
        out.append(PricedLine(LineKind.IDLE_HELD, quantity=sums["idle_held_hours"], unit="gpu_hour",
                              unit_price=idle_price, note="allocated while the GPU was idle", **base))
    kwh = sums["energy_gpu_kwh"] + sums["energy_node_kwh"] + sums["energy_facility_kwh"]
    if kwh and card.price_per_kwh:
        note = (f"GPU {_plain(sums['energy_gpu_kwh'])} + node {_plain(sums['energy_node_kwh'])} + facility "
                f"{_plain(sums['energy_facility_kwh'])} kWh")
        out.append(PricedLine(LineKind.ENERGY, quantity=kwh, unit="kwh", unit_price=card.price_per_kwh, note=note,
                              **base))
    return out


def price_usage(tenant: Tenant, period_start: datetime, period_end: datetime, *,
                book: CardBook | None = None) -> list[PricedLine]:
    """Priced lines for `tenant`'s usage in [period_start, period_end), one SQL aggregate per card segment."""
    book = book or load_cards(tenant)
    lines: list[PricedLine] = []
    for card, start, end in book.segments(period_start, period_end):
        rows = (UsageHour.objects.filter(tenant=tenant, hour__gte=start, hour__lt=end)
                .values("job_id", "gpu_model", "mig_profile", "qos")
                .annotate(**{name: Sum(name) for name in USAGE_SUMS})
                .order_by("job_id", "gpu_model", "mig_profile", "qos"))
        for row in rows:
            if card is None:
                raise BillingError(f"no rate card is in force at {start:%Y-%m-%d %H:%M} for {tenant}: "
                                   "create a default card (tenant empty) starting before the usage")
            key = (row["job_id"], row["gpu_model"], row["mig_profile"], row["qos"])
            lines += lines_for_usage(key, row, card, book.price(card, *key[1:]), policy=tenant.lost_hours_policy)
    _attach_job_keys(lines)
    return lines


def _attach_job_keys(lines: list[PricedLine]) -> None:
    """`source:external_id` of each line's job; a pruned job keeps its id as `job:<id>`."""
    ids = sorted({ln.job_id for ln in lines if ln.job_id is not None})
    keys: dict[int, str] = {}
    for i in range(0, len(ids), 10000):
        for pk, source, ext in Job.objects.filter(id__in=ids[i:i + 10000]).values_list("id", "source", "external_id"):
            keys[pk] = f"{source}:{ext}"
    for ln in lines:
        ln.job_key = keys.get(ln.job_id, f"job:{ln.job_id}")


# --- Invoices ------------------------------------------------------------------------------------------------


@dataclass
class Statement:
    """What the tenant's invoice for a period holds: its priced usage lines and the corrections posted onto it."""

    lines: list[PricedLine]
    corrections: Decimal

    @property
    def total(self) -> Decimal:
        """The invoice total: the sum of the line amounts (each already rounded to the cent)."""
        return sum((ln.amount for ln in self.lines), ZERO) + self.corrections


def statement(tenant: Tenant, period_start: datetime, period_end: datetime, *,
              book: CardBook | None = None) -> Statement:
    """The tenant's invoice for [period_start, period_end) as its draft holds it once (re)generated: the one
    computation behind both `do_generate_invoice` and the portal's spend so far (a final invoice is as
    stored, so its lines are left to it)."""
    priced = price_usage(tenant, period_start, period_end, book=book)
    posted = InvoiceLine.objects.filter(invoice__tenant=tenant, invoice__period_start=period_start,
                                        kind__in=CORRECTION_KINDS).aggregate(s=Sum("amount"))["s"]
    return Statement(priced, posted or ZERO)



def _check_period(period_start: datetime, period_end: datetime) -> None:
    """BillingError unless the period is aware, on whole hours and not empty."""
    for t in (period_start, period_end):
        if timezone.is_naive(t):
            raise BillingError("billing periods are timezone-aware (UTC)")
        if t != t.replace(minute=0, second=0, microsecond=0):
            raise BillingError(f"billing periods start and end on whole hours (usage is hourly), not {t:%H:%M:%S}")
    if period_end <= period_start:
        raise BillingError("a billing period ends after it starts")


def draft_number(tenant_id: int, period_start: datetime) -> str:
    """A draft's number, unique like (tenant, period start); finalizing replaces it."""
    return f"DRAFT-{period_start:%Y%m%d%H}-{tenant_id:05d}"


def final_number(invoice: Invoice) -> str:
    """Stable and URL-safe: one invoice per tenant and period start; SB- marks a showback statement."""
    return f"{'SB' if invoice.showback else 'INV'}-{invoice.period_start:%Y%m%d%H}-{invoice.tenant_id:05d}"


def _lock_draft(tenant: Tenant, period_start: datetime, period_end: datetime) -> Invoice:
    """The tenant's invoice for this period, locked; created as an empty draft if missing."""
    clash = (Invoice.objects.filter(tenant=tenant, period_start__lt=period_end, period_end__gt=period_start)
             .exclude(period_start=period_start).first())
    if clash:
        raise BillingError(f"{clash.number} ({clash.period_start:%Y-%m-%d} to {clash.period_end:%Y-%m-%d}) "
                           "overlaps this period: usage would be billed twice")
    invoice, _ = Invoice.objects.select_for_update().get_or_create(
        tenant=tenant, period_start=period_start,
        defaults={"period_end": period_end, "number": draft_number(tenant.id, period_start),
                  "currency": tenant.currency, "showback": tenant.billing_mode == BillingMode.SHOWBACK})
    if invoice.state == InvoiceState.FINAL:
        raise InvoiceFinalError(f"invoice {invoice.number} is final and cannot be regenerated; correct it with "
                                "a credit or debit line on a later invoice (do_correct_line)")
    return invoice


def _retotal(invoice: Invoice) -> None:
    """Set the total to the sum of the lines (never kept any other way)."""
    invoice.total = invoice.lines.aggregate(s=Sum("amount"))["s"] or ZERO
    Invoice.objects.filter(pk=invoice.pk).update(total=invoice.total)


def _check_currency(tenant: Tenant, lines: Iterable[PricedLine]) -> None:
    """BillingError if a card used prices in another currency than the tenant is billed in."""
    for card in {ln.card for ln in lines if ln.card is not None}:
        if card.currency != tenant.currency:
            raise BillingError(f"rate card {card.name!r} is in {card.currency} but {tenant} is billed in "
                               f"{tenant.currency}")


@transaction.atomic
def do_generate_invoice(tenant: Tenant, period_start: datetime, period_end: datetime, *,
                        now: datetime | None = None, book: CardBook | None = None) -> Invoice:
    """Create or recompute the tenant's draft for the period from its usage.

    1. A final invoice for the period is refused (InvoiceFinalError); an overlapping period too.
    2. The draft's usage lines are replaced; correction lines posted onto it (credits/debits) are kept.
    3. The total is the sum of the lines.
    """
    _check_period(period_start, period_end)
    now = now or timezone.now()
    if period_start >= now:
        raise BillingError(f"the period starting {period_start:%Y-%m-%d %H:%M} has not begun")
    invoice = _lock_draft(tenant, period_start, period_end)
    priced = statement(tenant, period_start, period_end, book=book).lines
    _check_currency(tenant, priced)
    invoice.lines.exclude(kind__in=CORRECTION_KINDS).delete()
    InvoiceLine.objects.bulk_create(
        [InvoiceLine(invoice=invoice, kind=p.kind, description=p.description, job_id=p.job_id, job_key=p.job_key,
                     gpu_model=p.gpu_model, mig_profile=p.mig_profile, qos=p.qos, rate_card=p.card,
                     quantity=p.quantity, unit=p.unit, unit_price=p.unit_price, amount=p.amount) for p in priced],
        batch_size=5000)
    Invoice.objects.filter(pk=invoice.pk).update(
        period_end=period_end, showback=tenant.billing_mode == BillingMode.SHOWBACK, currency=tenant.currency)
    invoice.refresh_from_db()
    _retotal(invoice)
    return invoice


def _actor_name(actor) -> str:
    """A user's username, or the string given (a command name, "ops")."""
    if actor is None:
        return ""
    getter = getattr(actor, "get_username", None)
    return (getter() if getter else str(actor))[:150]


@transaction.atomic
def do_finalize_invoice(invoice_id: int, actor, *, now: datetime | None = None) -> Invoice:
    """Give a draft its number and make it final; from then on the database refuses any change to it."""
    now = now or timezone.now()
    invoice = Invoice.objects.select_for_update().select_related("tenant").get(pk=invoice_id)
    if invoice.state == InvoiceState.FINAL:
        raise InvoiceFinalError(f"invoice {invoice.number} is already final")
    if invoice.period_end > now:
        raise BillingError(f"the period of {invoice.number} ends {invoice.period_end:%Y-%m-%d %H:%M}: "
                           "finalize it once the period is over")
    _retotal(invoice)
    invoice.number = final_number(invoice)
    invoice.state = InvoiceState.FINAL
    invoice.finalized_at = now
    invoice.finalized_by = _actor_name(actor)
    invoice.save(update_fields=["number", "state", "finalized_at", "finalized_by", "total"])
    log.info("invoice %s final: %s %s by %s", invoice.number, invoice.total, invoice.currency, invoice.finalized_by)
    return invoice


def next_period(period_start: datetime, period_end: datetime) -> tuple[datetime, datetime]:
    """The period after this one: the next calendar month for a calendar month, else the same length."""
    if _is_calendar_month(period_start, period_end):
        return period_end, add_month(period_end)
    return period_end, period_end + (period_end - period_start)


def add_month(t: datetime) -> datetime:
    """The same day and time one calendar month later (periods start on the 1st, so the day always exists)."""
    return t.replace(year=t.year + t.month // 12, month=t.month % 12 + 1)


def _is_calendar_month(start: datetime, end: datetime) -> bool:
    """True for [1st of a month 00:00, 1st of the next)."""
    return start.day == 1 and start.hour == 0 and add_month(start) == end


def _next_draft(tenant: Tenant, after: Invoice) -> Invoice:
    """The tenant's first draft starting at or after `after`'s end, created (empty) if there is none."""
    draft = (Invoice.objects.select_for_update().filter(tenant=tenant, state=InvoiceState.DRAFT,
                                                         period_start__gte=after.period_end)
             .order_by("period_start").first())
    if draft:
        return draft
    start, end = after.period_start, after.period_end
    while Invoice.objects.filter(tenant=tenant, period_start__lt=end, period_end__gt=start).exists():
        start, end = next_period(start, end)
    return Invoice.objects.create(tenant=tenant, period_start=start, period_end=end,
                                  number=draft_number(tenant.id, start), currency=after.currency,
                                  showback=tenant.billing_mode == BillingMode.SHOWBACK)


@transaction.atomic
def do_correct_line(line_id: int, amount, reason: str, actor) -> InvoiceLine:
    """Correct a line of a final invoice: a debit (amount > 0) or credit (< 0) on the tenant's next draft."""
    original = InvoiceLine.objects.select_related("invoice__tenant").get(pk=line_id)
    source = original.invoice
    if source.state != InvoiceState.FINAL:
        raise BillingError(f"line {line_id} is on draft {source.number}: regenerate the draft instead")
    amount = Decimal(str(amount))
    if not amount or amount != money(amount):
        raise BillingError("a correction is a non-zero amount in whole cents")
    if not (reason or "").strip():
        raise BillingError("a correction needs a reason")
    target = _next_draft(source.tenant, source)
    kind = LineKind.CREDIT if amount < 0 else LineKind.DEBIT
    who = _actor_name(actor)
    line = InvoiceLine.objects.create(
        invoice=target, kind=kind, job_id=original.job_id, job_key=original.job_key, gpu_model=original.gpu_model,
        mig_profile=original.mig_profile, qos=original.qos, rate_card=original.rate_card, quantity=1,
        unit="adjustment", unit_price=amount, amount=amount, corrects=original, reason=reason.strip(),
        description=(f"{LineKind(kind).label} · {original.job_key} · corrects {source.number} line {original.id}"
                     f"{f' · by {who}' if who else ''} · {reason.strip()}")[:300])
    _retotal(target)
    return line


# --- The monthly run -----------------------------------------------------------------------------------------


def _billable_tenants(period_start: datetime, period_end: datetime) -> list[Tenant]:
    """Tenants with usage in the period, or with an invoice for it already (corrections may sit on a draft)."""
    used = (UsageHour.objects.filter(hour__gte=period_start, hour__lt=period_end, tenant__isnull=False)
            .values("tenant_id"))
    listed = Invoice.objects.filter(period_start=period_start).values("tenant_id")
    return list(Tenant.objects.filter(Q(id__in=used) | Q(id__in=listed)).order_by("name"))


def run_invoices(period_start: datetime, period_end: datetime, *, now: datetime | None = None,
                 finalize: bool = False, actor="run_invoices",
                 progress: Callable[[int, int, Tenant, Invoice | None], None] | None = None) -> dict:
    """Generate (and optionally finalize) every tenant's invoice for the period; showback tenants get
    showback statements. Each tenant is its own transaction: one tenant's error does not stop the rest."""
    _check_period(period_start, period_end)
    t0 = time.perf_counter()
    tenants = _billable_tenants(period_start, period_end)
    out = {"tenants": len(tenants), "invoices": 0, "billed": 0, "showback": 0, "finalized": 0,
           "already_final": [], "lines": 0, "total": ZERO, "showback_total": ZERO, "errors": {}}
    for i, tenant in enumerate(tenants, 1):
        invoice = None
        try:
            invoice = do_generate_invoice(tenant, period_start, period_end, now=now)
            if finalize:
                invoice = do_finalize_invoice(invoice.id, actor, now=now)
                out["finalized"] += 1
        except InvoiceFinalError:
            out["already_final"].append(tenant.slug)
        except BillingError as exc:
            out["errors"][tenant.slug] = str(exc)
        if invoice is not None:
            out["invoices"] += 1
            out["lines"] += invoice.lines.count()
            out["showback" if invoice.showback else "billed"] += 1
            out["showback_total" if invoice.showback else "total"] += invoice.total
        if progress:
            progress(i, len(tenants), tenant, invoice)
    out["seconds"] = round(time.perf_counter() - t0, 3)
    log.info("run_invoices %s..%s: %s", period_start, period_end, out)
    return out
