"""Fixtures for the alerts tests: a local notification receiver and a real Celery worker process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from alerts.receiver import Receiver

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def receiver():
    """A real local HTTP receiver (PagerDuty/Opsgenie/Slack-like answers) on a free loopback port."""
    with Receiver(secret="s3cret-for-tests") as rec:
        yield rec


class WorkerProcess:
    """`celery worker` as a child process on the test database and the test queue; killable with SIGKILL."""

    def __init__(self, env: dict):
        self.env = env
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        celery = str(Path(sys.executable).parent / "celery")
        self.proc = subprocess.Popen(
            [celery, "-A", "dashboard", "worker", "--pool", "solo", "--concurrency", "1", "-Q",
             self.env["CELERY_QUEUE"], "--without-heartbeat", "--without-gossip", "--without-mingle",
             "-n", f"bwtest-{os.getpid()}-{time.monotonic_ns()}@%h", "--loglevel", "WARNING"],
            cwd=REPO, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True,
        )

    def kill(self) -> None:
        """SIGKILL: the worker dies mid-task with nothing acknowledged."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def celery_worker_process(django_db_setup, django_db_blocker):
    """Factory: start real worker processes against the test database; all are stopped afterwards.
    The test queue is purged first."""
    from urllib.parse import quote

    from django.conf import settings

    from dashboard.celery import app

    db = settings.DATABASES["default"]
    url = f"postgresql://{quote(db['USER'])}:{quote(db['PASSWORD'])}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    env = {**os.environ, "DATABASE_URL": url, "DB_CONN_MAX_AGE": "0", "LOG_LEVEL": "WARNING",
           "CELERY_QUEUE": settings.CELERY_TASK_DEFAULT_QUEUE}
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
