"""The reliability page in a real browser: plotly.js (served locally) draws this fleet's weekly
failures, the Kaplan-Meier curves and the forest plot without a JavaScript error."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from tests import personas
from tests.conftest import save_screenshot
from tests.dashboard.test_reliability import titan_subset
from tests.telemetry.reliability_seed import expected_failures, seed_fleet

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PASSWORD = personas.PASSWORD


def test_reliability_page_draws_figures(asgi_server, browser_page, tmp_path):
    csv = tmp_path / "gc_subset.csv"
    titan_subset(csv)
    call_command("fit_survival", "--csv", str(csv), "--points", "120", stdout=io.StringIO())
    seed_fleet()
    personas.operator("rel-op")
    errors, page = [], browser_page
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(f"{asgi_server.url}/login/?next=/reliability/")
    page.fill("input[name=username]", "rel-op")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{asgi_server.url}/reliability/")
    for figure in ("bw-fleet-weekly", "bw-km-cage", "bw-km-node", "bw-km-slot", "bw-forest"):
        page.wait_for_selector(f"#{figure}[data-rendered=true] .main-svg", timeout=15_000)
    # Three cages: a band and a line each.
    assert page.locator("#bw-km-cage .scatterlayer .trace").count() == 6
    assert page.locator("#bw-hazard-table tbody tr").count() > 40
    assert page.locator("#bw-fleet-recent tbody tr").count() == len(expected_failures())
    save_screenshot(page, "reliability-laptop", full_page=True)
    assert errors == []
