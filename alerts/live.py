"""Tell the open alert and remediation pages that what they show changed.

A change calls `publish_on_commit(topic)` inside its transaction; after the commit one bare message
{"type": "live.changed", "topic", "at"} goes to the topic's channel-layer group, on which every page
of that topic re-renders its live regions (`dashboard.consumers.pages`). Rolled back, nothing is sent.

Coalescing, per process and topic: the first change sends at once; changes within MIN_INTERVAL_S of a
send arm one timer that sends once when the interval is over, so a storm of a thousand alerts is one
or two messages a second, and the last change of a burst still reaches the pages. Pages pace their own
renders as well, so several processes publishing at once cost them no more. Best effort: a failure is
logged, never raised into the change that published.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import threading
import time
from datetime import UTC

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.utils import timezone

logger = logging.getLogger(__name__)

ALERTS = "alerts"  # alert rows: fired, merged, resolved, acknowledged, silenced
REMEDIATION = "remediation"  # remediation actions: requested, decided, run, verified
TOPICS = (ALERTS, REMEDIATION)
MIN_INTERVAL_S = 1.0

_guard = threading.Lock()
_last_sent: dict[str, float] = {}  # topic -> time.monotonic() of its last send
_armed: dict[str, threading.Timer] = {}  # topic -> the trailing send waiting for the interval to end


def group_name(topic: str) -> str:
    """The channel-layer group of a topic's pages."""
    return f"live.{topic}"


def publish_on_commit(topic: str) -> None:
    """Tell the topic's pages once the current transaction commits (at once outside a transaction)."""
    if topic not in TOPICS:
        raise ValueError(f"unknown live topic {topic!r}; expected one of {TOPICS}")
    transaction.on_commit(functools.partial(publish, topic), robust=True)


def publish(topic: str) -> None:
    """Send now, or arm the topic's trailing send if one went out less than MIN_INTERVAL_S ago."""
    with _guard:
        if topic in _armed:
            return  # the armed send goes out after this commit: it covers this change
        wait = _last_sent.get(topic, -math.inf) + MIN_INTERVAL_S - time.monotonic()
        if wait > 0:
            timer = threading.Timer(wait, _send_trailing, args=(topic,))
            timer.daemon = True
            _armed[topic] = timer
            timer.start()
            return
        _last_sent[topic] = time.monotonic()
    _send(topic)


def _send_trailing(topic: str) -> None:
    with _guard:
        _armed.pop(topic, None)
        _last_sent[topic] = time.monotonic()
    _send(topic)


def _send(topic: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        _send_now(topic)
    else:
        # This thread runs an event loop (a commit inside async code): async_to_sync cannot block on it here.
        threading.Thread(target=_send_now, args=(topic,), daemon=True).start()


def _send_now(topic: str) -> None:
    try:
        at = timezone.now().astimezone(UTC).isoformat()  # the telemetry tick's format: pages order ticks by it
        async_to_sync(get_channel_layer().group_send)(group_name(topic), {"type": "live.changed", "topic": topic,
                                                                          "at": at})
    except Exception:
        logger.exception("live %s publish failed", topic)
