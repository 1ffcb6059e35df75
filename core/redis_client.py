"""The Redis client every process shares: fails within about a second instead of stalling a request."""

from __future__ import annotations

import threading

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry

_shared: redis.Redis | None = None
_lock = threading.Lock()


def fast_client(url: str) -> redis.Redis:
    """A Redis client that fails within about a second instead of stalling ingest (or a sign-in page).

    redis-py's default retries ten times with backoff (several seconds when Redis is down); one
    immediate retry is enough to replace a pooled connection that Redis closed.
    """
    return redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 1))


def shared_client() -> redis.Redis:
    """One client per process for settings.REDIS_URL; redis-py pools connections and is thread-safe."""
    global _shared
    if _shared is None:
        with _lock:
            if _shared is None:
                _shared = fast_client(settings.REDIS_URL)
    return _shared
