"""The Anomalies page's consumer: the filtered event list and the open-per-detector chart.

The page subscribes by message after each (re)connect, with the filters it was rendered with:

    {"subscribe": "anomalies", "sub": 1, "state": "open" | "24h" | "7d", "kind": "", "q": ""}

and gets the whole list at once, then again on a telemetry tick whenever the list or the chart
changed (ingest ticks at most once a second; the scoring pass ticks after it commits):

    {"type": "anomalies", "sub": 1, "seq": 3, "rows": [display rows, newest first], "limited": bool,
     "open_total": n, "figure": {Plotly spec}, "scored_text": when the detectors last ran}

The list is a few hundred rows at most and changes a few times a minute, so the page redraws it
whole rather than patching rows. A bad filter is answered {"type": "error", "message": ...}.
"""

from __future__ import annotations

from channels.db import database_sync_to_async

from dashboard.consumers.base import LiveConsumer
from dashboard.pages.anomalies import FilterError, page_data, parse_filters


class AnomalyConsumer(LiveConsumer):
    """Pushes the Anomalies page's list and chart when they change; see the module docstring."""

    async def connect(self) -> None:
        self.sub: dict | None = None
        self.seq = 0
        await super().connect()

    async def receive_json(self, content, **kwargs) -> None:
        if not isinstance(content, dict) or content.get("subscribe") != "anomalies":
            await self.send_json({"type": "error", "message": 'expected {"subscribe": "anomalies", ...}'})
            return
        try:
            filters = parse_filters(content)
        except FilterError as exc:
            await self.send_json({"type": "error", "message": str(exc)})
            return
        # A new dict per subscription: a pass still reading for the old one sees it is stale.
        self.sub = {"sub": content.get("sub", 0), "filters": filters, "sent": None}
        self.refresh()

    async def push(self) -> None:
        sub = self.sub
        if sub is None:
            return
        data = await database_sync_to_async(page_data)(sub["filters"])
        if sub is not self.sub or data == sub["sent"]:
            return  # the page subscribed anew while we read (its refresh follows), or nothing changed
        sub["sent"] = data
        self.seq += 1
        await self.send_json({"type": "anomalies", "sub": sub["sub"], "seq": self.seq, **data})
