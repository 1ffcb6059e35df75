"""Admission control for the ingest API: shed load early and cheaply instead of falling over.

Two gates stand in front of the parse-validate-write work, both answered with 429 + Retry-After:

- `Admission` (per web process): at most `max_inflight` batches run at once and at most
  `max_waiting` wait for a slot in FIFO order; a request beyond that is refused at once, before
  its body is decoded or parsed. Without the bound, a fleet offering more than the database can
  write queues work without limit: memory grows with the backlog, latency passes the agents'
  timeouts, the agents re-send, and the server spends its time on answers nobody waits for.
- `RateLimiter` (per collector token, across every web process): a token bucket in Redis, so one
  runaway collector cannot take the capacity of the others. If Redis is unreachable it fails
  open: the limit is a fairness guard, and losing it must never cost a batch.

The Retry-After of an `overloaded` answer is the time the current backlog takes to clear at the
recent per-batch service time, at least 1 s and jittered up to twice that, so refused agents do
not all come back in the same second.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import random
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import redis
from asgiref.sync import sync_to_async
from django.conf import settings

from core.api import ApiError

log = logging.getLogger(__name__)

# The longest Retry-After ever sent: the agent's pusher caps its wait at 10 s anyway, and a longer
# pause only delays delivery after the backlog is gone.
MAX_RETRY_AFTER_S = 30
# After Redis fails, the limiter stays open this long before trying Redis again, so an outage
# costs one failed connection attempt per few seconds, not one per request.
REDIS_RETRY_S = 5.0
# Refusals are logged at most this often (with the count since the last line), not once each.
REFUSAL_LOG_EVERY_S = 10.0


class Refused(ApiError):
    """A request turned away before its work started: 429 with Retry-After."""

    def __init__(self, code: str, message: str, retry_after: int):
        super().__init__(429, code, message, headers={"Retry-After": str(retry_after)})
        self.retry_after = retry_after


class Admission:
    """Bounded concurrency with a bounded FIFO queue, for the event loop of one web process.

    1. `acquire` takes a free slot, or joins the queue if it has room, or raises Refused.
    2. `release` hands the slot straight to the oldest live waiter (the in-flight count does not
       dip, so a newcomer cannot jump the queue), or frees it.
    3. A waiter cancelled (its client went away) leaves the queue; one cancelled just after it was
       handed a slot passes the slot on. Either way no slot leaks.
    4. `run` holds the slot until the worker thread has really finished, even when the view is
       cancelled meanwhile: the thread keeps writing, so its slot must stay taken.
    """

    def __init__(self, max_inflight: int, max_waiting: int, *, service_s: float = 0.1):
        if max_inflight < 1 or max_waiting < 0:
            raise ValueError(f"max_inflight must be >= 1 and max_waiting >= 0, got {max_inflight}, {max_waiting}")
        self.max_inflight, self.max_waiting = max_inflight, max_waiting
        self.inflight = 0
        self.service_s = service_s  # moving average of one batch's time in its slot
        self.admitted = self.refused = 0
        self._waiters: deque[asyncio.Future] = deque()
        self._refused_since_log = 0
        self._last_log = -REFUSAL_LOG_EVERY_S

    @property
    def waiting(self) -> int:
        return sum(not f.done() for f in self._waiters)

    def retry_after(self) -> int:
        """Seconds until the present backlog has cleared, jittered; 1..MAX_RETRY_AFTER_S."""
        backlog = self.inflight + self.waiting + 1
        clear_s = backlog * self.service_s / self.max_inflight
        low = max(1, math.ceil(clear_s))
        high = max(low + 1, math.ceil(2 * clear_s))
        return min(MAX_RETRY_AFTER_S, random.randint(low, high))

    async def acquire(self) -> None:
        if self.inflight < self.max_inflight and not self.waiting:
            self.inflight += 1
            self.admitted += 1
            return
        if self.waiting >= self.max_waiting:
            self._refuse()
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._hand_on()  # the slot came just as the client left: pass it on
            else:
                self._waiters.remove(waiter)
            raise
        self.admitted += 1

    def release(self, started: float | None = None) -> None:
        if started is not None:
            self.service_s += 0.2 * (time.monotonic() - started - self.service_s)
        self._hand_on()

    def _hand_on(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.inflight -= 1

    def _refuse(self) -> None:
        self.refused += 1
        self._refused_since_log += 1
        now = time.monotonic()
        if now - self._last_log >= REFUSAL_LOG_EVERY_S:
            log.warning("ingest overloaded: %d batches refused with 429 since the last such line; %d in flight, "
                        "%d waiting, %.0f ms a batch", self._refused_since_log, self.inflight, self.waiting,
                        self.service_s * 1000)
            self._refused_since_log, self._last_log = 0, now
        wait = self.retry_after()
        raise Refused("overloaded", f"the server is at capacity ({self.inflight} batches in flight, "
                                    f"{self.waiting} waiting); nothing was stored; retry in {wait} s", wait)

    async def run(self, func: Callable, *args):
        """`func(*args)` in a worker thread once admitted; raises Refused when the queue is full."""
        await self.acquire()
        started = time.monotonic()
        task = asyncio.ensure_future(sync_to_async(func, thread_sensitive=False)(*args))
        task.add_done_callback(lambda t: self._finished(t, started))
        # Shielded: a client that disconnects cancels this view, not the write already under way.
        return await asyncio.shield(task)

    def _finished(self, task: asyncio.Future, started: float) -> None:
        self.release(started)
        if not task.cancelled():
            task.exception()  # retrieved here, so an abandoned task's error is not reported twice


_LUA_TOKEN_BUCKET = """
if redis.replicate_commands then pcall(redis.replicate_commands) end
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or burst
local ts = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local wait_ms = 0
if tokens >= 1 then tokens = tokens - 1 else wait_ms = math.ceil((1 - tokens) / rate * 1000) end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return wait_ms
"""


class RateLimiter:
    """Token bucket per collector token in Redis: `rate` requests/s sustained, `burst` at once.

    The clock is Redis's own (TIME in the script), so web processes on hosts with skewed clocks
    share one bucket correctly. Keys hold a hash of the token, never the token. The call runs on
    two threads of its own: a slow Redis never stalls the event loop, nor waits behind the
    ingest work in the default pool, and a blocking client serves any event loop (an asyncio one
    belongs to the loop that made it).
    """

    def __init__(self, redis_url: str, rate: float, burst: int, *, prefix: str = "bw:ingest-rate:",
                 timeout_s: float = 0.25):
        self.redis_url, self.rate, self.burst, self.prefix = redis_url, rate, max(1, burst), prefix
        self.timeout_s = timeout_s
        self.limited = 0
        self._script = None
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="ingest-rate")
        self._down_until = 0.0
        self._down = False

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    async def check(self, authorization: str | None) -> None:
        """Raise Refused when the token behind `authorization` is over its rate; fail open."""
        token = _bearer(authorization)
        if not self.enabled or not token or time.monotonic() < self._down_until:
            return
        key = self.prefix + hashlib.sha256(token.encode()).hexdigest()[:32]
        try:
            wait_ms = await asyncio.get_running_loop().run_in_executor(self._pool, self._take, key)
        except Exception as exc:  # noqa: BLE001  any Redis or socket failure: admit, never 500
            self._fail_open(exc)
            return
        if self._down:
            self._down = False
            log.warning("ingest rate limit back on: Redis answers again")
        if wait_ms > 0:
            self.limited += 1
            wait = min(MAX_RETRY_AFTER_S, max(1, math.ceil(wait_ms / 1000)))
            raise Refused("rate_limited", f"this collector token is over its limit of {self.rate:g} requests/s "
                                          f"(burst {self.burst}); nothing was stored; retry in {wait} s", wait)

    def _take(self, key: str) -> int:
        """One token from `key`'s bucket: 0, or the milliseconds until one is there."""
        if self._script is None:
            client = redis.Redis.from_url(self.redis_url, socket_connect_timeout=self.timeout_s,
                                          socket_timeout=self.timeout_s)
            self._script = client.register_script(_LUA_TOKEN_BUCKET)
        return int(self._script(keys=[key], args=[self.rate, self.burst]))

    def _fail_open(self, exc: Exception) -> None:
        self._down_until = time.monotonic() + REDIS_RETRY_S
        if not self._down:
            self._down = True
            log.warning("ingest rate limit off, admitting every request: Redis at %s failed: %s",
                        self.redis_url.rpartition("@")[2], exc)


def _bearer(header: str | None) -> str:
    scheme, _, raw = (header or "").partition(" ")
    return raw.strip() if scheme.lower() == "bearer" else ""


_gate: Admission | None = None
_limiter: RateLimiter | None = None


def gate() -> Admission:
    """This process's admission gate, sized by INGEST_MAX_INFLIGHT and INGEST_MAX_WAITING."""
    global _gate
    if _gate is None:
        _gate = Admission(settings.INGEST_MAX_INFLIGHT, settings.INGEST_MAX_WAITING)
    return _gate


def limiter() -> RateLimiter:
    """This process's per-token limiter (INGEST_RATE_PER_TOKEN, INGEST_RATE_BURST; rate 0 = off)."""
    global _limiter
    if _limiter is None:
        _limiter = RateLimiter(settings.REDIS_URL, settings.INGEST_RATE_PER_TOKEN, settings.INGEST_RATE_BURST)
    return _limiter


async def admit(authorization: str | None, func: Callable, *args):
    """Rate limit, then admission, then `func(*args)` in a worker thread. Raises Refused."""
    await limiter().check(authorization)
    return await gate().run(func, *args)
