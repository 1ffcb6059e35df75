"""Several Breakwater processes on loopback for the reliability tests: daphne servers and Celery workers
(started, logged, awaited and stopped by tests/procs.py, the harness of every test and bench).

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
import time

from dashboard.celery import app  # `celery -A tests.reliability.procs` finds the app here
from tests import procs as harness
from tests.procs import child_env  # noqa: F401  (the tests take the children's environment from here)

APP = "tests.reliability.procs"  # this module, as the workers' `-A`
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


# --- Processes (tests/procs.py's harness: command lines, logs, readiness, process-group kill) ----------------

class Worker(harness.Child):
    """One `celery worker` (solo pool, one task at a time) on the test queue, with this module as its app;
    killable with SIGKILL. `name` is its Celery node name (what `wait_ready` pings)."""

    def __init__(self, env: dict[str, str], label: str):
        name = f"bwrel-{os.getpid()}-{label}-{time.monotonic_ns()}@localhost"
        super().__init__(name, harness.worker_argv(env["CELERY_QUEUE"], name, app=APP, solo=True), env)


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


class Server(harness.Child):
    """One daphne serving the project on a free loopback port (as tests.conftest.AsgiServer, but started
    without waiting, so several start side by side, and with a deadline that fits a loaded CI machine)."""

    def __init__(self, env: dict[str, str]):
        port = harness.free_port()
        super().__init__("daphne", harness.daphne_argv(port), env, port=port)

    def wait_listening(self, deadline: float) -> None:
        self.wait_port(timeout=max(0.1, deadline - time.monotonic()))


def start_all(servers: list[Server], workers: list[Worker], timeout: float = 120.0) -> None:
    """Start every process at once (each spends seconds importing) and wait until all of them serve."""
    for p in [*servers, *workers]:
        p.start()
    deadline = time.monotonic() + timeout
    for s in servers:
        s.wait_listening(deadline)
    wait_ready(workers, timeout=max(1.0, deadline - time.monotonic()))


stop_all = harness.stop_all  # SIGTERM to every process group at once, then wait (SIGKILL after 10 s)


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
