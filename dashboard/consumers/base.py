"""The base of every live page's consumer.

Ingest sends a bare tick to the "telemetry" group after each commit (at most one per second,
`telemetry.live`); on a tick the consumer asks one selector for its page's current state,
compares it with what it last sent, and sends only what changed. A tick that arrives while the
last one is still being computed is folded into one more pass, so a slow query never queues up
work. Subclasses implement `push()` and usually `receive_json()` for the page's subscription.
"""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from telemetry.live import TELEMETRY_GROUP
from tenancy.scoping import is_operator

logger = logging.getLogger(__name__)

# Application close codes (4000-4999 are free for applications): not signed in; signed in but not allowed.
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403


async def admit_operator(consumer: AsyncJsonWebsocketConsumer) -> bool:
    """Whether the connecting user is an operator; anyone else is refused (4401 anonymous, 4403 the rest).

    These streams carry cluster-wide state, which a tenant's user must not see: their live views are the
    portal's, whose groups are per tenant.
    """
    user = consumer.scope["user"]
    if not user.is_authenticated:
        await consumer.close(code=CLOSE_UNAUTHENTICATED)
        return False
    if not await database_sync_to_async(is_operator)(user):
        await consumer.close(code=CLOSE_FORBIDDEN)
        return False
    return True


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """Base for a page that recomputes its change on every telemetry tick (operators only)."""

    bw_access = "operator"  # read by the isolation test (tests/tenancy/test_isolation.py)

    async def connect(self) -> None:
        if not await admit_operator(self):
            return
        self._running: asyncio.Task | None = None
        self._again = False
        await self.channel_layer.group_add(TELEMETRY_GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(TELEMETRY_GROUP, self.channel_name)
        if getattr(self, "_running", None):
            self._running.cancel()

    async def telemetry_tick(self, event: dict) -> None:
        self.refresh()

    def refresh(self) -> None:
        """Run `push()` now, or once more after the pass that is running."""
        if self._running and not self._running.done():
            self._again = True
            return
        self._running = asyncio.ensure_future(self._refresh_loop())

    async def _refresh_loop(self) -> None:
        while True:
            self._again = False
            try:
                await self.push()
            except Exception:
                logger.exception("%s: live refresh failed", type(self).__name__)
            if not self._again:
                return

    async def push(self) -> None:
        raise NotImplementedError
