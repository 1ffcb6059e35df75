"""The rack heatmap's consumer."""

from __future__ import annotations

import json

from dashboard.consumers.base import LiveConsumer, TickMemo
from telemetry.selectors.racks import METRICS, SlowCache, gpu_readings, uses_readings

# One memo per process for the metrics read from rollups and events (see SlowCache).
_slow_metrics = SlowCache()
# Pages showing the same metric share one read per tick.
_shared = TickMemo()
READINGS = ("readings",)  # the memo key of every GPU's state and newest values (never a metric's name)
DIFF_MEMO_MAX = 8  # a few metrics open at once, and pages a tick behind; each entry holds up to 2 reads


class SharedDiffs:
    """The cells that changed from one shared read to the next, found and JSON-encoded once for all pages.

    Every heatmap showing a metric reads the same shared values dict each tick, so pages that drew the
    previous read need the same diff. At 16k GPUs and 15 open heatmaps, each page comparing 16k values
    and encoding its own copy of the message was the largest single cost of the live pages in daphne.
    Keyed by the identity of both reads, and holding them, so an id cannot be reused while memoised.
    Reads are never changed once made (TickMemo's contract), and a cell absent from a read is "no data",
    the same as None.
    """

    def __init__(self) -> None:
        self._memo: dict[tuple[int, int], tuple[dict | None, dict, dict, str]] = {}

    def between(self, old: dict | None, new: dict) -> tuple[dict, str]:
        """(changed cells, their JSON) from `old` (None: nothing drawn yet, so every cell) to `new`."""
        key = (id(old), id(new))
        hit = self._memo.get(key)
        if hit is not None and hit[0] is old and hit[1] is new:
            return hit[2], hit[3]
        if old is None:
            changed = new
        else:
            changed = {gpu_id: v for gpu_id, v in new.items() if old.get(gpu_id) != v}
            # A GPU that lost its value (removed, or its last-value row rebuilt) shows "no data".
            changed.update({gpu_id: None for gpu_id in old.keys() - new.keys() if old[gpu_id] is not None})
        encoded = json.dumps(changed)
        if len(self._memo) >= DIFF_MEMO_MAX:
            self._memo.clear()
        self._memo[key] = (old, new, changed, encoded)
        return changed, encoded


_diffs = SharedDiffs()


class HeatmapConsumer(LiveConsumer):
    """The rack heatmap: every changed cell value of the metric the page shows.

    The page sends {"subscribe": metric} after each (re)connect and after the operator picks
    another metric; the first message after that carries every value ("full": true), later ones
    only the GPUs whose value changed. A GPU id the page has not drawn makes the page reload
    its grid (heatmap.js).
    """

    pace_memo = _shared  # passes paced by what its shared reads cost (LiveConsumer)

    async def connect(self) -> None:
        self.metric: str | None = None
        self.drawn: dict | None = None  # the shared read the page's cells now equal; None: draw every cell
        self.seq = 0
        await super().connect()

    async def receive_json(self, content, **kwargs) -> None:
        metric = content.get("subscribe") if isinstance(content, dict) else None
        if metric not in METRICS:
            await self.send_json({"type": "error", "message": f"unknown metric: {metric!r}"})
            return
        self.metric, self.drawn = metric, None
        self.tick = None  # a fresh read, not the last tick's
        self.refresh()

    @staticmethod
    def _read(metric: str, tick: str | None) -> dict:
        """`metric` for this tick: the pages of every metric derived from readings share one fleet read."""
        readings = _shared.get(READINGS, tick, gpu_readings) if uses_readings(metric) else None
        return _shared.get(metric, tick, _slow_metrics.get, metric, readings)

    async def push(self) -> None:
        metric = self.metric
        if metric is None:
            return
        values = (await _shared.run(self._read, metric, self.tick))["values"]
        if metric != self.metric:
            return  # the page switched metric while we read: its own refresh follows
        full = self.drawn is None
        changed, encoded = _diffs.between(self.drawn, values)
        self.drawn = values
        if not changed and not full:
            return
        self.seq += 1
        # The message as send_json would encode it, around the diff encoded once for every page.
        await self.send(text_data=f'{{"type": "values", "metric": {json.dumps(metric)}, '
                                  f'"full": {"true" if full else "false"}, "seq": {self.seq}, "values": {encoded}}}')
