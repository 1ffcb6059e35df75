"""Microsoft Teams: an Adaptive Card posted to a Workflows ("Post to a channel when a webhook request is
received") or legacy incoming-webhook URL.

Config: {"url": "https://….logic.azure.com/workflows/…"} (the URL carries its signature; it is never stored).
Workflows answer 202, connectors 200 "1"; a connector that hit Teams' own rate limit answers 200 with
"Microsoft Teams endpoint returned HTTP error 429" in the body, which is retried.
"""

from __future__ import annotations

from alerts.transports import render
from alerts.transports.base import HttpTransport, Outbound, TransportError, clip, register

SCHEMA = "http://adaptivecards.io/schemas/adaptive-card.json"
# Teams rejects messages over ~28 KB; 25 facts and short values keep a card well below that.
MAX_FACTS = 25
FACT_VALUE_MAX = 400
TEXT_MAX = 2000
COLOUR = {"critical": "attention", "error": "attention", "warning": "warning", "info": "accent"}


def _facts(payload: dict) -> list[dict]:
    """One fact per alert (name and entity; severity, state and summary), at most MAX_FACTS."""
    facts = []
    for alert in render.alerts_of(payload)[:MAX_FACTS]:
        title = clip(f"{alert.get('name') or 'alert'} {render.entity_of(alert)}".strip(), 200)
        value = f"{alert.get('severity') or ''} · {alert.get('state') or 'firing'}"
        if render.summary_of(alert):
            value += f" — {render.summary_of(alert)}"
        facts.append({"title": title, "value": clip(value, FACT_VALUE_MAX)})
    return facts


def build_card(notification) -> dict:
    """The Adaptive Card (version 1.4, the newest every Teams client renders)."""
    payload = notification.payload or {}
    severity = render.severity_of(payload)
    colour = "good" if notification.event == "resolve" else COLOUR.get(severity, "default")
    body = [
        {"type": "TextBlock", "text": clip(render.headline(notification), 300), "size": "Large",
         "weight": "Bolder", "wrap": True, "color": colour},
    ]
    if payload.get("summary"):
        body.append({"type": "TextBlock", "text": clip(str(payload["summary"]), TEXT_MAX), "wrap": True})
    facts = _facts(payload)
    if facts:
        body.append({"type": "FactSet", "facts": facts})
    hidden = len(render.alerts_of(payload)) - len(facts)
    if hidden > 0:
        body.append({"type": "TextBlock", "text": f"…and {hidden} more", "isSubtle": True, "wrap": True})
    card = {"$schema": SCHEMA, "type": "AdaptiveCard", "version": "1.4", "body": body,
            "msteams": {"width": "Full"}}
    if payload.get("url"):
        card["actions"] = [{"type": "Action.OpenUrl", "title": "Open in Breakwater", "url": str(payload["url"])}]
    return card


def build_message(notification) -> dict:
    """The webhook body: one message carrying the card as an attachment."""
    attachment = {"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": None,
                  "content": build_card(notification)}
    return {"type": "message", "attachments": [attachment]}


@register
class TeamsTransport(HttpTransport):
    """POST an Adaptive Card message to a Teams workflow or incoming webhook."""

    kind = "teams"
    label = "Microsoft Teams"
    url_is_secret = True

    def prepare(self, notification) -> Outbound:
        """The card message to the configured URL (the URL is redacted in the stored copy)."""
        url = self.require_url(notification)
        return self.json_request(url, build_message(notification), secrets=(url,))

    def check_answer(self, status: int, text: str) -> None:
        """A connector reports its own rate limit inside a 200: retry it."""
        if "HTTP error 429" in text:
            raise TransportError("Microsoft Teams rate limited the connector (HTTP error 429 in a 200 answer)",
                                 status_code=status, response=text)
