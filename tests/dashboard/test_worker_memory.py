"""Worker memory (dashboard/celery.py): children hand freed heap pages back (after heavy tasks, and at
least every 30 s), and the scientific stack is loaded once in the pool's parent rather than separately in each
child."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from dashboard.celery import _trim_after_task
from tests import procs

PROBE = r"""
import sys
sys.path.insert(0, ".")
from dashboard.celery import release_freed_memory

def anon_kb():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

blocks = [bytes(1024) for _ in range(200_000)]  # ~200 MB from malloc (past pymalloc's 512 B limit)
pin = bytes(1024)  # allocated last: the heap's top stays in use, so free() alone cannot shrink it
del blocks
before = anon_kb()
assert release_freed_memory()
print(before, anon_kb())
"""


def test_release_freed_memory_returns_the_heap_pages_to_the_os():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60)
    before, after = map(int, out.stdout.split())
    assert before - after > 100_000, (before, after)  # kB: most of the ~200 MB freed


def test_heavy_tasks_trim_at_once_and_others_at_most_every_30_s(monkeypatch):
    from dashboard import celery as app_module

    calls, clock = [], [1000.0]
    monkeypatch.setattr(app_module, "release_freed_memory", lambda: calls.append(1) or True)
    monkeypatch.setattr(app_module.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(app_module, "_last_trim", [0.0])

    class Task:
        def __init__(self, name):
            self.name = name

    light = Task("alerts.tasks.flush_groups")
    _trim_after_task(sender=light)  # the child's first task: never trimmed before
    _trim_after_task(sender=light)
    clock[0] += app_module.TRIM_EVERY_S - 1
    _trim_after_task(sender=light)
    assert len(calls) == 1
    for name in sorted(app_module.HEAVY_TASKS):
        _trim_after_task(sender=Task(name))
    assert len(calls) == 1 + len(app_module.HEAVY_TASKS)
    clock[0] += app_module.TRIM_EVERY_S
    _trim_after_task(sender=light)
    assert len(calls) == 2 + len(app_module.HEAVY_TASKS)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def _maps_sklearn(pid: int) -> bool:
    return "/sklearn/" in Path(f"/proc/{pid}/maps").read_text()


def test_pool_children_inherit_the_scientific_stack_before_their_first_task():
    """A real prefork worker on a queue nobody sends to: its children have run no task, yet scikit-learn's
    compiled modules are already mapped in them (inherited from the parent), so a child's first scoring
    pass adds no import of its own."""
    queue = f"bw-test-preload-{os.getpid()}-{time.monotonic_ns()}"
    worker = procs.Child("worker", procs.worker_argv(queue, f"{queue}@%h", concurrency=2, heartbeat=False),
                         {**os.environ, "LOG_LEVEL": "WARNING"}).start()

    def pool_children() -> list[int] | None:
        kids = _children(worker.pid)
        return kids if len(kids) >= 2 else None

    try:
        kids = worker.wait_until(pool_children, "two pool children", timeout=60, interval=0.2)
        assert _maps_sklearn(worker.pid)
        assert all(_maps_sklearn(k) for k in kids), kids
    finally:
        worker.stop(timeout=30)


def test_a_finished_task_leaves_no_logged_queries_behind(db):
    """DEBUG's query log is cleared by a request's start; in a worker, by the end of each task."""
    from celery.signals import task_postrun
    from django.db import connection

    connection.force_debug_cursor = True  # what DEBUG = True does to every connection
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        assert len(connection.queries) >= 1
        task_postrun.send(sender=None, task_id="t", task=None, args=(), kwargs={}, retval=None, state="SUCCESS")
        assert connection.queries == []
    finally:
        connection.force_debug_cursor = False
