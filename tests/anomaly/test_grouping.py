"""Anomaly events per root cause: findings that share a cause are one event with its members, a persistent
condition is not re-opened every time it shows, and one entity is one event whatever flags it."""

from __future__ import annotations

from datetime import timedelta

import pytest

from anomaly.actions import do_record_findings
from anomaly.findings import Contribution, Finding
from anomaly.grouping import EVIDENCE_SIGMA, HOLD, group_text
from anomaly.models import Anomaly, AnomalyKind
from telemetry.models import Port
from telemetry.simulator.topology import build_layout, topology_document
from telemetry.topology import do_import_topology
from tests.conftest import FIXED_NOW

pytestmark = pytest.mark.django_db
AT = FIXED_NOW
MIN = timedelta(minutes=1)
FLEET = {AnomalyKind.PEER_NODE, AnomalyKind.PEER_LEAF, AnomalyKind.BASELINE, AnomalyKind.STRAGGLER}
LAYOUT = build_layout(64, 1)
HOST = LAYOUT.nodes[0].hostname
GPU_0, GPU_1 = LAYOUT.nodes[0].gpus[0].uuid, LAYOUT.nodes[0].gpus[1].uuid


def _finding(kind: str, entity_kind: str, entity_id: str, *, score: float = 0.7, field: str = "gpu_temp",
             host: str = HOST, **extra) -> Finding:
    c = Contribution(field, field.replace("_", " "), 1.0, 0.0, 9.0 * score, "peers")
    return Finding(kind, entity_kind, entity_id, score, (c,), host=host, extra=extra)


def _port(name: str) -> str:
    owner, port = name.split(":")
    q = Port.objects.filter(name=port)
    q = q.filter(node__hostname=owner) if owner.startswith("gpu-") else q.filter(switch__name=owner)
    return str(q.get().pk)


@pytest.fixture
def fabric():
    do_import_topology(topology_document(LAYOUT))
    up = next(a for a, b in LAYOUT.links if a.startswith("leaf-r0-01:"))  # an uplink of leaf-r0-01
    spine = next(b for a, b in LAYOUT.links if a == up)
    return {"down": _port("leaf-r0-01:p1"), "hca": _port(f"{HOST}:mlx5_0/1"), "up": _port(up),
            "spine": _port(spine), "other": _port("leaf-r1-01:p1")}


def test_a_leafs_ports_and_the_ports_cabled_to_it_are_one_event_with_its_members(fabric):
    found = [_finding(AnomalyKind.PEER_LEAF, "port", fabric[k], field="xmit_wait", host="")
             for k in ("down", "hca", "up", "spine", "other")]
    counts = do_record_findings(found, kinds=FLEET, at=AT)
    events = {a.group_key: a for a in Anomaly.objects.all()}
    assert counts["opened"] == 2 and set(events) == {"fleet|leaf:leaf-r0-01", "fleet|leaf:leaf-r1-01"}
    leaf = events["fleet|leaf:leaf-r0-01"]
    assert leaf.member_count == 4 and {m["entity_id"] for m in leaf.members} == {
        fabric["down"], fabric["hca"], fabric["up"], fabric["spine"]}
    assert group_text(leaf.members) == " (+3 more ports)" and group_text(leaf.members[:2]) == " (+1 more port)"
    assert all(m["first_seen"] == AT.isoformat() and m["signals"] == [["xmit_wait", 6.3]] for m in leaf.members)


def test_a_condition_that_recurs_within_the_hold_extends_its_event_and_closes_as_of_its_last_finding():
    flag = [_finding(AnomalyKind.BASELINE, "gpu", GPU_0, field="ecc_sbe_vol")]
    do_record_findings(flag, kinds=FLEET, at=AT)
    assert do_record_findings([], kinds=FLEET, at=AT + 5 * MIN)["closed"] == 0
    assert do_record_findings(flag, kinds=FLEET, at=AT + 40 * MIN) == {"opened": 0, "extended": 1, "closed": 0}
    [event] = Anomaly.objects.all()
    assert (event.started_at, event.last_seen, event.ended_at) == (AT, AT + 40 * MIN, None)
    assert do_record_findings([], kinds=FLEET, at=AT + 40 * MIN + HOLD - MIN)["closed"] == 0
    assert do_record_findings([], kinds=FLEET, at=AT + 40 * MIN + HOLD)["closed"] == 1
    event.refresh_from_db()
    assert event.ended_at == AT + 40 * MIN
    assert do_record_findings(flag, kinds=FLEET, at=AT + 3 * HOLD)["opened"] == 1  # a new episode: a new event


def test_one_host_is_one_event_across_detectors_its_gpus_and_the_rank_its_gpu_runs():
    found = [_finding(AnomalyKind.PEER_NODE, "gpu", GPU_0, score=0.9),
             _finding(AnomalyKind.BASELINE, "gpu", GPU_0, score=0.7),
             _finding(AnomalyKind.PEER_NODE, "gpu", GPU_1, score=0.68)]
    do_record_findings(found, kinds=FLEET, at=AT)
    # A minute later the rank on GPU 0 straggles, reported on another host name: it is still GPU 0's event.
    rank = _finding(AnomalyKind.STRAGGLER, "rank", "slurm:sim-4#0", score=0.95, field="sm_active", host="elsewhere",
                    gpu_uuid=GPU_0)
    do_record_findings([*found, rank], kinds=FLEET, at=AT + MIN)
    [event] = Anomaly.objects.all()
    assert event.group_key == f"fleet|host:{HOST}" and event.member_count == 3 and len(event.members) == 4
    # The event shows its worst moment: the straggling rank, found at 0.95.
    assert (event.kind, event.entity_kind, event.entity_id, event.score) == ("straggler", "rank", "slurm:sim-4#0", 0.95)
    first = {(m["kind"], m["entity_id"]): m["first_seen"] for m in event.members}
    assert first[("straggler", "slurm:sim-4#0")] == (AT + MIN).isoformat()
    assert first[("peer_node", GPU_0)] == AT.isoformat()


def test_failure_risk_forecasts_are_events_of_their_own_that_a_detector_pass_leaves_alone():
    do_record_findings([_finding(AnomalyKind.PEER_NODE, "gpu", GPU_0)], kinds=FLEET, at=AT)
    risk = _finding(AnomalyKind.FAILURE_RISK, "gpu", GPU_0, field="sbe_1h")
    do_record_findings([risk], kinds={AnomalyKind.FAILURE_RISK}, at=AT)
    assert sorted(Anomaly.objects.values_list("group_key", flat=True)) == [f"fleet|host:{HOST}", f"risk|host:{HOST}"]
    do_record_findings([], kinds=FLEET, at=AT + 2 * HOLD)
    assert Anomaly.objects.get(kind=AnomalyKind.FAILURE_RISK).ended_at is None
    assert Anomaly.objects.get(kind=AnomalyKind.PEER_NODE).ended_at == AT


def test_an_event_saved_by_hand_stands_for_its_own_detector_and_entity():
    a = Anomaly.objects.create(kind="straggler", entity_kind="rank", entity_id="slurm:1#2", started_at=AT,
                               last_seen=AT, score=0.5, last_score=0.5, summary="slow")
    assert a.group_key == "legacy|straggler|rank:slurm:1#2"


def test_a_finding_that_names_no_metric_beyond_the_threshold_opens_no_event_but_keeps_its_score():
    from anomaly.models import EntityScore
    from anomaly.scoring import Z_THRESHOLD

    assert EVIDENCE_SIGMA == Z_THRESHOLD
    vague = _finding(AnomalyKind.COHORT, "gpu", GPU_0, score=0.6)  # its strongest deviation: 5.4σ
    clear = _finding(AnomalyKind.COHORT, "gpu", GPU_1, score=0.7)  # 6.3σ
    counts = do_record_findings([vague, clear], kinds={AnomalyKind.COHORT}, at=AT)
    assert counts["opened"] == 1 and Anomaly.objects.get().entity_id == GPU_1
    assert EntityScore.objects.get(entity_kind="gpu", entity_id=GPU_0).anomaly_score == 0.6


def test_an_extended_event_is_rewritten_column_by_column_with_its_stronger_finding():
    """The events a pass extends are written by one UPDATE from a JSON record set: every column of the
    stronger finding lands exactly (text, time, float to the last bit, JSON members and contributions)."""
    do_record_findings([_finding(AnomalyKind.BASELINE, "gpu", GPU_0, score=0.7)], kinds=FLEET, at=AT)
    stronger = _finding(AnomalyKind.BASELINE, "gpu", GPU_0, score=0.8123456789012345, field="memory_temp")
    other = _finding(AnomalyKind.BASELINE, "gpu", GPU_1, score=0.75, field="power_w")
    assert do_record_findings([stronger, other], kinds=FLEET, at=AT + 3 * MIN) == {
        "opened": 0, "extended": 1, "closed": 0}
    [event] = Anomaly.objects.all()
    assert (event.kind, event.entity_kind, event.entity_id, event.host) == (AnomalyKind.BASELINE, "gpu", GPU_0, HOST)
    assert (event.last_seen, event.started_at) == (AT + 3 * MIN, AT)
    assert event.score == event.last_score == 0.8123456789012345
    assert event.summary == stronger.text()
    assert event.contributions == [c.as_dict() for c in stronger.contributions]
    assert event.member_count == 2 and {m["entity_id"] for m in event.members} == {GPU_0, GPU_1}
    assert [m["signals"] for m in event.members if m["entity_id"] == GPU_1] == [[["power_w", 6.75]]]
