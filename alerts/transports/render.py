"""Reading a Notification.payload the same way in every transport: headline, severity, one line per alert.

The payload schema is alerts.routing's (see /docs/alerting-channels.md); these helpers tolerate missing
keys so a hand-written or older payload still renders.
"""

from __future__ import annotations

from typing import Any

# Highest first; PagerDuty's four levels (Breakwater rules use critical, warning and info).
SEVERITY_RANK = {"critical": 0, "error": 1, "warning": 2, "info": 3}
# Labels that name what an alert is about, most specific first.
ENTITY_LABELS = ("gpu", "port", "node", "job", "rack")
EVENT_TAG = {"trigger": "FIRING", "acknowledge": "ACKNOWLEDGED", "resolve": "RESOLVED",
             "escalate": "ESCALATED", "test": "TEST"}


def alerts_of(payload: dict) -> list[dict]:
    """The payload's alerts (dicts), never None."""
    return [a for a in payload.get("alerts") or [] if isinstance(a, dict)]


def severity_of(payload: dict) -> str:
    """The highest severity among the payload's open alerts (all alerts if none is open); 'warning' if unknown."""
    alerts = alerts_of(payload)
    open_ones = [a for a in alerts if a.get("state") != "resolved"] or alerts
    found = [str(a.get("severity") or (a.get("labels") or {}).get("severity") or "") for a in open_ones]
    found.append(str((payload.get("common_labels") or {}).get("severity") or ""))
    known = [s for s in found if s in SEVERITY_RANK]
    return min(known, key=SEVERITY_RANK.__getitem__) if known else "warning"


def headline(notification) -> str:
    """'[FIRING:3] <title>' and the like; the subject of emails and the fallback text of chat messages."""
    payload = notification.payload or {}
    tag = EVENT_TAG.get(notification.event, str(notification.event).upper())
    if notification.event == "trigger":
        firing = sum(1 for a in alerts_of(payload) if a.get("state") != "resolved")
        tag = f"{tag}:{firing}" if firing else tag
    title = str(payload.get("title") or "Breakwater alert")
    return f"[{tag}] {title}".replace("\n", " ")


def entity_of(alert: dict) -> str:
    """What the alert is about: its most specific entity label's value, or ''."""
    labels = alert.get("labels") or {}
    return next((str(labels[k]) for k in ENTITY_LABELS if labels.get(k)), "")


def summary_of(alert: dict) -> str:
    """The alert's summary annotation (or description), or ''."""
    annotations = alert.get("annotations") or {}
    return str(annotations.get("summary") or annotations.get("description") or "")


def alert_line(alert: dict) -> str:
    """'critical GpuHot gpu-0a1b (firing): temperature 91 C' as plain text."""
    parts = [str(alert.get("severity") or ""), str(alert.get("name") or "alert")]
    entity = entity_of(alert)
    if entity:
        parts.append(entity)
    line = " ".join(p for p in parts if p) + f" ({alert.get('state') or 'firing'})"
    summary = summary_of(alert)
    return f"{line}: {summary}" if summary else line


def source_of(payload: dict) -> str:
    """The system the notification is about, for providers that want one (PagerDuty source, Opsgenie entity)."""
    common = payload.get("common_labels") or {}
    for key in ("node", "rack", "gpu", "port", "job"):
        if common.get(key):
            return str(common[key])
    alerts = alerts_of(payload)
    return (entity_of(alerts[0]) if alerts else "") or str(payload.get("group_key") or "") or "breakwater"


def string_map(values: Any) -> dict[str, str]:
    """A label dict with every value as a string (providers reject nested values)."""
    if not isinstance(values, dict):
        return {}
    return {str(k): "" if v is None else str(v) for k, v in values.items()}
