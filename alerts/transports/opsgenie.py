"""Opsgenie Alert API v2 (docs.opsgenie.com/docs/alert-api).

Config: {"url": optional, default https://api.opsgenie.com; EU accounts use https://api.eu.opsgenie.com};
Channel.secret is the API integration key, sent as "Authorization: GenieKey <key>" (never stored).
The notification's dedup_key is the alert alias: a redelivery updates the open alert, and acknowledge/close
address it by alias. Opsgenie answers 202 (processed asynchronously); 401/403/422 and other 4xx are
permanent; 429 and 5xx are retried.
"""

from __future__ import annotations

from urllib.parse import quote

from alerts.transports import render
from alerts.transports.base import HttpTransport, Outbound, clip, register

DEFAULT_URL = "https://api.opsgenie.com"
# Field limits from the Create Alert reference.
MESSAGE_MAX = 130
ALIAS_MAX = 512
DESCRIPTION_MAX = 15000
ENTITY_MAX = 512
SOURCE_MAX = 100
USER_MAX = 100
NOTE_MAX = 25000
TAGS_MAX = 20
TAG_MAX = 50
DETAILS_MAX_CHARS = 8000
PRIORITY = {"critical": "P1", "error": "P2", "warning": "P3", "info": "P5"}
SOURCE = "Breakwater"


def _tags(payload: dict) -> list[str]:
    """Short tags to filter on in Opsgenie, within its count and length limits."""
    common = payload.get("common_labels") or {}
    tags = ["breakwater", render.severity_of(payload)]
    tags += [f"{k}:{common[k]}" for k in ("alertname", "tenant", "rack") if common.get(k)]
    if payload.get("route"):
        tags.append(f"route:{payload['route']}")
    return [clip(str(t), TAG_MAX) for t in dict.fromkeys(tags)][:TAGS_MAX]


def _details(payload: dict) -> dict[str, str]:
    """Group labels plus the console link, as strings, within Opsgenie's total size for details."""
    details = {"url": str(payload.get("url") or ""), "route": str(payload.get("route") or "")}
    used = sum(len(k) + len(v) for k, v in details.items())
    for key, value in render.string_map(payload.get("group_labels")).items():
        used += len(key) + len(value)
        if used > DETAILS_MAX_CHARS:
            break
        details.setdefault(key, value)
    return {k: v for k, v in details.items() if v}


def _description(payload: dict) -> str:
    """The summary, one line per alert and the console link, cut to Opsgenie's limit."""
    lines = [str(payload.get("summary") or "")] if payload.get("summary") else []
    lines += [f"- {render.alert_line(a)}" for a in render.alerts_of(payload)]
    if payload.get("url"):
        lines.append(f"\n{payload['url']}")
    return clip("\n".join(lines), DESCRIPTION_MAX)


def create_body(notification) -> dict:
    """Create Alert body: message, alias (dedup key), description, tags, details, entity, source, priority."""
    payload = notification.payload or {}
    return {
        "message": clip(render.headline(notification), MESSAGE_MAX),
        "alias": notification.dedup_key[:ALIAS_MAX],
        "description": _description(payload),
        "tags": _tags(payload),
        "details": _details(payload),
        "entity": clip(render.source_of(payload), ENTITY_MAX),
        "source": SOURCE,
        "priority": PRIORITY.get(render.severity_of(payload), "P3"),
    }


def action_body(notification) -> dict:
    """Acknowledge / Close body: who did it and a note."""
    payload = notification.payload or {}
    verb = "acknowledged" if notification.event == "acknowledge" else "resolved"
    note = f"{verb.capitalize()} in Breakwater" + (f": {payload['url']}" if payload.get("url") else "")
    return {"source": SOURCE, "user": clip(SOURCE, USER_MAX), "note": clip(note, NOTE_MAX)}


@register
class OpsgenieTransport(HttpTransport):
    """Create, acknowledge or close an Opsgenie alert identified by the notification's dedup key."""

    kind = "opsgenie"
    label = "Opsgenie"

    def prepare(self, notification) -> Outbound:
        """Create for trigger/escalate/test; acknowledge or close by alias otherwise."""
        base = self.require_url(notification, DEFAULT_URL).rstrip("/")
        key = self.require_secret(notification, "API key")
        headers = {"Authorization": f"GenieKey {key}"}
        if notification.event in ("acknowledge", "resolve"):
            verb = "acknowledge" if notification.event == "acknowledge" else "close"
            alias = quote(notification.dedup_key[:ALIAS_MAX], safe="")
            url = f"{base}/v2/alerts/{alias}/{verb}?identifierType=alias"
            return self.json_request(url, action_body(notification), headers=headers, secrets=(key,))
        return self.json_request(f"{base}/v2/alerts", create_body(notification), headers=headers, secrets=(key,))
