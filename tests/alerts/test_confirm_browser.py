"""Approving in a real browser: the Approve button opens a dialog with the impact preview; Esc and Cancel leave
the action pending (focus back on the button); confirming approves it. The evidence page shows a timeline, and
its raw JSON only once toggled. Chromium against daphne, under the pages' strict CSP."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from alerts.models import ActionState, RemediationAction
from alerts.remediation.actions import do_request_action
from telemetry.models import GpuEvent
from tests import personas
from tests.alerts.remediation_helpers import build_fleet, rail
from tests.alerts.test_impact import run_job, tenant
from tests.conftest import save_screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PASSWORD = personas.PASSWORD


def _sign_in(page, url: str) -> None:
    page.goto(f"{url}/login/?next=/remediation/")
    page.fill("input[name=username]", "op")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{url}/remediation/")


def _focus_in_dialog(page) -> bool:
    return page.evaluate("() => !!document.activeElement.closest('#bw-confirm-dialog')")


def test_approve_shows_the_impact_in_a_dialog_and_acts_only_on_confirm(asgi_server, browser_page):
    personas.operator("op")
    now = timezone.now()
    nodes = build_fleet(4, gpus=8)
    tenant("Acme", "acme-ml")
    run_job("5001", "llama-pretrain", "acme-ml", nodes[0], range(8))
    rail("drain", "cluster", max_count=2)
    GpuEvent.objects.create(gpu=nodes[0].gpus.get(index=2), kind="xid", code=79, first_seen=now - timedelta(minutes=9),
                            last_seen=now - timedelta(minutes=9), source="kmsg")
    drain = do_request_action("drain", nodes[0].hostname, mode="approval", reason="XID 79 on GPU 2", evidence={},
                              requested_by="playbook:xid-drain-node", now=now)
    page, url, errors, csp = browser_page, asgi_server.url, [], []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: csp.append(msg.text) if "Content Security Policy" in msg.text else None)
    _sign_in(page, url)

    button = page.locator(f'#bw-awaiting tr[data-id="{drain.pk}"] button.bw-approve')
    dialog = page.locator("#bw-confirm-dialog")

    # Esc cancels: nothing approved, focus back on the button.
    button.click()
    dialog.locator(".bw-impact").wait_for()
    assert dialog.evaluate("d => d.open") and _focus_in_dialog(page)
    text = dialog.inner_text()
    assert "slurm:5001" in text and "llama-pretrain" in text and "Acme" in text and "8 GPUs on gpu-node-00" in text
    assert "uses 1 of 2 drains of the cluster budget for the last hour; 0 used before, 1 left after" in text
    save_screenshot(page, "remediation-confirm")
    page.keyboard.press("Escape")
    page.wait_for_function("() => !document.getElementById('bw-confirm-dialog').open")
    assert page.evaluate("() => document.activeElement.classList.contains('bw-approve')")
    assert RemediationAction.objects.get(pk=drain.pk).state == ActionState.AWAITING

    # Cancel leaves it pending too.
    button.click()
    dialog.locator(".bw-cancel").click()
    page.wait_for_function("() => !document.getElementById('bw-confirm-dialog').open")
    assert RemediationAction.objects.get(pk=drain.pk).state == ActionState.AWAITING

    # Confirm approves it.
    button.click()
    dialog.locator("button.bw-confirm").click()
    page.wait_for_selector(f"#bw-messages >> text=Action {drain.pk} approved.")
    drain.refresh_from_db()
    assert drain.state == ActionState.APPROVED and drain.decided_by.username == "op"

    # Its evidence: a timeline, the raw JSON only after the toggle.
    page.goto(f"{url}/remediation/{drain.pk}/")
    timeline = page.locator("#bw-evidence-timeline")
    assert "XID 79 (GPU has fallen off the bus) on GPU 2 of gpu-node-00" in timeline.inner_text()
    assert "Approved by op" in timeline.inner_text()
    raw = page.locator("#bw-raw-evidence pre")
    assert not raw.is_visible()
    page.locator("#bw-raw-evidence summary").click()
    assert raw.is_visible() and '"target"' in raw.inner_text()
    save_screenshot(page, "remediation-evidence", full_page=True)
    assert errors == [] and csp == []
