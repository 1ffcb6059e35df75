"""Writing the audit log. Rows are only ever inserted (the database refuses UPDATE and DELETE)."""

from __future__ import annotations

from datetime import datetime

from django.dispatch import Signal
from django.utils import timezone

from core.models import AuditEntry

# Sent with `entry` inside the transaction of the change it records: apps above core act on what concerns them
# (alerts refreshes its live pages when an alert, silence or action changed).
audited = Signal()


def actor_name(user) -> str:
    """The actor string for a user, or 'system' when there is none."""
    return getattr(user, "username", None) or "system"


def do_audit(actor: str, verb: str, object_kind: str, object_id: object, *, reason: str = "", outcome: str = "",
             detail: dict | None = None, at: datetime | None = None) -> AuditEntry:
    """Append one entry; call it inside the transaction of the change it records."""
    entry = AuditEntry.objects.create(
        time=at or timezone.now(), actor=actor[:150], verb=verb[:40], object_kind=object_kind[:40],
        object_id=str(object_id)[:200], reason=reason, outcome=outcome[:40], detail=detail or {},
    )
    audited.send(sender=AuditEntry, entry=entry)
    return entry
