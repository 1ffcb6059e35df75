"""The alert lifecycle: fire, merge duplicates, resolve, fire again as a new alert, acknowledge; the advisory
lock against double firing; the Redis-debounced evaluation trigger; playbooks queued after commit."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta

import pytest
import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection

from alerts.actions import (
    MAX_PACING_S,
    MIN_SPACING_S,
    PACE,
    clear_evaluation_flag,
    evaluation_flag_key,
    pacing_key,
    record_evaluation,
    schedule_evaluation,
)
from alerts.lifecycle import (
    Observation,
    do_ack_alert,
    do_apply_observations,
    do_resolve_alert,
    do_resolve_orphans,
    do_unack_alert,
)
from alerts.matching import fingerprint
from alerts.models import Alert, AlertEvent, AlertSource, AlertState, Rule, RuleKind
from core.models import AuditEntry
from tests.conftest import FIXED_NOW

T0 = FIXED_NOW


@pytest.fixture
def rule(db):
    return Rule.objects.create(name="GpuHot", kind=RuleKind.THRESHOLD, metric="gpu_temp", op=">", threshold=85,
                               severity="critical")


def _obs(gpu: str = "GPU-1", value: float = 90.0, **annotations) -> Observation:
    labels = {"alertname": "GpuHot", "severity": "critical", "gpu": gpu, "node": "node-a", "entity": "gpu"}
    return Observation(labels, {"summary": f"hot {value}", "value": str(value), **annotations}, "gpu", gpu, value)


def _events(alert: Alert) -> list[str]:
    return list(alert.events.values_list("kind", flat=True))


def test_new_observation_fires_alert_with_fired_event(rule):
    ids = do_apply_observations(rule, [_obs()], T0)
    alert = Alert.objects.get()
    assert ids == [alert.pk]
    assert (alert.state, alert.rule, alert.source, alert.name, alert.severity) == (
        AlertState.FIRING, rule, AlertSource.RULE, "GpuHot", "critical")
    assert alert.fingerprint == fingerprint(_obs().labels)
    assert (alert.entity_kind, alert.entity_key, alert.value, alert.starts_at) == ("gpu", "GPU-1", 90.0, T0)
    assert _events(alert) == ["fired"]


def test_resighting_merges_and_records_only_real_changes(rule):
    do_apply_observations(rule, [_obs(value=90.0)], T0)
    # The gauge drifts: same alert, value and last_seen follow, but no event and no new occurrence.
    assert do_apply_observations(rule, [_obs(value=91.5)], T0 + timedelta(seconds=10)) == []
    alert = Alert.objects.get()
    assert (alert.value, alert.last_seen, alert.occurrences) == (91.5, T0 + timedelta(seconds=10), 1)
    assert alert.annotations["summary"] == "hot 91.5"
    assert _events(alert) == ["fired"]
    # A real change (a stable annotation, e.g. an event count) is a merged duplicate.
    ids = do_apply_observations(rule, [_obs(value=91.5, count="2")], T0 + timedelta(seconds=20))
    alert.refresh_from_db()
    assert ids == [alert.pk]
    assert alert.occurrences == 2
    assert _events(alert) == ["fired", "merged"]
    assert Alert.objects.count() == 1


def test_unobserved_alert_resolves_only_when_result_is_complete(rule):
    do_apply_observations(rule, [_obs("GPU-1"), _obs("GPU-2")], T0)
    later = T0 + timedelta(seconds=30)
    assert do_apply_observations(rule, [], later, complete=False) == []
    assert Alert.objects.filter(state=AlertState.FIRING).count() == 2
    ids = do_apply_observations(rule, [_obs("GPU-2")], later)
    gone = Alert.objects.get(entity_key="GPU-1")
    assert ids == [gone.pk]
    assert (gone.state, gone.ends_at) == (AlertState.RESOLVED, later)
    assert _events(gone) == ["fired", "resolved"]
    assert Alert.objects.get(entity_key="GPU-2").state == AlertState.FIRING


def test_refire_after_resolve_is_a_new_alert(rule):
    do_apply_observations(rule, [_obs()], T0)
    do_apply_observations(rule, [], T0 + timedelta(seconds=10))
    do_apply_observations(rule, [_obs()], T0 + timedelta(seconds=20))
    old, new = Alert.objects.order_by("pk")
    assert old.fingerprint == new.fingerprint
    assert (old.state, new.state) == (AlertState.RESOLVED, AlertState.FIRING)
    assert new.starts_at == T0 + timedelta(seconds=20)
    assert _events(new) == ["fired"]


def test_ack_unack_and_resolve_record_events_and_audit(rule):
    user = get_user_model().objects.create_user("oncall")
    [alert_id] = do_apply_observations(rule, [_obs()], T0)
    alert = do_ack_alert(alert_id, user, "looking", now=T0 + timedelta(seconds=1))
    assert (alert.state, alert.acked_by) == (AlertState.ACKNOWLEDGED, user)
    do_ack_alert(alert_id, user)  # twice changes nothing
    # An acknowledged alert still merges re-sightings and keeps its acknowledgement.
    do_apply_observations(rule, [_obs(value=95.0)], T0 + timedelta(seconds=10))
    assert Alert.objects.get().state == AlertState.ACKNOWLEDGED
    do_unack_alert(alert_id, user, "not mine", now=T0 + timedelta(seconds=20))
    do_resolve_alert(alert_id, "oncall", "fixed by hand", now=T0 + timedelta(seconds=30))
    alert.refresh_from_db()
    assert (alert.state, alert.ends_at, alert.acked_by) == (AlertState.RESOLVED, T0 + timedelta(seconds=30), None)
    assert _events(alert) == ["fired", "acknowledged", "unacknowledged", "resolved"]
    assert list(AlertEvent.objects.filter(alert=alert).exclude(kind="fired").values_list("actor", "note")) == [
        ("oncall", "looking"), ("oncall", "not mine"), ("oncall", "fixed by hand")]
    verbs = list(AuditEntry.objects.order_by("time", "id").values_list("verb", "object_id"))
    assert verbs == [("alert.ack", str(alert_id)), ("alert.unack", str(alert_id)), ("alert.resolve", str(alert_id))]


def test_ack_of_resolved_alert_is_refused(rule):
    [alert_id] = do_apply_observations(rule, [_obs()], T0)
    do_apply_observations(rule, [], T0 + timedelta(seconds=10))
    with pytest.raises(ValueError, match="resolved"):
        do_ack_alert(alert_id, None)


def test_alerts_of_deleted_rule_resolve(rule):
    do_apply_observations(rule, [_obs()], T0)
    rule.delete()
    ids = do_resolve_orphans(T0 + timedelta(seconds=5))
    assert Alert.objects.get(pk__in=ids).state == AlertState.RESOLVED


# --- After commit: playbooks and the evaluation trigger (real Redis, the test's own queue) -------------

@pytest.fixture
def queue():
    """The test queue in Redis, emptied; returns a reader of the task names and args queued since."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    names = (settings.CELERY_TASK_DEFAULT_QUEUE, settings.CELERY_ALERTS_QUEUE)
    client.delete(*names)
    clear_evaluation_flag()

    def tasks() -> list[tuple[str, str]]:
        out = []
        for name in names:
            for raw in client.lrange(name, 0, -1):
                msg = json.loads(raw)
                out.append((msg["headers"]["task"], msg["headers"].get("argsrepr", "")))
        return out

    client.delete(pacing_key())
    yield tasks
    client.delete(*names, pacing_key())
    clear_evaluation_flag()


def test_playbooks_queued_after_commit_for_fired_alerts_only(rule, queue, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        [fired] = do_apply_observations(rule, [_obs()], T0)
    with django_capture_on_commit_callbacks(execute=True) as merged:
        do_apply_observations(rule, [_obs(value=99.0)], T0 + timedelta(seconds=10))
    assert merged == []
    assert queue() == [("alerts.tasks.run_playbooks", f"([{fired}],)")]


def test_schedule_evaluation_queues_one_run_until_evaluation_starts(queue):
    for _ in range(5):
        schedule_evaluation()
    assert queue() == [("alerts.tasks.evaluate", "()")]
    assert redis.Redis.from_url(settings.REDIS_URL).ttl(evaluation_flag_key()) > 0
    clear_evaluation_flag()  # what run_evaluation does first: a later commit queues exactly one more
    schedule_evaluation()
    schedule_evaluation()
    assert [t for t, _ in queue()] == ["alerts.tasks.evaluate"] * 2


@pytest.mark.django_db(transaction=True)
def test_an_evaluation_never_waits_in_a_worker_slot_for_another(queue):
    """A worker slot blocked on the lifecycle lock is one rollups cannot use: busy means defer or drop."""
    import psycopg

    from alerts import tasks
    from alerts.locks import LIFECYCLE_LOCK

    schedule_evaluation()  # the trigger flag is set and one run is queued
    held = psycopg.connect(_dsn())
    try:
        held.execute("SELECT pg_advisory_xact_lock(%s, %s)", list(LIFECYCLE_LOCK))  # a running evaluation
        assert tasks.evaluate(backstop=True) == {"skipped": "an evaluation is running"}
        assert tasks.evaluate() == {"deferred_s": tasks.BUSY_RETRY_S}
        # Queued again for after the running pass; the flag stays set, so commits queue nothing more.
        assert [t for t, _ in queue()] == ["alerts.tasks.evaluate"] * 2
        schedule_evaluation()
        assert len(queue()) == 2
    finally:
        held.rollback()
        held.close()
    counts = tasks.evaluate()
    assert counts["errors"] == 0 and "ms" in counts
    schedule_evaluation()  # the run cleared the flag: the next commit queues one more
    assert len(queue()) == 3


def _dsn() -> str:
    from django.db import connection as conn

    params = conn.get_connection_params()
    return " ".join(f"{k}={v}" for k, v in params.items() if k in ("host", "port", "user", "password", "dbname"))


def _etas(queue_name: str) -> list[float | None]:
    """Seconds from now until each queued message is due (None: due at once), newest first (kombu LPUSHes)."""
    out = []
    for raw in redis.Redis.from_url(settings.REDIS_URL).lrange(queue_name, 0, -1):
        eta = json.loads(raw)["headers"].get("eta")
        out.append(None if eta is None else (datetime.fromisoformat(eta) - datetime.now(UTC)).total_seconds())
    return out


def test_triggered_evaluations_are_paced_by_the_last_ones_duration(queue):
    """A pass that took 0.4 s and started just now: the next triggered run is due PACE times that after it
    started (2.4 s), so evaluation keeps to about a sixth of a worker slot; an old pass delays nothing, a
    pathological one is capped, and a short one that just started holds the next for the minimum spacing."""
    import time as clock

    assert PACE * 0.4 < MAX_PACING_S  # the first case below is paced by duration, not by the cap
    record_evaluation(clock.time(), 0.4)
    schedule_evaluation()
    [delay] = _etas(settings.CELERY_ALERTS_QUEUE)
    assert delay is not None and PACE * 0.4 - 0.5 < delay <= PACE * 0.4 + 0.1
    clear_evaluation_flag()
    record_evaluation(clock.time() - 60, 1.0)  # long ago
    schedule_evaluation()
    assert _etas(settings.CELERY_ALERTS_QUEUE)[0] is None
    clear_evaluation_flag()
    record_evaluation(clock.time(), 30.0)  # a pathological pass: the wait is capped
    schedule_evaluation()
    assert _etas(settings.CELERY_ALERTS_QUEUE)[0] <= MAX_PACING_S + 0.1
    clear_evaluation_flag()
    record_evaluation(clock.time(), 0.05)  # a fast pass just started: the next waits out the minimum spacing
    schedule_evaluation()
    delay = _etas(settings.CELERY_ALERTS_QUEUE)[0]
    assert delay is not None and MIN_SPACING_S - 0.2 < delay <= MIN_SPACING_S + 0.1


def test_a_new_fault_is_evaluated_at_once_even_while_a_paced_run_waits(queue):
    """An urgent trigger (a commit that opened a fault event) is queued unpaced beside the paced run, once
    until an evaluation starts; the evaluation's start clears both triggers."""
    import time as clock

    record_evaluation(clock.time(), 0.4)  # a pass just started: the paced run waits ~2.4 s
    schedule_evaluation()
    schedule_evaluation(urgent=True)
    schedule_evaluation(urgent=True)
    paced_and_urgent = _etas(settings.CELERY_ALERTS_QUEUE)
    assert len(paced_and_urgent) == 2 and paced_and_urgent[0] is None and paced_and_urgent[1] > 1.0
    clear_evaluation_flag()
    schedule_evaluation(urgent=True)
    schedule_evaluation()
    assert len(_etas(settings.CELERY_ALERTS_QUEUE)) == 4


def test_an_unreadable_pacing_record_delays_nothing(queue):
    redis.Redis.from_url(settings.REDIS_URL).set(pacing_key(), "not two numbers")
    schedule_evaluation()
    assert _etas(settings.CELERY_ALERTS_QUEUE) == [None]


def test_an_evaluation_records_its_duration_for_pacing(db):
    from alerts.evaluation import run_evaluation

    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(pacing_key())
    counts = run_evaluation(datetime.now(UTC))
    started, duration = map(float, client.get(pacing_key()).split())
    assert abs(duration * 1000 - counts["ms"]) < 1
    assert abs(started - datetime.now(UTC).timestamp()) < 30
    client.delete(pacing_key())


def test_paging_tasks_go_to_the_paging_queue_and_the_rest_to_the_default_one(queue):
    """evaluate, flush and deliver have a queue (and in `./dev up` a worker) of their own; playbooks do not."""
    from celery import current_app

    with current_app.connection_for_write() as conn:  # both queues bound, as a worker consuming them binds them
        for q in current_app.amqp.queues.values():
            q.bind(conn).declare()
    for name in ("alerts.tasks.evaluate", "alerts.tasks.flush_groups", "alerts.tasks.deliver",
                 "alerts.tasks.run_playbooks"):
        current_app.send_task(name, args=(1,) if name.endswith(("deliver", "playbooks")) else ())
    client = redis.Redis.from_url(settings.REDIS_URL)
    in_queue = {q: sorted(json.loads(raw)["headers"]["task"] for raw in client.lrange(q, 0, -1))
                for q in (settings.CELERY_ALERTS_QUEUE, settings.CELERY_TASK_DEFAULT_QUEUE)}
    assert in_queue == {settings.CELERY_ALERTS_QUEUE: ["alerts.tasks.deliver", "alerts.tasks.evaluate",
                                                       "alerts.tasks.flush_groups"],
                        settings.CELERY_TASK_DEFAULT_QUEUE: ["alerts.tasks.run_playbooks"]}
    # Each task in one queue only (a queue bound by the default routing key would get every task), and a worker
    # started without -Q (one general worker and nothing else) consumes both.
    assert {q.name for q in current_app.amqp.queues.values()} >= set(in_queue)


def test_evaluation_flag_is_per_queue():
    assert evaluation_flag_key().startswith(settings.CELERY_TASK_DEFAULT_QUEUE + ":")


# --- Two evaluators at once ------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_concurrent_evaluators_never_double_fire():
    rule = Rule.objects.create(name="GpuHot", kind=RuleKind.THRESHOLD, metric="gpu_temp", threshold=85)
    barrier, errors = threading.Barrier(4), []

    def evaluator() -> None:
        try:
            barrier.wait()
            do_apply_observations(rule, [_obs("GPU-1"), _obs("GPU-2")], T0)
        except Exception as exc:  # surfaced below; a unique violation would land here
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=evaluator) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert Alert.objects.count() == 2
    assert AlertEvent.objects.filter(kind="fired").count() == 2

