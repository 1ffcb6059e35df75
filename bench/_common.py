"""Shared plumbing for bench/ scripts: a scratch database, a real daphne server, timing.

Child processes are started, awaited and stopped by tests/procs.py (imported here as `procs`)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# The process harness the tests use too (ports, command lines, logs, readiness, process-group stop): one copy.
from tests import procs  # noqa: E402


def say(msg: str) -> None:
    print(f"[bench] {msg}", flush=True)


def scratch_database_url(name: str) -> str:
    """DATABASE_URL pointing at a bench-only database on the same server (never the dev data)."""
    base = os.environ["DATABASE_URL"]
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=f"/{parts.path.lstrip('/')}_bench_{name}"))


def setup_django(database_url: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    import django

    django.setup()


def recreate_database(database_url: str) -> None:
    """Drop and create the scratch database, then migrate it (progress printed)."""
    import psycopg

    parts = urlsplit(database_url)
    dbname = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{dbname}"')
    say(f"migrating scratch database {dbname}")
    env = {**os.environ, "DATABASE_URL": database_url}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=REPO, env=env, check=True)


def drop_database(database_url: str) -> None:
    import psycopg

    parts = urlsplit(database_url)
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        for attempt in range(30):
            try:
                conn.execute(f'DROP DATABASE IF EXISTS "{parts.path.lstrip("/")}" WITH (FORCE)')
                return
            except psycopg.errors.InsufficientPrivilege:
                # An autovacuum worker (the superuser's) is in the database: FORCE may not end it, but
                # it stops by itself within moments.
                if attempt == 29:
                    raise
                time.sleep(1)


LOG_DIR = REPO / "var" / "log"  # the logs of the stack under test, overwritten by the next run


@contextmanager
def daphne_server(database_url: str, extra_env: dict | None = None):
    """Run the real ASGI server on a free loopback port (tests/procs.py's daphne); yields its base URL."""
    # DEBUG off: production mode (no per-query logging in the server under test).
    env = {**os.environ, "DATABASE_URL": database_url, "LOG_LEVEL": "WARNING", "DEBUG": "false", **(extra_env or {})}
    # The server's log goes to a file: an unread pipe would fill up and stall the server under test.
    server = procs.daphne(env, log=LOG_DIR / "bench-daphne.log").start()
    try:
        server.wait_port(timeout=30)
        yield server.url
    finally:
        server.stop()


def simulate_once(server: str, gpus: int) -> None:
    """The simulator's topology and one tick of telemetry for `gpus` GPUs, through the real ingest API."""
    from telemetry.actions import do_create_collector_token

    token = do_create_collector_token("bench-simulator-fill", replace=True)
    say(f"simulating {gpus:,} GPUs (topology import + one tick)")
    subprocess.run(procs.simulator_argv(server, "--token", token, "--gpus", str(gpus), "--once"),
                   cwd=REPO, env=os.environ, check=True)


@contextmanager
def simulator_ticking(server: str, gpus: int, interval: float = 10.0):
    """The simulator ticking the whole fleet every `interval` s through `server`, as a live site runs, for
    the body of the `with` (its first tick is in when the body starts). Needs `simulate_once` first."""
    from telemetry.actions import do_create_collector_token

    token = do_create_collector_token("bench-simulator-live", replace=True)
    say(f"simulator ticking {gpus:,} GPUs every {interval:g} s beside the measurement")
    live = subprocess.Popen(procs.simulator_argv(server, "--token", token, "--gpus", str(gpus),
                                                 "--interval", f"{interval:g}"),
                            cwd=REPO, env=os.environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(interval + 2)  # its first tick is in
        if live.poll() is not None:
            raise RuntimeError(f"the simulator beside the bench exited with {live.returncode}")
        yield live
    finally:
        live.terminate()
        live.wait(timeout=30)


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))]


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent working so far (soak_lib.machine_cpu's `busy`: idle, I/O wait and
    steal are not work done here)."""
    sys.path.insert(0, str(REPO / "tests" / "reliability"))
    import soak_lib  # a test-side module (bench/soak uses it too): the one reader of /proc/stat

    return soak_lib.machine_cpu()["busy"]


class Span:
    """Wall time and the machine's CPU time of one timed section: `with Span() as s: ...; s.wall, s.cpu`.

    The CPU figure is every process's (server, database, this client), which is what a section costs a machine
    whose cores it shares; /proc/stat counts in clock ticks (10 ms), so sum it over several sections."""

    def __enter__(self) -> Span:
        self.cpu0, self.t0 = machine_busy_s(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self.t0
        self.cpu = machine_busy_s() - self.cpu0


def result(name: str, figure: str, value: float, target: float, passed: bool, **extra) -> None:
    tail = "".join(f" {k}={v}" for k, v in extra.items())
    print(f"RESULT {name} {figure}={value:.2f} target={target}{tail} {'PASS' if passed else 'FAIL'}", flush=True)
