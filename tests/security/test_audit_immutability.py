"""The audit log and final invoices cannot be altered: the database refuses UPDATE, DELETE and TRUNCATE (raw SQL
and the ORM alike), the admin offers no change or delete, and no route of the site or the API changes them.

The world: three audit entries and a final October invoice with two lines (plus the November draft a
correction lands on). Every check ends by comparing the rows with a snapshot taken before.
"""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.db import DatabaseError, connection, transaction
from django.forms.models import model_to_dict
from django.urls import URLPattern, URLResolver, get_resolver

from core.audit import do_audit
from core.models import AuditEntry
from tenancy.billing import do_finalize_invoice, do_generate_invoice
from tenancy.models import Invoice, InvoiceLine
from tests.conftest import FIXED_NOW
from tests.tenancy.billing_factories import H100, OCT, card, job, tenant, usage

pytestmark = pytest.mark.django_db

TABLES = {"audit": "alerts_auditentry", "invoice": "tenancy_invoice", "line": "tenancy_invoiceline"}
WRITE_METHODS = ("post", "put", "patch", "delete")
# Routes that do not touch the data at all, or end the session the walk runs in.
SKIP_ROUTES = re.compile(r"^(admin/|django_plotly_dash/|login/|logout/|oidc/)")


@pytest.fixture
def world():
    acme = tenant("acme")
    card("Standard", OCT[0], {("", "", ""): "2.00", (H100, "", ""): "3.00"})
    usage(acme, job(acme, "1"), OCT[0], 2)
    usage(acme, job(acme, "2"), OCT[0], 1, gpu_hours="4")
    final = do_finalize_invoice(do_generate_invoice(acme, *OCT, now=FIXED_NOW).id, "ops", now=FIXED_NOW)
    for i in range(3):
        do_audit("alice", "rule.update", "rule", i, reason=f"entry {i}", outcome="ok", at=FIXED_NOW)
    assert final.state == "final" and final.lines.count() == 2
    return {"tenant": acme, "invoice": final, "line": final.lines.order_by("id").first()}


def snapshot(final: Invoice) -> dict:
    """The protected rows as plain values, to compare before and after."""
    return {"audit": [model_to_dict(a) for a in AuditEntry.objects.order_by("id")],
            "invoice": model_to_dict(Invoice.objects.get(pk=final.pk)),
            "lines": [model_to_dict(ln) for ln in InvoiceLine.objects.filter(invoice=final).order_by("id")]}


def assert_unchanged(before: dict, final: Invoice) -> None:
    """Final invoice and its lines identical; every earlier audit entry identical (new ones may be added)."""
    after = snapshot(final)
    assert after["invoice"] == before["invoice"]
    assert after["lines"] == before["lines"]
    assert after["audit"][: len(before["audit"])] == before["audit"]


def refused(sql: str, params=(), *, allow_setting: str | None = None) -> str:
    """Run raw SQL in a savepoint; return the database's refusal (the test fails if it is accepted)."""
    with pytest.raises(DatabaseError) as err, transaction.atomic(), connection.cursor() as cur:
        # The guard's escape hatch is a session setting (tests/conftest.py turns it on for the flush between
        # transactional tests); here it is off, as in production.
        cur.execute("SET LOCAL breakwater.allow_truncate = %s", [allow_setting or "off"])
        # TRUNCATE refuses to run while the fixture's deferred foreign-key checks are pending: run them now.
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cur.execute(sql, params)
    return str(err.value)


# --- The database ---------------------------------------------------------------------------------

def test_raw_sql_cannot_update_delete_or_truncate_the_audit_log(world):
    before = snapshot(world["invoice"])
    first = before["audit"][0]["id"]
    assert "append-only (UPDATE refused)" in refused("UPDATE alerts_auditentry SET reason = 'x' WHERE id = %s",
                                                     [first])
    assert "append-only (DELETE refused)" in refused("DELETE FROM alerts_auditentry")
    assert "append-only (TRUNCATE refused)" in refused("TRUNCATE alerts_auditentry")
    assert "append-only (TRUNCATE refused)" in refused("TRUNCATE alerts_auditentry RESTART IDENTITY CASCADE")
    assert_unchanged(before, world["invoice"])


def test_raw_sql_cannot_change_a_final_invoice_or_its_lines(world):
    inv, line = world["invoice"], world["line"]
    before = snapshot(inv)
    for sql, params in [
        ("UPDATE tenancy_invoice SET total = 0 WHERE id = %s", [inv.id]),
        ("UPDATE tenancy_invoice SET state = 'draft' WHERE id = %s", [inv.id]),
        ("DELETE FROM tenancy_invoice WHERE id = %s", [inv.id]),
        ("UPDATE tenancy_invoiceline SET amount = 0 WHERE id = %s", [line.id]),
        ("DELETE FROM tenancy_invoiceline WHERE invoice_id = %s", [inv.id]),
        ("INSERT INTO tenancy_invoiceline (invoice_id, kind, description, job_key, gpu_model, mig_profile, qos, "
         "quantity, unit, unit_price, amount, reason) VALUES (%s, 'debit', 'x', '', '', '', '', 1, 'x', 1, 1, '')",
         [inv.id]),
    ]:
        assert "is final" in refused(sql, params), sql
    for table in ("tenancy_invoiceline", "tenancy_invoice CASCADE", "tenancy_invoice, tenancy_invoiceline"):
        assert "holds final invoices" in refused(f"TRUNCATE {table}"), table
    assert_unchanged(before, inv)


def test_truncate_guard_lets_an_empty_log_be_emptied_and_honours_only_its_setting(world):
    """An empty table loses nothing (so a fresh test database flushes cleanly); with rows, only the session
    setting the test flush uses lets TRUNCATE through, and a wrong value does not."""
    assert "TRUNCATE refused" in refused("TRUNCATE alerts_auditentry", allow_setting="yes")
    with transaction.atomic():
        sid = transaction.savepoint()
        with connection.cursor() as cur:
            cur.execute("SET LOCAL breakwater.allow_truncate = 'on'")
            cur.execute("TRUNCATE alerts_auditentry")  # the flush path
            cur.execute("SET LOCAL breakwater.allow_truncate = 'off'")
            cur.execute("TRUNCATE alerts_auditentry")  # empty now: nothing to protect
        transaction.savepoint_rollback(sid)
    assert AuditEntry.objects.count() == 3


def test_the_orm_cannot_save_or_delete_them(world):
    inv, line = world["invoice"], world["line"]
    before = snapshot(inv)
    entry = AuditEntry.objects.order_by("id").first()
    entry.reason = "rewritten"
    inv.total = Decimal("0")
    line.amount = Decimal("0")
    attempts = [
        entry.save, entry.delete,
        lambda: AuditEntry.objects.filter(pk=entry.pk).update(reason="rewritten"),
        lambda: AuditEntry.objects.all().delete(),
        inv.save, inv.delete, line.save, line.delete,
        lambda: Invoice.objects.filter(pk=inv.pk).update(total=0),
        lambda: Invoice.objects.filter(pk=inv.pk).delete(),
        lambda: InvoiceLine.objects.filter(invoice=inv).update(amount=0),
        lambda: InvoiceLine.objects.filter(invoice=inv).delete(),
    ]
    for attempt in attempts:
        with pytest.raises(DatabaseError, match="append-only|is final"), transaction.atomic():
            attempt()
    assert_unchanged(before, inv)


# --- The admin ------------------------------------------------------------------------------------

def test_admin_offers_no_change_or_delete_even_to_a_superuser(world, client, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("root", "root@example.com", "pw-root-1"))
    before = snapshot(world["invoice"])
    entry = AuditEntry.objects.order_by("id").first()
    base = "/admin/core/auditentry/"

    listing = client.get(base)
    assert listing.status_code == 200 and "delete_selected" not in listing.content.decode()
    view = client.get(f"{base}{entry.pk}/change/")
    assert view.status_code == 200  # viewable, read-only
    page = view.content.decode()
    assert 'name="_save"' not in page and f"{base}{entry.pk}/delete/" not in page
    assert client.post(f"{base}{entry.pk}/change/", {"reason": "rewritten", "actor": "mallory"}).status_code == 403
    assert client.post(f"{base}{entry.pk}/delete/", {"post": "yes"}).status_code == 403
    assert client.post(f"{base}add/", {"actor": "mallory", "verb": "x"}).status_code == 403
    bulk = client.post(base, {"action": "delete_selected", "_selected_action": [entry.pk], "post": "yes"})
    assert bulk.status_code in (200, 302, 403)
    # Invoices are not in the admin at all: chargeback (finalise, correct) is the only way to touch them.
    for path in ("/admin/tenancy/invoice/", f"/admin/tenancy/invoice/{world['invoice'].pk}/change/",
                 "/admin/tenancy/invoiceline/"):
        assert client.get(path).status_code == 404, path
    assert_unchanged(before, world["invoice"])


# --- Every route ----------------------------------------------------------------------------------

def _routes(patterns, prefix: str = "") -> list[str]:
    """Every route of the URLconf as a pattern string (e.g. "chargeback/invoices/<str:number>/")."""
    routes = []
    for p in patterns:
        if isinstance(p, URLResolver):
            routes += _routes(p.url_patterns, prefix + str(p.pattern))
        elif isinstance(p, URLPattern):
            routes.append(prefix + str(p.pattern))
    return routes


def _fill(route: str, world: dict) -> str:
    """A route with its parameters pointing at the protected rows (other ids at the first audit entry)."""
    values = {"number": world["invoice"].number, "slug": world["tenant"].slug, "line_id": world["line"].pk}
    first_audit = AuditEntry.objects.order_by("id").first().pk

    def value(m: re.Match) -> str:
        return str(values.get(m.group(2), first_audit if m.group(1) == "int" else "x"))
    return "/" + re.sub(r"<(?:(\w+):)?(\w+)>", value, route)


def test_no_route_changes_the_audit_log_or_a_final_invoice(world, client, django_user_model):
    """Every page and API route, with every write method, as a superuser operator: the rows stay."""
    client.force_login(django_user_model.objects.create_superuser("root", "root@example.com", "pw-root-1"))
    before = snapshot(world["invoice"])
    routes = [r for r in _routes(get_resolver().url_patterns) if not SKIP_ROUTES.match(r)]
    touching = [r for r in routes if re.search(r"audit|invoice|chargeback|lines", r)]
    assert {"api/v1/audit", "audit/", "chargeback/invoices/<str:number>/finalize/",
            "chargeback/lines/<int:line_id>/correct/"} <= set(touching)
    body = {"reason": "rewrite history", "amount": "-1000", "actor": "mallory", "total": "0", "state": "draft"}
    for route in routes:
        path = _fill(route, world)
        for method in WRITE_METHODS:
            response = getattr(client, method)(path, body if method == "post" else "reason=x",
                                               **({} if method == "post" else {"content_type": "text/plain"}))
            assert response.status_code < 500, (method, path, response.status_code)
        if route in touching:
            assert_unchanged(before, world["invoice"])
    assert_unchanged(before, world["invoice"])
    # The API's audit endpoint refuses every write outright.
    for method in WRITE_METHODS:
        response = getattr(client, method)("/api/v1/audit", "{}", content_type="application/json")
        assert response.status_code == 405 and response["Allow"] == "GET"
