"""Delivering the notification outbox, and the two channel actions that go with it (test, re-enable).

`deliver_notification(id)` is what the Celery task `alerts.tasks.deliver` runs. It is safe to run twice,
concurrently, or after a worker died half-way:

1. Claim: one conditional UPDATE turns the row to 'sending' if it is pending and due, or if it is
   'sending' under a claim older than ALERT_CLAIM_TIMEOUT (its worker died). Only one worker wins.
2. Record before: in its own committed transaction, count the attempt and write a DeliveryAttempt
   (outcome 'sending', the request without secrets). An attempt left 'sending' by a dead worker is
   marked 'abandoned' here. So the log shows every request that may have reached the provider.
3. Send through the channel kind's transport (alerts.transports); it never raises.
4. Record after: the attempt's status code, answer, duration and outcome, then the row's fate:
   delivered; pending again with doubling backoff and a scheduled task (retryable, attempts left);
   failed (out of attempts, or permanent, which also disables the channel with the provider's reason).
   The row is only changed if this worker still holds the claim it made in step 1.

Providers deduplicate on Notification.dedup_key (PagerDuty dedup_key, Opsgenie alias, webhook
X-Breakwater-Delivery), so a redelivery after step 3 never opens a second incident.
`sweep_outbox(now)` (beat, every 15 s) re-enqueues due rows whose task was lost and stale claims.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from alerts import transports, urlguard
from alerts.models import Channel, DeliveryAttempt, Notification, NotificationEvent, NotificationStatus
from alerts.transports import DeliveryResult, TransportError
from core.audit import actor_name, do_audit
from core.queue import enqueue

log = logging.getLogger(__name__)

SENDING = "sending"
ABANDONED = "abandoned"
ABANDONED_ERROR = "the worker stopped before the provider's answer was recorded; delivered again"
# A countdown task may start a moment before next_attempt_at; it should not then find the row "not due".
CLOCK_SLACK = timedelta(seconds=1)
# Pending rows younger than this still have their own task on the way; the sweep leaves them to it.
SWEEP_GRACE = timedelta(seconds=10)
SWEEP_BATCH = 500
MAX_RETRY_DELAY_S = 3600


def deliver_notification(notification_id: int) -> str:
    """Deliver one outbox row (steps in the module docstring). Returns delivered, retry, failed, skipped
    (not due, taken by another worker or done), missing, superseded or error; never raises."""
    try:
        return _deliver(notification_id)
    except Exception:  # the database went away mid-delivery: the claim goes stale and the sweep retries
        log.exception("delivery of notification %s failed", notification_id)
        return "error"


def _deliver(notification_id: int) -> str:
    """Steps 1-4 for one row (deliver_notification catches what escapes)."""
    claimed_at = timezone.now()
    if not _claim(notification_id, claimed_at):
        return "skipped" if Notification.objects.filter(pk=notification_id).exists() else "missing"
    notification = Notification.objects.select_related("channel").get(pk=notification_id)
    channel = notification.channel
    if not channel.enabled:
        return _fail_unsent(notification, claimed_at, f"channel disabled: {channel.disabled_reason or 'by hand'}")
    if notification.attempts >= settings.ALERT_DELIVERY_MAX_ATTEMPTS:
        return _fail_unsent(notification, claimed_at, f"gave up after {notification.attempts} attempts")
    try:
        transport = transports.get(channel.kind)
        outbound = transport.prepare(notification)
    except TransportError as exc:
        attempt = _record_start(notification, {"kind": channel.kind})
        return _record_result(notification, attempt, claimed_at, DeliveryResult.from_error(exc))
    except Exception as exc:  # a rendering bug: retried (bounded), never a reason to disable the channel
        log.exception("cannot render notification %s for %s", notification_id, channel.kind)
        attempt = _record_start(notification, {"kind": channel.kind})
        return _record_result(notification, attempt, claimed_at,
                              DeliveryResult(outcome="retry", error=f"cannot render: {exc!r}"[:2000]))
    attempt = _record_start(notification, outbound.record)  # committed before anything leaves
    result = transport.send(outbound)
    return _record_result(notification, attempt, claimed_at, result)


def _stale_claim(now: datetime) -> Q:
    """Rows claimed by a worker that has been silent longer than ALERT_CLAIM_TIMEOUT (presumed dead)."""
    return Q(status=NotificationStatus.SENDING) & (
        Q(claimed_at__isnull=True) | Q(claimed_at__lt=now - settings.ALERT_CLAIM_TIMEOUT))


def _claim(notification_id: int, now: datetime) -> bool:
    """Step 1: the conditional UPDATE (autocommit: the claim is visible to every other worker at once)."""
    due = Q(status=NotificationStatus.PENDING) & (
        Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now + CLOCK_SLACK))
    claimed = Notification.objects.filter(due | _stale_claim(now), pk=notification_id)
    return claimed.update(status=NotificationStatus.SENDING, claimed_at=now) == 1


def _abandon_unfinished(notification_id: int) -> None:
    """Mark attempts a dead worker left in flight as abandoned."""
    DeliveryAttempt.objects.filter(notification_id=notification_id, outcome=SENDING).update(
        outcome=ABANDONED, error=ABANDONED_ERROR)


@transaction.atomic
def _record_start(notification: Notification, request: dict) -> DeliveryAttempt:
    """Step 2: count the attempt and log the request; the transaction commits before the send."""
    _abandon_unfinished(notification.pk)
    Notification.objects.filter(pk=notification.pk).update(attempts=F("attempts") + 1)
    notification.refresh_from_db(fields=["attempts"])
    return DeliveryAttempt.objects.create(notification=notification, number=notification.attempts,
                                          started_at=timezone.now(), request=request, outcome=SENDING)


def _record_result(notification: Notification, attempt: DeliveryAttempt, claimed_at: datetime,
                   result: DeliveryResult) -> str:
    """Step 4: the provider's answer on the attempt, then the row's new state (if the claim is still ours)."""
    now = timezone.now()
    with transaction.atomic():
        DeliveryAttempt.objects.filter(pk=attempt.pk).update(
            duration_ms=result.duration_ms, status_code=result.status_code, response=result.response,
            error=result.error, outcome=result.outcome)
        row = (Notification.objects.select_for_update()
               .filter(pk=notification.pk, status=NotificationStatus.SENDING, claimed_at=claimed_at).first())
        if row is None:
            log.warning("notification %s was taken over by another worker; attempt %s: %s",
                        notification.pk, attempt.number, result.outcome)
            return "superseded"
        if result.ok:
            outcome = _mark_delivered(row, now)
        elif result.outcome == "retry" and row.attempts < settings.ALERT_DELIVERY_MAX_ATTEMPTS:
            outcome = _schedule_retry(row, result, now)
        else:
            outcome = _mark_failed(row, result, now)
    log.info("notification %s attempt %s via %s: %s %s", row.pk, attempt.number, notification.channel.kind,
             outcome, result.error or result.status_code)
    return outcome


def _mark_delivered(row: Notification, now: datetime) -> str:
    """The provider took it: done, and the channel is known to work."""
    Notification.objects.filter(pk=row.pk).update(status=NotificationStatus.DELIVERED, delivered_at=now,
                                                  claimed_at=None, next_attempt_at=None, error="")
    Channel.objects.filter(pk=row.channel_id).update(last_ok_at=now)
    return "delivered"


def retry_delay(attempts: int, retry_after: float | None = None) -> float:
    """Seconds until the next try: ALERT_RETRY_BASE_SECONDS doubling per attempt, at least the provider's
    Retry-After, at most an hour."""
    delay = settings.ALERT_RETRY_BASE_SECONDS * 2 ** max(attempts - 1, 0)
    return float(min(max(delay, retry_after or 0), MAX_RETRY_DELAY_S))


def _schedule_retry(row: Notification, result: DeliveryResult, now: datetime) -> str:
    """Back to pending with backoff, and a countdown task after commit."""
    delay = retry_delay(row.attempts, result.retry_after)
    Notification.objects.filter(pk=row.pk).update(status=NotificationStatus.PENDING, claimed_at=None,
                                                  next_attempt_at=now + timedelta(seconds=delay), error=result.error)
    # robust: if the broker is down the row is still pending and the sweep sends it later.
    transaction.on_commit(lambda: enqueue("alerts.tasks.deliver", row.pk, countdown=delay), robust=True)
    return "retry"


def _mark_failed(row: Notification, result: DeliveryResult, now: datetime) -> str:
    """Out of attempts, or refused for good (which also disables the channel)."""
    error = result.error if result.outcome == "permanent" else f"gave up after {row.attempts} attempts: {result.error}"
    Notification.objects.filter(pk=row.pk).update(status=NotificationStatus.FAILED, claimed_at=None,
                                                  next_attempt_at=None, error=error)
    if result.outcome == "permanent":
        _disable_channel(row.channel_id, result.error, row.pk, now)
    return "failed"


def _disable_channel(channel_id: int, reason: str, notification_id: int, now: datetime) -> None:
    """A permanent refusal (bad key, unknown service) will refuse every later message too: stop sending."""
    channel = Channel.objects.select_for_update().get(pk=channel_id)
    if not channel.enabled:
        return
    channel.enabled, channel.disabled_reason, channel.disabled_at = False, reason, now
    channel.save(update_fields=["enabled", "disabled_reason", "disabled_at"])
    do_audit("system:delivery", "disable", "channel", channel.pk, reason=reason, outcome="disabled",
             detail={"notification": notification_id, "kind": channel.kind}, at=now)


def _fail_unsent(notification: Notification, claimed_at: datetime, error: str) -> str:
    """Give up on a row without sending it (disabled channel, attempts used up)."""
    with transaction.atomic():
        _abandon_unfinished(notification.pk)
        Notification.objects.filter(pk=notification.pk, claimed_at=claimed_at).update(
            status=NotificationStatus.FAILED, claimed_at=None, next_attempt_at=None, error=error)
    log.info("notification %s not sent: %s", notification.pk, error)
    return "failed"


def sweep_outbox(now: datetime) -> int:
    """Re-enqueue rows whose delivery task was lost: pending and due for SWEEP_GRACE (their own task
    normally gets there first), or claimed by a presumed-dead worker. Returns how many were enqueued."""
    due_at = now - SWEEP_GRACE
    lost = Q(status=NotificationStatus.PENDING) & (
        Q(next_attempt_at__lte=due_at) | Q(next_attempt_at__isnull=True, created_at__lte=due_at))
    rows = Notification.objects.filter(lost | _stale_claim(now)).order_by("next_attempt_at", "pk")
    ids = list(rows.values_list("pk", flat=True)[:SWEEP_BATCH])
    for notification_id in ids:
        enqueue("alerts.tasks.deliver", notification_id)
    if ids:
        log.info("outbox sweep re-enqueued %d notification(s)", len(ids))
    return len(ids)


# --- Channel actions ------------------------------------------------------------------------------

def build_test_payload(channel: Channel, now: datetime, actor: str) -> dict:
    """A one-alert payload in the routing schema, marked as a test."""
    url = f"{settings.BREAKWATER_BASE_URL}/alerts/"
    labels = {"alertname": "BreakwaterTest", "severity": "info", "channel": channel.name}
    alert = {"id": None, "fingerprint": "test", "name": "BreakwaterTest", "state": "firing", "severity": "info",
             "labels": labels, "annotations": {"summary": f"Test notification sent by {actor}"}, "value": None,
             "starts_at": now.isoformat(), "ends_at": None, "url": url}
    return {"status": "firing", "event": NotificationEvent.TEST.value, "route": "test", "group_key": "test",
            "group_labels": {}, "common_labels": labels, "title": f"Test notification for {channel.name}",
            "summary": f"{actor} tested this {channel.get_kind_display()} channel; no action is needed.",
            "url": url, "alerts": [alert]}


@transaction.atomic
def do_send_test(channel_id: int, user) -> Notification:
    """Queue a test notification to one channel (delivered like any other, so it shows in the log).
    A URL the outbound guard refuses is a ValidationError on config.url (400), not a doomed delivery."""
    channel = Channel.objects.get(pk=channel_id)
    urlguard.validate_channel(channel.kind, channel.config)
    now, actor = timezone.now(), actor_name(user)
    notification = Notification.objects.create(
        channel=channel, event=NotificationEvent.TEST, status=NotificationStatus.PENDING,
        # Unique per test: each test is its own PagerDuty incident / Opsgenie alert, never a real one's update.
        dedup_key=f"breakwater-test-{uuid.uuid4().hex}", payload=build_test_payload(channel, now, actor),
        created_at=now, next_attempt_at=now)
    do_audit(actor, "test", "channel", channel.pk, outcome="queued", detail={"notification": notification.pk}, at=now)
    transaction.on_commit(lambda: enqueue("alerts.tasks.deliver", notification.pk), robust=True)
    return notification


@transaction.atomic
def do_enable_channel(channel_id: int, user) -> Channel:
    """Switch delivery back on after a permanent error was fixed; notifications that failed stay failed."""
    channel = Channel.objects.select_for_update().get(pk=channel_id)
    if channel.enabled:
        return channel
    previous = channel.disabled_reason
    channel.enabled, channel.disabled_reason, channel.disabled_at = True, "", None
    channel.save(update_fields=["enabled", "disabled_reason", "disabled_at"])
    do_audit(actor_name(user), "enable", "channel", channel.pk, reason=previous, outcome="enabled")
    return channel
