"""Invoice and usage exports: CSV and JSON parse back, columns keep their order, totals equal the lines."""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal

import pytest
from django.contrib.auth.models import AnonymousUser

from tenancy.billing import do_correct_line, do_finalize_invoice, do_generate_invoice
from tenancy.exports import INVOICE_COLUMNS, USAGE_COLUMNS, invoice_csv, invoice_json, usage_csv
from tenancy.models import Membership
from tests.conftest import FIXED_NOW
from tests.tenancy.billing_factories import A100, H100, NOV, OCT, at, card, job, tenant, usage

pytestmark = pytest.mark.django_db


@pytest.fixture
def billed():
    """Acme's October (final, with a spot discount, MIG, energy and idle-held lines) and November with a credit."""
    acme = tenant("acme")
    card("Standard", at(9, 1), {("", "", ""): "2.00", (H100, "", ""): "3.00", (A100, "1g.10gb", ""): "7.00"},
         kwh="0.15", idle="0.50", preemptible=["spot"], discount="0.25")
    usage(acme, job(acme, "1001"), at(10, 3), 3, gpu_hours="8", idle="1.25", gpu_kwh="4.2", node_kwh="0.6",
          facility_kwh="1.2")
    usage(acme, job(acme, "1002", qos="spot"), at(10, 5), 5, model=A100, gpu_hours="2")
    usage(acme, job(acme, "1003"), at(10, 9), 7, model=A100, profile="1g.10gb", gpu_hours="0.142857")
    october = do_finalize_invoice(do_generate_invoice(acme, *OCT, now=FIXED_NOW).id, "ops", now=FIXED_NOW)
    credit = do_correct_line(october.lines.first().id, "-3.33", "node 7 ran hot, jobs slowed", "ops")
    return acme, october, credit.invoice


def _csv_rows(text: str) -> tuple[list[str], list[dict]]:
    reader = csv.DictReader(io.StringIO(text))
    return reader.fieldnames, list(reader)


def test_invoice_csv_parses_back_and_lines_sum_to_the_total(billed):
    _, october, _ = billed
    header, rows = _csv_rows(invoice_csv(october))
    assert tuple(header) == INVOICE_COLUMNS
    lines, total = rows[:-1], rows[-1]
    assert total["kind"] == "total" and Decimal(total["amount"]) == october.total
    assert sum(Decimal(r["amount"]) for r in lines) == october.total
    assert len(lines) == october.lines.count()
    assert sorted(r["kind"] for r in lines) == ["discount", "energy", "gpu_time", "gpu_time", "gpu_time", "idle_held"]
    for r in lines:  # every amount is quantity x unit price, rounded half up to the cent
        assert Decimal(r["amount"]) == (Decimal(r["quantity"]) * Decimal(r["unit_price"])).quantize(Decimal("0.01"),
                                                                                                   "ROUND_HALF_UP")
        assert r["job_key"].startswith("slurm:100") and r["invoice"] == october.number
    mig = next(r for r in lines if r["mig_profile"] == "1g.10gb")
    assert (mig["quantity"], mig["unit"], mig["unit_price"], mig["amount"]) == ("0.999999", "gpu_hour", "7.000000",
                                                                                "7.00")


def test_invoice_json_parses_back_with_decimals_as_strings(billed):
    _, october, november = billed
    doc = json.loads(invoice_json(october))
    assert list(doc) == ["invoice", "lines", "totals"]
    assert doc["invoice"]["number"] == october.number and doc["invoice"]["state"] == "final"
    assert all(isinstance(ln[k], str) for ln in doc["lines"] for k in ("quantity", "unit_price", "amount"))
    assert sum(Decimal(ln["amount"]) for ln in doc["lines"]) == Decimal(doc["totals"]["amount"]) == october.total
    assert sum(Decimal(v) for v in doc["totals"]["by_kind"].values()) == october.total
    assert Decimal(doc["totals"]["by_kind"]["discount"]) == Decimal("-5.00")  # 10 GPU-h x $2 x 25%
    credit = json.loads(invoice_json(november))["lines"][0]
    assert (credit["kind"], credit["amount"], credit["reason"]) == ("credit", "-3.33", "node 7 ran hot, jobs slowed")
    assert credit["corrects"] == october.lines.first().id


def test_invoice_exports_agree_with_each_other(billed):
    _, october, _ = billed
    _, rows = _csv_rows(invoice_csv(october))
    doc = json.loads(invoice_json(october))
    assert [(r["line"], r["amount"], r["quantity"]) for r in rows[:-1]] == [
        (str(ln["line"]), ln["amount"], ln["quantity"]) for ln in doc["lines"]]


def _persona(django_user_model, name, tenant_=None, *, superuser=False):
    user = django_user_model.objects.create_user(name, is_superuser=superuser)
    if tenant_ is not None:
        Membership.objects.create(user=user, tenant=tenant_, role="member")
    return user


def test_usage_csv_shows_each_persona_only_its_own_tenant(billed, django_user_model):
    acme, _, _ = billed
    other = tenant("other")
    usage(other, job(other, "9"), at(10, 3), 2)
    operator = _persona(django_user_model, "op", superuser=True)
    member = _persona(django_user_model, "alice", acme)
    outsider = _persona(django_user_model, "eve", other)
    seen = {}
    for name, who in (("operator", operator), ("member", member), ("outsider", outsider),
                      ("anonymous", AnonymousUser())):
        header, rows = _csv_rows(usage_csv(who, *OCT))
        assert tuple(header) == USAGE_COLUMNS
        seen[name] = {r["tenant"] for r in rows}
    assert seen == {"operator": {"acme", "other"}, "member": {"acme"}, "outsider": {"other"}, "anonymous": set()}


def test_usage_csv_quantities_sum_to_the_invoiced_quantities(billed, django_user_model):
    acme, october, _ = billed
    operator = _persona(django_user_model, "op", superuser=True)
    _, rows = _csv_rows(usage_csv(operator, *OCT, tenant=acme))
    assert len(rows) == 3 + 5 + 7 and rows[0]["hour"] == at(10, 3).isoformat()
    gpu_hours = sum(Decimal(r["gpu_hours"]) for r in rows)
    assert gpu_hours == sum(ln.quantity for ln in october.lines.filter(kind="gpu_time")) == Decimal("34.999999")
    assert {r["job_key"] for r in rows} == {"slurm:1001", "slurm:1002", "slurm:1003"}
    assert usage_csv(operator, *NOV, tenant=acme).count("\n") == 1  # the header only
