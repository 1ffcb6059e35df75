"""Several Breakwater processes on loopback for the reliability tests: daphne servers and Celery workers.

They run against the test database, the test Celery queue and the test channel prefix (tests/conftest.py
exports both per TEST_DB_SUFFIX), as production runs several of each against one database and one Redis.

This module is also the Celery app module of the workers it starts (``celery -A tests.reliability.procs``):
it re-exports the project's app and, only when `PAUSE_ENV` is set in the worker's environment, installs a
pause inside one rollup slice so a test can SIGKILL the worker mid-pass at a known point without any hook
in product code. The pause is a post_save receiver on the rollup's watermark row: it runs inside the slice's
transaction, after the slice's rows are written and before the commit, with the rollup's advisory lock held.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from dashboard.celery import app  # noqa: F401  (`celery -A tests.reliability.procs` finds the app here)

REPO = Path(__file__).resolve().parents[2]
# "<rollup>:<slice>:<seconds>": sleep `seconds` inside slice number `slice` (from 1) of that rollup.
PAUSE_ENV = "BW_TEST_PAUSE_IN_ROLLUP_SLICE"


def _install_rollup_pause(spec: str) -> None:
    from django.db.models.signals import post_save

    name, nth, seconds = spec.split(":")
    seen = [0]

    def pause(sender, instance, created, update_fields=None, **kwargs) -> None:
        # The watermark is saved with update_fields once per slice, at its end; created at the first pass.
        if instance.name != name or created or not update_fields:
            return
        seen[0] += 1
        if seen[0] == int(nth):
            time.sleep(float(seconds))

    post_save.connect(pause, sender="telemetry.RollupWatermark", weak=False)


if os.environ.get(PAUSE_ENV):
    _install_rollup_pause(os.environ[PAUSE_ENV])


# --- Processes --------------------------------------------------------------------------------------------

def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child process: the test database, queue and channel prefix of this run."""
    from urllib.parse import quote

    from django.conf import settings

    db = settings.DATABASES["default"]
    url = f"postgresql://{quote(db['USER'])}:{quote(db['PASSWORD'])}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    return {**os.environ, "DATABASE_URL": url, "DB_CONN_MAX_AGE": "0", "LOG_LEVEL": "WARNING",
            "CELERY_QUEUE": settings.CELERY_TASK_DEFAULT_QUEUE,
            "BREAKWATER_CHANNEL_PREFIX": settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"], **extra}


class Worker:
    """One `celery worker` (solo pool, one task at a time) on the test queue; killable with SIGKILL."""

    def __init__(self, env: dict[str, str], label: str):
        self.env = env
        self.name = f"bwrel-{os.getpid()}-{label}-{time.monotonic_ns()}@localhost"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Worker:
        celery = str(Path(sys.executable).parent / "celery")
        self.proc = subprocess.Popen(
            [celery, "-A", "tests.reliability.procs", "worker", "--pool", "solo", "--concurrency", "1",
             "-Q", self.env["CELERY_QUEUE"], "--without-heartbeat", "--without-gossip", "--without-mingle",
             "-n", self.name, "--loglevel", "WARNING"],
            cwd=REPO, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: the worker dies mid-task with nothing acknowledged and no cleanup."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def failure(self) -> str:
        """Why the worker is gone (its stderr), for an assertion message."""
        return f"worker {self.name} exited ({self.proc.returncode}): {self.proc.stderr.read().decode()[-2000:]}"


def wait_ready(workers: list[Worker], timeout: float = 60.0) -> None:
    """Until every worker answers a ping (the queue is consumed from then on)."""
    waiting = {w.name for w in workers}
    deadline = time.monotonic() + timeout
    while waiting:
        for w in workers:
            assert w.alive() or w.name not in waiting, w.failure()
        replies = app.control.ping(destination=sorted(waiting), timeout=0.5)
        waiting -= {name for reply in replies for name in reply}
        assert time.monotonic() < deadline, f"workers not up within {timeout:.0f} s: {sorted(waiting)}"


class Server:
    """One daphne serving the project on a free loopback port (tests.conftest.AsgiServer, but started without
    waiting, so several start side by side, and with a deadline that fits a loaded CI machine)."""

    def __init__(self, env: dict[str, str]):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.env = env
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Server:
        daphne = str(Path(sys.executable).parent / "daphne")
        self.proc = subprocess.Popen(
            [daphne, "-b", "127.0.0.1", "-p", str(self.port), "dashboard.asgi:application"],
            cwd=REPO, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )
        return self

    def wait_listening(self, deadline: float) -> None:
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                assert self.proc.poll() is None, f"daphne exited: {self.proc.stderr.read().decode()[-3000:]}"
                assert time.monotonic() < deadline, f"daphne on port {self.port} did not start in time"
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def start_all(servers: list[Server], workers: list[Worker], timeout: float = 120.0) -> None:
    """Start every process at once (each spends seconds importing) and wait until all of them serve."""
    for p in [*servers, *workers]:
        p.start()
    deadline = time.monotonic() + timeout
    for s in servers:
        s.wait_listening(deadline)
    wait_ready(workers, timeout=max(1.0, deadline - time.monotonic()))


def stop_all(processes: list) -> None:
    """SIGTERM every process at once, then wait (SIGKILL after 10 s): stopping them one by one adds up."""
    running = [p for p in processes if p.proc and p.proc.poll() is None]
    for p in running:
        os.killpg(p.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for p in running:
        try:
            p.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.proc.pid, signal.SIGKILL)
            p.proc.wait(timeout=10)


def queue_length() -> int:
    """Messages waiting in the test queue (kombu's Redis transport keeps a queue as a list of its name)."""
    import redis
    from django.conf import settings

    with redis.Redis.from_url(settings.REDIS_URL) as r:
        return r.llen(settings.CELERY_TASK_DEFAULT_QUEUE)


def wait_idle(workers: list[Worker], timeout: float = 30.0) -> None:
    """Until the queue is empty and every live worker answers that it has nothing running, reserved or
    scheduled (a countdown). A solo worker cannot answer while it runs a task, so silence counts as busy.
    Asked twice in a row, so a task that one worker queues as another finishes is not missed."""
    names = {w.name for w in workers if w.alive()}
    deadline = time.monotonic() + timeout
    quiet = 0
    while quiet < 2:
        assert time.monotonic() < deadline, f"workers still busy after {timeout:.0f} s"
        inspect = app.control.inspect(destination=sorted(names), timeout=0.5)
        replies = [inspect.active() or {}, inspect.reserved() or {}, inspect.scheduled() or {}]
        busy = queue_length() > 0 or any(set(r) != names or any(r.values()) for r in replies)
        quiet = 0 if busy else quiet + 1
        if busy:
            time.sleep(0.1)
