"""Chargeback: rate cards by hour, line arithmetic, invoices draft -> final (immutable), corrections, showback."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from tenancy.billing import (
    BillingError,
    InvoiceFinalError,
    do_correct_line,
    do_finalize_invoice,
    do_generate_invoice,
    load_cards,
    price_usage,
    run_invoices,
)
from tenancy.models import Invoice, InvoiceLine, InvoiceState, LineKind
from tests.conftest import FIXED_NOW
from tests.tenancy.billing_factories import A100, H100, NOV, OCT, at, card, job, tenant, usage

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme():
    return tenant("acme")


@pytest.fixture
def standard():
    """The default card from September: $2 any GPU, $3 an H100, $7 per GPU-hour for a 1g.10gb slice."""
    return card("Standard", at(9, 1), {("", "", ""): "2.00", (H100, "", ""): "3.00", (A100, "1g.10gb", ""): "7.00"})


def generate(t, period=OCT):
    return do_generate_invoice(t, *period, now=FIXED_NOW)


def amounts(invoice, kind=None) -> list[Decimal]:
    qs = invoice.lines.order_by("id")
    return [ln.amount for ln in (qs.filter(kind=kind) if kind else qs)]


# --- Rate cards and prices -----------------------------------------------------------------------------------


def test_rate_change_mid_period_splits_usage_by_hour(acme, standard):
    card("Standard v2", at(10, 16), {(H100, "", ""): "3.60"})
    j = job(acme, "1001")
    usage(acme, j, at(10, 15, 20), 8, gpu_hours="8")  # 20:00 on the 15th to 04:00 on the 16th, 8 GPUs
    inv = generate(acme)
    lines = list(inv.lines.order_by("rate_card__effective_from"))
    assert [(ln.rate_card.name, ln.quantity, ln.unit_price, ln.amount) for ln in lines] == [
        ("Standard", Decimal("32"), Decimal("3"), Decimal("96.00")),
        ("Standard v2", Decimal("32"), Decimal("3.6"), Decimal("115.20")),
    ]
    assert inv.total == Decimal("211.20")
    assert {ln.job_key for ln in lines} == {"slurm:1001"}


def test_card_change_inside_an_hour_applies_from_the_next_hour(acme, standard):
    card("Standard v2", at(10, 16).replace(minute=30), {(H100, "", ""): "4.00"})
    usage(acme, job(acme, "1"), at(10, 16), 2)  # 00:00 and 01:00 on the 16th
    inv = generate(acme)
    assert amounts(inv) == [Decimal("3.00"), Decimal("4.00")]


def test_tenant_card_beats_default_once_started(acme, standard):
    card("Acme deal", at(10, 10), {("", "", ""): "1.50"}, owner=acme)
    usage(acme, job(acme, "1"), at(10, 9, 23), 2)  # one hour on the default, one on the tenant's card
    assert amounts(generate(acme)) == [Decimal("3.00"), Decimal("1.50")]


def test_other_tenants_card_is_ignored(acme, standard):
    card("Other deal", at(9, 1), {("", "", ""): "0.01"}, owner=tenant("other"))
    usage(acme, job(acme, "1"), at(10, 2), 1)
    assert amounts(generate(acme)) == [Decimal("3.00")]


def test_most_specific_price_wins(acme):
    c = card("Specific", at(9, 1), {("", "", ""): "1", (H100, "", ""): "2", ("", "", "high"): "5",
                                    (H100, "", "high"): "3", ("", "1g.10gb", ""): "4"})
    book = load_cards(acme)
    assert book.price(c, H100, "", "high") == Decimal("3")  # two fields beat one
    assert book.price(c, H100, "", "normal") == Decimal("2")
    assert book.price(c, A100, "", "high") == Decimal("5")
    assert book.price(c, A100, "", "normal") == Decimal("1")  # blanks match anything
    assert book.price(c, H100, "1g.10gb", "normal") == Decimal("2")  # a tie of one field: the model wins


def test_missing_price_names_what_is_missing(acme):
    card("Narrow", at(9, 1), {(H100, "", ""): "3"})
    usage(acme, job(acme, "1"), at(10, 2), 1, model=A100)
    with pytest.raises(BillingError, match="no price for model NVIDIA A100"):
        generate(acme)


def test_usage_before_any_card_is_refused(acme):
    card("Late", at(10, 20), {("", "", ""): "3"})
    usage(acme, job(acme, "1"), at(10, 2), 1)
    with pytest.raises(BillingError, match="no rate card is in force at 2026-10-01"):
        generate(acme)


# --- Line arithmetic -----------------------------------------------------------------------------------------


def test_mig_slice_is_billed_by_its_share_of_the_gpu(acme, standard):
    usage(acme, job(acme, "mig"), at(10, 3), 7, model=A100, profile="1g.10gb", gpu_hours="0.142857")  # 1/7
    usage(acme, job(acme, "half"), at(10, 3), 2, model=A100, gpu_hours="0.5")  # a fractional GPU
    inv = generate(acme)
    half, mig = inv.lines.order_by("job_key")  # slurm:half, slurm:mig
    assert (mig.mig_profile, mig.quantity, mig.unit_price, mig.amount) == (
        "1g.10gb", Decimal("0.999999"), Decimal("7"), Decimal("7.00"))  # 7 slice-hours = one GPU-hour
    assert (half.quantity, half.amount) == (Decimal("1"), Decimal("2.00"))
    assert "1g.10gb" in mig.description


def test_preemptible_discount_is_a_negative_line(acme):
    card("Spot", at(9, 1), {("", "", ""): "2.00"}, preemptible=["spot"], discount="0.40")
    usage(acme, job(acme, "1", qos="spot"), at(10, 3), 10)
    usage(acme, job(acme, "2"), at(10, 3), 1)  # normal QoS: no discount
    inv = generate(acme)
    assert [(ln.job_key, ln.kind, ln.unit_price, ln.amount) for ln in inv.lines.order_by("job_key", "id")] == [
        ("slurm:1", LineKind.GPU_TIME, Decimal("2"), Decimal("20.00")),
        ("slurm:1", LineKind.DISCOUNT, Decimal("-0.8"), Decimal("-8.00")),
        ("slurm:2", LineKind.GPU_TIME, Decimal("2"), Decimal("2.00")),
    ]
    assert inv.total == Decimal("14.00")


def test_idle_held_charge_only_when_the_card_sets_one(acme):
    card("No idle", at(9, 1), {("", "", ""): "2.00"})
    card("Idle", at(10, 15), {("", "", ""): "2.00"}, idle="0.50")
    j = job(acme, "1")
    usage(acme, j, at(10, 14, 22), 4, idle="0.75")  # two hours under each card
    inv = generate(acme)
    idle = inv.lines.get(kind=LineKind.IDLE_HELD)
    assert (idle.quantity, idle.unit_price, idle.amount, idle.rate_card.name) == (
        Decimal("1.5"), Decimal("0.5"), Decimal("0.75"), "Idle")
    assert inv.total == Decimal("8.75")


def test_energy_line_prices_all_kwh_and_shows_the_split(acme):
    card("Energy", at(9, 1), {("", "", ""): "2.00"}, kwh="0.15")
    usage(acme, job(acme, "1"), at(10, 3), 2, gpu_kwh="5", node_kwh="1", facility_kwh="1.5")
    energy = generate(acme).lines.get(kind=LineKind.ENERGY)
    assert (energy.quantity, energy.unit, energy.amount) == (Decimal("15"), "kwh", Decimal("2.25"))
    assert "GPU 10 + node 2 + facility 3 kWh" in energy.description


def test_amounts_round_half_up_per_line_and_total_is_their_sum(acme):
    card("Cheap", at(9, 1), {("", "", ""): "1.00"}, preemptible=["spot"], discount="0.5")
    usage(acme, job(acme, "1"), at(10, 3), 1, gpu_hours="0.005")
    usage(acme, job(acme, "2"), at(10, 3), 1, gpu_hours="0.005")
    usage(acme, job(acme, "3", qos="spot"), at(10, 3), 1, gpu_hours="0.01")
    inv = generate(acme)
    # 0.005 -> 0.01 each (half up, not to even); the spot discount -0.005 -> -0.01 (away from zero)
    assert amounts(inv) == [Decimal("0.01"), Decimal("0.01"), Decimal("0.01"), Decimal("-0.01")]
    assert inv.total == sum(amounts(inv)) == Decimal("0.02")


def test_job_spanning_two_periods_is_billed_in_each_for_its_hours(acme, standard):
    j = job(acme, "long")
    usage(acme, j, at(10, 31, 22), 5)  # 22:00 on 31 Oct to 03:00 on 1 Nov
    october, november = generate(acme, OCT), generate(acme, NOV)
    assert [ln.quantity for ln in october.lines.all()] == [Decimal("2")]
    assert [ln.quantity for ln in november.lines.all()] == [Decimal("3")]
    assert october.total + november.total == Decimal("15.00")


def test_price_usage_writes_nothing(acme, standard):
    usage(acme, job(acme, "1"), at(10, 3), 1)
    assert [ln.amount for ln in price_usage(acme, *OCT)] == [Decimal("3.00")]
    assert not Invoice.objects.exists()


# --- Invoices: draft, final, corrections ---------------------------------------------------------------------


def test_regenerating_a_draft_replaces_its_lines(acme, standard):
    j = job(acme, "1")
    usage(acme, j, at(10, 3), 1)
    first = generate(acme)
    usage(acme, j, at(10, 4), 1)
    second = generate(acme)
    assert second.id == first.id and second.state == InvoiceState.DRAFT
    assert [ln.quantity for ln in second.lines.all()] == [Decimal("2")]
    assert second.total == Decimal("6.00")


def test_finalize_numbers_the_invoice_and_records_who(acme, standard, django_user_model):
    usage(acme, job(acme, "1"), at(10, 3), 1)
    inv = generate(acme)
    alice = django_user_model.objects.create_user("alice")
    final = do_finalize_invoice(inv.id, alice, now=FIXED_NOW)
    assert (final.state, final.number, final.finalized_by, final.finalized_at, final.total) == (
        "final", f"INV-2026100100-{acme.id:05d}", "alice", FIXED_NOW, Decimal("3.00"))
    with pytest.raises(InvoiceFinalError, match="already final"):
        do_finalize_invoice(inv.id, alice, now=FIXED_NOW)


def test_finalize_refuses_an_open_period(acme, standard):
    usage(acme, job(acme, "1"), at(11, 3), 1)
    inv = generate(acme, NOV)
    with pytest.raises(BillingError, match="once the period is over"):
        do_finalize_invoice(inv.id, "ops", now=FIXED_NOW)


def test_regenerating_a_final_invoice_is_refused(acme, standard):
    usage(acme, job(acme, "1"), at(10, 3), 1)
    do_finalize_invoice(generate(acme).id, "ops", now=FIXED_NOW)
    with pytest.raises(InvoiceFinalError, match="is final and cannot be regenerated.*do_correct_line"):
        generate(acme)


def _refused(sql: str, params) -> str:
    with pytest.raises(DatabaseError) as err, transaction.atomic(), connection.cursor() as cur:
        cur.execute(sql, params)
    return str(err.value)


def test_database_refuses_changes_to_a_final_invoice(acme, standard):
    usage(acme, job(acme, "1"), at(10, 3), 1)
    inv = do_finalize_invoice(generate(acme).id, "ops", now=FIXED_NOW)
    line = inv.lines.get()
    assert "is final" in _refused("UPDATE tenancy_invoice SET total = 0 WHERE id = %s", [inv.id])
    assert "is final" in _refused("DELETE FROM tenancy_invoice WHERE id = %s", [inv.id])
    assert "is final" in _refused("UPDATE tenancy_invoiceline SET amount = 0 WHERE id = %s", [line.id])
    assert "is final" in _refused("DELETE FROM tenancy_invoiceline WHERE id = %s", [line.id])
    with pytest.raises(DatabaseError, match="is final"), transaction.atomic():
        InvoiceLine.objects.create(invoice=inv, kind=LineKind.DEBIT, description="sneaky", quantity=1, unit="x",
                                   unit_price=1, amount=1)
    inv.refresh_from_db()
    assert (inv.total, inv.lines.get().amount) == (Decimal("3.00"), Decimal("3.00"))


def test_correction_is_a_line_on_the_next_draft_that_survives_regeneration(acme, standard):
    j = job(acme, "1")
    usage(acme, j, at(10, 3), 2)
    october = do_finalize_invoice(generate(acme).id, "ops", now=FIXED_NOW)
    original = october.lines.get()
    credit = do_correct_line(original.id, Decimal("-2.50"), "GPU 3 had an XID 79 for an hour", "ops")
    november = credit.invoice
    assert (november.period_start, november.period_end, november.state) == (*NOV, InvoiceState.DRAFT)
    assert (credit.kind, credit.amount, credit.corrects_id, credit.job_key) == (
        LineKind.CREDIT, Decimal("-2.50"), original.id, "slurm:1")
    assert credit.reason == "GPU 3 had an XID 79 for an hour" and october.number in credit.description
    assert november.total == Decimal("-2.50")
    usage(acme, j, at(11, 3), 1)
    november = generate(acme, NOV)  # regenerating keeps the correction and adds the usage
    assert sorted(amounts(november)) == [Decimal("-2.50"), Decimal("3.00")]
    assert november.total == Decimal("0.50")
    debit = do_correct_line(original.id, "1.25", "under-billed energy", "ops")
    assert (debit.kind, debit.invoice_id) == (LineKind.DEBIT, november.id)
    november.refresh_from_db()
    assert november.total == Decimal("1.75")
    october.refresh_from_db()
    assert october.total == Decimal("6.00")  # the final invoice itself never changed


def test_correction_skips_periods_already_final(acme, standard):
    usage(acme, job(acme, "1"), at(9, 3), 1)
    september = do_finalize_invoice(do_generate_invoice(acme, at(9, 1), at(10, 1), now=FIXED_NOW).id, "ops",
                                    now=FIXED_NOW)
    do_finalize_invoice(generate(acme).id, "ops", now=FIXED_NOW)  # October, empty and final
    line = do_correct_line(september.lines.get().id, "-1.00", "duplicate hour", "ops")
    assert (line.invoice.period_start, line.invoice.period_end) == NOV


def test_corrections_are_refused_without_a_reason_on_a_draft_or_for_zero(acme, standard):
    usage(acme, job(acme, "1"), at(10, 3), 1)
    draft = generate(acme)
    with pytest.raises(BillingError, match="regenerate the draft"):
        do_correct_line(draft.lines.get().id, "-1.00", "why", "ops")
    final = do_finalize_invoice(draft.id, "ops", now=FIXED_NOW)
    with pytest.raises(BillingError, match="needs a reason"):
        do_correct_line(final.lines.get().id, "-1.00", "  ", "ops")
    with pytest.raises(BillingError, match="non-zero amount in whole cents"):
        do_correct_line(final.lines.get().id, "0.001", "fraction of a cent", "ops")
    assert not InvoiceLine.objects.filter(corrects__isnull=False).exists()


def test_overlapping_period_is_refused(acme, standard):
    usage(acme, job(acme, "1"), at(10, 3), 1)
    generate(acme)
    with pytest.raises(BillingError, match="overlaps this period"):
        do_generate_invoice(acme, at(10, 15), at(11, 15), now=FIXED_NOW)


def test_period_must_be_whole_hours_and_started(acme, standard):
    with pytest.raises(BillingError, match="whole hours"):
        do_generate_invoice(acme, at(10, 1).replace(minute=5), at(11, 1), now=FIXED_NOW)
    with pytest.raises(BillingError, match="has not begun"):
        do_generate_invoice(acme, at(12, 1), at(12, 31), now=FIXED_NOW)


# --- The monthly run and showback ----------------------------------------------------------------------------


def test_run_invoices_bills_invoice_tenants_and_shows_back_showback_tenants(acme, standard):
    beta = tenant("beta", showback=True)
    tenant("idle")  # no usage: no invoice
    usage(acme, job(acme, "1"), at(10, 3), 2)
    usage(beta, job(beta, "2"), at(10, 3), 1)
    out = run_invoices(*OCT, now=FIXED_NOW, finalize=True)
    assert (out["tenants"], out["invoices"], out["billed"], out["showback"], out["finalized"]) == (2, 2, 1, 1, 1 + 1)
    assert (out["total"], out["showback_total"], out["errors"]) == (Decimal("6.00"), Decimal("3.00"), {})
    sb = Invoice.objects.get(tenant=beta)
    assert sb.showback and sb.number.startswith("SB-") and sb.state == InvoiceState.FINAL
    assert not Invoice.objects.get(tenant=acme).showback
    again = run_invoices(*OCT, now=FIXED_NOW)
    assert sorted(again["already_final"]) == ["acme", "beta"] and again["invoices"] == 0


def test_run_invoices_reports_one_tenants_error_and_bills_the_rest(acme, standard):
    broke = tenant("broke")
    card("Broke deal", at(9, 1), {(A100, "", ""): "1"}, owner=broke)  # no price for an H100
    usage(acme, job(acme, "1"), at(10, 3), 1)
    usage(broke, job(broke, "2"), at(10, 3), 1)
    out = run_invoices(*OCT, now=FIXED_NOW)
    assert list(out["errors"]) == ["broke"] and "no price" in out["errors"]["broke"]
    assert out["invoices"] == 1 and out["total"] == Decimal("3.00")


def test_run_invoices_command_finalizes_a_month(acme, standard, capsys):
    usage(acme, job(acme, "1"), at(10, 3), 1)
    call_command("run_invoices", period="2026-10", finalize=True)
    inv = Invoice.objects.get(tenant=acme)
    assert (inv.state, inv.total, inv.period_end) == (InvoiceState.FINAL, Decimal("3.00"), at(11, 1))
    assert "1 invoices for 1 tenants" in capsys.readouterr().out
    with pytest.raises(CommandError, match="expected YYYY-MM"):
        call_command("run_invoices", period="October")


# --- Failed and unmeasured hours ----------------------------------------------------------------------------


def _failed_usage(owner, j, hours: int, failed: str):
    rows = usage(owner, j, at(10, 3), hours, gpu_hours="4")
    for row in rows:  # each hour: 4 GPU-hours held, `failed` of them after one GPU failed
        row.failed_hours = row.lost_hours = Decimal(failed)
        row.busy_hours = Decimal(4) - Decimal(failed)
        row.save()


def test_failed_hours_are_credited_at_the_price_paid_by_default(acme):
    card("Spot", at(9, 1), {("", "", ""): "2.00"}, preemptible=["spot"], discount="0.25")
    _failed_usage(acme, job(acme, "1", qos="spot"), 2, "0.75")
    inv = generate(acme)
    lines = {ln.kind: ln for ln in inv.lines.all()}
    assert acme.lost_hours_policy == "credit"
    assert lines[LineKind.FAILED].quantity == Decimal("1.5")
    assert lines[LineKind.FAILED].unit_price == Decimal("-1.5")  # the $2 price less the 25 % discount
    assert lines[LineKind.FAILED].amount == Decimal("-2.25") and "credited (policy: credit)" in \
        lines[LineKind.FAILED].description
    assert inv.total == Decimal("16.00") - Decimal("4.00") - Decimal("2.25")


def test_failed_hours_under_a_charge_policy_are_listed_at_no_extra_cost(acme, standard):
    acme.lost_hours_policy = "charge"
    acme.save()
    _failed_usage(acme, job(acme, "1"), 2, "1")
    inv = generate(acme)
    failed = inv.lines.get(kind=LineKind.FAILED)
    assert failed.quantity == 2 and failed.amount == 0 and "charged as GPU time (policy: charge)" in failed.description
    assert inv.total == Decimal("24.00")  # 8 GPU-hours at $3


def test_unmeasured_hours_are_billed_as_held_and_named_on_the_gpu_time_line(acme):
    card("Idle", at(9, 1), {("", "", ""): "2.00"}, idle="1.00")
    rows = usage(acme, job(acme, "1"), at(10, 3), 1, gpu_hours="2")
    rows[0].busy_hours, rows[0].unmeasured_hours = Decimal("0.5"), Decimal("1.5")
    rows[0].save()
    inv = generate(acme)
    gpu_time = inv.lines.get(kind=LineKind.GPU_TIME)
    assert gpu_time.amount == Decimal("4.00") and "1.5 of them unmeasured" in gpu_time.description
    assert not inv.lines.filter(kind=LineKind.IDLE_HELD).exists()  # unknown activity is never charged as idle


def test_statement_total_is_the_draft_total_with_its_corrections(acme, standard):
    from tenancy.billing import statement

    usage(acme, job(acme, "9"), at(9, 2), 1)
    sep = do_finalize_invoice(do_generate_invoice(acme, at(9, 1), OCT[0], now=FIXED_NOW).id, "ops", now=FIXED_NOW)
    do_correct_line(sep.lines.first().id, "-1.25", "goodwill", "ops")  # lands on October's draft
    for i in range(3):
        usage(acme, job(acme, str(i)), at(10, 3 + i), 5 + i, gpu_hours="0.333333", idle="0.1")
    inv = generate(acme)
    assert statement(acme, *OCT).total == inv.total == Decimal("18.00") - Decimal("1.25")  # 5 + 6 + 7 by the cent
