"""The Slurm remediation backend against the real local Slurm of the test harness (munge, slurmdbd, slurmctld,
3 slurmd in a network namespace): drain, verify, resume and requeue through `scontrol`, reached the way a site
reaches its head node, through SLURM_COMMAND_PREFIX. Run alone with `-m slurm`; the cluster takes 10-20 s."""

from __future__ import annotations

import pytest

from alerts.remediation.actions import do_approve_action, do_request_action
from alerts.remediation.executor import execute
from telemetry.models import Node
from tests.alerts.remediation_helpers import netns_prefix
from tests.slurm.harness import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]


@pytest.fixture(scope="module")
def slurm_cluster():
    """A cluster of this module's own (as tests/slurm/test_sync.py has), stopped when the module ends."""
    with SlurmCluster(nodes=3) as cluster:
        yield cluster


@pytest.fixture
def slurm(slurm_cluster, settings) -> SlurmCluster:
    settings.REMEDIATION_BACKEND, settings.SLURM_COMMAND_PREFIX = "slurm", netns_prefix(slurm_cluster)
    for name in slurm_cluster.node_names:
        Node.objects.create(hostname=name)
    return slurm_cluster


def _run(kind: str, target: str, reason: str = "XID 79 on GPU 2"):
    action = do_request_action(kind, target, mode="approval", reason=reason, evidence={}, requested_by="olivia")
    do_approve_action(action.pk, None)
    outcome = execute(action.pk)
    action.refresh_from_db()
    return outcome, action


def _node(c: SlurmCluster, name: str) -> str:
    return c.scontrol("-o", "show", "node", name)


def test_drain_is_verified_then_resume_returns_the_node(slurm):
    outcome, drain = _run("drain", "node1")
    assert outcome == "succeeded" and drain.verified is True
    shown = _node(slurm, "node1")
    assert "DRAIN" in drain.result["verification"]["state"] and "+DRAIN" in shown
    assert "Reason=breakwater: XID 79 on GPU 2" in shown
    assert drain.result["commands"][-1]["cmd"] == ("scontrol update NodeName=node1 State=DRAIN "
                                                   "'Reason=breakwater: XID 79 on GPU 2'")
    assert Node.objects.get(hostname="node1").state == "drained"

    outcome, resume = _run("resume", "node1")
    assert outcome == "succeeded" and resume.verified is True
    shown = _node(slurm, "node1")
    assert "State=IDLE" in shown and "DRAIN" not in shown, shown
    assert Node.objects.get(hostname="node1").state == "active"


def test_drain_of_a_node_drained_by_hand_succeeds_and_keeps_its_reason(slurm):
    slurm.scontrol("update", "NodeName=node2", "State=DRAIN", "Reason=bad fan, by hand")
    try:
        outcome, action = _run("drain", "node2")
        assert outcome == "succeeded" and action.verified is True
        assert action.result["commands"][-1]["skipped"].startswith("node already ")
        assert "Reason=bad fan, by hand" in _node(slurm, "node2")
    finally:
        slurm.scontrol("update", "NodeName=node2", "State=RESUME")


def test_requeue_puts_a_running_job_back_in_the_queue(slurm):
    job = slurm.sbatch("--gres=gpu:1", "-J", "straggler", wrap="sleep 120")
    try:
        slurm.wait_for("running", lambda: slurm.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()
                       == "RUNNING", 20)
        outcome, action = _run("requeue", f"slurm:{job}", reason="rank 6 straggles")
        assert outcome == "succeeded" and action.verified is True
        assert action.result["commands"][-1]["cmd"] == f"scontrol requeue {job}"
        assert "Restarts=1" in slurm.scontrol("-o", "show", "job", job)
    finally:
        slurm.run("scancel", job, check=False)


def test_drain_of_an_unknown_node_fails_with_scontrols_error(slurm):
    outcome, action = _run("drain", "node9")
    assert action.state == "failed" and outcome.startswith("failed: ")
    assert "scontrol -o show node node9" in action.result["error"]
    assert action.result["commands"][-1]["cmd"] == "scontrol -o show node node9"
