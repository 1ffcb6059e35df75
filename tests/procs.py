"""The one harness for the child processes the tests and the benches start: ports, command lines, logs,
readiness and stopping.

- `free_port()`: a loopback port nothing listens on (the kernel's pick).
- The command lines of the product's processes, each built here and nowhere else: `daphne_argv`,
  `worker_argv` (Celery worker), `beat_argv` (Celery beat) and `simulator_argv` (`manage.py simulate`).
- `child_env()`: the environment of a child on this test session's database (`session_database_url()`),
  Celery queue and channel prefix.
- `Child`: one long-running process in its own process group (a Celery worker's pool goes with it), its
  stdout and stderr in a log file, never a pipe nobody reads: a child that fills a pipe stalls. `wait_port`,
  `wait_log`, `wait_http` and `wait_until` block until it is ready and otherwise raise `NotReady`, naming what
  did not come up, with the end of its log. `stop()` SIGTERMs the group (SIGKILL after a grace period),
  `kill()` SIGKILLs it; `stop_all()` stops several at once.

It imports neither Django nor the project at module level, so the benches (bench/_common.py puts the
repository on sys.path) and code running before Django is configured use it too.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # the virtual environment's scripts: daphne, celery
HOST = "127.0.0.1"


# --- ports ------------------------------------------------------------------------------------------------

def free_port() -> int:
    """A loopback port nothing listens on now (the kernel's pick; closed again, so also "a closed port")."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_open(port: int, host: str = HOST) -> bool:
    """Whether something accepts connections on host:port."""
    try:
        socket.create_connection((host, port), timeout=0.2).close()
        return True
    except OSError:
        return False


# --- command lines ----------------------------------------------------------------------------------------

def daphne_argv(port: int) -> list[str]:
    """daphne serving the project on 127.0.0.1:`port`."""
    return [str(BIN / "daphne"), "-b", HOST, "-p", str(port), "dashboard.asgi:application"]


def worker_argv(queue: str, name: str, *, app: str = "dashboard", solo: bool = False, concurrency: int = 2,
                heartbeat: bool = True, loglevel: str = "WARNING", alerts_only: bool = False) -> list[str]:
    """`celery worker` consuming `queue` and its paging queue (`queue`.alerts, settings.CELERY_ALERTS_QUEUE),
    or with `alerts_only` the paging queue alone (the worker `./dev up` gives paging), named `name` (`%h`
    is the host).

    `solo`: the solo pool, one task at a time in the worker process itself, without heartbeats (what the tests
    that drive a worker, or SIGKILL it mid-task, need). Otherwise the prefork pool with `concurrency` children,
    as `./dev up` runs it. Never gossip or mingle: a worker here has no business with the others on the Redis.
    `app` is the Celery app module (`-A`)."""
    from core.queue import paging_queue  # here, not at the top: this module imports nothing of the project there

    queues = paging_queue(queue) if alerts_only else f"{queue},{paging_queue(queue)}"
    argv = [str(BIN / "celery"), "-A", app, "worker", "-l", loglevel, "-Q", queues, "-n", name,
            "--without-gossip", "--without-mingle"]
    if solo:
        argv += ["--pool", "solo", "--concurrency", "1"]
        heartbeat = False
    else:
        argv += ["--concurrency", str(concurrency)]
    if not heartbeat:
        argv.append("--without-heartbeat")
    return argv


def beat_argv(schedule: str | Path, *, loglevel: str = "WARNING") -> list[str]:
    """`celery beat` with its schedule file at `schedule` (a fresh path: beat keeps its last-run times there)."""
    return [str(BIN / "celery"), "-A", "dashboard", "beat", "-l", loglevel, "-s", str(schedule)]


def simulator_argv(server: str, *args: str) -> list[str]:
    """`manage.py simulate` against `server` (a base URL), with the caller's options (`--gpus`, `--once`, ...);
    run with the repository as the working directory."""
    return [sys.executable, "manage.py", "simulate", "--server", server, *args]


# --- environment ------------------------------------------------------------------------------------------

def session_database_url() -> str:
    """The URL of the database the running pytest session uses (Django's settings, after pytest-django's
    test-database name is in place)."""
    from urllib.parse import quote

    from django.conf import settings

    db = settings.DATABASES["default"]
    return f"postgresql://{quote(db['USER'])}:{quote(db['PASSWORD'])}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child process of the tests: this session's test database (no persistent
    connections, so the database can be dropped at the end), its Celery queue and its channel prefix
    (tests/conftest.py sets both per TEST_DB_SUFFIX), warnings only in the log; `extra` on top."""
    from django.conf import settings

    return {**os.environ, "DATABASE_URL": session_database_url(), "DB_CONN_MAX_AGE": "0", "LOG_LEVEL": "WARNING",
            "CELERY_QUEUE": settings.CELERY_TASK_DEFAULT_QUEUE,
            "BREAKWATER_CHANNEL_PREFIX": settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"], **extra}


# --- logs -------------------------------------------------------------------------------------------------

_log_dir: Path | None = None


def default_log_dir() -> Path:
    """Where a child logs unless told otherwise: one temporary directory per process, removed at exit
    (BW_KEEP_LOGS=1 keeps it, and says where). A readiness failure prints the log's end anyway."""
    global _log_dir
    if _log_dir is None:
        _log_dir = Path(tempfile.mkdtemp(prefix="bw-procs-"))
        atexit.register(_remove_log_dir, _log_dir)
    return _log_dir


def _remove_log_dir(path: Path) -> None:
    if os.environ.get("BW_KEEP_LOGS"):
        print(f"child process logs kept in {path}")  # noqa: T201 - the only way to find them afterwards
        return
    shutil.rmtree(path, ignore_errors=True)


def tail(path: Path, chars: int = 3000) -> str:
    """The last `chars` characters of a log file ("" if there is none)."""
    try:
        return path.read_text(errors="replace")[-chars:]
    except FileNotFoundError:
        return ""


# --- processes --------------------------------------------------------------------------------------------

class NotReady(RuntimeError):
    """A child did not come up (or died): the message names it, what was awaited, and ends with its log."""


class Child:
    """One long-running child process in a process group of its own, its output in the file `log_path` (the
    `log` argument, else a new file in `default_log_dir()`).

    `port`: the port it will listen on (for `wait_port` and `url`). `on_stdout(line, arrived)`: instead of
    going straight to the log, stdout is read line by line by a thread of the harness, which writes each line
    to the log and passes it on with its arrival time (time.time()); stderr still goes to the log directly.
    `start()` again after `stop()` restarts it with the same command line, appending to the same log.
    """

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None = None, *, port: int | None = None,
                 log: str | Path | None = None, cwd: str | Path = REPO,
                 on_stdout: Callable[[str, float], None] | None = None):
        self.name, self.argv, self.env, self.port, self.cwd = name, argv, env, port, cwd
        self.log_path = Path(log) if log else default_log_dir() / f"{name}-{time.monotonic_ns()}.log"
        self.on_stdout = on_stdout
        self.proc: subprocess.Popen | None = None
        self._started = 0
        self._reader: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"<Child {self.name} pid={self.proc.pid if self.proc else None} log={self.log_path}>"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc else None

    # --- starting -------------------------------------------------------------------------------------
    def start(self) -> Child:
        """Start it (not waiting for anything): in its own session, so that a signal to its group reaches
        everything it forks and a Ctrl-C meant for the caller does not."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if not self._started:
            self.log_path.write_bytes(b"")  # a restart appends to the first run's log
        self._started += 1
        # Append mode: the child's writes and the stdout reader's (`on_stdout`) never overwrite each other.
        with open(self.log_path, "ab") as out:
            if self.on_stdout is None:
                self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, stdout=out,
                                             stderr=subprocess.STDOUT, start_new_session=True)
                return self
            self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, stdout=subprocess.PIPE, stderr=out,
                                         start_new_session=True, text=True, bufsize=1)
        self._reader = threading.Thread(target=self._read_stdout, name=f"{self.name}-stdout", daemon=True)
        self._reader.start()
        return self

    def _read_stdout(self) -> None:
        with open(self.log_path, "a") as out:
            for line in self.proc.stdout:
                arrived = time.time()
                out.write(line)
                out.flush()
                self.on_stdout(line, arrived)

    # --- state ----------------------------------------------------------------------------------------
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        """Its whole log so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def tail(self, chars: int = 3000) -> str:
        """The end of its log."""
        return tail(self.log_path, chars)

    def failure(self, chars: int = 3000) -> str:
        """Why it is gone, for an assertion message: its exit status and the end of its log."""
        return f"{self.name} exited ({self.returncode}); the end of {self.log_path}:\n{self.tail(chars)}"

    def check(self) -> None:
        """Raise NotReady (with the end of its log) if it has exited."""
        if not self.alive():
            raise NotReady(self.failure())

    # --- readiness ------------------------------------------------------------------------------------
    def wait_until(self, ready: Callable[[], object], what: str, timeout: float = 30.0,
                   interval: float = 0.05) -> object:
        """Poll `ready()` until it returns something true (returned); NotReady if the child exits first or
        `timeout` seconds pass, naming `what` was awaited, with the end of the log."""
        deadline = time.monotonic() + timeout
        while True:
            if found := ready():
                return found
            if not self.alive():
                raise NotReady(f"{self.name} exited ({self.returncode}) before {what}; "
                               f"the end of {self.log_path}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise NotReady(f"{self.name}: no {what} within {timeout:.0f} s; "
                               f"the end of {self.log_path}:\n{self.tail()}")
            time.sleep(interval)

    def wait_port(self, timeout: float = 30.0) -> Child:
        """Until it accepts connections on its port."""
        self.wait_until(lambda: port_open(self.port), f"listener on {HOST}:{self.port}", timeout)
        return self

    def wait_log(self, text: str, timeout: float = 30.0) -> Child:
        """Until `text` appears in its log (a Celery worker logs "ready." once it consumes)."""
        self.wait_until(lambda: text in self.log_text(), f"{text!r} in its log", timeout, interval=0.1)
        return self

    def wait_http(self, url_or_path: str = "/", timeout: float = 60.0) -> Child:
        """Until a GET answers 200 (a path is taken relative to `url`)."""
        url = url_or_path if "://" in url_or_path else self.url + url_or_path

        def ok() -> bool:
            try:
                with urllib.request.urlopen(url, timeout=1) as resp:
                    return resp.status == 200
            except (OSError, http.client.HTTPException):  # not up yet, or not answering 200
                return False

        self.wait_until(ok, f"HTTP 200 from {url}", timeout, interval=0.2)
        return self

    # --- stopping -------------------------------------------------------------------------------------
    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):  # gone between the check and the signal
            os.killpg(self.proc.pid, sig)

    def terminate(self) -> None:
        """SIGTERM to its process group, without waiting."""
        if self.alive():
            self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to its process group: it dies at once (mid-task, nothing acknowledged, no cleanup)."""
        if self.alive():
            self._signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._finish()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM to its process group; SIGKILL if it has not exited within `timeout` seconds."""
        self.terminate()
        self.wait_exit(timeout)

    def wait_exit(self, timeout: float = 10.0) -> None:
        """Wait for an exit already asked for (`terminate`); SIGKILL to the group after `timeout` seconds."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=max(0.1, timeout))
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._finish()

    def _finish(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=5)  # the pipe is at its end once the process is gone
            self._reader = None


def stop_all(children: Iterable[Child], timeout: float = 10.0) -> None:
    """SIGTERM every child at once, then wait for them all (SIGKILL to what is left after `timeout` seconds):
    each takes a second or more to shut down, and one by one that adds up."""
    children = [c for c in children if c is not None]
    for c in children:
        c.terminate()
    deadline = time.monotonic() + timeout
    for c in children:
        c.wait_exit(deadline - time.monotonic())


def daphne(env: dict[str, str] | None = None, *, port: int | None = None, log: str | Path | None = None,
           name: str = "daphne") -> Child:
    """daphne (not started yet) on `port`, or a free one; `.start().wait_port()` to serve."""
    port = port or free_port()
    return Child(name, daphne_argv(port), env, port=port, log=log)
