"""Guard rails: blast-radius caps (cluster, NVLink domain, leaf, rack), cooldowns and maintenance, checked at
request, at approval and again at execution."""

from __future__ import annotations

from datetime import timedelta

import pytest

from alerts.models import Silence
from alerts.remediation.actions import do_approve_action, do_request_action
from alerts.remediation.executor import execute
from core.models import AuditEntry
from telemetry.models import Node
from tests.alerts.remediation_helpers import FIXED_NOW, build_fleet, rail

pytestmark = pytest.mark.django_db


def _request(target, kind="drain", mode="auto", now=FIXED_NOW, **kw):
    return do_request_action(kind, target, mode=mode, reason="XID 79", evidence={}, requested_by="olivia", now=now,
                             **kw)


def _states(actions) -> list[str]:
    return [a.state for a in actions]


def test_cluster_cap_blocks_the_fifth_drain_with_the_numbers():
    nodes = build_fleet(6)
    rail("drain", "cluster", max_count=4)
    actions = [_request(n.hostname) for n in nodes[:5]]
    assert _states(actions) == ["approved"] * 4 + ["blocked"]
    assert actions[4].blocked_reason == "cluster cap: 4 of 4 drains in the last hour"
    assert AuditEntry.objects.filter(verb="action.request", outcome="blocked").get().detail["blocked_reason"] == \
        actions[4].blocked_reason


def test_cluster_fraction_makes_the_smaller_cap():
    nodes = build_fleet(40, gpus=1)
    rail("drain", "cluster", max_count=4, max_fraction=0.05)
    actions = [_request(n.hostname) for n in nodes[:3]]
    assert _states(actions) == ["approved", "approved", "blocked"]
    assert actions[2].blocked_reason == "cluster cap: 2 of 2 drains in the last hour (5% of 40 nodes)"


def test_cluster_cap_frees_up_when_the_window_has_passed():
    nodes = build_fleet(3)
    rail("drain", "cluster", max_count=1, window_s=1800)
    assert _request(nodes[0].hostname).state == "approved"
    assert _request(nodes[1].hostname, now=FIXED_NOW + timedelta(minutes=29)).blocked_reason == \
        "cluster cap: 1 of 1 drains in the last 30 min"
    assert _request(nodes[2].hostname, now=FIXED_NOW + timedelta(minutes=31)).state == "approved"


def test_target_cooldown_blocks_a_second_action_on_the_same_target():
    rail("requeue", "target", window_s=900)
    first = _request("slurm:4242", kind="requeue")
    first.state = "succeeded"
    first.save()
    again = _request("slurm:4242", kind="requeue", now=FIXED_NOW + timedelta(minutes=5))
    assert again.state == "blocked" and again.blocked_reason == (
        f"target cooldown: requeue of slurm:4242 already succeeded 5 min ago (#{first.pk}); no second one within "
        "15 min")
    assert _request("slurm:4243", kind="requeue", now=FIXED_NOW + timedelta(minutes=5)).state == "approved"
    assert _request("slurm:4242", kind="requeue", now=FIXED_NOW + timedelta(minutes=16)).state == "approved"


def test_drained_node_blocks_a_drain_but_not_its_resume():
    node = build_fleet(1)[0]
    Node.objects.filter(pk=node.pk).update(state="drained")
    assert _request(node.hostname).blocked_reason == f"maintenance: node {node.hostname} is already drained"
    assert _request(node.hostname, kind="resume").state == "approved"


def test_maintenance_window_blocks_the_nodes_it_matches_only():
    nodes = build_fleet(3)
    window = Silence.objects.create(
        kind="maintenance", matchers=[{"name": "node", "op": "=~", "value": "gpu-node-0[01]"}],
        starts_at=FIXED_NOW - timedelta(hours=1), ends_at=FIXED_NOW + timedelta(hours=2), author="olivia",
        comment="PSU swap in rack 1")
    Silence.objects.create(kind="silence", matchers=[{"name": "node", "op": "=", "value": "gpu-node-02"}],
                           starts_at=FIXED_NOW - timedelta(hours=1), ends_at=FIXED_NOW + timedelta(hours=2),
                           author="olivia", comment="a plain silence mutes, it does not block")
    blocked = _request(nodes[0].hostname)
    assert blocked.blocked_reason == (f"maintenance: window #{window.pk} until 2026-11-30 14:00 UTC covers "
                                      "gpu-node-00: PSU swap in rack 1")
    cap = _request(nodes[1].gpus.get(index=0).uuid, kind="power_cap", params={"watts": 500})
    assert cap.state == "blocked" and cap.blocked_reason.startswith(f"maintenance: window #{window.pk}")
    assert _request(nodes[2].hostname).state == "approved"
    assert _request(nodes[0].hostname, now=FIXED_NOW + timedelta(hours=3)).state == "approved"  # window over


def test_maintenance_window_ended_early_no_longer_blocks():
    node = build_fleet(1)[0]
    Silence.objects.create(kind="maintenance", matchers=[{"name": "node", "op": "=", "value": node.hostname}],
                           starts_at=FIXED_NOW - timedelta(hours=1), ends_at=FIXED_NOW + timedelta(hours=2),
                           expired_at=FIXED_NOW - timedelta(minutes=1), author="olivia", comment="done early")
    assert _request(node.hostname).state == "approved"


def test_nvlink_domain_cap_counts_nodes_already_drained():
    nodes = build_fleet(16, per_domain=8, gpus=1)
    rail("drain", "nvlink_domain", max_fraction=0.25)
    Node.objects.filter(pk=nodes[0].pk).update(state="down")  # went down by itself, nobody drained it
    assert _request(nodes[1].hostname).state == "approved"
    blocked = _request(nodes[2].hostname)
    assert blocked.blocked_reason == ("nvlink domain cap (gpu-node-nvl-0): 2 of 8 nodes drained or draining in the "
                                      "last hour; at most 2 (25% of 8)")
    assert _request(nodes[8].hostname).state == "approved"  # the other domain


def test_one_node_nvlink_domain_can_still_lose_its_node():
    nodes = build_fleet(2, per_domain=1)
    rail("drain", "nvlink_domain", max_fraction=0.25)
    assert _states([_request(n.hostname) for n in nodes]) == ["approved", "approved"]


def test_leaf_cap_counts_the_nodes_cabled_to_that_leaf():
    nodes = build_fleet(8, per_leaf=4, gpus=1)
    rail("drain", "leaf", max_fraction=0.25)
    assert _request(nodes[0].hostname).state == "approved"
    assert _request(nodes[1].hostname).blocked_reason == (
        "leaf switch cap (gpu-node-leaf-0): 1 of 4 nodes drained or draining in the last hour; at most 1 (25% of 4)")
    assert _request(nodes[4].hostname).state == "approved"


def test_rack_cap_by_count():
    nodes = build_fleet(4, per_rack=2, gpus=1)
    rail("drain", "rack", max_count=1)
    assert _states([_request(n.hostname) for n in nodes]) == ["approved", "blocked", "approved", "blocked"]
    assert _request("gpu-node-01", mode="shadow").blocked_reason == (
        "rack cap (gpu-node-rack-0): 1 of 2 nodes drained or draining in the last hour; at most 1")


def test_disabled_rail_does_not_block():
    nodes = build_fleet(2)
    r = rail("drain", "cluster", max_count=1)
    r.enabled = False
    r.save()
    assert _states([_request(n.hostname) for n in nodes]) == ["approved", "approved"]


def test_approval_checks_the_rails_again():
    nodes = build_fleet(3)
    rail("drain", "cluster", max_count=2)
    waiting = [_request(n.hostname, mode="approval") for n in nodes]
    assert _states(waiting) == ["awaiting"] * 3  # nothing is let through until approved
    decided = [do_approve_action(a.pk, None, now=FIXED_NOW) for a in waiting]
    assert _states(decided) == ["approved", "approved", "blocked"]
    assert decided[2].blocked_reason == "cluster cap: 2 of 2 drains in the last hour"
    entry = AuditEntry.objects.get(verb="action.approve", outcome="blocked")
    assert entry.reason == decided[2].blocked_reason
    # Once the window has passed, the blocked action can be approved after all.
    assert do_approve_action(waiting[2].pk, None, now=FIXED_NOW + timedelta(hours=2)).state == "approved"


def test_execution_checks_the_rails_again():
    node = build_fleet(1)[0]
    action = _request(node.hostname, mode="approval")
    do_approve_action(action.pk, None)
    Silence.objects.create(kind="maintenance", matchers=[{"name": "node", "op": "=", "value": node.hostname}],
                           starts_at=FIXED_NOW - timedelta(hours=1), ends_at=FIXED_NOW + timedelta(hours=1),
                           author="olivia", comment="hands on the node")
    assert execute(action.pk, now=FIXED_NOW).startswith("blocked: maintenance: window #")
    action.refresh_from_db()
    assert action.state == "blocked" and action.started_at is None
    assert Node.objects.get(pk=node.pk).state == "active"  # nothing ran
    assert AuditEntry.objects.filter(verb="action.execute", outcome="blocked").count() == 1
