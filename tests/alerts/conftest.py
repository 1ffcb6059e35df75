"""Fixtures for the alerts tests: a local notification receiver and a real Celery worker process."""

from __future__ import annotations

import os
import time

import pytest

from alerts.receiver import Receiver
from tests import procs


@pytest.fixture
def receiver():
    """A real local HTTP receiver (PagerDuty/Opsgenie/Slack-like answers) on a free loopback port."""
    with Receiver(secret="s3cret-for-tests") as rec:
        yield rec


class WorkerProcess(procs.Child):
    """`celery worker` (solo pool) as a child process on the test database and the test queue; killable with
    SIGKILL (`kill()`). Its output is in its log (`tail()`, `failure()`)."""

    def __init__(self, env: dict):
        name = f"bwtest-{os.getpid()}-{time.monotonic_ns()}@%h"
        super().__init__("worker", procs.worker_argv(env["CELERY_QUEUE"], name, solo=True), env)

    def stop(self, timeout: float = 15.0) -> None:
        super().stop(timeout)


@pytest.fixture
def celery_worker_process(django_db_setup, django_db_blocker):
    """Factory: start real worker processes against the test database; all are stopped afterwards.
    The test queue is purged first."""
    from dashboard.celery import app

    env = procs.child_env()
    workers: list[WorkerProcess] = []
    app.control.purge()  # leftovers of an earlier run (other ids, other database) must not run here

    def start(extra_env: dict[str, str] | None = None) -> WorkerProcess:
        """Start one worker; `extra_env` adds variables (e.g. ALERT_CLAIM_TIMEOUT_SECONDS) for it alone."""
        w = WorkerProcess({**env, **(extra_env or {})})
        w.start()
        workers.append(w)
        return w

    yield start
    for w in workers:
        w.stop()
