"""Isolation of parallel test workers (pytest-xdist), loaded with `-p tests.parallel` before pytest-django.

pytest-django gives each worker its own test database (`test_breakwater_gw0`, ...). Everything else a test
touches in Redis must be the worker's own too: Celery's queue, the channel layer's groups, the evaluation
flag, rate limits, live counters. Each worker therefore gets a Redis database of its own (the number after the
URL's host), its own Celery queue and its own channel prefix. This runs at import, before pytest-django reads
the settings, so the settings of the worker and of every process a test starts (daphne, Celery workers, the
simulator inherit the environment) agree.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...; empty without -n
FIRST_REDIS_DB = 1  # database 0 stays the development stack's (./dev up)


def worker_redis_url(url: str, worker: str) -> str:
    """`url` with the Redis database number of `worker` ("gw3" -> 1 + 3)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{FIRST_REDIS_DB + int(worker.removeprefix('gw'))}"))


if WORKER:
    base = os.environ.get("REDIS_URL", "redis://127.0.0.1:56379/0")
    os.environ["REDIS_URL"] = worker_redis_url(base, WORKER)
    suffix = os.environ.get("TEST_DB_SUFFIX", "") + "-" + WORKER
    os.environ.setdefault("CELERY_QUEUE", "bw-test" + suffix)
    os.environ.setdefault("BREAKWATER_CHANNEL_PREFIX", "bwtest" + suffix)
