"""Signed webhooks: the notification as JSON, HMAC-SHA256-signed with the channel's secret.

Config: {"url": "https://…"}; Channel.secret is the shared signing secret. Headers:
  X-Breakwater-Timestamp: unix seconds when sent
  X-Breakwater-Signature: v1=<hex HMAC-SHA256(secret, f"{timestamp}.{body}")>
  X-Breakwater-Delivery:  the notification id; the same on every retry, so receivers deduplicate on it
  X-Breakwater-Event:     trigger, acknowledge, resolve, escalate or test
Receivers should reject timestamps older than a few minutes (replay). Any 2xx is success; 408/425/429/5xx
and network errors are retried; other answers are permanent. See docs/alerting-channels.md.
"""

from __future__ import annotations

import hashlib
import hmac
import time

from alerts.transports.base import HttpRequest, HttpTransport, Outbound, register

SIGNATURE_VERSION = "v1"


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The signature header value for a body sent at `timestamp`."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"{SIGNATURE_VERSION}={digest}"


def build_body(notification) -> dict:
    """The notification payload plus what a receiver needs to deduplicate and route it."""
    return {
        **(notification.payload or {}),
        "delivery_id": notification.id,
        "event": notification.event,
        "dedup_key": notification.dedup_key,
        "channel": notification.channel.name,
    }


@register
class WebhookTransport(HttpTransport):
    """POST the signed JSON notification to any HTTP endpoint."""

    kind = "webhook"
    label = "Webhook"

    def prepare(self, notification) -> Outbound:
        """The JSON body with delivery headers, signed at the moment of sending."""
        url = self.require_url(notification)
        secret = self.require_secret(notification, "signing secret")
        outbound = self.json_request(url, build_body(notification), headers={
            "X-Breakwater-Delivery": str(notification.id),
            "X-Breakwater-Event": notification.event,
        })
        request: HttpRequest = outbound.request
        timestamp = str(int(time.time()))
        extra = {"X-Breakwater-Timestamp": timestamp, "X-Breakwater-Signature": sign(secret, timestamp, request.body)}
        request.headers.update(extra)
        outbound.record["headers"].update(extra)
        return outbound

