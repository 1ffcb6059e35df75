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
import math
import time
import weakref

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from telemetry.live import TELEMETRY_GROUP
from tenancy.scoping import is_operator

logger = logging.getLogger(__name__)
MEMO_MAX_KEYS = 512  # distinct reads kept per process (pages × subscriptions); beyond it, start afresh
_MEMOS: weakref.WeakSet = weakref.WeakSet()  # every TickMemo of the process, for clear_tick_memos

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


class TickMemo:
    """One read per key and tick for every page in the process.

    Ingest sends at most one tick a second to every consumer; the first page to handle it reads,
    the other pages that need the same read (the same heatmap metric, the same job, the same job
    list filters) reuse its result instead of repeating it. At 16k GPUs a heatmap read is 16k rows,
    and 15 open heatmaps re-reading them every second kept Channels' one sync thread busy enough to
    fall minutes behind. A page without a tick (just subscribed) reads afresh and shares nothing.
    Reads run on Channels' one thread for sync code (database_sync_to_async), so there is no lock.
    Values are shared: callers must not change them.
    """

    def __init__(self) -> None:
        self._memo: dict = {}
        # Seconds of reads spent on the newest tick so far and on the one before it, whole: what one pass of
        # every page sharing this memo costs the process (LiveConsumer paces its passes by it).
        self._cost_tick: str | None = None
        self._cost_now = self._cost_last = 0.0
        _MEMOS.add(self)

    async def run(self, fn, *args):
        """`fn(*args)` where the live pages read: Channels' one thread for sync code (stale connections closed)."""
        return await database_sync_to_async(fn)(*args)

    @property
    def tick_cost_s(self) -> float:
        return max(self._cost_now, self._cost_last)

    def get(self, key, tick: str | None, read, *args):
        if tick is None:
            return read(*args)
        hit = self._memo.get(key)
        if hit is not None and hit[0] == tick:
            return hit[1]
        started = time.perf_counter()
        value = read(*args)
        self._add_cost(tick, time.perf_counter() - started)
        # Ticks are ISO times of one format, so a page still working on an older tick cannot
        # replace the newer tick's read that other pages are about to reuse.
        if hit is None or tick > hit[0]:
            if len(self._memo) >= MEMO_MAX_KEYS:
                self._memo.clear()
            self._memo[key] = (tick, value)
        return value

    def _add_cost(self, tick: str, seconds: float) -> None:
        if tick != self._cost_tick:
            if self._cost_tick is not None and tick < self._cost_tick:
                return  # a page a tick behind: its read is not part of the newest pass
            self._cost_tick, self._cost_last, self._cost_now = tick, self._cost_now, 0.0
        self._cost_now += seconds

    def clear(self) -> None:
        self._memo.clear()
        self._cost_tick, self._cost_now, self._cost_last = None, 0.0, 0.0


def clear_tick_memos() -> None:
    """Forget every shared read (tests: one test's ticks must not answer the next test's pages)."""
    for memo in list(_MEMOS):
        memo.clear()


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """Base for a page that recomputes its change on every telemetry tick (operators only).

    Pacing: a page class whose reads go through a TickMemo (`pace_memo`) starts a pass on a tick no sooner than
    PACE_FACTOR times what the last whole pass of that memo cost after its previous pass began (at most
    MAX_PACE_S); a tick that comes earlier is answered by one pass when that time comes, on the newest tick.
    Ticks come with every fleet summary (1-5 s apart), and at 16k GPUs the 12 job pages of the soak read
    ~0.25 s of job details per tick on an idle machine and more under load: repeated on every tick, the job
    pages alone once took ~15 % of the soak machine. Paced, each page class costs at most about 1/PACE_FACTOR
    of the process's sync thread, and the newest state still reaches every page, a little later on a big fleet
    (the factor's trade of latency for CPU is measured with the slot's, in telemetry.live). Every page of a
    class gets the same ticks and the same pace, so their passes stay together and keep sharing reads.
    """

    bw_access = "operator"  # read by the isolation test (tests/tenancy/test_isolation.py)
    pace_memo: TickMemo | None = None
    PACE_FACTOR = 8.0
    MAX_PACE_S = 10.0  # one collection interval: no page lags the data by more than that on top
    live_groups: tuple[str, ...] = (TELEMETRY_GROUP,)  # joined on connect; a subclass may join more later

    async def admit(self) -> bool:
        """Whether this socket may open; refuses it (closes with a code) when not."""
        return await admit_operator(self)

    async def connect(self) -> None:
        self._groups: set[str] = set()
        if not await self.admit():
            return
        self._running: asyncio.Task | None = None
        self._again = False
        self._last_pass = -math.inf  # time.monotonic() when the last pass began
        self._deferred: asyncio.TimerHandle | None = None
        self.tick: str | None = None  # the last tick's time: the key under which pages share reads (TickMemo)
        for group in self.live_groups:
            await self.join(group)
        await self.accept()

    async def join(self, group: str) -> None:
        await self.channel_layer.group_add(group, self.channel_name)
        self._groups.add(group)

    async def leave(self, group: str) -> None:
        await self.channel_layer.group_discard(group, self.channel_name)
        self._groups.discard(group)

    async def disconnect(self, code: int) -> None:
        for group in list(getattr(self, "_groups", ())):
            await self.leave(group)
        if getattr(self, "_running", None):
            self._running.cancel()
        if getattr(self, "_deferred", None):
            self._deferred.cancel()

    async def telemetry_tick(self, event: dict) -> None:
        self.tick = event.get("at")
        wait = self.pace_wait()
        if wait <= 0:
            self.refresh()
        elif self._deferred is None:
            self._deferred = asyncio.get_running_loop().call_later(wait, self._deferred_refresh)

    def pace_wait(self) -> float:
        """Seconds until this page may start a pass on a tick (0: now)."""
        if self.pace_memo is None:
            return 0.0
        pace = min(self.MAX_PACE_S, self.PACE_FACTOR * self.pace_memo.tick_cost_s)
        return self._last_pass + pace - time.monotonic()

    def _deferred_refresh(self) -> None:
        self._deferred = None
        self.refresh()  # on self.tick, the newest tick heard meanwhile

    def refresh(self) -> None:
        """Run `push()` now, or once more after the pass that is running."""
        if self._running and not self._running.done():
            self._again = True
            return
        self._running = asyncio.ensure_future(self._refresh_loop())

    async def _refresh_loop(self) -> None:
        while True:
            self._again = False
            self._last_pass = time.monotonic()
            try:
                await self.push()
            except Exception:
                logger.exception("%s: live refresh failed", type(self).__name__)
            if not self._again:
                return

    async def push(self) -> None:
        raise NotImplementedError
