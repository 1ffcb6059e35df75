"""Live pages pace their passes by what their shared reads cost (dashboard.consumers.base)."""

from __future__ import annotations

import asyncio
import math
import time

from dashboard.consumers.base import LiveConsumer, TickMemo


def test_tick_memo_counts_what_the_newest_pass_read():
    memo = TickMemo()

    def slow(seconds):
        time.sleep(seconds)
        return seconds

    memo.get("job-1", "2026-12-02T08:00:00Z", slow, 0.02)
    memo.get("job-2", "2026-12-02T08:00:00Z", slow, 0.03)
    memo.get("job-1", "2026-12-02T08:00:00Z", slow, 0.5)  # a hit: no read, no cost
    assert 0.05 <= memo.tick_cost_s < 0.2

    memo.get("job-1", "2026-12-02T08:00:02Z", slow, 0.01)  # the next tick, partly read
    assert memo.tick_cost_s >= 0.05, "the last whole pass still counts while the next one is under way"
    memo.get("job-1", "2026-12-02T07:59:58Z", slow, 0.3)  # a page a tick behind is not the newest pass
    assert memo.tick_cost_s < 0.2

    memo.clear()
    assert memo.tick_cost_s == 0


class _Page(LiveConsumer):
    """A LiveConsumer without a socket: records the tick of every pass."""

    def __init__(self, memo: TickMemo) -> None:  # noqa: D107  (no channel layer, no websocket)
        self.pace_memo = memo
        self._running = None
        self._again = False
        self._last_pass = -math.inf
        self._deferred = None
        self.tick = None
        self.passes: list[tuple[float, str]] = []

    async def push(self) -> None:
        self.passes.append((time.monotonic(), self.tick))


def test_ticks_inside_the_pace_become_one_pass_on_the_newest_tick():
    memo = TickMemo()
    memo.get("k", "t0", time.sleep, 0.05)  # one pass of these pages costs ~50 ms: the pace is ~0.4 s
    page = _Page(memo)

    async def scenario():
        started = time.monotonic()
        await page.telemetry_tick({"at": "t1"})
        await asyncio.sleep(0.05)
        for t in ("t2", "t3", "t4"):  # three more ticks well inside the pace
            await page.telemetry_tick({"at": t})
            await asyncio.sleep(0.02)
        assert [t for _, t in page.passes] == ["t1"], "a tick inside the pace started a pass at once"
        await asyncio.sleep(1.0)
        return started

    started = asyncio.run(scenario())

    assert [t for _, t in page.passes] == ["t1", "t4"], "the deferred pass must run once, on the newest tick"
    gap = page.passes[1][0] - page.passes[0][0]
    assert gap >= LiveConsumer.PACE_FACTOR * 0.05 * 0.9 and page.passes[1][0] - started < 1.0


def test_cheap_pages_and_pages_without_a_memo_are_not_paced():
    cheap = _Page(TickMemo())  # nothing read yet: cost 0
    unpaced = _Page(None)

    async def scenario():
        for page in (cheap, unpaced):
            for t in ("t1", "t2", "t3"):
                await page.telemetry_tick({"at": t})
                await asyncio.sleep(0.01)

    asyncio.run(scenario())

    assert [t for _, t in cheap.passes] == ["t1", "t2", "t3"]
    assert [t for _, t in unpaced.passes] == ["t1", "t2", "t3"]


def test_the_pace_is_capped_at_one_collection_interval():
    memo = TickMemo()
    memo._add_cost("t0", 60.0)  # a pathological pass: a minute of reads
    page = _Page(memo)
    page._last_pass = time.monotonic()

    assert LiveConsumer.MAX_PACE_S - 0.1 <= page.pace_wait() <= LiveConsumer.MAX_PACE_S
