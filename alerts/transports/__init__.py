"""Notification transports, one module per channel kind, registered by name.

    transport = alerts.transports.get(channel.kind)
    result = transport.notify(notification)       # or prepare() + send(), as alerts.delivery does

Importing this package registers every kind (the modules below).
"""

from __future__ import annotations

from alerts.transports import email, opsgenie, pagerduty, slack, teams, webhook  # noqa: F401 - registers
from alerts.transports.base import (
    REGISTRY,
    DeliveryResult,
    HttpTransport,
    Outbound,
    Transport,
    TransportError,
)

__all__ = ["DeliveryResult", "HttpTransport", "Outbound", "Transport", "TransportError", "get", "kinds"]


def get(kind: str) -> Transport:
    """The transport for a channel kind; an unknown kind is a permanent TransportError."""
    try:
        return REGISTRY[kind]()
    except KeyError:
        raise TransportError(f"no transport for channel kind {kind!r}", permanent=True) from None


def kinds() -> list[str]:
    """Every registered kind."""
    return sorted(REGISTRY)
