"""Routing: the route tree, groups and their timers, acknowledge / resolve / repeat / escalate, inhibition, and a
flush that two workers never double-send. Time is fixed; do_route_alerts and do_flush_due_groups are called
directly with explicit times (no Celery), on Alert rows made here."""

from __future__ import annotations

import hashlib
import json
import threading
from datetime import timedelta

import pytest
from django.db import connection

from alerts.matching import fingerprint
from alerts.models import (
    Alert,
    AlertEvent,
    AlertGroup,
    AlertState,
    Channel,
    Notification,
    Route,
)
from alerts.routing import do_flush_due_groups, do_route_alerts
from alerts.silences import do_upsert_inhibit_rule
from tests.conftest import FIXED_NOW

NOW = FIXED_NOW
pytestmark = pytest.mark.django_db


# --- Helpers (test_silences imports them) ---------------------------------------------------------------

def make_channel(name: str) -> Channel:
    return Channel.objects.create(name=name, kind="webhook", config={"url": f"http://127.0.0.1:9/{name}"})


def make_route(name: str, parent: Route | None = None, *, channels=(), escalation=(), **fields) -> Route:
    fields.setdefault("group_wait_s", 30)
    fields.setdefault("group_interval_s", 300)
    fields.setdefault("repeat_interval_s", 3600)
    route = Route.objects.create(name=name, parent=parent, **fields)
    route.channels.set(channels)
    route.escalation_channels.set(escalation)
    return route


def make_alert(alertname: str, *, severity: str = "warning", at=NOW, route: bool = True, **labels) -> Alert:
    """An open alert row with alertname and severity labels, routed at `at` (as the lifecycle would)."""
    labels = {"alertname": alertname, "severity": severity, **labels}
    alert = Alert.objects.create(
        fingerprint=fingerprint(labels), name=alertname, severity=severity, labels=labels, starts_at=at,
        last_seen=at, annotations={"summary": f"{alertname} on {labels.get('gpu') or labels.get('node', '?')}"},
        entity_key=labels.get("gpu") or labels.get("node", ""), value=91.0)
    if route:
        do_route_alerts([alert.pk], at)
    return alert


def set_state(alert: Alert, state: str, at) -> Alert:
    """Move an alert to `state` as the lifecycle does (fields, then routing in the same transaction)."""
    alert.state = state
    alert.acked_at = at if state == AlertState.ACKNOWLEDGED else None
    alert.ends_at = at if state == AlertState.RESOLVED else None
    alert.save(update_fields=["state", "acked_at", "ends_at"])
    do_route_alerts([alert.pk], at)
    alert.refresh_from_db()
    return alert


def flush(at) -> list[Notification]:
    """Run one flush at `at`; the notifications it made, and its return value agrees with them."""
    before = Notification.objects.order_by("-id").values_list("id", flat=True).first() or 0
    made = do_flush_due_groups(at)
    notes = list(Notification.objects.filter(id__gt=before).order_by("id"))
    assert made == len(notes)
    return notes


def alert_ids(note: Notification) -> set[int]:
    return {a["id"] for a in note.payload["alerts"]}


def secs(n: float):
    return NOW + timedelta(seconds=n)


@pytest.fixture
def page() -> Channel:
    return make_channel("page")


# --- Grouping and payload -------------------------------------------------------------------------------

def test_group_by_labels_batches_alerts_per_node_with_complete_payload(page):
    root = make_route("root", channels=[page], group_by=["alertname", "node"])
    a1 = make_alert("GpuOverheating", node="n1", gpu="GPU-a")
    a2 = make_alert("GpuOverheating", node="n1", gpu="GPU-b", at=secs(5))
    b1 = make_alert("GpuOverheating", node="n2", gpu="GPU-c")

    assert AlertGroup.objects.filter(route=root).count() == 2
    notes = flush(secs(30))
    assert len(notes) == 2
    by_node = {n.payload["group_labels"]["node"]: n for n in notes}
    n1 = by_node["n1"]
    assert alert_ids(n1) == {a1.pk, a2.pk} and alert_ids(by_node["n2"]) == {b1.pk}
    assert n1.channel == page and n1.event == "trigger" and n1.status == "pending"
    assert set(n1.alerts.values_list("id", flat=True)) == {a1.pk, a2.pk}
    key = 'alertname="GpuOverheating",node="n1"'
    assert n1.dedup_key == hashlib.sha256(f"{root.pk}:{{{key}}}".encode()).hexdigest()
    p = n1.payload
    assert p["status"] == "firing" and p["event"] == "trigger" and p["route"] == "root"
    assert p["group_key"] == "{" + key + "}"
    assert p["group_labels"] == {"alertname": "GpuOverheating", "node": "n1"}
    assert p["common_labels"] == {"alertname": "GpuOverheating", "node": "n1", "severity": "warning"}
    assert p["title"] == "[FIRING:2] GpuOverheating node=n1"
    assert p["summary"] == "GpuOverheating on GPU-a (and 1 more)"
    assert p["url"] == f"http://localhost:8000/alerts/{a1.pk}/"
    first = p["alerts"][0]
    assert first == {"id": a1.pk, "fingerprint": a1.fingerprint, "name": "GpuOverheating", "state": "firing",
                     "severity": "warning", "labels": a1.labels, "annotations": a1.annotations, "value": 91.0,
                     "starts_at": NOW.isoformat(), "ends_at": None, "url": f"http://localhost:8000/alerts/{a1.pk}/"}
    json.dumps(p)  # what transports render must be plain JSON
    assert AlertEvent.objects.filter(kind="notified", alert__in=[a1, a2, b1]).count() == 3


def test_group_by_dots_makes_one_group_per_label_set_and_empty_group_by_one_group(page):
    dots = make_route("root", channels=[page], group_by=["..."])
    make_route("all-in-one", dots, channels=[page], matchers=[{"name": "team", "op": "=", "value": "ml"}],
               group_by=["-"])  # a label nobody has: every alert of the route in one group
    make_alert("A", node="n1")
    make_alert("A", node="n2")
    make_alert("B", node="n1", team="ml")
    make_alert("C", node="n2", team="ml")

    assert AlertGroup.objects.filter(route=dots).count() == 2
    assert AlertGroup.objects.get(route__name="all-in-one").alerts.count() == 2
    assert AlertGroup.objects.get(route__name="all-in-one").key == "{}"


def test_group_wait_then_group_interval_then_repeat_interval(page):
    make_route("root", channels=[page], group_by=["alertname"], group_wait_s=30, group_interval_s=300,
               repeat_interval_s=3600)
    a = make_alert("Hot", node="n1")
    group = AlertGroup.objects.get()
    assert group.next_flush_at == secs(30)

    assert flush(secs(29)) == []  # group_wait
    assert [alert_ids(n) for n in flush(secs(30))] == [{a.pk}]
    b = make_alert("Hot", node="n2", at=secs(40))
    group.refresh_from_db()
    assert group.next_flush_at == secs(330)  # last notification + group_interval
    assert flush(secs(329)) == []
    assert [alert_ids(n) for n in flush(secs(330))] == [{a.pk, b.pk}]
    assert flush(secs(331)) == []  # nothing changed
    group.refresh_from_db()
    assert group.next_flush_at == secs(330 + 3600) and group.last_notified_at == secs(330)
    assert group.notified_state == {a.fingerprint: "firing", b.fingerprint: "firing"}
    assert flush(secs(330 + 3599)) == []
    repeat = flush(secs(330 + 3600))
    assert [(n.event, alert_ids(n)) for n in repeat] == [("trigger", {a.pk, b.pk})]


def test_change_after_long_quiet_sends_at_once_not_after_group_interval(page):
    make_route("root", channels=[page], group_by=["alertname"])
    make_alert("Hot", node="n1")
    flush(secs(30))
    make_alert("Hot", node="n2", at=secs(1000))
    assert AlertGroup.objects.get().next_flush_at == secs(1000)  # max(last + interval, now)


def test_route_tree_first_match_wins_continue_and_fallback_to_parent(page):
    root = make_route("root", channels=[page], group_by=["alertname"])
    acme = make_route("acme", root, position=0, channels=[page],
                      matchers=[{"name": "tenant", "op": "=", "value": "acme"}])
    make_route("acme-critical", acme, channels=[page], matchers=[{"name": "severity", "op": "=", "value": "critical"}])
    make_route("audit", root, position=1, continue_matching=True, channels=[page],
               matchers=[{"name": "severity", "op": "=~", "value": "critical|warning"}])
    make_route("critical", root, position=2, channels=[page],
               matchers=[{"name": "severity", "op": "=", "value": "critical"}])
    make_route("never", root, position=3, channels=[page],
               matchers=[{"name": "severity", "op": "=", "value": "critical"}])

    def routes_of(alert):
        return set(AlertGroup.objects.filter(alerts=alert).values_list("route__name", flat=True))

    assert routes_of(make_alert("X", severity="critical", tenant="acme")) == {"acme-critical"}
    assert routes_of(make_alert("Y", severity="warning", tenant="acme")) == {"acme"}
    assert routes_of(make_alert("Z", severity="critical", tenant="beta")) == {"audit", "critical"}
    assert routes_of(make_alert("W", severity="warning", tenant="beta")) == {"audit"}
    assert routes_of(make_alert("V", severity="info", tenant="beta")) == {"root"}


def test_child_route_without_channels_or_group_by_inherits_them(page):
    root = make_route("root", channels=[page], group_by=["alertname", "node"])
    make_route("gpu", root, matchers=[{"name": "gpu", "op": "=~", "value": "GPU-.*"}], group_wait_s=0)
    make_alert("Hot", node="n1", gpu="GPU-1")
    make_alert("Hot", node="n1", gpu="GPU-2")

    group = AlertGroup.objects.get()
    assert group.route.name == "gpu" and group.labels == {"alertname": "Hot", "node": "n1"}
    notes = flush(NOW)
    assert [(n.channel.name, n.payload["route"], len(n.payload["alerts"])) for n in notes] == [("page", "gpu", 2)]


# --- Acknowledge, resolve ----------------------------------------------------------------------------

def test_ack_sends_acknowledge_and_unack_triggers_again(page):
    make_route("root", channels=[page], group_by=["alertname"], group_interval_s=60)
    a = make_alert("Hot", node="n1")
    b = make_alert("Hot", node="n2")
    flush(secs(30))

    set_state(a, AlertState.ACKNOWLEDGED, secs(40))
    notes = flush(secs(90))
    assert [n.event for n in notes] == ["trigger"]  # b still fires unacknowledged
    assert {x["id"]: x["state"] for x in notes[0].payload["alerts"]} == {a.pk: "acknowledged", b.pk: "firing"}
    set_state(b, AlertState.ACKNOWLEDGED, secs(100))
    notes = flush(secs(150))
    assert [(n.event, n.payload["status"], n.payload["title"]) for n in notes] == [
        ("acknowledge", "firing", "[ACKNOWLEDGED:2] Hot")]
    assert flush(secs(150 + 7200)) == []  # acknowledged alerts do not repeat
    set_state(b, AlertState.FIRING, secs(8000))
    assert [n.event for n in flush(secs(8000))] == ["trigger"]


def test_all_resolved_sends_resolve_and_empties_the_group(page):
    make_route("root", channels=[page], group_by=["alertname"], group_interval_s=60)
    a = make_alert("Hot", node="n1")
    b = make_alert("Hot", node="n2")
    flush(secs(30))
    set_state(a, AlertState.RESOLVED, secs(40))

    notes = flush(secs(90))
    assert [n.event for n in notes] == ["trigger"]
    assert {x["id"]: x["state"] for x in notes[0].payload["alerts"]} == {a.pk: "resolved", b.pk: "firing"}
    group = AlertGroup.objects.get()
    assert set(group.alerts.values_list("id", flat=True)) == {b.pk}  # a left after its resolve was sent

    set_state(b, AlertState.RESOLVED, secs(100))
    notes = flush(secs(150))
    assert [(n.event, n.payload["status"], n.payload["title"]) for n in notes] == [
        ("resolve", "resolved", "[RESOLVED] Hot")]
    assert notes[0].payload["alerts"][0]["ends_at"] == secs(100).isoformat()
    group.refresh_from_db()
    assert group.alerts.count() == 0 and group.notified_state == {} and group.next_flush_at is None
    assert flush(secs(5000)) == []

    c = make_alert("Hot", node="n3", at=secs(6000))  # a new incident in the same group waits group_wait again
    group.refresh_from_db()
    assert group.next_flush_at == secs(6030)
    assert [alert_ids(n) for n in flush(secs(6030))] == [{c.pk}]
    assert notes[0].dedup_key == Notification.objects.latest("id").dedup_key


def test_alert_resolved_before_first_notification_sends_nothing(page):
    make_route("root", channels=[page], group_by=["alertname"])
    a = make_alert("Blip", node="n1")
    set_state(a, AlertState.RESOLVED, secs(10))
    assert flush(secs(30)) == []
    assert AlertGroup.objects.get().alerts.count() == 0


def test_disabled_channel_gets_no_notification(page):
    off = make_channel("off")
    Channel.objects.filter(pk=off.pk).update(enabled=False)
    make_route("root", channels=[page, off], group_by=["alertname"], group_wait_s=0)
    make_alert("Hot", node="n1")
    assert [n.channel.name for n in flush(NOW)] == ["page"]


# --- Escalation -----------------------------------------------------------------------------------------

@pytest.fixture
def escalating(page):
    boss = make_channel("boss")
    make_route("root", channels=[page], escalation=[boss], group_by=["alertname"], group_wait_s=0,
               escalate_after_s=600, repeat_interval_s=3600)
    return boss


def test_escalation_after_escalate_after_when_unacked(escalating):
    a = make_alert("Down", severity="critical", node="n1")
    assert [n.channel.name for n in flush(NOW)] == ["page"]
    group = AlertGroup.objects.get()
    assert group.next_flush_at == secs(600)  # escalation comes before the repeat

    assert flush(secs(599)) == []
    notes = flush(secs(600))
    assert [(n.channel, n.event, alert_ids(n)) for n in notes] == [(escalating, "escalate", {a.pk})]
    assert notes[0].payload["title"] == "[ESCALATED:1] Down"
    assert AlertEvent.objects.filter(alert=a, kind="escalated").count() == 1
    group.refresh_from_db()
    assert group.escalated_at == secs(600) and group.next_flush_at == secs(3600)
    assert [n.event for n in flush(secs(3600))] == ["trigger"]  # the repeat, never a second escalation
    assert not Notification.objects.filter(event="escalate").exclude(pk=notes[0].pk).exists()


def test_no_escalation_when_acknowledged_in_time(escalating):
    a = make_alert("Down", severity="critical", node="n1")
    flush(NOW)
    set_state(a, AlertState.ACKNOWLEDGED, secs(300))
    flush(secs(300))
    assert [n.event for n in flush(secs(600))] == []
    assert flush(secs(10_000)) == []
    assert not Notification.objects.filter(event="escalate").exists()
    assert not AlertEvent.objects.filter(kind="escalated").exists()


# --- Inhibition -----------------------------------------------------------------------------------------

@pytest.fixture
def node_down_rule():
    # The shipped default (alerts/defaults.py): a down node mutes its GPUs and ports.
    return do_upsert_inhibit_rule(
        "node-down-mutes-its-devices", source_matchers=[{"name": "alertname", "op": "=", "value": "NodeDown"}],
        target_matchers=[{"name": "entity", "op": "=~", "value": "gpu|port"}], equal=["node"], now=NOW)


def test_node_down_inhibits_same_node_devices_only_until_it_resolves(page, node_down_rule):
    make_route("root", channels=[page], group_by=["alertname", "node"], group_wait_s=0, group_interval_s=60)
    down = make_alert("NodeDown", severity="critical", node="X", entity="node")
    gpu_x = make_alert("XidGpuReset", node="X", gpu="GPU-1", entity="gpu")
    port_x = make_alert("IbSymbolErrors", node="X", port="sw1:3", entity="port")
    gpu_y = make_alert("XidGpuReset", node="Y", gpu="GPU-9", entity="gpu")

    for alert in (gpu_x, port_x):
        alert.refresh_from_db()
        assert alert.inhibited_by_id == down.pk and alert.muted
        assert AlertEvent.objects.filter(alert=alert, kind="inhibited").count() == 1
    gpu_y.refresh_from_db()
    assert gpu_y.inhibited_by_id is None
    sent = {frozenset(alert_ids(n)) for n in flush(NOW)}
    assert sent == {frozenset({down.pk}), frozenset({gpu_y.pk})}

    set_state(down, AlertState.RESOLVED, secs(120))
    for alert in (gpu_x, port_x):
        alert.refresh_from_db()
        assert alert.inhibited_by_id is None
        assert AlertEvent.objects.filter(alert=alert, kind="unmuted").count() == 1
    notes = flush(secs(120))
    assert {(n.event, frozenset(alert_ids(n))) for n in notes} == {
        ("resolve", frozenset({down.pk})), ("trigger", frozenset({gpu_x.pk})), ("trigger", frozenset({port_x.pk}))}


def test_alert_notified_then_inhibited_is_held_back_and_told_again_when_released(page, node_down_rule):
    make_route("root", channels=[page], group_by=["alertname", "node"], group_wait_s=0, group_interval_s=60)
    gpu = make_alert("XidGpuReset", node="X", gpu="GPU-1", entity="gpu")
    assert len(flush(NOW)) == 1
    down = make_alert("NodeDown", severity="critical", node="X", entity="node", at=secs(10))
    gpu.refresh_from_db()
    assert gpu.inhibited_by_id == down.pk

    notes = flush(secs(60))
    assert [alert_ids(n) for n in notes] == [{down.pk}]  # the GPU group has only a muted alert: silence
    assert AlertGroup.objects.get(key__contains="XidGpuReset").notified_state == {}
    set_state(down, AlertState.RESOLVED, secs(200))
    assert {frozenset(alert_ids(n)) for n in flush(secs(200))} == {frozenset({gpu.pk}), frozenset({down.pk})}


def test_alert_matching_both_sides_never_inhibits_itself_or_its_twin(page):
    do_upsert_inhibit_rule("critical-mutes-warning", source_matchers=[{"name": "tier", "op": "=", "value": "x"}],
                           target_matchers=[{"name": "tier", "op": "=", "value": "x"}], equal=["node"], now=NOW)
    make_route("root", channels=[page], group_by=["..."], group_wait_s=0)
    a = make_alert("A", node="n1", tier="x")
    b = make_alert("B", node="n1", tier="x")
    a.refresh_from_db()
    b.refresh_from_db()
    assert not a.muted and not b.muted
    assert len(flush(NOW)) == 2


def test_silenced_source_does_not_inhibit(page, node_down_rule):
    from alerts.silences import do_create_silence

    make_route("root", channels=[page], group_by=["alertname", "node"], group_wait_s=0)
    do_create_silence([{"name": "alertname", "op": "=", "value": "NodeDown"}], NOW, secs(3600),
                      author="ops", comment="planned", now=NOW)
    make_alert("NodeDown", severity="critical", node="X", entity="node")
    gpu = make_alert("XidGpuReset", node="X", gpu="GPU-1", entity="gpu")
    gpu.refresh_from_db()
    assert not gpu.muted
    assert [alert_ids(n) for n in flush(NOW)] == [{gpu.pk}]


# --- Scheduling and concurrency ------------------------------------------------------------------------

def test_route_schedules_flush_after_commit_at_group_wait(page, django_capture_on_commit_callbacks):
    make_route("root", channels=[page], group_by=["alertname"], group_wait_s=30)
    make_route("critical", Route.objects.get(name="root"), channels=[page], group_wait_s=0,
               matchers=[{"name": "severity", "op": "=", "value": "critical"}])
    with django_capture_on_commit_callbacks() as callbacks:
        warn = make_alert("Hot", node="n1", route=False)
        crit = make_alert("Down", severity="critical", node="n2", route=False)
        do_route_alerts([warn.pk, crit.pk], NOW)
    assert len(callbacks) == 2  # one flush for the critical group now, one for the other after group_wait
    assert sorted(cb.__defaults__[0] for cb in callbacks) == [0, 30]


@pytest.fixture
def sent_tasks(monkeypatch):
    """The tasks queued after commit, recorded instead of sent: under pytest the settings keep the default queue
    (tests/conftest.py sets CELERY_QUEUE after Django has read it), so a real send would reach a live worker."""
    from alerts import routing

    sent: dict[str, list] = {"deliver": [], "flush_groups": []}
    lock = threading.Lock()

    def record(name, *args, countdown=None):
        with lock:
            sent[name.rpartition(".")[2]].append(args or {"countdown": countdown})

    monkeypatch.setattr(routing, "enqueue", record)
    return sent


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_flushes_never_double_send(sent_tasks):
    page, other = make_channel("page"), make_channel("other")
    make_route("root", channels=[page, other], group_by=["alertname", "node"], group_wait_s=0)
    alerts = [make_alert("Hot", node=f"n{i}") for i in range(20)]
    barrier = threading.Barrier(2)
    results: list[int] = []

    def worker():
        try:
            barrier.wait()
            results.append(do_flush_due_groups(NOW))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sum(results) == 40 and len(results) == 2
    assert Notification.objects.count() == 40
    for alert in alerts:
        assert Notification.objects.filter(alerts=alert).count() == 2
        assert AlertEvent.objects.filter(alert=alert, kind="notified").count() == 1
    assert do_flush_due_groups(NOW) == 0
    # every outbox row is queued for delivery exactly once, after its transaction committed
    queued = sorted(args[0] for args in sent_tasks["deliver"])
    assert queued == sorted(Notification.objects.values_list("id", flat=True))
    assert {kw["countdown"] for kw in sent_tasks["flush_groups"]} == {0}
