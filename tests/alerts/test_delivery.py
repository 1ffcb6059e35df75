"""The notification outbox: claims, the attempt log, retries, disabling channels, the sweep, and a worker
killed in the middle of a delivery (redelivered, no second incident)."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from alerts import tasks
from alerts.delivery import (
    deliver_notification,
    do_enable_channel,
    do_send_test,
    retry_delay,
    sweep_outbox,
)
from alerts.models import Channel, DeliveryAttempt, Notification
from alerts.receiver import Behaviour
from core.models import AuditEntry
from tests.alerts.test_transports import GENIE_KEY, ROUTING_KEY, make_notification

CLAIM_TIMEOUT_S = 3


def pd_notification(receiver, **fields) -> Notification:
    """A pending PagerDuty trigger to the local receiver, due now."""
    fields.setdefault("created_at", timezone.now())
    return make_notification("pagerduty", {"url": receiver.url("/pagerduty")}, secret=ROUTING_KEY, **fields)


def attempt_log(notification: Notification) -> list[tuple[int, str]]:
    return list(DeliveryAttempt.objects.filter(notification=notification).values_list("number", "outcome"))


def reload(notification: Notification) -> Notification:
    return Notification.objects.select_related("channel").get(pk=notification.pk)


def wait_until_delivered(notification: Notification, receiver, worker, timeout: float = 120) -> None:
    """Poll the row until the worker delivered it; fail with what happened so far."""
    deadline = time.monotonic() + timeout
    while (row := reload(notification)).status != "delivered":
        if worker.proc.poll() is not None:
            pytest.fail(worker.failure(2000))
        assert time.monotonic() < deadline, (
            f"not delivered: status {row.status}, attempts {attempt_log(row)}, {len(receiver.requests)} request(s)")
        time.sleep(0.2)


# --- One delivery ---------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_attempt_is_committed_before_the_request_and_completed_after(receiver):
    n = pd_notification(receiver)
    seen_by_provider: list = []

    def look_from_another_connection(_request):
        # The receiver thread has its own database connection: it sees only committed rows.
        seen_by_provider.append(attempt_log(n))
        connection.close()

    receiver.on_request = look_from_another_connection

    assert deliver_notification(n.id) == "delivered"

    assert seen_by_provider == [[(1, "sending")]]
    attempt = DeliveryAttempt.objects.get(notification=n)
    assert (attempt.outcome, attempt.status_code, attempt.error) == ("ok", 202, "")
    assert json.loads(attempt.response)["dedup_key"] == n.dedup_key
    assert attempt.duration_ms > 0 and attempt.request["body"]["event_action"] == "trigger"
    n = reload(n)
    assert (n.status, n.attempts, n.claimed_at, n.error) == ("delivered", 1, None, "")
    assert n.delivered_at is not None and n.channel.last_ok_at == n.delivered_at


@pytest.mark.django_db
def test_retryable_error_then_success_delivers_with_two_attempts(receiver, django_capture_on_commit_callbacks):
    receiver.script.append(Behaviour(status=500, body='{"status": "error"}'))
    n = pd_notification(receiver)

    with override_settings(ALERT_RETRY_BASE_SECONDS=5), django_capture_on_commit_callbacks() as scheduled:
        before = timezone.now()
        assert deliver_notification(n.id) == "retry"
    n = reload(n)
    assert n.status == "pending" and n.error == "PagerDuty answered HTTP 500: error"
    assert before + timedelta(seconds=5) <= n.next_attempt_at <= timezone.now() + timedelta(seconds=5)
    assert len(scheduled) == 1  # the retry task (countdown 5 s), sent after commit
    assert deliver_notification(n.id) == "skipped"  # not due yet
    Notification.objects.filter(pk=n.pk).update(next_attempt_at=timezone.now() - timedelta(seconds=1))

    assert deliver_notification(n.id) == "delivered"

    assert attempt_log(n) == [(1, "retry"), (2, "ok")]
    assert reload(n).attempts == 2 and reload(n).status == "delivered"
    assert [r.json()["dedup_key"] for r in receiver.requests] == [n.dedup_key, n.dedup_key]
    assert receiver.incidents == {n.dedup_key: "trigger"}  # the 500 opened nothing; the retry opened one


@pytest.mark.django_db
def test_retries_stop_after_the_maximum_attempts(receiver, django_capture_on_commit_callbacks):
    receiver.script += [Behaviour(status=503), Behaviour(status=503)]
    n = pd_notification(receiver)
    with override_settings(ALERT_DELIVERY_MAX_ATTEMPTS=2), django_capture_on_commit_callbacks():
        assert deliver_notification(n.id) == "retry"
        Notification.objects.filter(pk=n.pk).update(next_attempt_at=timezone.now())
        assert deliver_notification(n.id) == "failed"
    n = reload(n)
    assert n.status == "failed" and n.error.startswith("gave up after 2 attempts: PagerDuty answered HTTP 503")
    assert attempt_log(n) == [(1, "retry"), (2, "retry")]
    assert n.channel.enabled  # a flaky provider is not a broken channel


def test_retry_delay_doubles_and_honours_retry_after():
    with override_settings(ALERT_RETRY_BASE_SECONDS=5):
        assert [retry_delay(a) for a in (1, 2, 3, 4)] == [5, 10, 20, 40]
        assert retry_delay(1, retry_after=30) == 30
        assert retry_delay(20) == 3600


@pytest.mark.django_db
def test_permanent_error_fails_and_disables_the_channel_with_the_providers_reason(receiver):
    answer = {"status": "invalid event", "message": "Event object is invalid",
              "errors": ["Length of 'routing_key' is incorrect (should be 32 characters)"]}
    receiver.script.append(Behaviour(status=400, body=json.dumps(answer)))
    n = pd_notification(receiver)

    assert deliver_notification(n.id) == "failed"

    n = reload(n)
    assert n.status == "failed" and attempt_log(n) == [(1, "permanent")]
    channel = n.channel
    assert not channel.enabled and channel.disabled_at is not None
    assert channel.disabled_reason == (
        "PagerDuty answered HTTP 400: Event object is invalid - invalid event - "
        "Length of 'routing_key' is incorrect (should be 32 characters)")
    audit = AuditEntry.objects.get(verb="disable", object_kind="channel", object_id=str(channel.pk))
    assert audit.actor == "system:delivery" and audit.reason == channel.disabled_reason


@pytest.mark.django_db
def test_disabled_channel_is_not_called(receiver):
    n = pd_notification(receiver)
    Channel.objects.filter(pk=n.channel_id).update(enabled=False, disabled_reason="PagerDuty answered HTTP 400")

    assert deliver_notification(n.id) == "failed"

    assert receiver.requests == []
    n = reload(n)
    assert n.status == "failed" and n.error == "channel disabled: PagerDuty answered HTTP 400"
    assert attempt_log(n) == [] and n.attempts == 0


@pytest.mark.django_db
def test_bad_channel_config_is_recorded_and_disables_the_channel(receiver):
    n = make_notification("slack", {"url": "hooks.slack.com/no-scheme"}, created_at=timezone.now())
    assert deliver_notification(n.id) == "failed"
    attempt = DeliveryAttempt.objects.get(notification=n)
    assert attempt.outcome == "permanent" and "http(s) url" in attempt.error
    assert not reload(n).channel.enabled


@pytest.mark.django_db
def test_secrets_are_never_stored_in_the_attempt_log(receiver):
    rows = [
        pd_notification(receiver),
        make_notification("opsgenie", {"url": receiver.url("/opsgenie")}, secret=GENIE_KEY,
                          created_at=timezone.now()),
        make_notification("slack", {"url": receiver.url("/services/T0/B0/xoxb-sl4ck-t0k3n")},
                          created_at=timezone.now()),
    ]
    for n in rows:
        assert deliver_notification(n.id) == "delivered"
    stored = json.dumps(list(DeliveryAttempt.objects.values("request", "response", "error")))
    for secret in (ROUTING_KEY, GENIE_KEY, "xoxb-sl4ck-t0k3n"):
        assert secret not in stored
    assert len(receiver.requests) == 3


@pytest.mark.django_db
def test_missing_notification_is_reported_not_raised():
    assert deliver_notification(987654) == "missing"


# --- Claims ---------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_delivered_notification_is_not_sent_again(receiver):
    n = pd_notification(receiver)
    assert deliver_notification(n.id) == "delivered"
    assert deliver_notification(n.id) == "skipped"
    assert len(receiver.requests) == 1


@pytest.mark.django_db
def test_fresh_claim_is_respected_and_stale_claim_is_taken_over(receiver):
    n = pd_notification(receiver, status="sending", claimed_at=timezone.now())
    DeliveryAttempt.objects.create(notification=n, number=1, started_at=timezone.now(), outcome="sending")
    Notification.objects.filter(pk=n.pk).update(attempts=1)

    assert deliver_notification(n.id) == "skipped"  # its worker may still be talking to the provider
    assert receiver.requests == []

    Notification.objects.filter(pk=n.pk).update(claimed_at=timezone.now() - timedelta(seconds=CLAIM_TIMEOUT_S + 1))
    with override_settings(ALERT_CLAIM_TIMEOUT=timedelta(seconds=CLAIM_TIMEOUT_S)):
        assert deliver_notification(n.id) == "delivered"
    assert attempt_log(n) == [(1, "abandoned"), (2, "ok")]
    assert "worker stopped" in DeliveryAttempt.objects.get(notification=n, number=1).error


@pytest.mark.django_db
def test_stale_claim_with_no_attempts_left_fails_without_sending(receiver):
    n = pd_notification(receiver, status="sending", attempts=2,
                        claimed_at=timezone.now() - timedelta(seconds=CLAIM_TIMEOUT_S + 1))
    with override_settings(ALERT_CLAIM_TIMEOUT=timedelta(seconds=CLAIM_TIMEOUT_S), ALERT_DELIVERY_MAX_ATTEMPTS=2):
        assert deliver_notification(n.id) == "failed"
    assert receiver.requests == [] and reload(n).error == "gave up after 2 attempts"


@pytest.mark.django_db(transaction=True)
def test_concurrent_deliveries_of_one_row_send_once(receiver):
    receiver.script.append(Behaviour(status=None, delay=0.5))  # keep the winner busy while the others try
    n = pd_notification(receiver)
    outcomes: list[str] = []

    def worker():
        try:
            outcomes.append(deliver_notification(n.id))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)

    assert sorted(outcomes) == ["delivered", "skipped", "skipped", "skipped"]
    assert len(receiver.requests) == 1 and attempt_log(n) == [(1, "ok")]


# --- The sweep ------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_sweep_enqueues_lost_and_stale_rows_only(receiver):
    from dashboard.celery import app

    now = timezone.now()
    old = now - timedelta(minutes=5)
    due = pd_notification(receiver, next_attempt_at=now - timedelta(seconds=30))
    never_enqueued = pd_notification(receiver, created_at=old)
    stale = pd_notification(receiver, status="sending", claimed_at=now - timedelta(seconds=61))
    pd_notification(receiver, next_attempt_at=now + timedelta(seconds=30))  # its retry is not due
    pd_notification(receiver, next_attempt_at=now - timedelta(seconds=2))  # its own task is about to run
    pd_notification(receiver, status="sending", claimed_at=now - timedelta(seconds=5))  # a live worker's
    pd_notification(receiver, status="delivered", created_at=old)
    pd_notification(receiver, status="failed", created_at=old)
    with override_settings(ALERT_CLAIM_TIMEOUT=timedelta(seconds=60)):
        try:
            assert sweep_outbox(now) == 3
        finally:
            app.control.purge()  # no worker here; drop the tasks it sent
    for n in (due, never_enqueued, stale):
        assert deliver_notification(n.id) == "delivered"


# --- Channel actions ------------------------------------------------------------------------------

@pytest.mark.django_db
def test_send_test_queues_a_test_notification_and_audits_it(receiver, django_user_model,
                                                             django_capture_on_commit_callbacks):
    user = django_user_model.objects.create_user("oncall-lead")
    channel = Channel.objects.create(name="pd", kind="pagerduty", config={"url": receiver.url("/pagerduty")},
                                     secret=ROUTING_KEY)

    with django_capture_on_commit_callbacks() as queued:
        n = do_send_test(channel.pk, user)

    assert len(queued) == 1
    assert (n.event, n.status, n.channel_id) == ("test", "pending", channel.pk)
    assert n.dedup_key.startswith("breakwater-test-")
    assert AuditEntry.objects.filter(actor="oncall-lead", verb="test", object_id=str(channel.pk)).exists()
    assert deliver_notification(n.id) == "delivered"
    event = receiver.requests[0].json()
    assert event["event_action"] == "trigger" and event["dedup_key"] == n.dedup_key
    assert event["payload"]["severity"] == "info" and event["payload"]["summary"].startswith("[TEST]")
    assert do_send_test(channel.pk, user).dedup_key != n.dedup_key  # each test is its own incident


@pytest.mark.django_db
def test_enable_channel_clears_the_disabled_state_and_audits(receiver, django_user_model):
    user = django_user_model.objects.create_user("oncall-lead")
    n = pd_notification(receiver)
    Channel.objects.filter(pk=n.channel_id).update(enabled=False, disabled_reason="PagerDuty answered HTTP 400",
                                                   disabled_at=timezone.now())

    do_enable_channel(n.channel_id, user)

    channel = Channel.objects.get(pk=n.channel_id)
    assert (channel.enabled, channel.disabled_reason, channel.disabled_at) == (True, "", None)
    audit = AuditEntry.objects.get(verb="enable", object_id=str(channel.pk))
    assert audit.actor == "oncall-lead" and audit.reason == "PagerDuty answered HTTP 400"
    assert deliver_notification(n.id) == "delivered"


# --- Real workers ---------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.django_db(transaction=True)
def test_retry_is_scheduled_and_delivered_by_a_real_worker(receiver, celery_worker_process):
    worker = celery_worker_process({"ALERT_RETRY_BASE_SECONDS": "1"})
    receiver.script.append(Behaviour(status=503, body="upstream connect error"))
    n = pd_notification(receiver)

    tasks.deliver.delay(n.id)

    wait_until_delivered(n, receiver, worker)
    assert attempt_log(n) == [(1, "retry"), (2, "ok")]
    gap = receiver.requests[1].at - receiver.requests[0].at
    assert gap >= 0.9  # the backoff (1 s), not an immediate repeat


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.django_db(transaction=True)
def test_worker_killed_mid_delivery_is_redelivered_without_a_duplicate_incident(receiver, celery_worker_process):
    env = {"ALERT_CLAIM_TIMEOUT_SECONDS": str(CLAIM_TIMEOUT_S), "ALERT_HTTP_TIMEOUT_SECONDS": "60"}
    n = pd_notification(receiver)
    # PagerDuty takes the first trigger (the incident opens) but the worker dies before the answer comes.
    receiver.script.append(Behaviour(status=None, delay=120))
    first = celery_worker_process(env)
    tasks.deliver.delay(n.id)
    receiver.wait_for(1, timeout=120)
    assert attempt_log(n) == [(1, "sending")]  # on record before the request left

    first.kill()
    second = celery_worker_process(env)
    claimed_at = reload(n).claimed_at
    expires = claimed_at + timedelta(seconds=CLAIM_TIMEOUT_S)
    time.sleep(max(0.0, (expires - timezone.now()).total_seconds()) + 0.5)
    with override_settings(ALERT_CLAIM_TIMEOUT=timedelta(seconds=CLAIM_TIMEOUT_S)):
        assert sweep_outbox(timezone.now()) == 1

    wait_until_delivered(n, receiver, second)
    requests = receiver.requests
    assert len(requests) == 2
    assert [r.json()["dedup_key"] for r in requests] == [n.dedup_key, n.dedup_key]
    assert receiver.incidents == {n.dedup_key: "trigger"}  # one incident, updated, never a second
    assert attempt_log(n) == [(1, "abandoned"), (2, "ok")]
    assert reload(n).attempts == 2
