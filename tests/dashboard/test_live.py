"""Live fleet updates: the websocket consumer and the throttled publisher.

These run the real ASGI application (auth middleware and all) through WebsocketCommunicator
against the real Redis channel layer. They need committed rows, because the consumer and the
trailing publisher read on their own threads' connections, hence `transaction=True`.
"""

from __future__ import annotations

import logging
import time

import pytest
import redis
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction

from core.redis_client import fast_client
from telemetry import live
from tests.dashboard.conftest import ws_communicator
from tests.dashboard.test_fleet_page import (  # noqa: F401  (fixtures are used by name)
    HEALTHY,
    _pin_stale_after,
    fixed_selector_now,
    make_gpu,
    write_latest,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fixed_selector_now"),
]


@pytest.fixture(autouse=True)
def _free_throttle():
    """Each test starts with the one-second slot free and ends with no publish in flight."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(live._throttle_key())
    yield client
    live.wait_for_trailing_publish()
    client.delete(live._throttle_key())


def _communicator(cookie: bytes | None = None):
    return ws_communicator("/ws/fleet/", cookie)


def _gpu_total(message: dict) -> int:
    return message["gpus"]["total"]


def test_consumer_rejects_anonymous_users():
    async def scenario():
        communicator = _communicator()
        connected, code = await communicator.connect()
        await communicator.disconnect()
        return connected, code

    assert async_to_sync(scenario)() == (False, 4401)


def test_consumer_sends_the_summary_on_connect_then_pushed_updates(session_cookie):
    make_gpu(**HEALTHY)

    async def scenario():
        communicator = _communicator(session_cookie)
        connected, _ = await communicator.connect()
        assert connected
        initial = await communicator.receive_json_from(timeout=5)
        await sync_to_async(make_gpu)(**{**HEALTHY, "ecc_dbe_vol": 1})
        sent = await sync_to_async(live.publish_fleet_summary)()
        pushed = await communicator.receive_json_from(timeout=5)
        await communicator.disconnect()
        return initial, sent, pushed

    initial, sent, pushed = async_to_sync(scenario)()

    assert _gpu_total(initial) == 1 and initial["gpus"]["by_health"]["ok"]["count"] == 1
    assert initial["generated_at"] == "2026-11-30T12:00:00+00:00"
    assert sent is True
    assert _gpu_total(pushed) == 2 and pushed["gpus"]["by_health"]["failed"]["count"] == 1


def test_fleet_pages_share_one_message_per_summary(session_cookie, monkeypatch):
    from dashboard.consumers import fleet as consumer

    make_gpu(**HEALTHY)
    counted = []
    real = consumer.open_alert_counts
    monkeypatch.setattr(consumer, "open_alert_counts", lambda: counted.append(1) or real())

    async def scenario():
        pages = [_communicator(session_cookie) for _ in range(3)]
        for ws in pages:
            assert (await ws.connect())[0]
            await ws.receive_json_from(timeout=5)  # the on-connect summary
        got = []
        for _ in range(2):  # two summaries computed at the same (pinned) instant are still two messages
            await sync_to_async(make_gpu)(**{**HEALTHY, "ecc_dbe_vol": 1})
            await sync_to_async(live._send_summary)()
            got.append([await ws.receive_json_from(timeout=5) for ws in pages])
        for ws in pages:
            await ws.disconnect()
        return got

    got = async_to_sync(scenario)()

    assert len(counted) == 2, "the pages of one process must read the alert counts once per summary"
    assert [[_gpu_total(m) for m in msgs] for msgs in got] == [[2, 2, 2], [3, 3, 3]]
    assert all("alerts" in m for msgs in got for m in msgs)


def test_throttle_sends_at_most_one_update_per_second_and_the_last_change_trails(session_cookie):
    gpu = make_gpu(**HEALTHY)

    async def scenario():
        communicator = _communicator(session_cookie)
        assert (await communicator.connect())[0]
        await communicator.receive_json_from(timeout=5)  # the on-connect summary
        results = []
        started = time.monotonic()
        for util in (10.0, 20.0, 30.0, 40.0, 50.0):  # five batches commit within the second
            await sync_to_async(write_latest)(gpu, **{**HEALTHY, "gpu_util": util})
            results.append(await sync_to_async(live.publish_fleet_summary)())
        first = await communicator.receive_json_from(timeout=5)
        trailing = await communicator.receive_json_from(timeout=5)
        # Measured from before the first claim, so a slow machine can only make it longer.
        second_after = time.monotonic() - started
        await sync_to_async(live.wait_for_trailing_publish)()
        nothing_more = await communicator.receive_nothing(timeout=1.2)
        await communicator.disconnect()
        return results, first, trailing, second_after, nothing_more

    results, first, trailing, second_after, nothing_more = async_to_sync(scenario)()

    assert results == [True, False, False, False, False]
    assert first["utilization"]["gpu_util_pct"] == 10.0
    assert second_after >= live.THROTTLE_MS / 1000, "a second summary went out within the second"
    assert trailing["utilization"]["gpu_util_pct"] == 50.0, "the last change of the burst was lost"
    assert nothing_more


def test_throttle_is_shared_by_every_process(_free_throttle):
    # Another process (here: another Redis client) holds this second's slot.
    assert _free_throttle.set(live._throttle_key(), "1", nx=True, px=live.THROTTLE_MS)
    make_gpu(**HEALTHY)

    assert live.publish_fleet_summary() is False
    # Our change is not lost: the trailing publish sends it once the slot frees.
    assert _receive_one_group_message(timeout=3)["gpus"]["total"] == 1


def test_a_commit_while_a_trailing_publish_is_armed_asks_redis_nothing_and_still_reaches_the_page(
    _free_throttle, monkeypatch
):
    assert _free_throttle.set(live._throttle_key(), "1", nx=True, px=live.THROTTLE_MS)
    gpu = make_gpu(**HEALTHY)
    assert live.publish_fleet_summary() is False  # the slot is taken: this arms the trailing publish
    real_claim, claims = live._claim_slot, []
    monkeypatch.setattr(live, "_claim_slot", lambda: claims.append(1) or real_claim())

    write_latest(gpu, **{**HEALTHY, "gpu_util": 77.0})  # a later commit in the same slot
    assert live.publish_fleet_summary() is False
    assert claims == [], "a commit covered by the armed timer still claimed the slot in Redis"

    # The timer claims once the slot frees, after both commits, so the page gets the later value.
    assert _receive_one_group_message(timeout=3)["utilization"]["gpu_util_pct"] == 77.0
    assert claims == [1]


def test_trailing_publish_that_fires_before_its_slot_expires_waits_again(_free_throttle):
    _free_throttle.set(live._throttle_key(), b"slot-we-waited-for", px=live.THROTTLE_MS)
    make_gpu(**HEALTHY)

    live._publish_trailing(b"slot-we-waited-for")  # as if its timer fired a hair early

    assert _receive_one_group_message(timeout=3)["gpus"]["total"] == 1


def test_trailing_publish_stands_down_when_a_later_slot_covers_it(_free_throttle):
    _free_throttle.set(live._throttle_key(), b"a-later-slot", px=live.THROTTLE_MS)

    live._publish_trailing(b"the-slot-we-waited-for")

    assert live._trailing is None


def test_schedule_publishes_after_commit_only():
    with transaction.atomic():
        make_gpu(**HEALTHY)
        live.schedule_fleet_publish()
        assert not live._redis.exists(live._throttle_key()), "published before commit"

    assert live._redis.exists(live._throttle_key())


def test_schedule_does_not_publish_on_rollback():
    with pytest.raises(RuntimeError), transaction.atomic():
        live.schedule_fleet_publish()
        raise RuntimeError("ingest failed")

    assert not live._redis.exists(live._throttle_key())


def test_publish_failure_is_logged_not_raised_and_does_not_stall_ingest(monkeypatch, caplog):
    monkeypatch.setattr(live, "_redis", fast_client("redis://127.0.0.1:1/0"))  # nothing listens

    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="telemetry.live"):
        assert live.publish_fleet_summary() is False

    assert time.monotonic() - started < 1.5
    assert "fleet summary publish failed" in caplog.text


def _receive_one_group_message(timeout: float) -> dict:
    """Join the fleet group on a fresh channel and return the next summary sent to it."""
    async def scenario():
        import asyncio

        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(live.FLEET_GROUP, channel)
        try:
            message = await asyncio.wait_for(layer.receive(channel), timeout)
        finally:
            await layer.group_discard(live.FLEET_GROUP, channel)
        assert message["type"] == "fleet.update"
        return message["data"]

    return async_to_sync(scenario)()


def test_the_slot_lengthens_with_what_the_summary_costs(monkeypatch, _free_throttle):
    """One second at small sizes; a summary that took 0.3 s (16k GPUs under load) holds the slot 2.4 s."""
    monkeypatch.setattr(live, "_last_cost_s", [0.01])
    assert live.slot_ms() == live.THROTTLE_MS
    monkeypatch.setattr(live, "_last_cost_s", [2.0])
    assert live.slot_ms() == live.MAX_SLOT_MS

    make_gpu(**HEALTHY)
    real = live.fleet_summary

    def slow_summary():
        time.sleep(0.3)
        return real()

    monkeypatch.setattr(live, "fleet_summary", slow_summary)
    monkeypatch.setattr(live, "_last_cost_s", [0.0])
    assert live.publish_fleet_summary() is True  # a one-second slot, and now we know the summary is slow
    assert 0.3 <= live._last_cost_s[0] < 1.0
    _free_throttle.delete(live._throttle_key())
    assert live.publish_fleet_summary() is True
    ttl = _free_throttle.pttl(live._throttle_key())
    assert ttl > live.SLOT_COST_FACTOR * 300 - 200, ttl  # the factor times >= 0.3 s
