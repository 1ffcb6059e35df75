"""The impact preview of a remediation action and the confirmation that guards approving it.

A small fleet (tests.alerts.remediation_helpers.build_fleet) with jobs on it, mapped to tenants through their
scheduler accounts; guard rails made by hand; the clock fixed at FIXED_NOW.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from alerts.models import ActionState, RemediationAction
from alerts.remediation.actions import do_request_action
from alerts.remediation.impact import action_impact, confirm_token, confirmed, impact_of
from core.models import AuditEntry
from dashboard.pages import alerts as page
from telemetry.models import Allocation, GpuEvent, Job
from tenancy.models import Tenant, TenantAccount
from tests import personas
from tests.alerts.remediation_helpers import FIXED_NOW, build_fleet, rail
from tests.telemetry.factories import insert_series

NOW = FIXED_NOW
pytestmark = pytest.mark.django_db


def run_job(external_id: str, name: str, account: str, node, gpu_indexes, *, source: str = "slurm") -> Job:
    job = Job.objects.create(source=source, external_id=external_id, name=name, user="ana", account=account,
                             state="running", start_time=NOW - timedelta(hours=2), gpu_count=len(gpu_indexes))
    for i in gpu_indexes:
        Allocation.objects.create(job=job, node=node, gpu=node.gpus.get(index=i), gpu_index=i,
                                  start=NOW - timedelta(hours=2))
    return job


def tenant(name: str, account: str) -> Tenant:
    org = Tenant.objects.create(name=name, slug=name.lower(), kind="organisation")
    TenantAccount.objects.create(tenant=org, kind="slurm", name=account)
    return org


def request_drain(hostname: str) -> RemediationAction:
    return do_request_action("drain", hostname, mode="approval", reason="xid 79", evidence={},
                             requested_by="playbook:xid-drain-node", now=NOW)


@pytest.fixture
def fleet():
    nodes = build_fleet(8, per_rack=4, gpus=8)
    tenant("Acme", "acme-ml")
    run_job("1001", "llama-pretrain", "acme-ml", nodes[0], range(0, 6))
    run_job("1002", "eval-sweep", "orphan-acct", nodes[0], [6])
    finished = run_job("999", "old-run", "acme-ml", nodes[0], [7])
    Allocation.objects.filter(job=finished).update(end=NOW - timedelta(hours=1))
    return nodes


# --- the preview --------------------------------------------------------------------------------------

def test_preview_lists_running_jobs_tenants_and_gpus_of_the_node(fleet):
    impact = impact_of("drain", "gpu-node-00", now=NOW)
    assert impact.gpus == 8 and impact.node == "gpu-node-00"
    assert [(j.key, j.name, j.gpus, j.tenant) for j in impact.jobs] == [
        ("slurm:1001", "llama-pretrain", 6, "Acme"), ("slurm:1002", "eval-sweep", 1, None)]
    assert impact.tenants == ["Acme", "account orphan-acct (no tenant)"]


def test_preview_of_a_gpu_reset_counts_one_gpu_and_the_job_holding_it(fleet):
    impact = impact_of("gpu_reset", "GPU-gpu-node-00-6", now=NOW)
    assert impact.gpus == 1 and [j.key for j in impact.jobs] == ["slurm:1002"]


def test_preview_of_a_node_with_no_jobs_says_so(fleet):
    impact = impact_of("drain", "gpu-node-05", now=NOW)
    assert impact.jobs == [] and impact.tenants == [] and impact.gpus == 8 and impact.known
    assert impact.allowed


def test_preview_of_an_unknown_node_says_it_is_unknown(fleet):
    impact = impact_of("drain", "no-such-node", now=NOW)
    assert not impact.known and impact.gpus == 0 and "not in the inventory" in impact.notes[0]


def test_budget_arithmetic_counts_earlier_drains_in_the_window(fleet):
    rail("drain", "cluster", max_count=4)
    rail("drain", "rack", max_fraction=0.5)
    for node in ("gpu-node-01", "gpu-node-04"):
        action = request_drain(node)
        RemediationAction.objects.filter(pk=action.pk).update(state=ActionState.SUCCEEDED, decided_at=NOW)
    # Outside the one-hour window: not counted.
    old = request_drain("gpu-node-06")
    RemediationAction.objects.filter(pk=old.pk).update(state=ActionState.SUCCEEDED, decided_at=NOW - timedelta(hours=2))

    impact = impact_of("drain", "gpu-node-00", now=NOW)
    cluster, rack = impact.budgets
    assert (cluster.used, cluster.cap, cluster.left_after, cluster.exhausted) == (2, 4, 1, False)
    assert (rack.group, rack.used, rack.cap, rack.left_after) == ("gpu-node-rack-0", 1, 2, 0)
    lines = impact.budget_lines()
    assert lines[0] == "uses 1 of 4 drains of the cluster budget for the last hour; 2 used before, 1 left after"
    assert lines[1].startswith("uses 1 of 2 drains (50% of 4) of the rack gpu-node-rack-0 budget")
    assert impact.allowed and impact.blocked_reason == ""


def test_exhausted_budget_blocks_and_says_so(fleet):
    rail("drain", "cluster", max_count=1)
    first = request_drain("gpu-node-01")
    RemediationAction.objects.filter(pk=first.pk).update(state=ActionState.APPROVED, decided_at=NOW)
    impact = impact_of("drain", "gpu-node-00", now=NOW)
    (cluster,) = impact.budgets
    assert cluster.exhausted and cluster.left_after == -1
    assert impact.budget_lines() == ["uses 1 of 1 drains of the cluster budget for the last hour: exhausted, "
                                     "1 already used; refused"]
    assert impact.blocked_reason.startswith("cluster cap: 1 of 1 drains") and not impact.allowed


def test_confirm_token_is_stale_once_the_impact_changes(fleet):
    action = request_drain("gpu-node-05")
    token = confirm_token(action_impact(action, now=NOW))
    assert confirmed(action_impact(action, now=NOW), token)
    run_job("1003", "late-starter", "acme-ml", fleet[5], [0])
    assert not confirmed(action_impact(action, now=NOW), token)
    other = request_drain("gpu-node-06")
    assert not confirmed(action_impact(other, now=NOW), confirm_token(action_impact(action, now=NOW)))
    assert not confirmed(action_impact(action, now=NOW), "") and not confirmed(action_impact(action, now=NOW), "x")


def test_line_chart_breaks_at_gaps_and_rounds_its_scale():
    from dashboard.pages.svgchart import line_chart

    t = [NOW + timedelta(minutes=m) for m in range(4)]
    g = line_chart([{"label": "GPU 0", "points": [(t[0], 10.0), (t[1], 73.0), (t[2], None), (t[3], 40.0)]}],
                   t[0], t[3], marks=[t[1], NOW - timedelta(days=1)])
    assert [y["text"] for y in g["y_ticks"]] == ["0", "50", "100"]
    assert g["paths"][0]["d"].count("M") == 2 and g["paths"][0]["d"].count("L") == 1
    assert len(g["marks"]) == 1  # a mark outside the window is not drawn


# --- the confirm page --------------------------------------------------------------------------------

@pytest.fixture
def operator(client, django_user_model, monkeypatch, settings):
    settings.REMEDIATION_BACKEND = "simulator"
    monkeypatch.setattr(page, "now", lambda: NOW)
    return personas.signed_in(personas.operator("oper"), client)


def test_confirm_page_shows_the_preview(operator, fleet):
    rail("drain", "cluster", max_count=4)
    action = request_drain("gpu-node-00")
    content = operator.get(f"/remediation/{action.pk}/approve/").content.decode()
    assert "slurm:1001" in content and "llama-pretrain" in content and "Acme" in content
    assert "8 GPUs on gpu-node-00" in content and "0 used before, 3 left after" in content
    assert 'name="confirm"' in content and "bw-confirm" in content
    partial = operator.get(f"/remediation/{action.pk}/approve/?partial=1").content.decode()
    assert "<html" not in partial and "llama-pretrain" in partial


def test_post_without_confirmation_does_not_act(operator, fleet):
    action = request_drain("gpu-node-00")
    response = operator.post(f"/remediation/{action.pk}/approve/")
    assert response.status_code == 409 and "Nothing was approved" in response.content.decode()
    stale = operator.post(f"/remediation/{action.pk}/approve/", {"confirm": "forged"})
    assert stale.status_code == 409
    action.refresh_from_db()
    assert action.state == ActionState.AWAITING and action.decided_by is None
    assert not AuditEntry.objects.filter(verb="action.approve", object_id=str(action.pk)).exists()


def test_post_with_the_confirm_token_approves(operator, fleet):
    action = request_drain("gpu-node-00")
    token = confirm_token(action_impact(action, now=NOW))
    response = operator.post(f"/remediation/{action.pk}/approve/", {"confirm": token})
    assert response.status_code == 302
    action.refresh_from_db()
    assert action.state != ActionState.AWAITING and action.decided_by.username == "oper"


def test_confirm_with_exhausted_budget_is_refused(operator, fleet):
    rail("drain", "cluster", max_count=1)
    first = request_drain("gpu-node-01")
    RemediationAction.objects.filter(pk=first.pk).update(state=ActionState.SUCCEEDED, decided_at=NOW)
    action = request_drain("gpu-node-00")
    assert action.state == ActionState.BLOCKED
    content = operator.get(f"/remediation/{action.pk}/approve/").content.decode()
    assert "exhausted" in content and "Refused:" in content and "bw-confirm\"" not in content
    token = confirm_token(action_impact(action, now=NOW))
    operator.post(f"/remediation/{action.pk}/approve/", {"confirm": token})
    action.refresh_from_db()
    assert action.state == ActionState.BLOCKED and "cluster cap" in action.blocked_reason
    assert "refused by a guard rail" in operator.get("/remediation/").content.decode()


def test_evidence_page_shows_a_timeline_and_raw_json_behind_a_toggle(operator, fleet):
    gpu = fleet[0].gpus.get(index=3)
    GpuEvent.objects.create(gpu=gpu, kind="xid", code=79, first_seen=NOW - timedelta(minutes=20),
                            last_seen=NOW - timedelta(minutes=20), source="kmsg")
    insert_series("gpu", gpu.pk, "gpu_temp", [(NOW - timedelta(minutes=m), 60.0 + m / 10) for m in range(40, 20, -1)])
    action = request_drain("gpu-node-00")
    content = operator.get(f"/remediation/{action.pk}/").content.decode()
    chart = content.split('data-field="gpu_temp"', 1)[1].split("</figure>", 1)[0]
    assert '<path d="M' in chart and "GPU 3" in chart and 'class="bw-mark"' in chart
    assert "No gpu_util data in this window." in content  # a GPU with a fault, but none of this metric
    timeline = content.split('id="bw-evidence-timeline"', 1)[1].split("</ol>", 1)[0]
    assert "XID 79 (GPU has fallen off the bus) on GPU 3 of gpu-node-00" in timeline
    assert "Drain node of gpu-node-00 proposed" in timeline
    assert timeline.index("XID 79") < timeline.index("proposed")  # oldest first
    raw = content.split('id="bw-raw-evidence"', 1)[1]
    assert raw.lstrip().startswith("><summary>") and "&quot;target&quot;" in raw.split("</details>", 1)[0]


def test_api_preview_and_confirmed_approval(client, django_user_model, fleet, settings):
    settings.REMEDIATION_BACKEND = "simulator"
    personas.signed_in(personas.operator("api-op"), client)
    action = request_drain("gpu-node-00")
    preview = client.get(f"/api/v1/remediation/actions/{action.pk}/impact").json()
    assert preview["gpus"] == 8 and preview["tenants"] == ["Acme", "account orphan-acct (no tenant)"]
    assert [j["key"] for j in preview["jobs"]] == ["slurm:1001", "slurm:1002"]
    run_job("1004", "newcomer", "acme-ml", fleet[0], [7])
    csrf = {"HTTP_X_CSRFTOKEN": "x" * 32}
    client.cookies["csrftoken"] = "x" * 32
    stale = client.post(f"/api/v1/remediation/actions/{action.pk}/approve", {"confirm": preview["confirm"]},
                        content_type="application/json", **csrf)
    assert stale.status_code == 409 and stale.json()["error"]["field"] == "confirm"
    fresh = client.get(f"/api/v1/remediation/actions/{action.pk}/impact").json()
    done = client.post(f"/api/v1/remediation/actions/{action.pk}/approve", {"confirm": fresh["confirm"]},
                       content_type="application/json", **csrf)
    assert done.status_code == 200 and done.json()["decided_by"] == "api-op"
