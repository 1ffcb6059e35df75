"""Every page of the operator console and the tenant portal, in Debian's Chromium against a real daphne, passes
the access checks of `tests.browser_checks`: no serious or critical axe-core violation, no console error, no
CSP violation, a skip link that works from the keyboard, and nothing that scrolls sideways in a 360 px window
(tables and charts scroll inside their own box). A screenshot of each page at 360 px is kept.

One browser for the module and one signed-in tab per role; the world is built once and emptied at the end, so
the pages are parametrized without paying a browser start and a sign-in each.
"""

from __future__ import annotations

import functools
import os
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from alerts.models import ActionState, Channel, Notification, Route, Rule, Silence
from dashboard.pages.portal import floor_day
from telemetry.models import Port
from telemetry.simulator.topology import build_layout, topology_document
from telemetry.topology import do_import_topology
from tenancy.billing import do_generate_invoice
from tenancy.demo import month_start
from tenancy.models import RateCard
from tests import personas
from tests.alerts.test_pages import make_action, make_alert
from tests.browser_checks import page_checks, skip_link_works, watch
from tests.conftest import CHROMIUM_ARGS, _wait_for_function, save_screenshot
from tests.tenancy.test_portal import PASSWORD, build_world

pytestmark = [pytest.mark.browser]
H = timedelta(hours=1)
# 64 nodes: every rail (0-7) has two leaves in the fabric matrix, and the rack heatmap is more than a strip.
CLUSTER_GPUS = 512

# Dash has finished its first round of callbacks when no component is loading any more.
SETTLED = """() => document.querySelector('#react-entry-point') === null ||
  (document.querySelector('#react-entry-point').children.length > 0 &&
   document.querySelectorAll('[data-dash-is-loading="true"]').length === 0)"""

# (role, path, expected status); {names} are filled from the world.
PAGES = [
    ("operator", "/", 200),
    ("operator", "/racks/", 200),
    ("operator", "/nodes/{node}/", 200),
    ("operator", "/gpus/{gpu}/", 200),
    ("operator", "/ports/{port}/", 200),
    ("operator", "/jobs/", 200),
    ("operator", "/jobs/slurm:101/", 200),
    ("operator", "/fabric/", 200),
    ("operator", "/nvlink/", 200),
    ("operator", "/power/", 200),
    ("operator", "/anomalies/", 200),
    ("operator", "/reliability/", 200),
    ("operator", "/search/?q=node-101", 200),
    ("operator", "/alerts/", 200),
    ("operator", "/alerts/{alert}/", 200),
    ("operator", "/alerts/rules/", 200),
    ("operator", "/alerts/rules/{rule}/", 200),
    ("operator", "/alerts/silences/", 200),
    ("operator", "/alerts/routing/", 200),
    ("operator", "/alerts/channels/", 200),
    ("operator", "/alerts/notifications/{notification}/", 200),
    ("operator", "/audit/", 200),
    ("operator", "/remediation/", 200),
    ("operator", "/chargeback/?period={period}", 200),
    ("operator", "/chargeback/invoices/{invoice}/", 200),
    ("operator", "/nodes/no-such-host/", 404),
    ("tenant", "/portal/llm-core/", 200),
    ("tenant", "/portal/llm-core/jobs/", 200),
    ("tenant", "/portal/llm-core/health/", 200),
    ("tenant", "/portal/llm-core/invoices/", 200),
    ("tenant", "/portal/llm-core/invoices/{invoice}/", 200),
    ("anonymous", "/login/", 200),
]


def _alerting(now) -> dict:
    """A rule, alerts, a silence, a routed channel with a delivered notification and remediation actions."""
    rule = Rule.objects.create(name="GpuHot", kind="threshold", metric="gpu_temp", op=">", threshold=87,
                               severity="critical", labels={"team": "infra"})
    hot = make_alert("GpuHot", severity="critical", key="GPU-node-101-1", rule=rule, value=91.0, starts=now - H,
                     annotations={"summary": "GPU at 91 °C on GPU-node-101-1"})
    silence = Silence.objects.create(matchers=[{"name": "node", "op": "=", "value": "node-301"}], starts_at=now - H,
                                     ends_at=now + H, author="ops", comment="PSU swap")
    make_alert("NodeDown", kind="node", key="node-301", severity="critical", starts=now - 0.4 * H,
               silenced_by=silence)
    webhook = Channel.objects.create(name="ops-webhook", kind="webhook", config={"url": "http://127.0.0.1:9/x"},
                                     secret="s3cret", last_ok_at=now - H)
    Route.objects.create(name="root", group_by=["alertname"]).channels.add(webhook)
    note = Notification.objects.create(channel=webhook, event="trigger", status="delivered", dedup_key="d1",
                                       payload={"title": "GpuHot"}, attempts=1, created_at=now - H,
                                       delivered_at=now - H)
    note.alerts.add(hot)
    make_action("drain", "node-101", ActionState.AWAITING, alert=hot, created_at=now - 0.5 * H)
    make_action("gpu_reset", "GPU-node-101-0", ActionState.SUGGESTED, mode="suggest", created_at=now - 2 * H)
    return {"alert": hot.pk, "rule": rule.pk, "notification": note.pk}


def _build(now) -> dict:
    do_import_topology(topology_document(build_layout(CLUSTER_GPUS)))
    world = build_world(now)
    personas.operator("op")
    # As in the portal's browser test: every day of the 30-day charts is priced, and the month holding the
    # first metered day is invoiced.
    RateCard.objects.filter(pk=world["card"].pk).update(effective_from=floor_day(now) - timedelta(days=40))
    start = month_start(now - timedelta(days=10))
    end = start.replace(year=start.year + start.month // 12, month=start.month % 12 + 1)
    invoice = do_generate_invoice(world["tenants"]["llm-core"], start, end, now=now)
    port = Port.objects.filter(switch__isnull=False).order_by("id").first()
    return {"node": "node-101", "gpu": "GPU-node-101-0", "port": port.pk, "invoice": invoice.number,
            "period": f"{start:%Y-%m}", **_alerting(now)}


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):
    """The world, committed for daphne to read, then emptied the way a transactional test leaves the database."""
    with django_db_blocker.unblock():
        built = _build(timezone.now())
    yield built
    with django_db_blocker.unblock():
        call_command("flush", verbosity=0, interactive=False)


@pytest.fixture(scope="module")
def chromium():
    """One Debian Chromium for the module (the per-test `browser_page` would start one per page)."""
    from playwright.sync_api import sync_playwright

    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        yield browser
        browser.close()
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


@pytest.fixture(scope="module")
def tabs(chromium, asgi_server, world):
    """A tab per role, each signed in once and watched from its first page on."""
    out = {}
    for role, username in (("operator", "op"), ("tenant", "llm-dev"), ("anonymous", None)):
        page = chromium.new_context(viewport={"width": 1366, "height": 900}).new_page()
        page.wait_for_function = functools.partial(_wait_for_function, page)
        watch(page)
        if username:
            page.goto(f"{asgi_server.url}/login/")
            page.fill("input[name=username]", username)
            page.fill("input[name=password]", PASSWORD)
            page.click("button[type=submit]")
            page.wait_for_load_state()
            assert "/login/" not in page.url, f"{username} could not sign in"
        out[role] = page
    return out


def _shot_name(role: str, path: str) -> str:
    name = path.strip("/").split("?")[0].replace("/", "-").replace(":", "-") or "fleet"
    return f"access-{role}-{name}-360"


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("role", "template", "status"), PAGES, ids=[f"{r}:{p}" for r, p, _ in PAGES])
def test_page_passes_axe_keyboard_overflow_and_csp_checks(tabs, world, asgi_server, role, template, status):
    page, path = tabs[role], template.format(**world)
    page._bw_checks.take()  # what an earlier page left behind (a late websocket close) is not this page's
    response = page.goto(f"{asgi_server.url}{path}")
    assert response.status == status, (path, response.status)
    page.wait_for_function(SETTLED, timeout=20_000)
    page.wait_for_timeout(500)  # clientside figures draw, and their errors surface, just after

    works, what = skip_link_works(page)
    assert works, f"{path}: skip link: {what}"
    found = page_checks(page, on_narrow=lambda p: save_screenshot(p, _shot_name(role, path)))

    if status != 200:  # Chromium logs the page's own error status as a console error; that one is expected
        found["console_errors"] = [e for e in found["console_errors"] if f"status of {status}" not in e]
    problems = {key: found[key] for key in ("axe_violations", "overflowing", "clipped", "console_errors",
                                            "csp_violations") if found[key]}
    if found["overflow_360"]:
        problems["overflow_360"] = found["overflow_360"]
    assert not problems, f"{path}: {problems}"
