"""The Celery app; tasks are discovered in each app's tasks.py."""

import ctypes
import ctypes.util
import importlib
import os
import time

import django
from celery import Celery
from celery.signals import task_postrun, worker_init
from django.db import reset_queries

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

app = Celery("breakwater")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Modules the anomaly tasks import on first use: scikit-learn, SciPy and the model code. Imported lazily,
# each pool child loaded them on its first scoring or training pass, and each child's private memory took
# a step of its own (measured in the soak: +300 MB per child at 4k GPUs, minutes after start). Imported in
# the pool's parent before it forks, they are loaded once and shared copy-on-write by every child, and the
# children's memory is flat from their first task. Costs the worker about 1 s at start.
PRELOAD = ("anomaly.lifecycle", "anomaly.scoring", "anomaly.failure_pipeline", "anomaly.survival", "anomaly.registry",
           "alerts.evaluation", "telemetry.rollups")


@worker_init.connect
def _preload_for_children(**kwargs) -> None:
    django.setup()  # idempotent; the Django fixup may not have run yet when this signal fires
    for name in PRELOAD:
        importlib.import_module(name)


def _libc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to hand back this way
        return None


_malloc_trim = _libc_trim()


def release_freed_memory() -> bool:
    """Return the C heap's free pages to the OS (glibc malloc_trim); False where unavailable."""
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True


# What a task frees stays in the worker's C heap as a high-water mark (result sets from libpq, numpy
# arrays, OpenMP threads' own arenas), and the heap fragments: measured in the 16k-GPU soak, a child held
# 380 MB after model training, 265 MB once the freed pages were handed back, and kept creeping by about
# 1 MB a minute between the heavy tasks. So the heavy tasks trim at once, and any other task when the
# child last trimmed TRIM_EVERY_S ago. Not after every task: a trimmed page that the next task touches
# again is a page fault, and at 16k GPUs evaluations alone ran dozens of times a minute.
HEAVY_TASKS = frozenset({"anomaly.tasks.train_models", "anomaly.tasks.score", "telemetry.tasks.run_rollups"})
TRIM_EVERY_S = 30.0
_last_trim = [0.0]


@task_postrun.connect
def _forget_logged_queries(**kwargs) -> None:
    """With DEBUG on (`./dev up --debug`), Django keeps every query's SQL on each connection, up to 9,000, and only a
    request's start clears them; a worker has no requests. At 16k GPUs a scoring pass logs SQL with id lists
    inlined, and a child grew ~1 MB a pass (measured, bench DB of the 16k soak: flat with DEBUG off)."""
    reset_queries()


@task_postrun.connect
def _trim_after_task(sender=None, **kwargs) -> None:
    now = time.monotonic()
    if (sender is not None and sender.name in HEAVY_TASKS) or now - _last_trim[0] >= TRIM_EVERY_S:
        _last_trim[0] = now
        release_freed_memory()
