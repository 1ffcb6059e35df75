"""Tickets (an RMA request for a GPU): a Notification in the outbox of the channel named in params["channel"],
delivered by the alerts delivery pipeline (alerts.tasks.deliver) like any other notification.

The notification's dedup_key is the action's idempotency key, so a provider that deduplicates (PagerDuty,
Opsgenie, a signed webhook's delivery id) opens one ticket however often the action is retried, and a retried
run reuses the row it already wrote. Verification reads the row back: delivered is verified, failed is not,
still queued is reported as queued (verified unknown).
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from alerts.models import Channel, Notification, NotificationEvent, NotificationStatus, RemediationAction
from alerts.remediation.backends.base import BackendError, Outcome, command
from core.queue import enqueue
from telemetry.models import Gpu


def _channel(action: RemediationAction) -> Channel:
    name = action.params.get("channel")
    channel = Channel.objects.filter(name=name).first() if name else None
    if channel is None:
        raise BackendError(f"no channel named {name!r} to open the ticket on (params.channel)")
    return channel


def ticket_payload(action: RemediationAction) -> dict:
    """The notification payload (the schema every transport renders) describing the ticket."""
    gpu = Gpu.objects.select_related("node").filter(uuid=action.target_key).first()
    where = f" in {gpu.node.hostname} (GPU {gpu.index}, serial {gpu.serial or 'unknown'})" if gpu else ""
    base = settings.BREAKWATER_BASE_URL
    labels = {"alertname": "RemediationTicket", "severity": "warning", "gpu": action.target_key,
              **({"node": gpu.node.hostname} if gpu else {})}
    alert = action.alert
    alerts = [{"id": alert.pk, "fingerprint": alert.fingerprint, "name": alert.name, "state": alert.state,
               "severity": alert.severity, "labels": alert.labels, "annotations": alert.annotations,
               "value": alert.value, "starts_at": alert.starts_at.isoformat(),
               "ends_at": alert.ends_at.isoformat() if alert.ends_at else None,
               "url": f"{base}/alerts/{alert.pk}/"}] if alert else []
    return {"status": "firing", "event": NotificationEvent.TRIGGER, "route": "remediation",
            "group_key": action.idempotency_key, "group_labels": labels, "common_labels": labels,
            "title": f"RMA ticket: GPU {action.target_key}{where}",
            "summary": action.reason, "url": f"{base}/remediation/", "alerts": alerts,
            "ticket": {"action_id": action.pk, "kind": action.kind, "target": action.target_key,
                       "evidence": action.evidence}}


class TicketBackend:
    """Opens a ticket by notifying a channel through the outbox."""

    name = "webhook"
    asynchronous = False

    def plan(self, action: RemediationAction) -> list[str]:
        return [f"notify channel {action.params.get('channel')!r}: ticket for GPU {action.target_key}"]

    @transaction.atomic
    def run(self, action: RemediationAction) -> Outcome:
        channel = _channel(action)
        key = action.idempotency_key[:255]
        note = Notification.objects.filter(channel=channel, dedup_key=key).first()
        if note is None:
            note = Notification.objects.create(channel=channel, event=NotificationEvent.TRIGGER, dedup_key=key,
                                               payload=ticket_payload(action), created_at=timezone.now())
            if action.alert_id:
                note.alerts.add(action.alert_id)
            _enqueue_delivery(note.pk)
        self.notification_id = note.pk
        return Outcome([command(f"notify {channel.name} ({channel.kind}): {note.payload.get('title', '')}",
                                notification=note.pk)], detail={"notification": note.pk})

    def verify(self, action: RemediationAction) -> tuple[bool | None, dict]:
        note_id = getattr(self, "notification_id", None)
        note = Notification.objects.filter(pk=note_id).first() if note_id else None
        if note is None:
            return False, {"check": "notification", "error": "no notification"}
        detail = {"check": "notification", "notification": note.pk, "status": note.status}
        if note.status == NotificationStatus.DELIVERED:
            return True, detail
        if note.status == NotificationStatus.FAILED:
            return False, {**detail, "error": note.error}
        return None, {**detail, "note": "queued for delivery"}


def _enqueue_delivery(notification_id: int) -> None:
    transaction.on_commit(lambda: enqueue("alerts.tasks.deliver", notification_id))
