"""Fixtures shared by every test module."""

from __future__ import annotations

import functools
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests import procs

REPO = Path(__file__).resolve().parent.parent

# Real captures live beside the checkout (../shared/data), never inside it.
SHARED_DATA = Path(os.environ.get("BREAKWATER_SHARED_DATA", REPO.parent / "shared" / "data"))

# Tasks the tests send go to a queue of their own (per test database), never to the worker of a
# `./dev up` sharing this Redis: that worker would run them against the live database.
os.environ.setdefault("CELERY_QUEUE", "bw-test" + os.environ.get("TEST_DB_SUFFIX", ""))
# Likewise live pushes: a test's ticks must not reach the pages of a running `./dev up`.
os.environ.setdefault("BREAKWATER_CHANNEL_PREFIX", "bwtest" + os.environ.get("TEST_DB_SUFFIX", ""))
# The tests' notification receivers listen on loopback, which the outbound URL guard refuses unless allowlisted.
os.environ.setdefault("OUTBOUND_URL_ALLOWLIST", "127.0.0.1,::1,localhost")


def _isolate_from_dev() -> None:
    """pytest-django reads the settings before this file runs, so the variables above reach only the
    processes the tests start (daphne, workers); the settings of this process are set here too."""
    from django.conf import settings

    if not settings.configured:
        return
    from dashboard.settings import celery_queues

    queue = os.environ["CELERY_QUEUE"]
    settings.CELERY_TASK_DEFAULT_QUEUE = queue
    settings.CELERY_ALERTS_QUEUE, settings.CELERY_TASK_QUEUES, settings.CELERY_TASK_ROUTES = celery_queues(queue)
    settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] = os.environ["BREAKWATER_CHANNEL_PREFIX"]
    settings.OUTBOUND_URL_ALLOWLIST = tuple(os.environ["OUTBOUND_URL_ALLOWLIST"].split(","))
    from dashboard.celery import app

    app.conf.task_default_queue = queue
    app.conf.task_queues, app.conf.task_routes = settings.CELERY_TASK_QUEUES, settings.CELERY_TASK_ROUTES


_isolate_from_dev()


def _flush_retries_a_deadlock() -> None:
    """A transactional test's teardown empties the database with one TRUNCATE of every table, taking their locks one
    by one. The session's daphne (asgi_server) lives across tests, and a page it still serves reads several tables
    on a tick that the test's last commit sent; the two can deadlock, and PostgreSQL aborts the TRUNCATE (seen once
    in a fresh clone's full run). The reader's query is short: flush again, a few times."""
    from django.conf import settings

    if not settings.configured:
        return
    from django.db import OperationalError
    from django.test import TransactionTestCase

    original = TransactionTestCase._fixture_teardown

    @functools.wraps(original)
    def teardown(self):
        for attempt in range(4):
            try:
                return original(self)
            except Exception as exc:  # flush wraps the driver's error in a CommandError
                cause = exc if isinstance(exc, OperationalError) else exc.__cause__
                if attempt == 3 or not isinstance(cause, OperationalError) or "deadlock" not in str(cause):
                    raise
                time.sleep(0.2)

    TransactionTestCase._fixture_teardown = teardown


_flush_retries_a_deadlock()

# Tests that took over half a second in a measured run (scripts/slow_tests.py writes the list): marked `slow`, so
# `./dev test --fast` (no browser, Slurm or slow tests) stays a tier to run while working. CI runs everything.
SLOW_LIST = Path(__file__).with_name("slow.txt")


def pytest_collection_modifyitems(config, items):
    slow = {ln for ln in SLOW_LIST.read_text().splitlines() if ln and not ln.startswith("#")}
    for item in items:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _trailing_publish_done():
    """A fleet publish armed by a test's commit runs on a timer thread that reads the database: it must be done
    before the test database is flushed (TRUNCATE), which it would otherwise deadlock with."""
    yield
    live = sys.modules.get("telemetry.live")
    if live is not None:
        live.wait_for_trailing_publish()


# Tests fix time with a constant, not now().
FIXED_NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Root of the real public captures; the suite fails loudly if they are missing."""
    if not SHARED_DATA.is_dir():
        pytest.fail(f"real captures not found at {SHARED_DATA}; set BREAKWATER_SHARED_DATA")
    return SHARED_DATA


@pytest.fixture(scope="session", autouse=True)
def _no_persistent_worker_connections():
    """API work runs in worker threads with their own connections; closing them after each
    request lets the test database be flushed and dropped."""
    from django.conf import settings

    if settings.configured:  # pure parser tests may run with -p no:django
        from django.db import connections

        connections.settings["default"]["CONN_MAX_AGE"] = 0
        # Django empties the test database with TRUNCATE after each transactional test; the audit log's and
        # final invoices' guards refuse that unless the session says so (alerts/tenancy migrations 0003).
        connections.settings["default"].setdefault("OPTIONS", {})["options"] = "-c breakwater.allow_truncate=on"
    yield


@pytest.fixture(autouse=True)
def _no_login_counters_across_tests():
    """Failed-login counts live in Redis for 15 minutes: one test's failures must not lock out the next."""
    from django.conf import settings

    if settings.configured:
        from dashboard.security import clear_login_counters

        clear_login_counters()
    yield


@pytest.fixture(autouse=True)
def _fresh_entity_cache():
    """Ingest caches inventory ids per process, live pages share reads per tick; each test starts afresh."""
    from django.conf import settings

    if not settings.configured:
        yield
        return
    from dashboard.consumers.base import clear_tick_memos
    from telemetry.ingest import entities

    entities.clear_cache()
    clear_tick_memos()
    yield
    entities.clear_cache()


# --- A real ASGI server and a real browser ------------------------------------------------------
# pytest-django's live_server speaks plain HTTP only; the operator pages need websockets, so the
# browser tests run daphne itself against the test database.

CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]


class AsgiServer(procs.Child):
    """A daphne process serving the project on a free loopback port; restartable on the same port.

    tests.procs' daphne with the readiness wait in `start()`, under the name some test modules import from
    here. Its output goes to a log file (`log_text()`, `tail()`), never to an unread pipe."""

    def __init__(self, env: dict):
        port = procs.free_port()
        super().__init__("daphne", procs.daphne_argv(port), env, port=port)

    def start(self) -> AsgiServer:
        super().start()
        self.wait_port(timeout=30)
        return self


@pytest.fixture(scope="session")
def asgi_server(django_db_setup, django_db_blocker):
    """daphne on a free port, connected to the test database and the test Redis."""
    from django.conf import settings

    server = AsgiServer(procs.child_env())
    server.start()
    yield server
    server.stop()
    _wait_for_backends_to_exit(settings.DATABASES["default"]["NAME"], django_db_blocker)


def _wait_for_backends_to_exit(dbname: str, django_db_blocker, timeout: float = 10.0) -> None:
    """A killed client's PostgreSQL backend lingers a moment; the test database can only be
    dropped once every other session on it is gone."""
    import time

    from django.db import connection

    deadline = time.monotonic() + timeout
    with django_db_blocker.unblock():
        while time.monotonic() < deadline:
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() "
                    "AND backend_type = 'client backend'",
                    [dbname],
                )
                if cur.fetchone()[0] == 0:
                    return
            time.sleep(0.1)



@pytest.fixture
def browser_page():
    """A fresh page in Debian's Chromium, driven by Playwright (it never downloads a browser)."""
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the ORM calls the test makes
    # meanwhile are still plain synchronous calls.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.wait_for_function = functools.partial(_wait_for_function, page)
        yield page
        browser.close()
        # While Playwright's loop runs, the test's ORM calls get a connection of their own
        # (asgiref keys connections by context); close it here, in that same context.
        from django.db import connections

        connections.close_all()
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


def _wait_for_function(page, expression: str, *, arg=None, timeout: float | None = None, polling=None) -> None:
    """Page.wait_for_function under the pages' strict CSP.

    Playwright re-checks the predicate inside the page by evaluating its source text, which a CSP without
    'unsafe-eval' forbids (EvalError), so the pages would need a weaker policy just to be tested. This polls
    from here instead: page.evaluate goes through the DevTools protocol, which the CSP does not govern. The
    browser tests therefore run under exactly the policy users get.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    deadline = time.monotonic() + (30_000 if timeout is None else timeout) / 1000
    interval_ms = polling if isinstance(polling, (int, float)) else 20
    while True:
        if page.evaluate(expression, arg):
            return
        if time.monotonic() > deadline:
            raise PlaywrightTimeoutError(f"wait_for_function: {timeout} ms exceeded waiting for {expression[:200]}")
        page.wait_for_timeout(interval_ms)


# Screenshots of every page, kept as test artefacts (CI keeps var/artifacts; README images are
# copied from here).
ARTIFACTS = Path(os.environ.get("BW_ARTIFACTS", REPO / "var" / "artifacts"))


def save_screenshot(page, name: str, *, full_page: bool = False) -> Path:
    """Save `page` as var/artifacts/screenshots/<name>.png and return the path."""
    path = ARTIFACTS / "screenshots" / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=full_page)
    return path
