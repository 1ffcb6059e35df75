"""Fixtures for the fault tests: one private stack per session, and the product's processes on it.

Both test files share the stack, one daphne and one Celery worker: the database is migrated once, and
processes that have been through a PostgreSQL restart must still serve the Redis tests, which is part of
what is being proved (no fault needs a process restart).
"""

from __future__ import annotations

import time

import pytest

from alerts.receiver import Receiver
from tests.procs import Child
from tests.reliability.stack import Stack

PASSWORD = "correct-horse-battery"
HOOK_SECRET = "fault-test-signing-secret"
# The tests never touch the shared test database (pytest-django's is not set up): the private one is
# seeded by one Django process, through the product's own actions.
SEED = """
from alerts.models import Channel
from django.contrib.auth import get_user_model
from telemetry.actions import do_create_collector_token
from tenancy.actions import do_create_api_token
op = get_user_model().objects.create_superuser("op", "op@example.com", {password!r})
hook = Channel.objects.create(name="fault-hook", kind="webhook", config={{"url": {hook_url!r}}}, secret={secret!r})
print(json.dumps({{"token": do_create_collector_token("fault-tests"), "channel": hook.pk,
                  "api_token": do_create_api_token("fault-tests", user=op, read_only=False)[1]}}))
"""


@pytest.fixture(scope="session")
def fault_receiver():
    """A real local HTTP receiver standing in for the notification provider (alerts/receiver.py)."""
    with Receiver(secret=HOOK_SECRET) as rec:
        yield rec


@pytest.fixture(scope="session")
def fault_stack(fault_receiver):
    """A private PostgreSQL + Redis, migrated and seeded, with daphne and a Celery worker on it; everything is
    stopped and removed at the end, whatever happened. `stack.seed` holds the tokens and the channel id."""
    t0 = time.monotonic()
    # The provider stand-in listens on loopback, which channel URLs may only name when allowed (SSRF guard).
    s = Stack(env={"OUTBOUND_URL_ALLOWLIST": f"127.0.0.1:{fault_receiver.port}"})
    try:
        s.start()
        # Neither daphne nor the worker needs a table to boot: they start while the migration runs.
        s.asgi = s.daphne(wait=False)
        s.worker = s.celery_worker()
        s.seed = s.migrate_and_seed(SEED.format(password=PASSWORD, hook_url=fault_receiver.url("/hook"),
                                                secret=HOOK_SECRET))
        s.token = s.seed["token"]
        s.checkpoint()
        s.asgi.wait_port(timeout=60)
        s.timings["stack_total_s"] = time.monotonic() - t0
        print(f"\nfault-test stack ready: {s.timings}")  # noqa: T201 - the measured start-up
        yield s
    finally:
        t0 = time.monotonic()
        s.close()
        print(f"\nfault-test stack removed in {time.monotonic() - t0:.1f} s")  # noqa: T201


@pytest.fixture(scope="session")
def fault_daphne(fault_stack) -> Child:
    """The ASGI server on the private stack, with production's persistent connections (DB_CONN_MAX_AGE unset):
    the case where a restart leaves every pooled connection broken. One process for the whole session."""
    assert fault_stack.asgi.alive(), fault_stack.asgi.tail()
    return fault_stack.asgi


@pytest.fixture(scope="session")
def fault_worker(fault_stack) -> Child:
    """The session's Celery worker, once it consumes."""
    fault_stack.worker.wait_log("ready.", timeout=60)
    return fault_stack.worker


@pytest.fixture
def pg_restored(fault_stack):
    """Whatever a test did to PostgreSQL, it is running again afterwards."""
    yield
    if not (fault_stack.pg_data / "postmaster.pid").exists():
        fault_stack.start_pg()
