"""The rack heatmap's consumer."""

from __future__ import annotations

from channels.db import database_sync_to_async

from dashboard.consumers.base import LiveConsumer, TickMemo
from telemetry.selectors.racks import METRICS, SlowCache

# One memo per process for the metrics read from rollups and events (see SlowCache).
_slow_metrics = SlowCache()
# Pages showing the same metric share one read per tick.
_shared = TickMemo()


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
        self.tick = None  # a fresh read, not the last tick's
        self.refresh()

    async def push(self) -> None:
        metric = self.metric
        if metric is None:
            return
        values = (await database_sync_to_async(_shared.get)(metric, self.tick, _slow_metrics.get, metric))["values"]
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
