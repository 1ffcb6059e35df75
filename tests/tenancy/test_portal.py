"""The tenant portal and the operator's chargeback pages, through Django's test client against the real database.

The world: the demo tenants (tenancy.demo), four running jobs in three teams with ten days of metered usage,
the GPUs they hold (one with an open fault), alerts labelled with their tenant and a draft invoice. Each test
signs in as one persona: llm-dev (member of the llm-core team), acme-admin (admin of the Acme organisation),
helix-viewer (viewer of Helix), an operator, or nobody.
"""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from alerts.models import Alert
from anomaly.models import Anomaly
from core.models import AuditEntry
from dashboard.pages import chargeback, portal
from telemetry.models import (
    SAMPLE_MODELS,
    Allocation,
    Gpu,
    GpuEvent,
    Hall,
    Job,
    JobStateChange,
    Node,
    Rack,
    Row,
    Site,
)
from tenancy.billing import do_finalize_invoice, do_generate_invoice
from tenancy.demo import GPU_MODEL, QUOTAS, USERS, install_demo, month_start
from tenancy.models import Invoice, InvoiceLine, InvoiceState, Membership, Quota, RateCard, RatePrice, Tenant, UsageHour
from tests import personas
from tests.conftest import FIXED_NOW

H = timedelta(hours=1)
D = timedelta(days=1)
PASSWORD = personas.PASSWORD
NOV = (month_start(FIXED_NOW), month_start(FIXED_NOW).replace(month=12))

# key: (team, name, qos, GPUs held, per metered hour: busy, idle-held)
JOBS = {
    "101": ("llm-core", "llm-70b-pretrain", "normal", 4, "3.8", "0.2"),
    "102": ("llm-core", "jupyter-notebook", "low", 4, "0.2", "3.8"),
    "201": ("serving", "serve-chat", "normal", 4, "3", "1"),
    "301": ("hpc-science", "cfd-les", "high", 8, "8", "0"),
}
SMALL_QUOTAS = {"llm-core": 6, "applied-ml": 2, "serving": 2, "research": 1, "hpc-science": 6}
HOURS_PER_DAY = 6  # metered hours per day, 10:00-15:59, over the ten days before `now`


def build_world(now) -> dict:
    """The demo tenants plus jobs, usage, GPUs, faults and alerts around `now` (see the module docstring)."""
    demo = install_demo({u.username: PASSWORD for u in USERS}, now=now)
    tenants = demo["tenants"]
    # The demo's quotas fit the simulator's 2,048 GPUs; this world has 20, so its quotas are scaled down.
    for slug, guaranteed in SMALL_QUOTAS.items():
        Quota.objects.filter(tenant__slug=slug).update(guaranteed=guaranteed, borrowable=guaranteed / 2)
    jobs = {}
    for key, (team, name, qos, n_gpus, busy, idle) in JOBS.items():
        job = Job.objects.create(source="slurm", external_id=key, name=name, account=team, qos=qos, state="running",
                                 user="alee", start_time=now - 10 * D, gpu_count=n_gpus, node_count=1)
        JobStateChange.objects.create(job=job, time=now - 10 * D, state="running")
        jobs[key] = job
        _usage(tenants[team], job, now, Decimal(busy), Decimal(idle))
        _hold_gpus(job, n_gpus, now)
    gpu = Gpu.objects.get(uuid="GPU-node-101-0")
    GpuEvent.objects.create(gpu=gpu, kind="xid", code=48, message="DBE", first_seen=now - H, last_seen=now - H,
                            source="kmsg")
    Anomaly.objects.create(kind="straggler", entity_kind="rank", entity_id="slurm:101#3", host="node-101",
                           started_at=now - 3 * H, last_seen=now, score=4.1, last_score=4.1,
                           summary="rank 3 step time +40% vs its gang")
    _alert("JobIdleGpus", "llm-core", "slurm:102", now)
    _alert("ServingLatencyHigh", "serving", "slurm:201", now)
    return {"tenants": tenants, "jobs": jobs, "card": demo["card"]}


def _usage(tenant, job, now, busy: Decimal, idle: Decimal) -> None:
    first_day = (now - 10 * D).replace(hour=10, minute=0, second=0, microsecond=0)
    rows = [UsageHour(hour=first_day + d * D + h * H, tenant=tenant, job=job, gpu_model=GPU_MODEL, qos=job.qos,
                      gpu_hours=busy + idle, busy_hours=busy, idle_held_hours=idle, energy_gpu_kwh=Decimal("2.5"),
                      energy_node_kwh=Decimal("0.5"), energy_facility_kwh=Decimal("0.9"))
            for d in range(10) for h in range(HOURS_PER_DAY) if first_day + d * D + (h + 1) * H <= now]
    UsageHour.objects.bulk_create(rows)


def _hold_gpus(job, count: int, now) -> None:
    """`count` GPUs of a node of their own, racked, held by `job`; GPU 0 of job 101 has failed (XID 79)."""
    row = Row.objects.get_or_create(name="r1", hall=Hall.objects.get_or_create(
        name="h1", site=Site.objects.get_or_create(name="dc1")[0])[0])[0]
    rack = Rack.objects.create(name=f"rack-{job.external_id}", row=row)
    node = Node.objects.create(hostname=f"node-{job.external_id}", rack=rack)
    latest = SAMPLE_MODELS["gpu"]["latest"]
    for i in range(count):
        gpu = Gpu.objects.create(uuid=f"GPU-node-{job.external_id}-{i}", node=node, index=i, model=GPU_MODEL)
        Allocation.objects.create(job=job, node=node, gpu=gpu, gpu_index=i, start=now - 10 * D)
        failed = job.external_id == "101" and i == 0
        latest.objects.create(gpu_id=gpu.id, time=now - timedelta(seconds=20), gpu_util=4.0 if failed else 91.0,
                              gpu_temp=70.0 + i, power_w=600.0, xid=79 if failed else 0)


def _alert(name: str, tenant: str, job_key: str, now) -> Alert:
    labels = {"alertname": name, "severity": "warning", "tenant": tenant, "job": job_key}
    return Alert.objects.create(fingerprint=f"fp-{name}", name=name, state="firing", severity="warning", labels=labels,
                                annotations={"summary": f"{name} on {job_key}"}, entity_kind="job",
                                entity_key=job_key, starts_at=now - 2 * H, last_seen=now)


@pytest.fixture
def world(db, monkeypatch):
    monkeypatch.setattr(portal, "now", lambda: FIXED_NOW)
    return build_world(FIXED_NOW)


def signed_in(client, username: str):
    client.force_login(get_user_model().objects.get(username=username))
    return client


@pytest.fixture
def operator(client, django_user_model):
    personas.operator("op")
    return signed_in(client, "op")


def charts(response) -> dict:
    return json.loads(re.search(r'<script id="bw-portal-charts" type="application/json">(.*?)</script>',
                                response.content.decode(), re.S)[1])


def csv_rows(response) -> list[dict]:
    body = b"".join(response.streaming_content) if response.streaming else response.content
    return list(csv.DictReader(io.StringIO(body.decode())))


# --- Landing and access ----------------------------------------------------------------------------------

def test_portal_home_sends_a_one_tenant_user_to_their_tenant(world, client):
    response = signed_in(client, "llm-dev").get("/portal/")
    assert response.status_code == 302 and response["Location"] == "/portal/llm-core/"


def test_portal_home_lets_an_operator_choose_any_tenant(world, operator):
    response = operator.get("/portal/")
    assert response.status_code == 200
    slugs = re.findall(r'data-slug="([-\w]+)"', response.content.decode())
    assert sorted(slugs) == sorted(Tenant.objects.values_list("slug", flat=True))


def test_anonymous_visitor_is_sent_to_login(world, client):
    for url in ("/portal/", "/portal/llm-core/", "/portal/llm-core/jobs/", "/chargeback/"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/login/?next="), url


def test_another_tenants_portal_is_forbidden(world, client):
    signed_in(client, "llm-dev")
    for url in ("/portal/serving/", "/portal/serving/jobs/", "/portal/helix/invoices/", "/portal/hpc-science/health/",
                "/portal/acme/", "/portal/serving/usage.csv"):
        assert client.get(url).status_code == 403, url
    assert client.get("/portal/no-such-team/").status_code == 404


def test_another_tenants_invoice_is_not_found_under_ones_own_slug(world, client):
    theirs = do_generate_invoice(world["tenants"]["serving"], *NOV, now=FIXED_NOW)
    signed_in(client, "llm-dev")
    for suffix in ("/", ".csv", ".json"):
        assert client.get(f"/portal/llm-core/invoices/{theirs.number}{suffix}").status_code == 404
    assert client.get(f"/portal/serving/invoices/{theirs.number}/").status_code == 403


def test_tenant_user_cannot_open_chargeback_or_post_to_it(world, client):
    draft = do_generate_invoice(world["tenants"]["llm-core"], *NOV, now=FIXED_NOW)
    signed_in(client, "acme-admin")
    assert client.get("/chargeback/").status_code == 403
    assert client.post(f"/chargeback/invoices/{draft.number}/finalize/").status_code == 403
    assert client.post("/chargeback/generate/", {"period": "2026-11"}).status_code == 403
    assert Invoice.objects.get(pk=draft.pk).state == InvoiceState.DRAFT


def test_tenant_user_header_links_no_operator_page(world, client):
    page = signed_in(client, "llm-dev").get("/portal/llm-core/").content.decode()
    header = page[page.index("<header"):page.index("</header>")]
    assert 'href="/portal/llm-core/"' in header
    for operator_url in ('href="/"', "/racks/", "/jobs/", "/alerts/", "/chargeback/", "/audit/", "/search/"):
        assert operator_url not in header, operator_url


def test_operator_header_links_chargeback(world, operator):
    header = operator.get("/chargeback/").content.decode().split("</header>")[0]
    assert 'href="/chargeback/" aria-current="page"' in header and 'href="/racks/"' in header


# --- A tenant's pages show its own data only -------------------------------------------------------------

def test_overview_shows_the_members_usage_waste_and_quota_only(world, client):
    response = signed_in(client, "llm-dev").get("/portal/llm-core/")
    assert response.status_code == 200
    page = response.content.decode()
    data = charts(response)
    assert len(data["days"]) == portal.CHART_DAYS and data["days"][-1] == "2026-11-30"
    # llm-core's two jobs only: 10 days x 6 h x (3.8 + 0.2) busy-ish, and idle 0.2 + 3.8 per hour.
    assert sum(data["busy"]) == pytest.approx(10 * HOURS_PER_DAY * 4.0)
    assert sum(data["idle_held"]) == pytest.approx(10 * HOURS_PER_DAY * 4.0)
    assert all(c is not None for c in data["cost"]) and sum(data["cost"]) > 0
    # The last 7 days (from Nov 23 12:00): 40 metered hours x 8 GPU-hours, half of them idle-held.
    assert '<p class="bw-big" id="bw-week-hours">320</p>' in page and 'id="bw-idle-share">50%<' in page
    assert "jupyter-notebook" in page or "slurm:102" in page  # the waste panel names the idle job
    waste = page[page.index('id="bw-waste-panel"'):]
    waste = waste[:waste.index("</section>")]
    assert "idle-held GPU-hours" in waste and "slurm:201" not in waste and "serve-chat" not in waste
    quota = page[page.index('id="bw-quota-table"'):page.index("</table>", page.index('id="bw-quota-table"'))]
    assert quota.count("<tr data-tenant=") == 1  # llm-core's own quota, not its siblings'


def test_overview_cost_chart_equals_the_draft_invoice_total(world, client):
    response = signed_in(client, "llm-dev").get("/portal/llm-core/")
    draft = do_generate_invoice(world["tenants"]["llm-core"], *NOV, now=FIXED_NOW)
    assert Decimal(str(round(sum(charts(response)["cost"]), 2))) == draft.total
    assert portal.money(draft.total) in response.content.decode()  # "Spent this month"


def test_organisation_admin_sees_its_teams_but_not_another_organisation(world, client):
    signed_in(client, "acme-admin")
    data = charts(client.get("/portal/acme/"))
    acme_busy = 10 * HOURS_PER_DAY * (3.8 + 0.2 + 3)  # llm-core and serving; not hpc-science
    assert sum(data["busy"]) == pytest.approx(acme_busy)
    jobs = client.get("/portal/acme/jobs/?days=30").content.decode()
    assert "slurm:101" in jobs and "slurm:201" in jobs and "slurm:301" not in jobs
    assert client.get("/portal/serving/").status_code == 200  # a team of its organisation
    assert client.get("/portal/helix/").status_code == 403


def test_jobs_page_lists_own_jobs_with_their_efficiency(world, client):
    page = signed_in(client, "llm-dev").get("/portal/llm-core/jobs/?days=30").content.decode()
    keys = re.findall(r'<tr data-job="([^"]+)"', page)
    assert sorted(keys) == ["slurm:101", "slurm:102"]
    row = page[page.index('data-job="slurm:102"'):]
    row = row[:row.index("</tr>")]
    assert "jupyter-notebook" in row and 'style="width: 5.0%"' in row  # 0.2 of 4 GPU-hours busy
    assert "none" in row
    pretrain = page[page.index('data-job="slurm:101"'):]
    assert "1 rank: 3" in pretrain[:pretrain.index("</tr>")]  # flagged a straggler by the anomaly detector


def test_health_page_shows_own_alerts_and_gpus_with_open_faults(world, client):
    page = signed_in(client, "llm-dev").get("/portal/llm-core/health/").content.decode()
    assert "JobIdleGpus" in page and "ServingLatencyHigh" not in page
    uuids = set(re.findall(r'<tr data-uuid="([^"]+)"', page))
    assert uuids == {f"GPU-node-{j}-{i}" for j in ("101", "102") for i in range(4)}
    first = page[page.index("<tr data-uuid="):]
    first = first[:first.index("</tr>")]  # the worst GPU leads: failed, with its open fault
    assert 'data-uuid="GPU-node-101-0" data-health="failed"' in first and "XID 48" in first
    assert "8 GPUs, 1 not OK, 1 with an open fault." in page


def test_viewer_sees_the_portal_of_its_organisation(world, client):
    signed_in(client, "helix-viewer")
    assert client.get("/portal/").status_code == 302
    page = client.get("/portal/helix/jobs/?days=30").content.decode()
    assert re.findall(r'<tr data-job="([^"]+)"', page) == ["slurm:301"]


# --- Invoices and exports ------------------------------------------------------------------------------

def test_invoice_pages_and_exports_parse_and_agree(world, client):
    draft = do_generate_invoice(world["tenants"]["llm-core"], *NOV, now=FIXED_NOW)
    signed_in(client, "llm-dev")
    listing = client.get("/portal/llm-core/invoices/").content.decode()
    assert f"/portal/llm-core/invoices/{draft.number}.csv" in listing
    detail = client.get(f"/portal/llm-core/invoices/{draft.number}/")
    assert detail.status_code == 200 and portal.money(draft.total) in detail.content.decode()
    as_csv = client.get(f"/portal/llm-core/invoices/{draft.number}.csv")
    assert as_csv["Content-Type"].startswith("text/csv")
    assert as_csv["Content-Disposition"] == f'attachment; filename="{draft.number}.csv"'
    rows = csv_rows(as_csv)
    assert rows[-1]["kind"] == "total" and Decimal(rows[-1]["amount"]) == draft.total
    assert {r["job_key"] for r in rows[:-1]} == {"slurm:101", "slurm:102"}
    doc = client.get(f"/portal/llm-core/invoices/{draft.number}.json").json()
    assert doc["invoice"]["number"] == draft.number and Decimal(doc["invoice"]["total"]) == draft.total
    assert [str(ln["line"]) for ln in doc["lines"]] == [r["line"] for r in rows[:-1]]


def test_portal_usage_csv_holds_own_hours_only(world, client):
    rows = csv_rows(signed_in(client, "llm-dev").get("/portal/llm-core/usage.csv?days=30"))
    assert {r["tenant"] for r in rows} == {"llm-core"} and {r["job_key"] for r in rows} == {"slurm:101", "slurm:102"}
    assert sum(Decimal(r["gpu_hours"]) for r in rows) == Decimal(10 * HOURS_PER_DAY * 8)


# --- Chargeback (operators) ----------------------------------------------------------------------------

def test_chargeback_page_shows_every_tenant_with_usage_cost_fair_share_and_quota(world, operator):
    stray = Job.objects.create(source="slurm", external_id="999", account="nobodys", state="completed")
    UsageHour.objects.bulk_create([UsageHour(hour=FIXED_NOW - (h + 2) * H, job=stray, gpu_model=GPU_MODEL,
                                             gpu_hours=Decimal(2), busy_hours=Decimal(2)) for h in range(5)])
    response = operator.get("/chargeback/?period=2026-11")
    assert response.status_code == 200
    rows = {r["tenant"].slug: r for r in response.context["tenants"]}
    assert set(rows) == set(Tenant.objects.values_list("slug", flat=True))
    assert rows["llm-core"]["gpu_hours"] == Decimal(10 * HOURS_PER_DAY * 8)
    assert rows["acme"]["gpu_hours"] == Decimal(10 * HOURS_PER_DAY * (8 + 4))  # its teams, rolled up
    assert rows["helix"]["gpu_hours"] == rows["hpc-science"]["gpu_hours"] == Decimal(10 * HOURS_PER_DAY * 8)
    assert rows["llm-core"]["cost"] > 0 and rows["research"]["cost"] == 0
    page = response.content.decode()
    assert '<p class="bw-small" id="bw-unmapped">10.0 GPU-hours this period' in page
    fair = page[page.index('id="bw-fair-share"'):page.index("</table>", page.index('id="bw-fair-share"'))]
    assert all(f'data-tenant="{slug}"' in fair or slug in fair for slug in QUOTAS)
    quota = page[page.index('id="bw-quota-table"'):page.index("</table>", page.index('id="bw-quota-table"'))]
    assert quota.count("<tr data-tenant=") == len(QUOTAS)
    # serving holds 4 GPUs on a quota of 2 guaranteed + 1 borrowable; llm-core holds 8 of 6 + 3.
    assert re.findall(r'<tr data-tenant="([-\w]+)" class="is-over"', quota) == ["serving"]


def test_generate_then_finalize_through_the_page(world, operator):
    response = operator.post("/chargeback/generate/", {"period": "2026-11", "tenant": "llm-core"}, follow=True)
    draft = Invoice.objects.get(tenant__slug="llm-core")
    assert draft.state == InvoiceState.DRAFT and draft.total > 0
    assert f"Draft {draft.number} for LLM Core" in response.content.decode()
    # The period is not over at FIXED_NOW: finalizing is refused with the reason, not a 500.
    refused = operator.post(f"/chargeback/invoices/{draft.number}/finalize/", follow=True)
    assert "finalize it once the period is over" in refused.content.decode()
    assert Invoice.objects.get(pk=draft.pk).state == InvoiceState.DRAFT


def test_finalize_a_past_period_and_correct_a_line(world, operator, monkeypatch):
    monkeypatch.setattr(portal, "now", lambda: FIXED_NOW + 2 * D)  # December: November is over
    operator.post("/chargeback/generate/", {"period": "2026-11", "tenant": "llm-core"})
    draft = Invoice.objects.get(tenant__slug="llm-core")
    response = operator.post(f"/chargeback/invoices/{draft.number}/finalize/", {"next": "invoice"}, follow=True)
    final = Invoice.objects.get(pk=draft.pk)
    assert final.state == InvoiceState.FINAL and final.number.startswith("INV-") and final.finalized_by == "op"
    assert response.redirect_chain[-1][0] == f"/chargeback/invoices/{final.number}/"
    line = final.lines.order_by("id").first()
    response = operator.post(f"/chargeback/lines/{line.id}/correct/", {"amount": "-12.50", "reason": "node ran hot"},
                             follow=True)
    credit = InvoiceLine.objects.get(corrects=line)
    assert (credit.kind, credit.amount, credit.reason) == ("credit", Decimal("-12.50"), "node ran hot")
    assert credit.invoice.period_start == NOV[1] and "posted to" in response.content.decode()
    assert Invoice.objects.get(pk=final.pk).total == final.total  # the final invoice itself is untouched


def test_a_bad_correction_is_an_error_message(world, operator):
    draft = do_generate_invoice(world["tenants"]["llm-core"], *NOV, now=FIXED_NOW)
    line = draft.lines.first()
    response = operator.post(f"/chargeback/lines/{line.id}/correct/", {"amount": "-1", "reason": "x"}, follow=True)
    assert "regenerate the draft instead" in response.content.decode()
    response = operator.post(f"/chargeback/lines/{line.id}/correct/", {"amount": "abc", "reason": "x"}, follow=True)
    assert "amount:" in response.content.decode()
    assert not InvoiceLine.objects.filter(corrects=line).exists()


def test_generate_all_drafts_and_showback_marking(world, operator):
    operator.post("/chargeback/tenants/serving/billing-mode/", {"mode": "showback", "period": "2026-11"})
    assert Tenant.objects.get(slug="serving").billing_mode == "showback"
    assert AuditEntry.objects.filter(verb__contains="billing", object_id="serving").exists()
    response = operator.post("/chargeback/generate/", {"period": "2026-11"}, follow=True)
    assert "3 draft(s) generated for 3 tenant(s)" in response.content.decode()
    by_slug = {i.tenant.slug: i for i in Invoice.objects.select_related("tenant")}
    assert set(by_slug) == {"llm-core", "serving", "hpc-science"}
    assert by_slug["serving"].showback and not by_slug["llm-core"].showback
    page = operator.get("/chargeback/?period=2026-11").content.decode()
    assert page.count('class="bw-btn bw-finalize" disabled') == 3  # November is not over yet


def test_chargeback_exports_parse(world, operator):
    draft = do_generate_invoice(world["tenants"]["hpc-science"], *NOV, now=FIXED_NOW)
    rows = csv_rows(operator.get("/chargeback/usage.csv?period=2026-11"))
    assert {r["tenant"] for r in rows} == {"llm-core", "serving", "hpc-science"}
    invoice_rows = csv_rows(operator.get(f"/chargeback/invoices/{draft.number}.csv"))
    assert Decimal(invoice_rows[-1]["amount"]) == draft.total
    assert operator.get(f"/chargeback/invoices/{draft.number}.json").json()["invoice"]["tenant"] == "hpc-science"


def test_chargeback_invoice_detail_offers_corrections_only_when_final(world, operator, monkeypatch):
    draft = do_generate_invoice(world["tenants"]["llm-core"], *NOV, now=FIXED_NOW)
    page = operator.get(f"/chargeback/invoices/{draft.number}/").content.decode()
    assert "bw-correct-form" not in page and "bw-finalize" in page
    final = do_finalize_invoice(draft.id, "op", now=FIXED_NOW + 2 * D)
    page = operator.get(f"/chargeback/invoices/{final.number}/").content.decode()
    assert page.count("bw-correct-form") == final.lines.count() and "bw-finalize" not in page


def test_period_parsing_falls_back_to_this_month():
    assert chargeback.parse_period("2026-02", FIXED_NOW)[0].month == 2
    assert chargeback.parse_period("2026-13", FIXED_NOW) == NOV
    assert chargeback.parse_period("'; drop", FIXED_NOW) == NOV
    assert chargeback.recent_periods(FIXED_NOW)[:3] == ["2026-11", "2026-10", "2026-09"]


# --- Demo tenants --------------------------------------------------------------------------------------

def test_install_demo_is_idempotent_and_maps_the_simulator_accounts(db):
    first = install_demo({u.username: PASSWORD for u in USERS}, now=FIXED_NOW)
    counts = [m.objects.count() for m in (Tenant, Quota, RateCard, RatePrice, Membership)]
    second = install_demo({u.username: PASSWORD for u in USERS}, now=FIXED_NOW + 40 * D)
    assert [m.objects.count() for m in (Tenant, Quota, RateCard, RatePrice, Membership)] == counts
    assert second["card"].pk == first["card"].pk and second["card"].effective_from == NOV[0]
    teams = dict(Tenant.objects.filter(parent__isnull=False).values_list("slug", "parent__slug"))
    assert teams == {"llm-core": "acme", "applied-ml": "acme", "serving": "acme", "research": "acme",
                     "hpc-science": "helix"}
    assert {(a.kind, a.name) for t in Tenant.objects.all() for a in t.accounts.all()} == {
        ("slurm", s) for s in teams}
    prices = dict(RatePrice.objects.values_list("priority_class", "price_per_gpu_hour"))
    assert prices["low"] == prices["normal"] < prices["high"] and second["card"].preemptible_qos == ["low"]
    assert second["card"].preemptible_discount == Decimal("0.40")
    roles = set(Membership.objects.values_list("user__username", "tenant__slug", "role"))
    assert roles == {("acme-admin", "acme", "tenant_admin"), ("llm-dev", "llm-core", "member"),
                     ("helix-viewer", "helix", "viewer")}


def test_tenancy_demo_command_writes_passwords_and_prints_logins(db, tmp_path):
    out = io.StringIO()
    call_command("tenancy_demo", "--password-dir", str(tmp_path), stdout=out)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == sorted(f"demo_{u.username}_password" for u in USERS)
    assert all((tmp_path / f).stat().st_mode & 0o077 == 0 for f in files)
    password = (tmp_path / "demo_llm-dev_password").read_text().strip()
    assert f"tenant login: llm-dev / {password}  (tenant member of LLM Core)" in out.getvalue()
    assert get_user_model().objects.get(username="llm-dev").check_password(password)
    again = io.StringIO()
    call_command("tenancy_demo", "--password-dir", str(tmp_path), stdout=again)
    assert "(created)" not in again.getvalue() and password in again.getvalue()


# --- Billing that follows the truth, and the hardware events behind it ----------------------------------

def _faults_and_actions(now) -> None:
    """Serving's GPU falls off the bus; the operators drain node-101 (llm-core's fault) and node-201 (serving's)."""
    from alerts.models import RemediationAction

    GpuEvent.objects.create(gpu=Gpu.objects.get(uuid="GPU-node-201-0"), kind="xid", code=79, source="kmsg",
                            first_seen=now - 2 * H, last_seen=now - 2 * H, message="GPU has fallen off the bus")
    for host, state in (("node-101", "succeeded"), ("node-201", "awaiting")):
        RemediationAction.objects.create(kind="drain", mode="approval", state=state, target_kind="node",
                                         target_key=host, reason=f"drain {host}: secret reason", created_at=now - 30
                                         * timedelta(minutes=1), idempotency_key=f"drain-{host}", requested_by="op")


def test_spent_this_month_is_the_draft_invoice_total_to_the_cent(world, client):
    draft = do_generate_invoice(world["tenants"]["llm-core"], *NOV, now=FIXED_NOW)
    assert draft.lines.values("job_id").distinct().count() == 2  # several jobs
    page = signed_in(client, "llm-dev").get("/portal/llm-core/").content.decode()
    assert re.search(r'id="bw-spent">([^<]+)<', page)[1] == portal.money(draft.total)
    assert f'href="/portal/llm-core/invoices/{draft.number}/" id="bw-spent-draft"' in page


def test_organisation_spend_is_its_own_draft_and_its_teams_apart(world, client):
    page = signed_in(client, "acme-admin").get("/portal/acme/").content.decode()
    teams = sum(do_generate_invoice(world["tenants"][t], *NOV, now=FIXED_NOW).total for t in ("llm-core", "serving"))
    assert re.search(r'id="bw-spent">([^<]+)<', page)[1] == portal.money(0)  # acme itself ran nothing
    assert re.search(r'id="bw-spent-teams">([^<]+)<', page)[1] == portal.money(teams)


def test_jobs_page_shows_own_jobs_hardware_event_and_what_operators_did(world, client):
    _faults_and_actions(FIXED_NOW)
    page = signed_in(client, "llm-dev").get("/portal/llm-core/jobs/?days=1").content.decode()
    events = page[page.index('id="bw-hw-events-table"'):]
    events = events[:events.index("</table>")]
    assert re.findall(r'<tr data-event-job="([^"]+)" data-gpu="([^"]+)" data-code="(\d+)"', events) == [
        ("slurm:101", "GPU-node-101-0", "48")]
    assert "node-101 #0" in events and "Double bit ECC error" in events and "GPU failed" in events
    assert "Drain node · succeeded" in events and "secret reason" not in events
    assert "node-201" not in page and "GPU-node-201-0" not in page and "Awaiting" not in events
    row = page[page.index('<tr data-job="slurm:101"'):]
    assert "XID 48" in row[:row.index("</tr>")]


def test_health_page_lists_the_teams_events_and_not_another_tenants(world, client):
    _faults_and_actions(FIXED_NOW)
    serving = signed_in(client, "acme-admin").get("/portal/serving/health/").content.decode()
    assert 'data-gpu="GPU-node-201-0" data-code="79"' in serving and "GPU has fallen off the bus" in serving
    assert "GPU-node-101-0" not in serving.split('id="bw-hw-events"')[1]
    client.logout()
    helix = signed_in(client, "helix-viewer").get("/portal/helix/health/").content.decode()
    assert "No hardware fault touched your jobs" in helix and "node-201" not in helix and "node-101" not in helix


def test_invoice_page_states_the_unmeasured_and_failed_hours_rules(world, client):
    draft = do_generate_invoice(world["tenants"]["llm-core"], *NOV, now=FIXED_NOW)
    page = signed_in(client, "llm-dev").get(f"/portal/llm-core/invoices/{draft.number}/").content.decode()
    rules = page[page.index('id="bw-billing-rules"'):]
    assert "never counted as busy" in rules and "are credited" in rules and "Credit: not charged" in rules


def test_jobs_window_select_has_no_inline_handler(world, client):
    page = signed_in(client, "llm-dev").get("/portal/llm-core/jobs/").content.decode()
    assert "onchange=" not in page and '<select name="days" data-autosubmit>' in page
