"""PagerDuty Events API v2 (developer.pagerduty.com/docs/events-api-v2/overview).

Config: {"url": optional, default https://events.pagerduty.com/v2/enqueue}; Channel.secret is the
integration's 32-character routing key (never stored in the attempt log). The notification's dedup_key
is PagerDuty's dedup_key, so a redelivery updates the open incident instead of opening a second one, and
acknowledge/resolve reach the incident the trigger opened. 202 is success; 400 (invalid event) is
permanent; 429 and 5xx are retried.
"""

from __future__ import annotations

from django.conf import settings

from alerts.transports import render
from alerts.transports.base import HttpTransport, Outbound, TransportError, clip, register

DEFAULT_URL = "https://events.pagerduty.com/v2/enqueue"
SUMMARY_MAX = 1024
DEDUP_KEY_MAX = 255
ROUTING_KEY_LEN = 32
SEVERITIES = ("critical", "error", "warning", "info")
# Notification events PagerDuty knows; escalations and tests open (or update) an incident.
EVENT_ACTION = {"trigger": "trigger", "escalate": "trigger", "test": "trigger",
                "acknowledge": "acknowledge", "resolve": "resolve"}
MAX_LINKS = 5


def _custom_details(payload: dict) -> dict:
    """What an on-call engineer reads in the incident: route, group labels, one line per alert."""
    alerts = render.alerts_of(payload)
    return {
        "route": payload.get("route") or "",
        "group_labels": render.string_map(payload.get("group_labels")),
        "firing": sum(1 for a in alerts if a.get("state") != "resolved"),
        "alerts": [render.alert_line(a) for a in alerts[:50]],
    }


def _links(payload: dict) -> list[dict]:
    """The console link and the first alerts' own pages (PagerDuty shows a handful)."""
    links = [{"href": payload["url"], "text": "Open in Breakwater"}] if payload.get("url") else []
    for alert in render.alerts_of(payload)[: MAX_LINKS - len(links)]:
        if alert.get("url"):
            links.append({"href": alert["url"], "text": clip(render.alert_line(alert), 200)})
    return links


def _timestamp(payload: dict) -> str | None:
    """The earliest alert start (ISO 8601), when the problem began."""
    starts = sorted(str(a["starts_at"]) for a in render.alerts_of(payload) if a.get("starts_at"))
    return starts[0] if starts else None


def trigger_payload(notification) -> dict:
    """PagerDuty's `payload` object for a trigger event."""
    payload = notification.payload or {}
    common = payload.get("common_labels") or {}
    summary = render.headline(notification)
    if payload.get("summary"):
        summary += f": {payload['summary']}"
    body = {
        "summary": clip(summary, SUMMARY_MAX),
        "source": clip(render.source_of(payload), 255),
        "severity": render.severity_of(payload),
        "custom_details": _custom_details(payload),
    }
    optional = {"timestamp": _timestamp(payload), "component": common.get("gpu") or common.get("port"),
                "group": common.get("rack") or common.get("node"), "class": common.get("alertname")}
    body.update({k: str(v) for k, v in optional.items() if v})
    return body


def build_event(notification, routing_key: str) -> dict:
    """The Events API v2 body for this notification's event (trigger, acknowledge or resolve)."""
    action = EVENT_ACTION.get(notification.event)
    if action is None:
        raise TransportError(f"PagerDuty has no event for {notification.event!r}", permanent=True)
    event = {"routing_key": routing_key, "event_action": action, "dedup_key": notification.dedup_key[:DEDUP_KEY_MAX]}
    if action == "trigger":
        payload = notification.payload or {}
        event.update(payload=trigger_payload(notification), links=_links(payload), client="Breakwater",
                     client_url=payload.get("url") or settings.BREAKWATER_BASE_URL)
    return event


@register
class PagerDutyTransport(HttpTransport):
    """Send trigger / acknowledge / resolve events to a PagerDuty service integration."""

    kind = "pagerduty"
    label = "PagerDuty"

    def prepare(self, notification) -> Outbound:
        """The Events API v2 event; a routing key of the wrong length is permanent."""
        url = self.require_url(notification, DEFAULT_URL)
        key = self.require_secret(notification, "routing key")
        if len(key) != ROUTING_KEY_LEN:
            raise TransportError(f"PagerDuty routing key must be {ROUTING_KEY_LEN} characters, not {len(key)}",
                                 permanent=True)
        return self.json_request(url, build_event(notification, key), secrets=(key,))
