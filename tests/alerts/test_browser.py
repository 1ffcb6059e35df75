"""The alerting pages in a real browser against a real daphne: an operator signs in, creates a rule in the
form, sees the alert it raises, acknowledges it, and approves a drain waiting in the remediation queue.
The screenshots (alerts, remediation) are the README's."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from alerts.lifecycle import Observation, do_apply_observations
from alerts.models import ActionState, Alert, Rule, Silence
from core.models import AuditEntry
from tests import personas
from tests.alerts.test_pages import make_action, make_alert
from tests.conftest import save_screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PASSWORD = personas.PASSWORD
H = timedelta(hours=1)


def _scenery(now) -> None:
    """Other alerts and actions, so the screenshots show a console in use."""
    silence = Silence.objects.create(matchers=[{"name": "node", "op": "=", "value": "gpu-0007"}], starts_at=now - H,
                                     ends_at=now + H, author="ops", comment="PSU swap")
    make_alert("NodeDown", kind="node", key="gpu-0007", severity="critical", starts=now - 0.4 * H, silenced_by=silence)
    make_alert("IbSymbolErrors", kind="port", key="leaf-03:p12", starts=now - 3.2 * H,
               annotations={"summary": "Symbol errors at 42/min on port leaf-03:p12"})
    make_alert("JobStraggler", kind="job", key="slurm:18842", severity="info", starts=now - 0.2 * H,
               annotations={"summary": "A rank of job slurm:18842 is straggling"})
    make_action("gpu_reset", "GPU-5d1c0e2a", ActionState.SUGGESTED, mode="suggest", created_at=now - 2 * H,
                reason="XID 48 (double-bit ECC)")
    make_action("drain", "gpu-0011", ActionState.SHADOWED, mode="shadow", created_at=now - 3 * H,
                reason="XID 79 (fallen off the bus)")
    make_action("drain", "gpu-0004", ActionState.SUCCEEDED, created_at=now - 5 * H, backend="simulator",
                verified=True, finished_at=now - 4.9 * H, reason="XID 94 (contained ECC error)",
                result={"verification": "node state drained"}, decided_by=get_user_model().objects.get(username="op"))


def test_operator_creates_a_rule_acks_its_alert_and_approves_a_drain(asgi_server, browser_page, settings):
    settings.REMEDIATION_BACKEND = "simulator"
    personas.operator("op")
    now = timezone.now()
    _scenery(now)
    errors, page, url = [], browser_page, asgi_server.url
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    page.goto(f"{url}/login/?next=/alerts/rules/")
    page.fill("input[name=username]", "op")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{url}/alerts/rules/")

    # The rule form shows the fields of the chosen kind only.
    page.select_option("#id_kind", "xid")
    assert page.locator("#bw-field-xid_codes").is_visible() and not page.locator("#bw-field-metric").is_visible()
    page.select_option("#id_kind", "threshold")
    assert page.locator("#bw-field-metric").is_visible() and not page.locator("#bw-field-xid_codes").is_visible()
    page.fill("#id_name", "GpuOverheating")
    page.fill("#id_metric", "gpu_temp")
    page.fill("#id_threshold", "87")
    page.select_option("#id_severity", "critical")
    page.fill("#id_labels", "team=infra")
    page.fill("#id_summary", "GPU at {value:.0f} °C on {entity}")
    page.click("#bw-rule-save")
    page.wait_for_selector("#bw-messages >> text=Rule GpuOverheating created.")
    rule = Rule.objects.get(name="GpuOverheating")
    assert page.locator(f'#bw-rules tr[data-id="{rule.pk}"]').count() == 1
    assert (rule.threshold, rule.severity, rule.labels) == (87.0, "critical", {"team": "infra"})

    # The evaluator finds the condition holding; the alert shows on the Alerts page.
    labels = {"alertname": rule.name, "severity": "critical", "team": "infra", "gpu": "GPU-7f3a", "node": "gpu-0003"}
    do_apply_observations(rule, [Observation(labels=labels, annotations={"summary": "GPU at 91 °C on GPU-7f3a"},
                                             entity_kind="gpu", entity_key="GPU-7f3a", value=91.0)], now)
    alert = Alert.objects.get(rule=rule)
    page.goto(f"{url}/alerts/")
    row = page.locator(f'#bw-open-alerts tr[data-id="{alert.pk}"]')
    assert row.locator(".bw-alert-name").inner_text() == "GpuOverheating"
    assert row.locator('a[href="/gpus/GPU-7f3a/"]').count() == 1
    assert page.locator("#bw-open-alerts tbody tr").first.get_attribute("data-id") in {
        str(a.pk) for a in Alert.objects.filter(severity="critical")}
    row.locator("button.bw-ack").click()
    page.wait_for_selector("#bw-messages >> text=Alert acknowledged.")
    row = page.locator(f'#bw-open-alerts tr[data-id="{alert.pk}"]')
    assert row.get_attribute("data-state") == "acknowledged" and "by op" in row.inner_text()
    alert.refresh_from_db()
    assert alert.state == "acknowledged" and alert.acked_by.username == "op"
    save_screenshot(page, "alerts", full_page=True)

    # A drain waits for approval; the operator approves it.
    drain = make_action("drain", "gpu-0003", ActionState.AWAITING, alert=alert, created_at=now,
                        reason="GpuOverheating on gpu-0003 for 10 min")
    page.click('.bw-nav a[href="/remediation/"]')
    page.wait_for_url(f"{url}/remediation/")
    page.locator(f'#bw-awaiting tr[data-id="{drain.pk}"] button.bw-approve').click()
    page.locator("#bw-confirm-dialog button.bw-confirm").click()  # the impact preview's confirmation
    page.wait_for_selector(f"#bw-messages >> text=Action {drain.pk} approved.")
    drain.refresh_from_db()
    assert drain.state == ActionState.APPROVED and drain.decided_by.username == "op"
    assert page.locator(f'#bw-awaiting tr[data-id="{drain.pk}"]').count() == 0
    assert page.locator(f'#bw-recent tr[data-id="{drain.pk}"]').get_attribute("data-state") == "approved"
    assert AuditEntry.objects.filter(verb="action.approve", object_id=str(drain.pk), actor="op").exists()
    save_screenshot(page, "remediation", full_page=True)
    assert errors == []
