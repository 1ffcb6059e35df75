"""Rule evaluation: every rule kind fires and resolves on data written through the real ingest writer (or the
anomaly models), the for_seconds hold, a broken rule next to good ones, and ingest-driven evaluation end to
end with a real Celery worker."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings

from alerts.evaluation import _moved_counters, rule_problem, run_evaluation
from alerts.models import Alert, AlertState, Rule, RuleKind, RulePending
from anomaly.models import Anomaly, EntityScore
from telemetry import health
from telemetry.ingest.documents import parse_json
from telemetry.ingest.schema import TimeParser
from telemetry.ingest.writer import write_batch
from telemetry.models import Gpu, GpuEvent, Hall, Node, Rack, Row, Site
from telemetry.rollups import run_rollups
from tests.conftest import FIXED_NOW

T0 = FIXED_NOW
pytestmark = pytest.mark.django_db


@pytest.fixture
def rack(db):
    """Rack r01 holding node-a; node-b stays unplaced (ingest registers it)."""
    hall = Hall.objects.create(site=Site.objects.create(name="dc1"), name="h1")
    rack = Rack.objects.create(row=Row.objects.create(hall=hall, name="row1"), name="r01", power_cap_w=10_000)
    Node.objects.create(hostname="node-a", rack=rack, u_position=1)
    return rack


def ingest(at: datetime, gpus=(), ports=()) -> None:
    """Write one batch through the real ingest writer, as the API does (raw rows, last values, fault events)."""
    body = {"time": at.isoformat(), "gpus": list(gpus), "ports": list(ports)}
    batch = parse_json(json.dumps(body).encode(), TimeParser(at, timedelta(minutes=5), timedelta(days=7)))
    write_batch(batch, collector="test", fmt="json")


def gpu(uuid: str, host: str = "node-a", index: int = 0, **fields) -> dict:
    return {"host": host, "uuid": uuid, "index": index, "fields": fields}


def rule(name: str = "R", **kw) -> Rule:
    return Rule.objects.create(name=name, **kw)


def open_alerts(r: Rule) -> list[Alert]:
    return list(Alert.objects.filter(rule=r).exclude(state=AlertState.RESOLVED).order_by("entity_key"))


def test_threshold_gpu_fires_with_entity_labels_and_resolves(rack):
    r = rule("GpuHot", kind=RuleKind.THRESHOLD, metric="gpu_temp", op=">", threshold=87, severity="critical",
             labels={"team": "gpu-ops"}, summary="GPU at {value:.0f} °C (> {threshold:.0f} °C) on {entity}")
    ingest(T0, [gpu("GPU-1", gpu_temp=91.0), gpu("GPU-2", index=1, gpu_temp=60.0)])
    counts = run_evaluation(T0)
    assert (counts["rules"], counts["fired"], counts["resolved"], counts["errors"]) == (1, 1, 0, 0)
    [alert] = open_alerts(r)
    assert alert.labels == {"alertname": "GpuHot", "severity": "critical", "team": "gpu-ops", "entity": "gpu",
                            "gpu": "GPU-1", "node": "node-a", "rack": "r01"}
    assert (alert.entity_kind, alert.entity_key, alert.value) == ("gpu", "GPU-1", 91.0)
    assert alert.annotations["summary"] == "GPU at 91 °C (> 87 °C) on node-a GPU 0"
    later = T0 + timedelta(seconds=10)
    ingest(later, [gpu("GPU-1", gpu_temp=70.0)])
    assert run_evaluation(later)["resolved"] == 1
    alert.refresh_from_db()
    assert (alert.state, alert.ends_at) == (AlertState.RESOLVED, later)


def test_threshold_skips_stale_last_values(rack):
    r = rule(kind=RuleKind.THRESHOLD, metric="gpu_temp", threshold=87)
    ingest(T0 - settings.STALE_AFTER - timedelta(seconds=1), [gpu("GPU-1", gpu_temp=99.0)])
    run_evaluation(T0)
    assert open_alerts(r) == []


def test_threshold_node_takes_its_worst_gpu(rack):
    r = rule(kind=RuleKind.THRESHOLD, entity="node", metric="memory_temp", op=">", threshold=95)
    ingest(T0, [gpu("GPU-1", memory_temp=97.0), gpu("GPU-2", index=1, memory_temp=99.0),
                gpu("GPU-3", host="node-b", memory_temp=80.0)])
    run_evaluation(T0)
    [alert] = open_alerts(r)
    assert (alert.entity_kind, alert.entity_key, alert.value) == ("node", "node-a", 99.0)
    assert alert.labels["node"] == "node-a" and alert.labels["rack"] == "r01" and "gpu" not in alert.labels


def test_threshold_below_on_port(rack):
    r = rule(kind=RuleKind.THRESHOLD, entity="port", metric="link_speed_gbps", op="<", threshold=400)
    ingest(T0, ports=[{"port": "mlx5_0/1", "host": "node-a", "fields": {"link_speed_gbps": 200.0}},
                      {"port": "mlx5_1/1", "host": "node-a", "fields": {"link_speed_gbps": 400.0}}])
    run_evaluation(T0)
    [alert] = open_alerts(r)
    assert alert.labels["port"] == "node-a:mlx5_0/1" and alert.labels["entity"] == "port"
    assert alert.entity_kind == "port" and alert.entity_key.isdigit() and alert.value == 200.0


def test_threshold_rack_power_draw(rack):
    r = rule(kind=RuleKind.THRESHOLD, entity="rack", metric="draw_w", op=">", threshold=1000)
    ingest(T0, [gpu("GPU-1", power_w=700.0), gpu("GPU-2", index=1, power_w=650.0)])
    run_evaluation(T0)
    [alert] = open_alerts(r)
    assert (alert.entity_key, alert.value, alert.labels["rack"]) == ("r01", 1350.0, "r01")
    assert alert.annotations["draw_source"] == "gpus"


def test_rate_counts_increase_per_minute_across_a_counter_reset(rack):
    r = rule(kind=RuleKind.RATE, metric="ecc_sbe_vol", op=">", threshold=5, window_seconds=300)
    # GPU-1: +10, then a restart to 5 (counts 5), then +20: 35 in 5 min = 7/min. GPU-2 never moves.
    for ago, v in ((240, 100), (180, 110), (120, 5), (60, 25)):
        ingest(T0 - timedelta(seconds=ago), [gpu("GPU-1", ecc_sbe_vol=v), gpu("GPU-2", index=1, ecc_sbe_vol=50)])
    run_evaluation(T0)
    [alert] = open_alerts(r)
    assert (alert.entity_key, alert.value) == ("GPU-1", 7.0)
    assert alert.annotations["summary"] == "ecc_sbe_vol 7/min > 5/min on node-a GPU 0"
    # Ten minutes later the window holds no increase: resolved.
    ingest(T0 + timedelta(seconds=540), [gpu("GPU-1", ecc_sbe_vol=25)])
    ingest(T0 + timedelta(seconds=600), [gpu("GPU-1", ecc_sbe_vol=25)])
    run_evaluation(T0 + timedelta(seconds=600))
    assert open_alerts(r) == []


def test_a_rate_rule_is_read_again_only_after_its_cadence_and_at_once_when_edited(rack, monkeypatch):
    from alerts import evaluation

    r = rule(kind=RuleKind.RATE, metric="ecc_sbe_vol", op=">", threshold=5, window_seconds=300)
    rule("T", kind=RuleKind.THRESHOLD, metric="gpu_temp", op=">", threshold=80)
    for ago, v in ((240, 100), (180, 110), (120, 120), (60, 130)):
        ingest(T0 - timedelta(seconds=ago), [gpu("GPU-1", ecc_sbe_vol=v, gpu_temp=60.0)])
    real, observed = evaluation.observe, []
    monkeypatch.setattr(evaluation, "observe", lambda rule, now: observed.append((rule.name, now)) or real(rule, now))

    run_evaluation(T0)
    assert [o.entity_key for o in open_alerts(r)] == ["GPU-1"]  # 30 in 5 min: 6/min
    run_evaluation(T0 + timedelta(seconds=5))  # ingest-triggered again 5 s later
    assert observed == [("R", T0), ("T", T0), ("T", T0 + timedelta(seconds=5))]
    assert [o.entity_key for o in open_alerts(r)] == ["GPU-1"], "a rate rule not read again must not resolve"
    observed.clear()
    run_evaluation(T0 + timedelta(seconds=10))  # max(10 s, 300 s / 30)
    assert ("R", T0 + timedelta(seconds=10)) in observed
    observed.clear()
    r.threshold = 50
    r.save()  # edited: read at once, and its alert resolves
    run_evaluation(T0 + timedelta(seconds=11))
    assert ("R", T0 + timedelta(seconds=11)) in observed and open_alerts(r) == []


def test_rate_reads_raw_only_for_counters_that_moved(rack):
    r = rule(kind=RuleKind.RATE, metric="pcie_replay", op=">", threshold=1, window_seconds=120)
    for s in range(0, 301, 15):  # GPU-1 replays +10 every 15 s from 240 s on; GPU-2 stays put
        moving = 100 + max(0, (s - 225) // 15) * 10
        ingest(T0 + timedelta(seconds=s), [gpu("GPU-1", pcie_replay=moving), gpu("GPU-2", index=1, pcie_replay=5)])
    now = T0 + timedelta(seconds=300)
    run_rollups(now)  # the minute before the window now has a rolled-up value to compare with
    assert _moved_counters("gpu", "pcie_replay", now - timedelta(seconds=120)) == [Gpu.objects.get(uuid="GPU-1").pk]
    run_evaluation(now)
    [alert] = open_alerts(r)
    assert (alert.entity_key, alert.value) == ("GPU-1", 25.0)  # 50 replays in 2 minutes


def test_a_site_younger_than_the_window_reads_raw_only_for_counters_that_moved(rack):
    """No minute before the window is rolled up yet: the rolled-up minutes since, and the newest value, decide."""
    r = rule(kind=RuleKind.RATE, metric="pcie_replay", op=">", threshold=1, window_seconds=600)
    for s in range(0, 241, 15):  # 4 minutes of data against a 10-minute window
        moving = 100 + (s // 60) * 20  # a step each minute
        ingest(T0 + timedelta(seconds=s), [gpu("GPU-1", pcie_replay=moving), gpu("GPU-2", index=1, pcie_replay=5),
                                           gpu("GPU-3", index=2, pcie_replay=7)])
    now = T0 + timedelta(seconds=240)
    since = now - timedelta(seconds=600)
    ids = {g.uuid: g.pk for g in Gpu.objects.all()}
    # Nothing rolled up: every GPU may have moved.
    assert sorted(_moved_counters("gpu", "pcie_replay", since)) == sorted(ids.values())
    run_rollups(now + timedelta(minutes=2))  # the 4 minutes rolled up: GPU-1 stepped in them, the others did not
    assert _moved_counters("gpu", "pcie_replay", since) == [ids["GPU-1"]]
    # A step after the newest rolled-up minute shows as a last value that differs from that minute's.
    ingest(now + timedelta(seconds=15), [gpu("GPU-3", index=2, pcie_replay=9)])
    assert sorted(_moved_counters("gpu", "pcie_replay", since)) == sorted([ids["GPU-1"], ids["GPU-3"]])
    run_evaluation(now)
    [alert] = open_alerts(r)
    assert (alert.entity_key, alert.value) == ("GPU-1", 8.0)  # 80 replays over a 10-minute window


def test_rate_rule_on_a_gauge_is_reported_not_run(rack):
    r = rule(kind=RuleKind.RATE, metric="gpu_temp", threshold=1)
    assert "not a counter" in rule_problem(r, T0)
    assert rule_problem(rule("ok", kind=RuleKind.RATE, metric="pcie_replay", threshold=1), T0) is None


def test_xid_rules_match_codes_and_catalogue_actions(rack):
    by_code = rule("Xid79", kind=RuleKind.XID, xid_codes=[79], severity="critical")
    by_action = rule("XidReset", kind=RuleKind.XID, xid_actions=["reset_gpu"])
    ingest(T0, [gpu("GPU-1", xid=79), gpu("GPU-2", index=1, xid=48), gpu("GPU-3", index=2, xid=13)])
    run_evaluation(T0)
    [a79] = open_alerts(by_code)
    [a48] = open_alerts(by_action)
    assert (a79.entity_key, a79.value, a79.labels["xid"], a79.annotations["action"]) == (
        "GPU-1", 79.0, "79", "drain_node")
    assert (a48.entity_key, a48.labels["xid"]) == ("GPU-2", "48")
    assert "GPU has fallen off the bus" in a79.annotations["summary"]
    # The same fault again: merged into the open alert as a new occurrence, not a second alert.
    ingest(T0 + timedelta(seconds=10), [gpu("GPU-1", xid=0)])
    ingest(T0 + timedelta(seconds=20), [gpu("GPU-1", xid=79)])
    run_evaluation(T0 + timedelta(seconds=20))
    a79.refresh_from_db()
    assert (a79.state, a79.occurrences) == (AlertState.FIRING, 2)
    # Cleared (a GPU reset): resolved.
    GpuEvent.objects.filter(gpu__uuid="GPU-1").update(cleared_at=T0 + timedelta(seconds=30))
    run_evaluation(T0 + timedelta(seconds=30))
    assert open_alerts(by_code) == [] and len(open_alerts(by_action)) == 1


def test_anomaly_and_risk_rules_read_current_scores(rack):
    anomalous = rule("Anomalous", kind=RuleKind.ANOMALY, op=">=", threshold=0.9)
    risky = rule("Risky", kind=RuleKind.RISK, op=">=", threshold=0.5)
    ingest(T0, [gpu("GPU-1", gpu_temp=50.0), gpu("GPU-2", index=1, gpu_temp=50.0)])
    EntityScore.objects.create(entity_kind="gpu", entity_id="GPU-1", anomaly_score=0.95, anomaly_at=T0,
                               failure_risk=0.2, risk_at=T0)
    EntityScore.objects.create(entity_kind="gpu", entity_id="GPU-2", anomaly_score=None, failure_risk=0.7,
                               risk_at=T0)
    run_evaluation(T0)
    assert [(a.entity_key, a.value) for a in open_alerts(anomalous)] == [("GPU-1", 0.95)]
    assert [(a.entity_key, a.value) for a in open_alerts(risky)] == [("GPU-2", 0.7)]
    EntityScore.objects.filter(entity_id="GPU-1").update(anomaly_score=None)
    EntityScore.objects.filter(entity_id="GPU-2").update(failure_risk=0.1)
    run_evaluation(T0 + timedelta(minutes=1))
    assert open_alerts(anomalous) == [] and open_alerts(risky) == []


def test_job_rule_raises_one_alert_per_job(rack):
    stragglers = rule("JobStraggler", kind=RuleKind.JOB, entity="job", metric="straggler")
    divergence = rule("JobDivergence", kind=RuleKind.JOB, entity="job", metric="divergence")
    for rank, host in ((3, "node-a"), (5, "node-b")):
        Anomaly.objects.create(kind="straggler", entity_kind="rank", entity_id=f"slurm:123#{rank}", host=host,
                               started_at=T0, last_seen=T0, score=0.8, last_score=0.7 + rank / 100,
                               summary=f"rank {rank} is slow")
    run_evaluation(T0)
    [alert] = open_alerts(stragglers)
    assert alert.labels["job"] == "slurm:123" and alert.entity_kind == "job" and alert.value == 0.75
    assert (alert.annotations["ranks"], alert.annotations["hosts"]) == ("5, 3", "node-b, node-a")
    assert open_alerts(divergence) == []
    Anomaly.objects.update(ended_at=T0 + timedelta(minutes=1))
    run_evaluation(T0 + timedelta(minutes=1))
    assert open_alerts(stragglers) == []


def _member(kind: str, entity_id: str, seen: datetime, score: float = 0.8, host: str = "node-a") -> dict:
    return {"kind": kind, "entity_kind": "rank" if "#" in entity_id else "gpu", "entity_id": entity_id, "host": host,
            "first_seen": T0.isoformat(), "last_seen": seen.isoformat(), "score": score, "last_score": score,
            "summary": f"{entity_id} is slow", "signals": [["step_time_s", 9.0]]}


def test_job_rule_reads_the_straggling_members_of_grouped_events_that_the_latest_pass_found(rack):
    stragglers = rule("JobStraggler", kind=RuleKind.JOB, entity="job", metric="straggler")
    later = T0 + timedelta(minutes=3)
    # One host's event: a hot GPU (the worst moment) with the straggling rank it slows, still found now;
    # another host's event holds a rank that caught up two minutes ago (the event waits out its hold).
    Anomaly.objects.create(
        kind="peer_node", entity_kind="gpu", entity_id="GPU-1", host="node-a", group_key="fleet|host:node-a",
        started_at=T0, last_seen=later, score=0.9, last_score=0.9, summary="hot",
        members=[_member("peer_node", "GPU-1", later, 0.9), _member("straggler", "slurm:7#2", later)])
    caught_up = T0 + timedelta(minutes=1)
    Anomaly.objects.create(
        kind="straggler", entity_kind="rank", entity_id="slurm:8#1", host="node-b", group_key="fleet|host:node-b",
        started_at=T0, last_seen=caught_up, score=0.8, last_score=0.8, summary="slow",
        members=[_member("straggler", "slurm:8#1", caught_up, host="node-b")])
    EntityScore.objects.create(entity_kind="fleet", entity_id="*", anomaly_at=later)
    run_evaluation(later)
    [alert] = open_alerts(stragglers)
    assert (alert.entity_key, alert.annotations["ranks"], alert.annotations["hosts"]) == ("slurm:7", "2", "node-a")
    assert "slurm:7#2 is slow" in alert.annotations["summary"]


def test_rule_replay_fires_once_per_episode_after_the_hold_and_stores_nothing(rack):
    from alerts.evaluation import RuleReplay

    replay = RuleReplay([Rule(name="GpuAnomalous", kind=RuleKind.ANOMALY, op=">=", threshold=0.9, for_seconds=120,
                              severity="info")])
    ingest(T0, [gpu("GPU-1", gpu_temp=50.0)])
    EntityScore.objects.create(entity_kind="gpu", entity_id="GPU-1", anomaly_score=0.95, anomaly_at=T0)
    fired = [replay(T0 + timedelta(minutes=k)) for k in range(4)]
    assert fired == [0, 0, 1, 0] and replay.fired[0]["entity"] == "GPU-1"  # held 2 min, then fires once
    EntityScore.objects.filter(entity_id="GPU-1").update(anomaly_score=None)
    assert replay(T0 + timedelta(minutes=4)) == 0
    EntityScore.objects.filter(entity_id="GPU-1").update(anomaly_score=0.97)
    assert [replay(T0 + timedelta(minutes=k)) for k in (5, 6, 7)] == [0, 0, 1]  # a new episode fires again
    assert not Alert.objects.exists() and not Rule.objects.exists()


def test_node_down_fires_for_a_silent_node_only(rack):
    r = rule("NodeDown", kind=RuleKind.NODE_DOWN, entity="node", threshold=180, severity="critical")
    ingest(T0 - timedelta(seconds=400), [gpu("GPU-1", gpu_temp=50.0)])
    ingest(T0, [gpu("GPU-3", host="node-b", gpu_temp=50.0)])
    Node.objects.create(hostname="node-never")  # never reported: not "down"
    run_evaluation(T0)
    [alert] = open_alerts(r)
    assert (alert.entity_key, alert.value, alert.labels["node"], alert.labels["entity"]) == (
        "node-a", 400.0, "node-a", "node")
    assert alert.annotations["summary"] == "node-a has not reported for 400 s"
    ingest(T0 + timedelta(seconds=10), [gpu("GPU-1", gpu_temp=50.0)])
    run_evaluation(T0 + timedelta(seconds=10))
    assert open_alerts(r) == []


def test_for_seconds_holds_before_firing_and_restarts_when_false(rack):
    r = rule(kind=RuleKind.THRESHOLD, metric="gpu_temp", threshold=87, for_seconds=60)

    def at(seconds: int, temp: float) -> list[Alert]:
        ingest(T0 + timedelta(seconds=seconds), [gpu("GPU-1", gpu_temp=temp)])
        run_evaluation(T0 + timedelta(seconds=seconds))
        return open_alerts(r)

    assert at(0, 90.0) == []
    assert RulePending.objects.get(rule=r).since == T0
    assert at(30, 91.0) == []
    [alert] = at(60, 92.0)
    assert alert.starts_at == T0 + timedelta(seconds=60)
    assert len(at(70, 93.0)) == 1  # firing stays firing
    assert at(80, 50.0) == [] and not RulePending.objects.filter(rule=r).exists()
    assert at(90, 95.0) == []  # the hold starts over
    assert RulePending.objects.get(rule=r).since == T0 + timedelta(seconds=90)


def test_broken_rule_is_skipped_and_others_still_run(rack):
    rule("Broken", kind=RuleKind.THRESHOLD, metric="no_such_field", threshold=1)
    good = rule("Good", kind=RuleKind.THRESHOLD, metric="gpu_temp", threshold=87)
    ingest(T0, [gpu("GPU-1", gpu_temp=99.0)])
    counts = run_evaluation(T0)
    assert (counts["errors"], counts["fired"]) == (1, 1)
    assert len(open_alerts(good)) == 1


def test_disabled_rule_alerts_resolve(rack):
    r = rule(kind=RuleKind.THRESHOLD, metric="gpu_temp", threshold=87)
    ingest(T0, [gpu("GPU-1", gpu_temp=99.0)])
    run_evaluation(T0)
    Rule.objects.filter(pk=r.pk).update(enabled=False)
    counts = run_evaluation(T0 + timedelta(seconds=10))
    assert (counts["rules"], counts["resolved"]) == (0, 1)
    assert open_alerts(r) == []


# --- End to end: the real ingest API, the on-commit trigger and a real Celery worker -------------------

def _worker_ready(timeout: float = 60.0) -> None:
    """Wait until a worker of this test process answers a ping (other workers on this Redis are ignored)."""
    import os

    from dashboard.celery import app

    mine = f"bwtest-{os.getpid()}-"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(mine in name for reply in app.control.ping(timeout=0.5) for name in reply):
            return
    pytest.fail("the Celery worker did not come up")


@pytest.mark.django_db(transaction=True)
def test_xid79_posted_to_ingest_fires_alert_within_seconds(client, celery_worker_process):
    from alerts.actions import clear_evaluation_flag
    from telemetry.actions import do_create_collector_token

    token = do_create_collector_token("e2e-collector")
    r = Rule.objects.create(name="XidNodeFault", kind=RuleKind.XID, xid_actions=["drain_node"], severity="critical")
    celery_worker_process()
    _worker_ready()
    clear_evaluation_flag()
    client.get("/api/v1/ingest")  # the first request loads the URLconf (and the Dash apps): not our latency
    now = datetime.now(UTC)
    body = {"gpus": [{"host": "node-e2e", "uuid": "GPU-E2E", "index": 0, "time": now.isoformat(),
                      "fields": {"xid": 79, "gpu_temp": 60.0}}]}
    t0 = time.perf_counter()
    resp = client.post("/api/v1/ingest", data=json.dumps(body), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {token}")
    assert resp.status_code == 200, resp.content
    alert = None
    while time.perf_counter() - t0 < 10 and alert is None:
        alert = Alert.objects.filter(rule=r, state=AlertState.FIRING).first()
        time.sleep(0.02)
    latency = time.perf_counter() - t0
    print(f"\nXID 79 ingest -> alert firing: {latency * 1000:.0f} ms")
    assert alert is not None, "no alert within 10 s of the ingest commit"
    assert (alert.entity_key, alert.labels["node"], alert.labels["xid"]) == ("GPU-E2E", "node-e2e", "79")
    assert latency < 5


def test_node_down_and_gpu_no_data_follow_the_health_model(rack, settings, monkeypatch):
    """Without a threshold the health model decides: two 10-s intervals plus 5 s of grace."""
    settings.STALE_GRACE = timedelta(seconds=5)
    node_rule = rule("NodeDown", kind=RuleKind.NODE_DOWN, entity="node", severity="critical",
                     summary="Node {entity}: {detail}")
    gpu_rule = rule("GpuNoData", kind=RuleKind.NODE_DOWN, entity="gpu", severity="warning")
    for t in (T0 - timedelta(seconds=10), T0):
        ingest(t, [gpu("GPU-1", gpu_temp=50.0), gpu("GPU-2", index=1, gpu_temp=50.0),
                   gpu("GPU-3", host="node-b", gpu_temp=50.0)])
    # GPU-2 goes silent; node-b as a whole goes silent; GPU-1 keeps reporting.
    for t in (T0 + timedelta(seconds=10), T0 + timedelta(seconds=20), T0 + timedelta(seconds=30)):
        ingest(t, [gpu("GPU-1", gpu_temp=50.0)])
    run_evaluation(T0 + timedelta(seconds=24))
    assert open_alerts(node_rule) == [] and open_alerts(gpu_rule) == []  # 24 s ≤ 25 s

    reads = []
    real = health.gpu_states
    monkeypatch.setattr(health, "gpu_states", lambda **kw: reads.append(kw) or real(**kw))
    run_evaluation(T0 + timedelta(seconds=30))
    assert len(reads) == 1, "both node-down rules of one pass share one read of every GPU's state"
    [node_alert] = open_alerts(node_rule)
    [gpu_alert] = open_alerts(gpu_rule)
    assert node_alert.entity_key == "node-b" and node_alert.annotations["summary"] == "Node node-b: no data for 30 s"
    assert gpu_alert.labels["node"] == "node-a" and gpu_alert.value == 30.0
