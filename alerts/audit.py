"""Writing the audit log. Rows are only ever inserted (the database refuses UPDATE and DELETE)."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from alerts import live
from alerts.models import AuditEntry

# What an audited change of each kind changes on the live pages (every remediation and hand-made alert
# change is audited; rule-driven alert changes are published by the lifecycle).
LIVE_TOPICS = {"alert": (live.ALERTS,), "silence": (live.ALERTS,), "action": (live.REMEDIATION, live.ALERTS)}


def actor_name(user) -> str:
    """The actor string for a user, or 'system' when there is none."""
    return getattr(user, "username", None) or "system"


def do_audit(actor: str, verb: str, object_kind: str, object_id: object, *, reason: str = "", outcome: str = "",
             detail: dict | None = None, at: datetime | None = None) -> AuditEntry:
    """Append one entry; call it inside the transaction of the change it records."""
    for topic in LIVE_TOPICS.get(object_kind, ()):
        live.publish_on_commit(topic)
    return AuditEntry.objects.create(
        time=at or timezone.now(), actor=actor[:150], verb=verb[:40], object_kind=object_kind[:40],
        object_id=str(object_id)[:200], reason=reason, outcome=outcome[:40], detail=detail or {},
    )
