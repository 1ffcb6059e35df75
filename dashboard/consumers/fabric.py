"""The Fabric page's consumer: changed leaf × spine cells and changed switch-graph edges.

The page sends {"subscribe": metric} after each (re)connect and when the operator picks another
metric. The first message after that carries every cell and edge ("full": true); on each
telemetry tick after that only those whose value changed, in columns:

    {"type": "fabric", "metric": "congestion", "full": false, "seq": 7,
     "cells": {"leaf": [...], "spine": [...], "value": [...]},
     "edges": {"id": [...], "state": [...], "util_pct": [...], "links": [...], "links_down": [...],
               "errors_per_s": [...], "xmit_wait_per_s": [...]},
     "removed": [edge ids no longer in the graph], "part": 1, "parts": 1}

A large change goes out in parts of at most `PART_SIZE` cells and edges each ("part" k of
"parts"), `removed` in the last; the page applies each part as it comes.

Both come from one `fabric_graph()` read. Every leaf-spine edge carries its switch pair's
utilization, summed XmitWait and summed error rate, which are the three metrics `fabric_matrix`
aggregates over the same pairs, so a tick costs one query, not two. Values are compared and sent
to four significant digits: what the page shows, without float noise that would resend a cell.

At 16k GPUs that read takes seconds, so the pages open in one process share it (`SharedGraph`).
"""

from __future__ import annotations

import asyncio
import time

from channels.db import database_sync_to_async

from dashboard.consumers.base import LiveConsumer
from telemetry.selectors.fabric import METRICS, fabric_graph

# The graph edge field that holds each matrix metric's value for a leaf-spine pair.
METRIC_FIELD = {"utilization": "util_pct", "congestion": "xmit_wait_per_s", "errors": "errors_per_s"}
EDGE_FIELDS = ("state", "util_pct", "links", "links_down", "errors_per_s", "xmit_wait_per_s")
_ROUNDED = frozenset({"util_pct", "errors_per_s", "xmit_wait_per_s"})
# Cells and edges per message. Daphne refuses websocket messages over 1 MiB; a full message at
# 16k GPUs (16,384 of each) is ~1.4 MB, and 4,000 of each stay under ~0.6 MB whatever the names.
PART_SIZE = 4000
# The read normally takes 0.7-2.5 s at 16k GPUs; once, under a heavy ingest and rollup burst, one
# ran for over 15 minutes. Past this it is cancelled (and logged); the next tick reads again.
READ_TIMEOUT_MS = 20_000


def read_graph() -> list[dict]:
    """`fabric_graph()` under a statement timeout, so a read gone wrong cannot hold the
    process's database thread and every open page's updates behind it."""
    return fabric_graph(timeout_ms=READ_TIMEOUT_MS)


class SharedGraph:
    """One `read_graph()` at a time per process, shared by every page that needs it.

    1. A page that learned of a change at monotonic time `since` needs a read that started at or
       after `since`; any such read, finished or still running, serves it.
    2. Otherwise it starts a new read, which every later caller with an earlier `since` joins.
    3. A read that failed is never served again.
    """

    def __init__(self) -> None:
        self._started = float("-inf")
        self._read: asyncio.Future | None = None

    async def get(self, since: float) -> list[dict]:
        read = self._read
        stale = read is None or self._started < since or read.get_loop() is not asyncio.get_running_loop()
        if stale or (read.done() and (read.cancelled() or read.exception() is not None)):
            self._started = time.monotonic()
            read = self._read = asyncio.ensure_future(database_sync_to_async(read_graph)())
        return await asyncio.shield(read)


_shared = SharedGraph()


class FabricConsumer(LiveConsumer):
    """The fabric page: changed matrix cells of the subscribed metric and changed graph edges."""

    async def connect(self) -> None:
        self.metric: str | None = None
        self.cells: dict[tuple[str, str], float | None] = {}
        self.edges: dict[str, tuple] = {}
        self.full = True
        self.seq = 0
        self.wanted = time.monotonic()
        await super().connect()

    async def receive_json(self, content, **kwargs) -> None:
        metric = content.get("subscribe") if isinstance(content, dict) else None
        if metric not in METRICS:
            await self.send_json({"type": "error", "message": f"unknown metric: {metric!r}"})
            return
        self.metric, self.cells, self.edges, self.full = metric, {}, {}, True
        self.wanted = time.monotonic()
        self.refresh()

    async def telemetry_tick(self, event: dict) -> None:
        self.wanted = time.monotonic()
        self.refresh()

    async def push(self) -> None:
        metric = self.metric
        if metric is None:
            return
        elements = await _shared.get(self.wanted)
        if metric != self.metric:
            return  # the page switched metric while we read: its own refresh follows
        cells, edges = snapshot(elements, metric)
        msg = change(self.cells, self.edges, cells, edges, full=self.full)
        self.cells, self.edges = cells, edges
        if msg is None:
            return
        self.full = False
        for part in parts(msg):
            self.seq += 1
            await self.send_json({"type": "fabric", "metric": metric, "seq": self.seq, **part})


# --- pure parts, tested on their own -------------------------------------------------------------

def _round(value):
    return float(f"{value:.4g}") if isinstance(value, float) else value


def snapshot(elements: list[dict], metric: str) -> tuple[dict[tuple[str, str], float | None], dict[str, tuple]]:
    """From `fabric_graph` elements: {(leaf, spine): value of `metric`} for every leaf-spine pair,
    and {edge id: (EDGE_FIELDS values)} for every edge, numbers rounded as sent."""
    nodes = {e["data"]["id"]: e["data"] for e in elements if "source" not in e["data"]}
    field = METRIC_FIELD[metric]
    cells, edges = {}, {}
    for e in elements:
        d = e["data"]
        if "source" not in d:
            continue
        edges[d["id"]] = tuple(_round(d[f]) if f in _ROUNDED else d[f] for f in EDGE_FIELDS)
        lo, hi = nodes.get(d["source"]), nodes.get(d["target"])
        if lo and hi and lo["role"] == "leaf" and hi["role"] == "spine":
            cells[(lo["label"], hi["label"])] = _round(d[field])
    return cells, edges


def change(sent_cells: dict, sent_edges: dict, cells: dict, edges: dict, *, full: bool) -> dict | None:
    """What the page must change to show `cells` and `edges`, given what it was sent; None when
    nothing changed (a full message always goes out, so the page knows it is current)."""
    new_cells = [(k, v) for k, v in cells.items() if full or k not in sent_cells or sent_cells[k] != v]
    new_edges = [(k, v) for k, v in edges.items() if full or sent_edges.get(k) != v]
    removed = [] if full else sorted(sent_edges.keys() - edges.keys())
    if not (full or new_cells or new_edges or removed):
        return None
    return {
        "full": full,
        "cells": {"leaf": [k[0] for k, _ in new_cells], "spine": [k[1] for k, _ in new_cells],
                  "value": [v for _, v in new_cells]},
        "edges": {"id": [k for k, _ in new_edges],
                  **{f: [v[n] for _, v in new_edges] for n, f in enumerate(EDGE_FIELDS)}},
        "removed": removed,
    }


def parts(msg: dict, size: int = PART_SIZE) -> list[dict]:
    """`msg` split so no part carries more than `size` cells or edges; `removed` goes in the last."""
    cells, edges = msg["cells"], msg["edges"]
    count = max(1, -(-max(len(cells["leaf"]), len(edges["id"])) // size))
    out = []
    for k in range(count):
        cut = slice(k * size, (k + 1) * size)
        out.append({
            "full": msg["full"], "part": k + 1, "parts": count,
            "cells": {name: column[cut] for name, column in cells.items()},
            "edges": {name: column[cut] for name, column in edges.items()},
            "removed": msg["removed"] if k == count - 1 else [],
        })
    return out
