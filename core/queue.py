"""Queueing a Celery task by its registered name.

A module whose work a task runs (routing, delivery, the lifecycle, remediation) often also queues that task.
Importing the task would make the module and its `tasks.py` import each other; naming it does not, and the
worker runs the same registered task. Every task the project queues this way has an explicit `name=` that
`tests/structure/test_tasks.py` checks against the registry.
"""

from __future__ import annotations

from celery import current_app


def paging_queue(default: str) -> str:
    """The queue of paging's tasks (evaluate, flush, deliver) beside the default queue `default`: the one name
    settings, `./dev up`'s worker and the test harness share."""
    return f"{default}.alerts"


def enqueue(name: str, *args, countdown: float | None = None):
    """Send task `name` with positional `args`, `countdown` seconds from now (None = at once).

    Under `task_always_eager` (tests that run tasks in the sending thread) the registered task runs here,
    as `apply_async` would run it: `send_task` ignores that setting.
    """
    app = current_app
    if app.conf.task_always_eager:
        if name not in app.tasks:  # outside a worker the apps' tasks.py load on first use, as the worker loads them
            app.loader.import_default_modules()
        return app.tasks[name].apply_async(args, countdown=countdown)
    return app.send_task(name, args=args, countdown=countdown)
