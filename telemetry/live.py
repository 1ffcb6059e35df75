"""Live pushes of the fleet summary to every open operator page.

Ingest calls `schedule_fleet_publish()` inside its transaction; after commit,
`publish_fleet_summary()` computes `fleet_summary()` and sends it to the "fleet" channel-layer
group, which `dashboard.consumers.FleetConsumer` forwards to browsers, and a bare tick to the
"telemetry" group, on which every other live page computes its own change.

Throttle, across every process that ingests:

1. A publisher first claims the slot with Redis `SET key NX PX <slot>`. Only the claimant
   computes and sends, so the fleet sees at most one summary per slot however many batches
   commit. The slot is one second, or longer where the summary is slow (`slot_ms`).
2. A publisher that loses the claim must not lose its change: it arms one timer in its own
   process for when the current slot expires. When the timer fires it tries to claim once.
3. If that claim fails too and the slot has a new holder (each claim stores a random token),
   the new holder claimed after the old slot expired, which is after our commit, and its
   summary (computed after claiming) already includes our rows, so nothing is retried. If the
   old holder is still there (the timer fired a hair early), the timer is armed again.
   Hence the last change of a burst reaches the page within about one slot.

Publishing is best effort: any failure is logged and never raised into ingest.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from uuid import uuid4

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connections, transaction

from core.redis_client import shared_client
from telemetry import health, signals
from telemetry.selectors import fleet_summary

logger = logging.getLogger(__name__)

FLEET_GROUP = "fleet"
# Every page that shows telemetry besides the fleet summary: a tiny "something committed" tick,
# on which each consumer computes its own page's change (see dashboard.consumers.LiveConsumer).
TELEMETRY_GROUP = "telemetry"
# One summary slot per site: the key carries the channel prefix, so another deployment (or test run)
# on the same Redis never wins our slot and silences our pages.
THROTTLE_KEY_SUFFIX = "live:fleet-summary"
THROTTLE_MS = 1000  # the shortest slot
# Every publish makes each open page re-read its view and costs the summary itself (~0.15-0.45 s of database
# and Python at 16k GPUs under load). With ingest committing all through every tick, a one-second slot meant
# a publish every second, which once cost ~40 % of a core on the 2-core soak machine for pages and summary
# together. So the slot lasts at least SLOT_COST_FACTOR times the last summary's cost: summaries take at most
# an eighth of a core however big the fleet, and a slower machine gets longer slots instead of falling
# behind. The price is latency, since a change waits up to one slot before any page hears of it: at 16k GPUs
# a factor of 4 brought every page kind's update p95 down by 1-3.5 s in the soak, but the stack used 0.15
# more of a core and ingest lag doubled on the saturated 2-core machine (docs/measurements.md).
SLOT_COST_FACTOR = 8.0
MAX_SLOT_MS = 5000
_last_cost_s = [0.0]  # this process's last summary: seconds to compute
# Wait a little past the slot's expiry so the trailing claim does not race the TTL.
_TRAILING_MARGIN_S = 0.02


# One client per process (core.redis_client).
_redis = shared_client()

_trailing_guard = threading.Lock()
_trailing: threading.Timer | None = None  # armed and not yet fired
_last_trailing: threading.Timer | None = None  # the latest one started, fired or not


def schedule_fleet_publish() -> None:
    """Publish a fresh summary once the current transaction commits (never on rollback)."""
    transaction.on_commit(publish_fleet_summary)


def publish_fleet_summary() -> bool:
    """Send the fleet summary to the "fleet" group if this second's slot is free.

    Returns True when this call sent a summary. Never raises.
    """
    with _trailing_guard:
        if _trailing is not None:
            # A timer armed here claims only after this commit (step 3 above covers a lost claim): it publishes
            # this change too. Skipping the claim saves two Redis round trips on most commits of a busy tick.
            return False
    try:
        claimed, holder, remaining_ms = _claim_slot()
        if claimed:
            _send_summary()
            return True
        _arm_trailing(holder, remaining_ms)
    except Exception:
        logger.exception("fleet summary publish failed")
    return False


HEALTH_DIGEST_SUFFIX = "live:health-digest"


def publish_on_health_change(now=None) -> bool:
    """Publish when any GPU's or port's state changed since the last look, though nothing was ingested.

    "No data" is a matter of time, not of a commit: a GPU that stops reporting turns stale two of its
    intervals after its last sample, when ingest may have nothing to commit about it. The beat calls
    this every couple of seconds; the digest of every non-OK state (in Redis, shared by every worker)
    decides whether the pages need a push. Never raises; True when a summary was sent.

    While a summary slot is held, a summary went out less than a slot ago, computed with every state as of
    then, and the trailing one will be too: the look is skipped. On a site that ingests all the time that is
    nearly every look, and each cost a fleet-wide pass over GPUs and ports (~0.4 s of PostgreSQL at 16k GPUs
    and 65k ports, every 2 s: a fifth of a core). A quiet site, where the look matters, holds no slot.
    """
    try:
        if _redis.exists(_throttle_key()):
            return False
        gpus = sorted((r[0], r[3]) for r in health.gpu_states(now=now) if r[3] != "ok")
        ports = sorted((i, h.state) for i, h in health.port_health(now=now, not_ok=True).items())
        digest = hashlib.sha1(repr((gpus, ports)).encode()).hexdigest().encode()
        key = f"{settings.CHANNEL_LAYERS['default']['CONFIG']['prefix']}:{HEALTH_DIGEST_SUFFIX}"
        if _redis.getset(key, digest) == digest:
            return False
        # A state that changed with time is news for the alert rules too (a GPU gone silent), as ingest is.
        signals.fleet_changed.send(sender=__name__)
        return publish_fleet_summary()
    except Exception:
        logger.exception("health change publish failed")
        return False


def wait_for_trailing_publish(timeout: float = 5.0) -> None:
    """Block until this process's pending trailing publish (if any) has run.

    For tests and graceful shutdown: the timer thread is a daemon and dies with the process.
    """
    deadline = time.monotonic() + timeout
    while True:
        with _trailing_guard:
            timer = _last_trailing
        if timer is None:
            return
        timer.join(max(0.0, deadline - time.monotonic()))
        with _trailing_guard:
            # A timer that found its slot not yet expired armed a successor: wait for that too.
            if _last_trailing is timer or time.monotonic() >= deadline:
                return


def _throttle_key() -> str:
    """The summary slot's Redis key; read at call time, as tests set the prefix after import. A
    layer without a prefix (scenario_eval's in-process one) gets a key of its own process, so its
    publishes never take the live pages' slot."""
    prefix = settings.CHANNEL_LAYERS["default"].get("CONFIG", {}).get("prefix") or f"process-{os.getpid()}"
    return f"{prefix}:{THROTTLE_KEY_SUFFIX}"


def slot_ms() -> int:
    """How long a claimed slot lasts: THROTTLE_MS, or SLOT_COST_FACTOR times the last summary's cost."""
    return int(min(MAX_SLOT_MS, max(THROTTLE_MS, SLOT_COST_FACTOR * _last_cost_s[0] * 1000)))


def _claim_slot() -> tuple[bool, bytes | None, int]:
    """(claimed, the current holder's token, milliseconds until the slot frees)."""
    token = uuid4().hex.encode()
    key = _throttle_key()
    slot = slot_ms()
    if _redis.set(key, token, nx=True, px=slot):
        return True, token, slot
    holder, remaining_ms = _redis.pipeline().get(key).pttl(key).execute()
    # PTTL is -2 when the slot expired between the two calls: retry right away.
    return False, holder, max(remaining_ms, 0)


def _send_summary() -> None:
    started = time.perf_counter()
    summary = fleet_summary()
    _last_cost_s[0] = time.perf_counter() - started
    layer = get_channel_layer()
    # `id` names this summary apart from any other computed at the same instant (the pages share per summary),
    # in the order they were sent, so a later summary's shared message replaces an earlier one's.
    sent_id = f"{time.time_ns():020d}-{uuid4().hex[:8]}"
    async_to_sync(layer.group_send)(FLEET_GROUP, {"type": "fleet.update", "data": summary, "id": sent_id})
    async_to_sync(layer.group_send)(TELEMETRY_GROUP, {"type": "telemetry.tick", "at": summary["generated_at"]})


def _arm_trailing(holder: bytes | None, remaining_ms: int) -> None:
    global _trailing, _last_trailing
    with _trailing_guard:
        if _trailing is not None:
            return  # one pending timer per process covers every change committed before it fires
        timer = threading.Timer(
            remaining_ms / 1000 + _TRAILING_MARGIN_S, _publish_trailing, args=(holder,)
        )
        timer.daemon = True
        _trailing = _last_trailing = timer
        timer.start()


def _publish_trailing(seen_holder: bytes | None) -> None:
    global _trailing
    # Disarm before claiming: a change that commits from here on arms a new timer if our claim
    # computes too early to include it.
    with _trailing_guard:
        _trailing = None
    try:
        claimed, holder, remaining_ms = _claim_slot()
        if claimed:
            _send_summary()
        elif holder == seen_holder:
            _arm_trailing(holder, remaining_ms)  # the slot we waited for has not expired yet
    except Exception:
        logger.exception("trailing fleet summary publish failed")
    finally:
        # This thread's database connection would otherwise stay open until the process exits.
        connections.close_all()
