"""Overload: the ingest API sheds load with 429 + Retry-After, and agents lose nothing.

The admission gate's accounting is tested in-process (no slot may leak, whatever happens to the
request); the gate itself against a real daphne started with one slot and one queue place, its
first batch held at the database by a table lock the test takes, so the burst's outcome is
certain rather than a race; the per-token limit and its fail-open path against the real Redis.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction

from telemetry.actions import do_create_collector_token
from telemetry.agent.pusher import Pusher, count_samples
from telemetry.api import admission
from telemetry.api.admission import Admission, RateLimiter, Refused
from tests import procs
from tests.conftest import _wait_for_backends_to_exit

GPU_FIELDS = ("gpu_util", "gpu_temp", "power_w", "sm_clock")


# --- The gate's accounting, in-process ----------------------------------------------------------

def _in_loop(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_third_request_is_refused_when_one_runs_and_one_waits():
    async def scenario():
        gate, release = Admission(1, 1, service_s=4.0), threading.Event()
        first = asyncio.ensure_future(gate.run(release.wait, 5))
        second = asyncio.ensure_future(gate.run(lambda: "second"))
        await asyncio.sleep(0.05)
        assert (gate.inflight, gate.waiting) == (1, 1)
        with pytest.raises(Refused) as refused:
            await gate.run(lambda: "third")
        release.set()
        assert await first is True and await second == "second"
        return gate, refused.value

    gate, refused = _in_loop(scenario())
    assert refused.code == "overloaded" and "nothing was stored" in refused.message
    # Backlog 3 at 4 s a batch on one slot: 12 s to clear, jittered to at most twice that.
    assert 12 <= refused.retry_after <= 24
    assert (gate.inflight, gate.waiting, gate.admitted, gate.refused) == (0, 0, 2, 1)


def test_slot_is_released_when_the_write_raises():
    def broken():
        raise RuntimeError("database exploded")

    async def scenario():
        gate = Admission(1, 0)
        with pytest.raises(RuntimeError, match="exploded"):
            await gate.run(broken)
        assert await gate.run(lambda: 42) == 42  # the slot is free again
        return gate

    gate = _in_loop(scenario())
    assert (gate.inflight, gate.waiting) == (0, 0)


def test_client_gone_mid_write_keeps_the_slot_until_the_thread_finishes():
    async def scenario():
        gate, release = Admission(1, 1), threading.Event()
        view = asyncio.ensure_future(gate.run(release.wait, 5))
        await asyncio.sleep(0.05)
        view.cancel()  # Django cancels the view when the client disconnects
        with pytest.raises(asyncio.CancelledError):
            await view
        held_while_writing = gate.inflight
        release.set()
        for _ in range(100):
            if gate.inflight == 0:
                break
            await asyncio.sleep(0.01)
        return gate, held_while_writing

    gate, held = _in_loop(scenario())
    assert held == 1 and gate.inflight == 0


def test_waiter_whose_client_leaves_frees_its_queue_place():
    async def scenario():
        gate, release = Admission(1, 1), threading.Event()
        running = asyncio.ensure_future(gate.run(release.wait, 5))
        waiting = asyncio.ensure_future(gate.run(lambda: "never"))
        await asyncio.sleep(0.05)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert gate.waiting == 0
        queued_again = asyncio.ensure_future(gate.run(lambda: "queued"))  # the place is free again
        await asyncio.sleep(0.05)
        release.set()
        return gate, await running, await queued_again

    gate, first, again = _in_loop(scenario())
    assert (first, again) == (True, "queued") and (gate.inflight, gate.waiting) == (0, 0)


def test_slot_handed_to_a_waiter_that_just_left_goes_to_the_next():
    async def scenario():
        gate = Admission(1, 2)
        await gate.acquire()
        a = asyncio.ensure_future(gate.acquire())
        b = asyncio.ensure_future(gate.acquire())
        await asyncio.sleep(0)
        gate.release()  # hands the slot to a...
        a.cancel()  # ...whose client leaves before it resumes
        await asyncio.gather(a, return_exceptions=True)
        await asyncio.wait_for(b, 1)  # b gets the slot a passed on
        assert gate.inflight == 1
        gate.release()
        return gate

    gate = _in_loop(scenario())
    assert (gate.inflight, gate.waiting) == (0, 0)


# --- The per-token rate limit against the real Redis --------------------------------------------

def test_token_over_its_burst_is_rate_limited_and_others_are_not():
    limiter = RateLimiter(os.environ.get("REDIS_URL", "redis://127.0.0.1:56379/0"), rate=0.05, burst=2,
                          prefix=f"bwtest-rate{os.environ.get('TEST_DB_SUFFIX', '')}:")
    token = f"Bearer bwc_{time.time_ns()}"

    async def scenario():
        await limiter.check(token)
        await limiter.check(token)
        refusals = []
        for _ in range(2):
            with pytest.raises(Refused) as refused:
                await limiter.check(token)
            refusals.append(refused.value)
        await limiter.check(token + "-other")  # its own bucket
        return refusals

    refusals = _in_loop(scenario())
    # One token per 20 s: the next one is 1..20 s away.
    assert [r.code for r in refusals] == ["rate_limited"] * 2 and all(1 <= r.retry_after <= 20 for r in refusals)
    assert limiter.limited == 2


def test_rate_limiter_fails_open_and_logs_once_when_redis_is_down(caplog):
    limiter = RateLimiter(f"redis://127.0.0.1:{procs.free_port()}/0", rate=1, burst=1)

    async def scenario():
        for _ in range(5):
            await limiter.check("Bearer bwc_anything")  # never raises, never 500s
            limiter._down_until = 0.0  # try Redis every time: a failure must still log only once

    with caplog.at_level(logging.WARNING, logger="telemetry.api.admission"):
        _in_loop(scenario())
    assert len([r for r in caplog.records if "rate limit off" in r.getMessage()]) == 1


@pytest.mark.django_db(transaction=True)
def test_rate_limited_request_answers_429_with_code_and_retry_after(client, monkeypatch):
    # One request per 20 s beyond a burst of 2: however slow this machine, the 3rd and 4th come too soon.
    monkeypatch.setattr(admission, "_limiter", RateLimiter(os.environ.get("REDIS_URL", ""), rate=0.05, burst=2))
    token = do_create_collector_token("agent-rate")
    now = datetime.now(UTC)
    statuses, last = [], None
    for i in range(4):
        last = client.post("/api/v1/ingest", data=json.dumps(_batch("node-rate", now - timedelta(seconds=i))),
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
        statuses.append(last.status_code)
    assert statuses == [200, 200, 429, 429]
    assert last.json()["error"]["code"] == "rate_limited" and int(last["Retry-After"]) >= 1
    assert _values("node-rate") == 2 * 8 * len(GPU_FIELDS)


# --- The gate in a real daphne with one slot and one queue place ---------------------------------

@pytest.fixture(scope="module")
def tight_server(django_db_setup, django_db_blocker):
    """daphne on the test database, admitting one batch at a time with one more waiting."""
    from django.conf import settings

    env = procs.child_env(LOG_LEVEL="ERROR", INGEST_MAX_INFLIGHT="1", INGEST_MAX_WAITING="1")
    server = procs.daphne(env).start().wait_port(timeout=30)
    yield server
    server.stop()
    _wait_for_backends_to_exit(settings.DATABASES["default"]["NAME"], django_db_blocker)


def _batch(host: str, t: datetime) -> dict:
    """One node's 8 GPUs at one instant: 32 samples, identified by (host, time)."""
    return {"gpus": {"host": [host] * 8, "uuid": [f"GPU-{host}-{i}" for i in range(8)], "index": list(range(8)),
                     "time": t.isoformat(),
                     "fields": {f: [float(i + 40) for i in range(8)] for f in GPU_FIELDS}}}


def _values(host_prefix: str) -> int:
    """Field values stored for the GPUs of hosts named `host_prefix`*."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT coalesce(sum(num_nonnulls({', '.join(GPU_FIELDS)})), 0) FROM telemetry_gpu_sample s "
                    "JOIN telemetry_gpu g ON g.id = s.gpu_id WHERE g.uuid LIKE %s", [f"GPU-{host_prefix}%"])
        return cur.fetchone()[0]


def _post(url: str, token: str, batch: dict) -> tuple[int, dict, dict]:
    req = urllib.request.Request(url + "/api/v1/ingest", data=gzip.compress(json.dumps(batch).encode()),
                                 method="POST", headers={"Authorization": f"Bearer {token}",
                                                         "Content-Type": "application/json",
                                                         "Content-Encoding": "gzip"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def _hold_ingest_log():
    """Hold a lock the writer needs last (its ingest-log insert): admitted batches wait in the
    database, exactly as behind a slow disk, until the block is left."""
    atomic = transaction.atomic()
    atomic.__enter__()
    with connection.cursor() as cur:
        cur.execute("LOCK TABLE telemetry_ingest_batch IN EXCLUSIVE MODE")
    return atomic


@pytest.mark.django_db(transaction=True)
def test_burst_beyond_capacity_gets_429_not_5xx_and_the_server_keeps_serving(tight_server):
    token = do_create_collector_token("agent-burst")
    now = datetime.now(UTC)
    answers: list = [None] * 10
    held = _hold_ingest_log()
    try:
        threads = [threading.Thread(target=lambda i=i: answers.__setitem__(
            i, _post(tight_server.url, token, _batch(f"burst{i:02d}", now)))) for i in range(10)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while sum(a is not None for a in answers) < 8 and time.monotonic() < deadline:
            time.sleep(0.02)  # eight refusals come back while two batches are held
        # Refused before its body is looked at: garbage that would be a 400 is a 429 here.
        garbage = urllib.request.Request(tight_server.url + "/api/v1/ingest", data=b"{not json", method="POST",
                                         headers={"Authorization": f"Bearer {token}"})
        with pytest.raises(urllib.error.HTTPError) as unparsed:
            urllib.request.urlopen(garbage, timeout=10)
    finally:
        held.__exit__(None, None, None)
    for t in threads:
        t.join(30)
    assert unparsed.value.code == 429 and json.loads(unparsed.value.read())["error"]["code"] == "overloaded"
    statuses = sorted(a[0] for a in answers)
    assert statuses == [200] * 2 + [429] * 8
    for status, headers, body in answers:
        if status == 429:
            assert body["error"]["code"] == "overloaded" and 1 <= int(headers["Retry-After"]) <= 30
    assert _values("burst") == 2 * 8 * len(GPU_FIELDS)  # the two admitted, nothing of the refused
    assert _post(tight_server.url, token, _batch("after", now))[0] == 200


@pytest.mark.django_db(transaction=True)
def test_pushers_back_off_spool_and_deliver_every_sample(tight_server, tmp_path):
    now = datetime.now(UTC).replace(microsecond=0)
    pushers = [Pusher(tight_server.url, do_create_collector_token(f"agent-p{i}"), tmp_path / f"spool{i}",
                      attempts=2, base_delay=0.05, max_delay=1.0, timeout=20) for i in range(5)]
    batches = [[_batch(f"push{i}", now - timedelta(seconds=30 - k)) for k in range(4)] for i in range(5)]

    def agent(i: int) -> None:
        for k, batch in enumerate(batches[i]):
            pushers[i].push(batch)
            if k == 0:
                first_done.wait(10)

    first_done = threading.Event()
    held = _hold_ingest_log()  # the first round meets a full server
    try:
        threads = [threading.Thread(target=agent, args=(i,)) for i in range(5)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while sum(p.health.spooled_batches for p in pushers) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        spooled_while_full = sum(p.health.spooled_batches for p in pushers)
    finally:
        held.__exit__(None, None, None)
    first_done.set()
    for t in threads:
        t.join(60)
    deadline = time.monotonic() + 20
    while any(not p.drain() for p in pushers) and time.monotonic() < deadline:
        time.sleep(0.2)  # each pusher waits out the Retry-After it was given
    offered = sum(count_samples(b) for bs in batches for b in bs)
    # Three of the five met a full server (one ran, one waited), were told to come back later, and spooled.
    assert spooled_while_full == 3 and sum("HTTP 429" in p.health.last_error for p in pushers) >= 3
    assert sum(p.health.spooled_batches for p in pushers) == 0 and all(not p.health.dropped_samples for p in pushers)
    assert sum(p.health.acked_samples for p in pushers) == offered == _values("push")


@pytest.mark.django_db(transaction=True)
def test_refused_pusher_does_not_call_again_before_retry_after(tight_server, tmp_path):
    token = do_create_collector_token("agent-hold")
    now = datetime.now(UTC).replace(microsecond=0)
    pusher = Pusher(tight_server.url, token, tmp_path, attempts=1, base_delay=0.05, max_delay=5.0, timeout=20)
    held = _hold_ingest_log()
    try:
        # One runs (held at the database), one waits, the third is refused: from then on the server is full.
        answers: list = []
        occupying = [threading.Thread(target=lambda i=i: answers.append(
            _post(tight_server.url, token, _batch(f"hold{i}", now))[0])) for i in range(3)]
        for t in occupying:
            t.start()
        deadline = time.monotonic() + 10
        while 429 not in answers and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not pusher.push(_batch("held", now - timedelta(seconds=2)))
        assert "HTTP 429" in pusher.health.last_error
        # Another try now would wait out a Retry-After (>= 1 s) between attempts; held off, it spools at once.
        pusher.attempts = 3
        started = time.monotonic()
        assert not pusher.push(_batch("held", now - timedelta(seconds=1)))
        assert time.monotonic() - started < 0.5 and pusher.health.spooled_batches == 2
    finally:
        held.__exit__(None, None, None)
    for t in occupying:
        t.join(30)
    deadline = time.monotonic() + 10
    while not pusher.drain() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pusher.health.spooled_batches == 0
    assert _values("held") == pusher.health.acked_samples == 2 * 8 * len(GPU_FIELDS)
