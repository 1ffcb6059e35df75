"""Slack incoming webhooks: a Block Kit message with a plain-text fallback.

Config: {"url": "https://hooks.slack.com/services/T…/B…/…"} (the URL is the credential; it is never stored in
the attempt log). Slack answers 200 "ok"; 400 invalid_payload, 403 invalid_token, 404 no_service and 410
channel_is_archived are permanent; 429 and 5xx are retried.
"""

from __future__ import annotations

from alerts.transports import render
from alerts.transports.base import HttpTransport, Outbound, clip, register

# Block Kit limits (api.slack.com/reference/block-kit/blocks).
HEADER_MAX = 150
SECTION_MAX = 3000
BUTTON_TEXT_MAX = 75
URL_MAX = 3000
FALLBACK_MAX = 4000
STATE_EMOJI = {"resolved": ":white_check_mark:", "acknowledged": ":eyes:"}
SEVERITY_EMOJI = {"critical": ":red_circle:", "error": ":red_circle:", "warning": ":large_orange_circle:",
                  "info": ":large_blue_circle:"}


def escape(text: str) -> str:
    """Slack mrkdwn control characters (api.slack.com/reference/surfaces/formatting#escaping)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _alert_mrkdwn(alert: dict) -> str:
    """One alert as a mrkdwn line: state emoji, linked name, entity, summary, state."""
    state = alert.get("state") or "firing"
    emoji = STATE_EMOJI.get(state) or SEVERITY_EMOJI.get(str(alert.get("severity")), ":white_circle:")
    name = escape(alert.get("name") or "alert")
    if alert.get("url") and len(alert["url"]) < 500:
        name = f"<{alert['url']}|{name}>"
    line = f"{emoji} *{name}*"
    if render.entity_of(alert):
        line += f" `{escape(render.entity_of(alert))}`"
    summary = render.summary_of(alert)
    return line + (f" — {escape(clip(summary, 300))}" if summary else "") + f" _{escape(state)}_"


def alerts_section(payload: dict) -> str:
    """The summary and one line per alert, cut (with a count of the rest) to fit one section block."""
    lines = [escape(clip(str(payload.get("summary") or ""), 1000))] if payload.get("summary") else []
    alerts = render.alerts_of(payload)
    for i, alert in enumerate(alerts):
        line = _alert_mrkdwn(alert)
        more = f"…and {len(alerts) - i} more"
        if len("\n".join([*lines, line, more])) > SECTION_MAX:
            lines.append(more)
            break
        lines.append(line)
    return "\n".join(lines) or "(no alerts)"


def build_message(notification) -> dict:
    """The Slack message body: text fallback plus header, alerts, context and a link button."""
    payload = notification.payload or {}
    title = render.headline(notification)
    blocks = [
        {"type": "header", "text": {"type": "plain_text", "text": clip(title, HEADER_MAX), "emoji": True}},
        {"type": "section", "text": {"type": "mrkdwn", "text": alerts_section(payload)}},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": _context(notification)}]},
    ]
    url = str(payload.get("url") or "")
    if url and len(url) <= URL_MAX:
        button = {"type": "button", "text": {"type": "plain_text", "text": clip("Open in Breakwater", BUTTON_TEXT_MAX)},
                  "url": url, "action_id": "breakwater_open"}
        blocks.append({"type": "actions", "elements": [button]})
    fallback = title + (f" — {payload['summary']}" if payload.get("summary") else "")
    return {"text": clip(fallback, FALLBACK_MAX), "blocks": blocks}


def _context(notification) -> str:
    """The small print under the alerts: severity, route, count."""
    payload = notification.payload or {}
    bits = [f"severity *{escape(render.severity_of(payload))}*"]
    if payload.get("route"):
        bits.append(f"route *{escape(payload['route'])}*")
    bits.append(f"{len(render.alerts_of(payload))} alert(s)")
    return " · ".join(bits) + " · Breakwater"


@register
class SlackTransport(HttpTransport):
    """POST a Block Kit message to a Slack incoming webhook."""

    kind = "slack"
    label = "Slack"
    url_is_secret = True

    def prepare(self, notification) -> Outbound:
        """The Block Kit message to the configured URL (the URL is redacted in the stored copy)."""
        url = self.require_url(notification)
        return self.json_request(url, build_message(notification), secrets=(url,))
