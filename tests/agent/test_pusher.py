"""The agent's pusher against the real server: nothing is lost across a server outage."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from telemetry.actions import do_create_collector_token
from telemetry.agent.pusher import Pusher, count_samples

pytestmark = pytest.mark.django_db(transaction=True)


def _batch(i: int, now: datetime) -> dict:
    t = (now - timedelta(seconds=60 - i)).isoformat()
    return {"gpus": {"host": ["node-a"] * 2, "uuid": ["GPU-a0", "GPU-a1"], "index": [0, 1], "time": t,
                     "fields": {"gpu_util": [float(i), float(i)], "gpu_temp": [40.0, 41.0]}}}


def _rows() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM telemetry_gpu_sample")
        return cur.fetchone()[0]


def test_every_sample_arrives_after_the_server_restarts(asgi_server, tmp_path):
    token = do_create_collector_token("agent-node-a")
    pusher = Pusher(asgi_server.url, token, tmp_path / "spool", attempts=2, base_delay=0.05, timeout=2)
    now = datetime.now(UTC)
    assert pusher.push(_batch(0, now))
    asgi_server.stop()
    try:
        assert not pusher.push(_batch(1, now))
        assert not pusher.push(_batch(2, now))
        assert pusher.health.spooled_batches == 2 and len(list((tmp_path / "spool").glob("*.json.gz"))) == 2
        assert "cannot reach" in pusher.health.last_error
    finally:
        asgi_server.start()
    assert pusher.push(_batch(3, now))
    assert _rows() == 8  # 4 batches x 2 GPUs, in order, none lost
    assert pusher.health.sent_batches == 4 and pusher.health.sent_samples == 16
    assert pusher.health.acked_samples == 16  # the server's answers agree
    assert pusher.health.dropped_samples == {} and pusher.health.spooled_batches == 0


def test_full_spool_drops_oldest_and_counts_it(tmp_path):
    pusher = Pusher("http://127.0.0.1:9", "t", tmp_path, attempts=1, max_spool_bytes=600, timeout=0.5)
    now = datetime.now(UTC)
    for i in range(6):
        assert not pusher.push(_batch(i, now))
    assert sum(p.stat().st_size for p in tmp_path.glob("*.json.gz")) <= 600
    dropped = pusher.health.dropped_samples["spool_full"]
    kept = len(list(tmp_path.glob("*.json.gz")))
    assert dropped == (6 - kept) * count_samples(_batch(0, now)) and dropped > 0


def test_malformed_batch_is_dropped_and_counted_not_spooled(asgi_server, tmp_path):
    token = do_create_collector_token("agent-node-b")
    pusher = Pusher(asgi_server.url, token, tmp_path, attempts=3, base_delay=0.01)
    bad = {"gpus": [{"host": "node-b", "uuid": "GPU-b0", "fields": {"gpu_utl": 1.0}}]}
    assert not pusher.push(bad)
    assert pusher.health.dropped_samples == {"refused": 1}
    assert "HTTP 400" in pusher.health.last_error and "gpu_utl" in pusher.health.last_error
    assert not list(tmp_path.glob("*.json.gz"))


def test_spool_survives_an_agent_restart(tmp_path):
    now = datetime.now(UTC)
    first = Pusher("http://127.0.0.1:9", "t", tmp_path, attempts=1, timeout=0.5)
    first.push(_batch(0, now))
    second = Pusher("http://127.0.0.1:9", "t", tmp_path, attempts=1, timeout=0.5)
    assert second.health.spooled_batches == 1
