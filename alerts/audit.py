"""What an audited change means for the alerts app's live pages (core.audit writes the log itself)."""

from __future__ import annotations

from alerts import live

# What an audited change of each kind changes on the live pages (every remediation and hand-made alert
# change is audited; rule-driven alert changes are published by the lifecycle).
LIVE_TOPICS = {"alert": (live.ALERTS,), "silence": (live.ALERTS,), "action": (live.REMEDIATION, live.ALERTS)}


def publish_audited(sender, entry, **kwargs) -> None:
    """core.audit.audited's receiver: refresh the pages the audited object is on, once the change commits."""
    for topic in LIVE_TOPICS.get(entry.object_kind, ()):
        live.publish_on_commit(topic)
