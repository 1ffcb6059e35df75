"""The tenant portal and the chargeback page in a real browser against a real daphne.

A tenant's member signs in, lands on their portal, sees the usage chart drawn and the waste message, and
downloads an invoice as CSV; then an operator opens the chargeback page. The screenshots (portal,
chargeback) are the README's.
"""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.pages.portal import floor_day
from tenancy.billing import do_generate_invoice
from tenancy.demo import month_start
from tenancy.models import RateCard
from tests import personas
from tests.conftest import save_screenshot
from tests.tenancy.test_portal import PASSWORD, build_world

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _sign_in(page, url: str, username: str, start: str) -> None:
    page.goto(f"{url}{start}")  # not signed in: the login page, which returns here afterwards
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")


def test_tenant_lands_on_portal_sees_usage_and_waste_and_downloads_invoice(asgi_server, browser_page):
    now = timezone.now()
    world = build_world(now)
    # The server's clock is the real one: the demo card (from this month's start) is moved back so that
    # every day of the 30-day charts is priced, whatever the day of the month the test runs on.
    RateCard.objects.filter(pk=world["card"].pk).update(effective_from=floor_day(now) - timedelta(days=40))
    # The world's usage spans the last ten days: invoice the month that holds the first of them (early in a month
    # this month's invoice would still be empty).
    start = month_start(now - timedelta(days=10))
    draft = do_generate_invoice(world["tenants"]["llm-core"], start, start.replace(
        year=start.year + start.month // 12, month=start.month % 12 + 1), now=now)
    errors, page, url = [], browser_page, asgi_server.url
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    _sign_in(page, url, "llm-dev", "/portal/")
    page.wait_for_url(f"{url}/portal/llm-core/")
    page.wait_for_selector("#bw-usage-chart[data-rendered=true]")
    page.wait_for_selector("#bw-cost-chart[data-rendered=true]")
    assert page.locator("#bw-usage-chart .trace.bars").count() == 4  # busy, idle-held, unmeasured and lost
    waste = page.locator("#bw-waste").inner_text()
    assert "idle-held GPU-hours" in waste and ("slurm:102" in waste or "jupyter-notebook" in waste)
    nav = page.locator("header nav").inner_text()
    assert "LLM Core" in nav and "Fleet" not in nav and "Chargeback" not in nav
    save_screenshot(page, "portal", full_page=True)

    page.click("a[href='/portal/llm-core/invoices/']")
    row = page.locator(f"#bw-invoices tr[data-number='{draft.number}']")
    with page.expect_download() as download:
        row.locator("a.bw-export-csv").click()
    body = open(download.value.path(), encoding="utf-8").read()
    rows = list(csv.DictReader(io.StringIO(body)))
    assert download.value.suggested_filename == f"{draft.number}.csv"
    assert rows[-1]["kind"] == "total" and rows[-1]["amount"] == f"{draft.total:f}"
    assert {r["job_key"] for r in rows[:-1]} == {"slurm:101", "slurm:102"}

    page.click("header button[type=submit]")  # log out
    personas.operator("op")
    _sign_in(page, url, "op", f"/chargeback/?period={start:%Y-%m}")
    page.wait_for_url(f"{url}/chargeback/?period={start:%Y-%m}")
    table = page.locator("#bw-tenants")
    for slug in ("acme", "llm-core", "serving", "helix", "hpc-science"):
        assert table.locator(f"tr[data-tenant='{slug}']").count() == 1
    assert page.locator(f"#bw-invoices tr[data-number='{draft.number}']").count() == 1
    assert page.locator("#bw-fair-share tbody tr").count() >= 5
    save_screenshot(page, "chargeback", full_page=True)
    assert errors == []


def test_tenant_sees_its_jobs_hardware_event_and_the_window_changes_the_list(asgi_server, browser_page):
    from telemetry.models import Job, JobStateChange
    from tenancy.models import UsageHour
    from tests.tenancy.test_portal import _faults_and_actions

    now = timezone.now()
    world = build_world(now)
    _faults_and_actions(now)
    # A job of five days ago: inside the 30-day window, outside the 1-day one.
    old = Job.objects.create(source="slurm", external_id="103", name="old-sweep", account="llm-core", qos="normal",
                             state="completed", start_time=now - timedelta(days=5), end_time=now - timedelta(days=5))
    JobStateChange.objects.create(job=old, time=old.start_time, state="running")
    UsageHour.objects.create(hour=floor_day(now) - timedelta(days=5), tenant=world["tenants"]["llm-core"], job=old,
                             gpu_model="H100", qos="normal", gpu_hours=1, busy_hours=1)
    # The world's usage lies at 10:00-15:59 of the days before today: after 16:00 the last 24 hours would hold
    # none of it, so job 101 is given the hour that has just ended.
    hour = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    UsageHour.objects.create(hour=hour, tenant=world["tenants"]["llm-core"], job=world["jobs"]["101"],
                             gpu_model="H100", qos="normal", gpu_hours=4, busy_hours=4)
    errors, page, url = [], browser_page, asgi_server.url
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: msg.type == "error" and errors.append(msg.text))
    page.add_init_script('window.__csp = []; document.addEventListener("securitypolicyviolation", '
                         'function (e) { window.__csp.push(e.violatedDirective + " " + e.blockedURI); });')

    _sign_in(page, url, "llm-dev", "/portal/llm-core/jobs/?days=30")
    page.wait_for_url(f"{url}/portal/llm-core/jobs/?days=30")
    jobs = page.locator("#bw-jobs")
    assert jobs.locator("tr[data-job='slurm:103']").count() == 1
    events = page.locator("#bw-hw-events-table")
    mine = events.locator("tr[data-event-job='slurm:101'][data-gpu='GPU-node-101-0'][data-code='48']")
    assert mine.count() == 1
    text = mine.inner_text()
    assert "node-101 #0" in text and "XID 48" in text and "Double bit ECC error" in text and "Drain node" in text
    assert "node-201" not in page.content() and "GPU-node-201-0" not in page.content()
    save_screenshot(page, "portal-hardware-events", full_page=True)

    page.select_option("select[name=days]", "1")  # no button: forms.js submits on change
    page.wait_for_url(f"{url}/portal/llm-core/jobs/?days=1")
    assert page.locator("#bw-jobs tr[data-job='slurm:103']").count() == 0
    assert page.locator("#bw-jobs tr[data-job='slurm:101']").count() == 1
    assert page.evaluate("window.__csp") == [] and errors == []
