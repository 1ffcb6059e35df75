"""Remediation actions: modes, approvals, idempotency, execution, evidence, audit, playbooks and the burst."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import DatabaseError, connections, transaction

from alerts import live
from alerts.models import Channel, GuardRail, Notification, Playbook, RemediationAction, Rule
from alerts.remediation.actions import ActionError, do_approve_action, do_reject_action, do_request_action
from alerts.remediation.defaults import install_default_playbooks
from alerts.remediation.executor import execute
from alerts.remediation.playbooks import run_playbooks_for_alerts
from anomaly.models import ModelVersion
from core.audit import do_audit
from core.models import AuditEntry
from telemetry.models import SAMPLE_MODELS, Node
from tests import personas
from tests.alerts import remediation_helpers as helpers
from tests.alerts.remediation_helpers import FIXED_NOW, build_fleet, make_alert, rail

pytestmark = pytest.mark.django_db
eager_celery, fake_scontrol = helpers.eager_celery, helpers.fake_scontrol  # fixtures


@pytest.fixture
def operator(django_user_model):
    return personas.operator("olivia")


def _scheduled(callbacks: list) -> list:
    """The after-commit work besides telling the live pages (alerts.live), which every change does."""
    return [c for c in callbacks if getattr(c, "func", None) is not live.publish]


def _request(kind="drain", target="gpu-node-00", mode="approval", **kw):
    return do_request_action(kind, target, mode=mode, reason=kw.pop("reason", "XID 79 on GPU 3"),
                             evidence=kw.pop("evidence", {}), requested_by=kw.pop("requested_by", "olivia"), **kw)


def _audit() -> list[tuple[str, str]]:
    return list(AuditEntry.objects.order_by("id").values_list("verb", "outcome"))


# --- Modes ------------------------------------------------------------------------------------------------

def test_suggest_mode_records_evidence_and_schedules_nothing(django_capture_on_commit_callbacks):
    node = build_fleet(1)[0]
    gpu = node.gpus.get(index=0)
    SAMPLE_MODELS["gpu"]["latest"].objects.create(gpu_id=gpu.pk, time=FIXED_NOW, gpu_temp=91.0, xid=79)
    ModelVersion.objects.create(kind="failure", version=3, status="active", created_at=FIXED_NOW, artefact=b"",
                                artefact_sha256="0" * 64)
    alert = make_alert("XidNodeFault", {"node": node.hostname, "gpu": gpu.uuid, "xid": "79"}, value=79)
    with django_capture_on_commit_callbacks() as callbacks:
        action = _request(mode="suggest", alert=alert, evidence={"note": "from the test"}, now=FIXED_NOW)
    assert action.state == "suggested" and _scheduled(callbacks) == []
    ev = action.evidence
    assert ev["note"] == "from the test" and ev["alert"]["id"] == alert.pk and ev["alert"]["value"] == 79
    assert ev["metrics"][gpu.uuid]["gpu_temp"] == 91.0 and ev["metrics"][gpu.uuid]["xid"] == 79
    assert ev["models"]["failure"]["version"] == 3
    assert ev["target"] == {"kind": "node", "key": node.hostname, "known": True, "node": node.hostname,
                            "node_state": "active"}
    entry = AuditEntry.objects.get()
    assert (entry.verb, entry.outcome, entry.actor, entry.object_id) == ("action.request", "suggested", "olivia",
                                                                         str(action.pk))


def test_approval_mode_waits_then_approve_executes_and_verifies(operator, django_capture_on_commit_callbacks):
    build_fleet(1)
    action = _request(mode="approval")
    assert action.state == "awaiting" and action.decided_at is None
    with django_capture_on_commit_callbacks() as callbacks:
        approved = do_approve_action(action.pk, operator)
    assert approved.state == "approved" and approved.decided_by == operator and len(_scheduled(callbacks)) == 1
    assert execute(action.pk) == "succeeded"
    action.refresh_from_db()
    assert action.verified is True and action.backend == "simulator" and action.finished_at is not None
    assert action.result["commands"][0]["cmd"] == "set node gpu-node-00 state drained"
    assert action.result["verification"] == {"check": "inventory node state", "state": "drained"}
    assert Node.objects.get(hostname="gpu-node-00").state == "drained"
    assert _audit() == [("action.request", "awaiting"), ("action.approve", "approved"),
                        ("action.execute", "started"), ("action.execute", "succeeded"), ("action.verify", "verified")]


def test_auto_mode_approves_and_runs_after_commit(eager_celery, django_capture_on_commit_callbacks):
    build_fleet(1)
    with django_capture_on_commit_callbacks(execute=True):
        action = _request(mode="auto", requested_by="playbook:xid-drain-node")
    action.refresh_from_db()
    assert action.state == "succeeded" and action.decided_at is not None and action.decided_by is None
    assert Node.objects.get(hostname="gpu-node-00").state == "drained"


def test_shadow_mode_records_would_run_and_runs_nothing(fake_scontrol, django_capture_on_commit_callbacks):
    build_fleet(1)
    with django_capture_on_commit_callbacks() as callbacks:
        action = _request(mode="shadow", reason="XID 79")
    assert action.state == "shadowed" and _scheduled(callbacks) == []
    assert action.result == {"would_run": ["scontrol update NodeName=gpu-node-00 State=DRAIN "
                                           "'Reason=breakwater: XID 79'"], "guard": {"passed": True, "reason": ""}}
    assert execute(action.pk) == f"nothing to do: action #{action.pk} is shadowed"
    assert fake_scontrol() == [] and Node.objects.get(hostname="gpu-node-00").state == "active"


def test_shadow_requests_count_earlier_shadow_passes_against_the_cap():
    build_fleet(3)
    rail("drain", "cluster", max_count=2)
    actions = [_request(target=f"gpu-node-0{i}", mode="shadow") for i in range(3)]
    assert [a.state for a in actions] == ["shadowed"] * 3
    assert [bool(a.result["would_run"]) for a in actions] == [True, True, False]
    assert actions[2].blocked_reason == "cluster cap: 2 of 2 drains in the last hour"
    assert actions[2].result["guard"] == {"passed": False, "reason": actions[2].blocked_reason}


# --- Idempotency ------------------------------------------------------------------------------------------

def test_same_alert_kind_and_target_give_one_action():
    node = build_fleet(1)[0]
    alert = make_alert("XidNodeFault", {"node": node.hostname, "xid": "79"}, value=79)
    first = _request(alert=alert)
    second = _request(alert=alert, mode="auto")
    assert second.pk == first.pk and second.was_created is False and first.was_created is True
    assert RemediationAction.objects.count() == 1 and AuditEntry.objects.count() == 1


def test_open_action_absorbs_a_second_alert_on_the_same_node():
    node = build_fleet(1)[0]
    gpu0, gpu1 = node.gpus.all()
    first = _request(alert=make_alert("XidNodeFault", {"node": node.hostname, "gpu": gpu0.uuid, "xid": "79"}))
    second = _request(alert=make_alert("XidNodeFault", {"node": node.hostname, "gpu": gpu1.uuid, "xid": "79"}))
    assert second.pk == first.pk and RemediationAction.objects.count() == 1


def test_execute_twice_runs_the_commands_once(fake_scontrol):
    build_fleet(1)
    action = do_approve_action(_request().pk, None)
    assert execute(action.pk) == "succeeded"
    assert execute(action.pk) == f"nothing to do: action #{action.pk} is succeeded"
    updates = [c for c in fake_scontrol() if c.startswith("scontrol update")]
    assert updates == ["scontrol update NodeName=gpu-node-00 State=DRAIN Reason=breakwater: XID 79 on GPU 3"]
    action.refresh_from_db()
    assert action.backend == "slurm" and action.verified is True
    assert action.result["verification"] == {"check": "scontrol -o show node gpu-node-00", "state": "IDLE+DRAIN"}


def test_running_action_is_left_alone_until_stale_then_retried(fake_scontrol):
    build_fleet(1)
    action = do_approve_action(_request().pk, None)
    now = FIXED_NOW + timedelta(days=1)
    RemediationAction.objects.filter(pk=action.pk).update(state="running", backend="slurm",
                                                          started_at=now - timedelta(minutes=1))
    assert execute(action.pk, now=now) == f"nothing to do: action #{action.pk} is running"
    assert fake_scontrol() == []
    RemediationAction.objects.filter(pk=action.pk).update(started_at=now - timedelta(minutes=20))
    assert execute(action.pk, now=now) == "succeeded"
    assert ("action.execute", "retried") in _audit()


def test_drain_of_a_node_already_draining_succeeds_without_a_second_update(fake_scontrol, tmp_path):
    build_fleet(1)
    (tmp_path / "drained-gpu-node-00").touch()  # drained by hand in Slurm; the inventory does not know yet
    action = do_approve_action(_request().pk, None)
    assert execute(action.pk) == "succeeded"
    action.refresh_from_db()
    assert action.result["commands"][-1]["skipped"] == "node already IDLE+DRAIN"
    assert not [c for c in fake_scontrol() if c.startswith("scontrol update")]


def test_failed_command_fails_the_action_with_its_output(fake_scontrol):
    action = do_approve_action(_request("requeue", "slurm:4242").pk, None)
    result = execute(action.pk)
    action.refresh_from_db()
    assert result.startswith("failed: ") and action.state == "failed" and action.verified is None
    assert "exited 1" in action.result["error"] and "unsupported: requeue 4242" in action.result["error"]
    assert action.result["commands"][0]["cmd"] == "scontrol requeue 4242"
    assert _audit()[-2:] == [("action.execute", "failed"), ("action.verify", "unknown")]


# --- Decisions --------------------------------------------------------------------------------------------

def test_reject_records_the_reason_and_refuses_a_later_approval(operator):
    build_fleet(1)
    action = do_reject_action(_request().pk, operator, "the XID came from a driver bug, node is fine")
    assert action.state == "rejected" and action.decided_by == operator
    entry = AuditEntry.objects.get(verb="action.reject")
    assert (entry.actor, entry.reason) == ("olivia", "the XID came from a driver bug, node is fine")
    with pytest.raises(ActionError) as err:
        do_approve_action(action.pk, operator)
    assert err.value.code == "conflict"


@pytest.mark.parametrize(("kind", "params", "message"), [
    ("power_cap", {}, "params.watts"), ("power_cap", {"watts": True}, "params.watts"),
    ("ticket", {}, "params.channel"), ("reboot", {}, "unknown action kind"),
])
def test_bad_request_is_refused_with_the_field(kind, params, message):
    with pytest.raises(ActionError) as err:
        _request(kind, "GPU-x", params=params)
    assert err.value.code == "invalid" and message in err.value.message


def test_audit_log_refuses_update_and_delete():
    entry = do_audit("olivia", "action.approve", "action", 1, reason="checked the node")
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditEntry.objects.filter(pk=entry.pk).update(reason="rewritten")
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditEntry.objects.filter(pk=entry.pk).delete()
    entry.refresh_from_db()
    assert entry.reason == "checked the node"


# --- Tickets ----------------------------------------------------------------------------------------------

def test_ticket_queues_one_notification_keyed_by_the_action(django_capture_on_commit_callbacks):
    node = build_fleet(1)[0]
    gpu = node.gpus.get(index=1)
    Channel.objects.create(name="rma-tickets", kind="webhook", config={"url": "http://127.0.0.1:9/tickets"})
    alert = make_alert("XidNodeFault", {"node": node.hostname, "gpu": gpu.uuid, "xid": "64"}, value=64)
    action = _request("ticket", gpu.uuid, alert=alert, params={"channel": "rma-tickets"}, reason="XID 64")
    do_approve_action(action.pk, None)
    with django_capture_on_commit_callbacks() as callbacks:
        assert execute(action.pk) == "succeeded"
    assert len(_scheduled(callbacks)) == 1  # the delivery, after commit
    note = Notification.objects.get()
    assert (note.dedup_key, note.event, note.status) == (action.idempotency_key, "trigger", "pending")
    assert note.payload["title"] == f"RMA ticket: GPU {gpu.uuid} in gpu-node-00 (GPU 1, serial SN001)"
    assert note.payload["alerts"][0]["id"] == alert.pk and list(note.alerts.all()) == [alert]
    action.refresh_from_db()
    assert action.verified is None and action.result["verification"]["status"] == "pending"


def test_ticket_to_a_missing_channel_fails():
    build_fleet(1)
    action = do_approve_action(_request("ticket", "GPU-gpu-node-00-0", params={"channel": "nope"}).pk, None)
    assert execute(action.pk) == "failed: no channel named 'nope' to open the ticket on (params.channel)"


# --- Playbooks --------------------------------------------------------------------------------------------

def test_default_playbooks_turn_alerts_into_their_catalogue_action():
    install_default_playbooks()
    node = build_fleet(1)[0]
    gpu0, gpu1 = node.gpus.all()
    xid_rule = Rule.objects.create(name="XidNodeFault", kind="xid", xid_actions=["drain_node"])
    alerts = [
        make_alert("XidNodeFault", {"node": node.hostname, "gpu": gpu0.uuid}, value=79, rule=xid_rule),
        make_alert("XidGpuReset", {"node": node.hostname, "gpu": gpu1.uuid, "xid": "48"}, value=48),
        make_alert("XidNodeFault", {"node": node.hostname, "gpu": gpu1.uuid, "xid": "64"}, value=64),
        make_alert("JobStraggler", {"job": "slurm:4242"}, entity_kind="job"),
        make_alert("GpuOverheating", {"node": node.hostname, "gpu": gpu0.uuid}, value=91),
    ]
    ids = [a.pk for a in alerts]
    assert run_playbooks_for_alerts(ids) == 5
    got = {(a.kind, a.target_key, a.state, a.playbook.name, a.alert_id)
           for a in RemediationAction.objects.select_related("playbook")}
    assert got == {("drain", node.hostname, "awaiting", "xid-drain-node", ids[0]),
                   ("drain", node.hostname, "shadowed", "xid-drain-node-shadow", ids[0]),
                   ("gpu_reset", gpu1.uuid, "awaiting", "xid-reset-gpu", ids[1]),
                   ("ticket", gpu1.uuid, "suggested", "xid-rma", ids[2]),
                   ("requeue", "slurm:4242", "suggested", "straggler-requeue", ids[3])}
    assert RemediationAction.objects.get(kind="ticket").params == {"channel": "rma-tickets"}
    assert run_playbooks_for_alerts(ids) == 0 and RemediationAction.objects.count() == 5


def test_playbooks_ignore_resolved_alerts_and_alerts_without_a_target():
    install_default_playbooks()
    node = build_fleet(1)[0]
    resolved = make_alert("XidNodeFault", {"node": node.hostname, "xid": "79"})
    resolved.state = "resolved"
    resolved.save()
    no_node = make_alert("XidNodeFault", {"gpu": "GPU-unknown", "xid": "79"})
    assert run_playbooks_for_alerts([resolved.pk, no_node.pk]) == 0


def test_install_default_playbooks_is_idempotent_and_keeps_operator_edits():
    assert install_default_playbooks() == {"playbooks": 5, "guard_rails": 5}
    Playbook.objects.filter(name="xid-drain-node").update(mode="auto")
    assert install_default_playbooks() == {"playbooks": 0, "guard_rails": 0}
    assert Playbook.objects.get(name="xid-drain-node").mode == "auto"
    rails = set(GuardRail.objects.values_list("action", "scope", "max_count", "max_fraction", "window_s"))
    assert rails == {("drain", "cluster", 4, 0.05, 3600), ("drain", "nvlink_domain", None, 0.25, 3600),
                     ("drain", "leaf", None, 0.25, 3600), ("drain", "target", None, None, 3600),
                     ("requeue", "target", None, None, 900)}


# --- Across processes and threads -------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_auto_action_runs_on_a_real_celery_worker(celery_worker_process):
    build_fleet(1)
    worker = celery_worker_process()
    action = _request(mode="auto")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and worker.proc.poll() is None:
        action.refresh_from_db()
        if action.state not in ("approved", "running"):
            break
        time.sleep(0.3)
    if action.state != "succeeded":
        worker.stop()
        pytest.fail(f"action {action.state}; worker said: {worker.tail(2000)}")
    assert action.verified is True
    assert Node.objects.get(hostname="gpu-node-00").state == "drained"


@pytest.mark.django_db(transaction=True)
def test_burst_of_50_concurrent_drains_lets_exactly_the_cap_through(eager_celery):
    """50 faulty nodes ask for a drain at the same moment, from 50 threads with their own connections."""
    nodes = build_fleet(50, gpus=1)
    rail("drain", "cluster", max_count=4)
    barrier, errors = threading.Barrier(len(nodes)), []

    def request(host: str) -> None:
        try:
            barrier.wait(timeout=60)
            _request(target=host, mode="auto", requested_by="playbook:xid-drain-node", reason="XID 79 storm")
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=request, args=(n.hostname,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert Counter(RemediationAction.objects.values_list("state", flat=True)) == {"succeeded": 4, "blocked": 46}
    assert Node.objects.filter(state="drained").count() == 4
    reasons = set(RemediationAction.objects.filter(state="blocked").values_list("blocked_reason", flat=True))
    assert reasons == {"cluster cap: 4 of 4 drains in the last hour"}
    requests = Counter(AuditEntry.objects.filter(verb="action.request").values_list("outcome", flat=True))
    assert requests == {"approved": 4, "blocked": 46}
    assert AuditEntry.objects.filter(verb="action.verify", outcome="verified").count() == 4
