"""Websocket consumers: thin, they join a group and forward what ingest publishes.

Two kinds:

- `FleetConsumer` forwards the fleet summary that ingest computes once per second.
- `LiveConsumer` subclasses serve one page each. Ingest sends a bare tick to the "telemetry"
  group after each commit (at most one per second, `telemetry.live`); on a tick the consumer
  asks one selector for its page's current state, compares it with what it last sent, and sends
  only what changed. A tick that arrives while the last one is still being computed is folded
  into one more pass, so a slow query never queues up work.
"""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from telemetry.live import FLEET_GROUP, TELEMETRY_GROUP
from telemetry.selectors import fleet_summary
from telemetry.selectors.racks import METRICS, SlowCache

logger = logging.getLogger(__name__)

# Application close code for "not signed in" (4000-4999 are free for applications).
CLOSE_UNAUTHENTICATED = 4401


class FleetConsumer(AsyncJsonWebsocketConsumer):
    """Pushes fleet summary changes to the operator's first page."""

    async def connect(self) -> None:
        if not self.scope["user"].is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        # Join before reading, so a change committed while we read is still pushed afterwards.
        await self.channel_layer.group_add(FLEET_GROUP, self.channel_name)
        await self.accept()
        # The page was rendered some time ago; bring it up to date without waiting for ingest.
        await self.send_json(await database_sync_to_async(fleet_summary)())

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(FLEET_GROUP, self.channel_name)

    async def fleet_update(self, event: dict) -> None:
        await self.send_json(event["data"])


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """Base for a page that recomputes its change on every telemetry tick."""

    async def connect(self) -> None:
        if not self.scope["user"].is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
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


# One memo per process for the metrics read from rollups and events (see SlowCache).
_slow_metrics = SlowCache()


class HeatmapConsumer(LiveConsumer):
    """The rack heatmap: every changed cell value of the metric the page shows.

    The page sends {"subscribe": metric} after each (re)connect and after the operator picks
    another metric; the first message after that carries every value ("full": true), later ones
    only the GPUs whose value changed. A GPU id the page has not drawn makes the page reload
    its grid (heatmap.js).
    """

    async def connect(self) -> None:
        self.metric: str | None = None
        self.sent: dict[int, float | None] = {}
        self.seq = 0
        await super().connect()

    async def receive_json(self, content, **kwargs) -> None:
        metric = content.get("subscribe") if isinstance(content, dict) else None
        if metric not in METRICS:
            await self.send_json({"type": "error", "message": f"unknown metric: {metric!r}"})
            return
        self.metric, self.sent = metric, {}
        self.refresh()

    async def push(self) -> None:
        metric = self.metric
        if metric is None:
            return
        values = (await database_sync_to_async(_slow_metrics.get)(metric))["values"]
        if metric != self.metric:
            return  # the page switched metric while we read: its own refresh follows
        full = not self.sent
        changed = {gpu_id: v for gpu_id, v in values.items() if full or self.sent.get(gpu_id) != v}
        # A GPU that lost its value (removed, or its last-value row rebuilt) shows "no data".
        changed.update({gpu_id: None for gpu_id in self.sent.keys() - values.keys() if self.sent[gpu_id] is not None})
        if not changed and not full:
            return
        self.sent.update(changed)
        self.seq += 1
        await self.send_json({"type": "values", "metric": metric, "full": full, "seq": self.seq, "values": changed})
