"""A throwaway PostgreSQL/TimescaleDB + Redis stack, and the product's processes on it, for the fault tests.

The fault tests stop and restart the database and Redis, which the rest of the suite shares (ports 55432 and
56379), so they get a private cluster and a private Redis on free loopback ports, under /tmp/bw-rel-XXXX.
Everything is torn down by `Stack.close()`, which the session fixture calls even when a test fails.

Every process writes its log to a file in the stack directory, never to a pipe: while a service is down the
product logs a warning per request, and a pipe nobody reads would fill and stall the process under test.
Ports, command lines, logs, readiness and stopping are tests/procs.py's (the harness of every test and bench).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import redis

from tests.procs import Child, daphne_argv, free_port, stop_all, worker_argv

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def pg_bin() -> Path:
    """The newest installed PostgreSQL's binaries (as ./dev picks them)."""
    versions = sorted(Path("/usr/lib/postgresql").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0)
    if not versions:
        raise RuntimeError("no PostgreSQL under /usr/lib/postgresql; run ./dev setup")
    return versions[-1] / "bin"


def _as_postgres(cmd: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root; as any other user it runs as that user.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


class Stack:
    """A private PostgreSQL cluster (TimescaleDB preloaded) and a private append-only Redis."""

    ROLE = "breakwater"
    DB = "breakwater"

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.extra_env = dict(env or {})
        self.root = Path(tempfile.mkdtemp(prefix="bw-rel-", dir="/tmp"))
        self.root.chmod(0o755)  # the postgres user must traverse it
        self.log_dir = self.root / "log"
        self.log_dir.mkdir()
        self.pg_bin = pg_bin()
        self.pg_data = self.root / "pg"
        self.pg_run = self.root / "pgrun"
        self.pg_port = free_port()
        self.password = os.urandom(12).hex()
        self.redis_dir = self.root / "redis"
        self.redis_port = free_port()
        # Append-only, as ./dev runs it: queued Celery messages survive a restart. It logs to stdout: the file.
        self.redis_server = Child("redis", ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
                                            "--dir", str(self.redis_dir), "--appendonly", "yes", "--save", ""],
                                  log=self.log_dir / "redis.log", cwd=self.root)
        self.children: list[Child] = []
        self.timings: dict[str, float] = {}

    # --- URLs and environment ---------------------------------------------------------------
    @property
    def database_url(self) -> str:
        return f"postgresql://{self.ROLE}:{self.password}@127.0.0.1:{self.pg_port}/{self.DB}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a product process on this stack (production's connection settings)."""
        env = {k: v for k, v in os.environ.items() if k not in ("DB_CONN_MAX_AGE", "TEST_DB_SUFFIX")}
        env.update({
            "DATABASE_URL": self.database_url, "REDIS_URL": self.redis_url, "CELERY_QUEUE": "bw-rel",
            "BREAKWATER_CHANNEL_PREFIX": "bwrel", "LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1",
        })
        env.update(self.extra_env)
        env.update(extra)
        return env

    def connect(self) -> psycopg.Connection:
        """A direct connection for the tests' own reads (autocommit)."""
        return psycopg.connect(self.database_url, autocommit=True, connect_timeout=5)

    def redis(self) -> redis.Redis:
        return redis.Redis(port=self.redis_port, socket_timeout=5)

    # --- start-up ---------------------------------------------------------------------------
    def start(self) -> Stack:
        t0 = time.monotonic()
        self._init_pg()
        self._start_pg()
        self._create_database()
        self.timings["postgres_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        self.redis_dir.mkdir()
        self._start_redis()
        self.timings["redis_s"] = time.monotonic() - t0
        return self

    def _init_pg(self) -> None:
        self.pg_data.mkdir()
        self.pg_run.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.pg_data, "postgres", "postgres")
            shutil.chown(self.pg_run, "postgres", "postgres")
        self.pg_data.chmod(0o700)
        subprocess.run(
            _as_postgres([str(self.pg_bin / "initdb"), "-D", str(self.pg_data), "-U", "postgres", "-E", "UTF8",
                          "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync", "--no-instructions"]),
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        # The same server settings as ./dev's cluster where they matter here; durability (fsync,
        # synchronous_commit) stays at PostgreSQL's defaults, since that is what "acknowledged" rests on.
        conf = (
            "\n# --- Breakwater fault tests ---\n"
            f"listen_addresses = '127.0.0.1'\nport = {self.pg_port}\nunix_socket_directories = '{self.pg_run}'\n"
            "shared_preload_libraries = 'timescaledb'\ntimescaledb.telemetry_level = off\n"
            "max_connections = 100\nshared_buffers = 128MB\n"
            # Crash recovery starts by syncing the data directory; one syncfs() instead of an fsync() per
            # file keeps a crash-restart to about a second on a busy disk.
            "recovery_init_sync_method = syncfs\n"
        )
        with open(self.pg_data / "postgresql.conf", "a") as f:
            f.write(conf)

    def _pg_ctl(self, *args: str, check: bool = True) -> None:
        subprocess.run(
            _as_postgres([str(self.pg_bin / "pg_ctl"), "-D", str(self.pg_data), *args]),
            check=check, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def _start_pg(self) -> None:
        log = self.log_dir / "postgres.log"
        if os.geteuid() == 0 and not log.exists():
            log.touch()
            shutil.chown(log, "postgres", "postgres")
        self._pg_ctl("-l", str(log), "-w", "-t", "60", "start")

    def _psql(self, db: str, sql: str) -> None:
        with psycopg.connect(host=str(self.pg_run), port=self.pg_port, user="postgres", dbname=db,
                             autocommit=True) as conn:
            conn.execute(sql)

    def checkpoint(self) -> None:
        """Write everything out, as a server that has been up a while has: a crash then replays only the WAL
        written after it, not the whole migration (which would make crash recovery take seconds)."""
        self._psql("postgres", "CHECKPOINT")

    def superuser_sql(self, sql: str) -> None:
        """Run SQL as the cluster's superuser in the product's database (fault injection)."""
        self._psql(self.DB, sql)

    def _create_database(self) -> None:
        self._psql("postgres", f"CREATE ROLE {self.ROLE} LOGIN CREATEDB PASSWORD '{self.password}'")
        # New databases get TimescaleDB from the template, as on ./dev's cluster (the role is no superuser).
        self._psql("template1", "CREATE EXTENSION IF NOT EXISTS timescaledb")
        self._psql("postgres", f"CREATE DATABASE {self.DB} OWNER {self.ROLE}")

    def _start_redis(self) -> None:
        self.redis_server.start()

        def pong() -> bool:
            with self.redis() as client:
                try:
                    return client.ping()
                except redis.ConnectionError:
                    return False

        self.redis_server.wait_until(pong, "PONG", timeout=15)

    def migrate_and_seed(self, seed: str) -> dict:
        """`migrate`, then `seed` (Python run with Django set up, which may print one JSON object), in ONE
        process: a Django start-up costs a second or more. Returns that object; times the migration."""
        code = (
            "import json, time\nfrom django.core.management import call_command\nt0 = time.monotonic()\n"
            "call_command('migrate', interactive=False, verbosity=0)\n"
            "print(json.dumps({'migrate_s': time.monotonic() - t0}))\n" + seed
        )
        out: dict = {}
        for line in self.django(code).splitlines():
            if line.startswith("{"):
                out.update(json.loads(line))
        self.timings["migrate_s"] = out.pop("migrate_s")
        return out

    def manage(self, *args: str, timeout: float = 300) -> str:
        """Run a management command against this stack; its stdout (fails with its stderr)."""
        proc = subprocess.run([PYTHON, "manage.py", *args], cwd=REPO, env=self.env(), capture_output=True,
                              text=True, timeout=timeout)
        if proc.returncode:
            raise RuntimeError(f"manage.py {args[0]} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        return proc.stdout

    def django(self, code: str, timeout: float = 120) -> str:
        """Run Python with Django set up against this stack (`manage.py shell -c`); its stdout."""
        return self.manage("shell", "--no-imports", "-c", code, timeout=timeout)

    # --- faults -----------------------------------------------------------------------------
    def stop_pg(self, mode: str = "fast") -> None:
        """`pg_ctl stop -m fast` (clean shutdown) or `-m immediate` (no checkpoint: a crash, recovered at start)."""
        if mode not in ("fast", "immediate"):
            raise ValueError(f"mode must be fast or immediate, got {mode!r}")
        self._pg_ctl("-m", mode, "-w", "-t", "60", "stop")

    def start_pg(self) -> None:
        self._start_pg()

    def restart_pg(self, mode: str = "fast", down_for: float = 0.0) -> dict[str, float]:
        """Stop PostgreSQL (fast, or immediate to simulate a crash), keep it down `down_for` seconds, start it.
        Returns monotonic times: stopped (down from here), started (accepting connections again)."""
        if mode == "fast" and not down_for:
            t0 = time.monotonic()
            self._pg_ctl("-m", "fast", "-w", "-t", "60", "-l", str(self.log_dir / "postgres.log"), "restart")
            return {"stopping": t0, "stopped": t0, "started": time.monotonic()}
        t0 = time.monotonic()
        self.stop_pg(mode)
        stopped = time.monotonic()
        time.sleep(down_for)
        self.start_pg()
        return {"stopping": t0, "stopped": stopped, "started": time.monotonic()}

    def restart_redis(self, down_for: float = 0.0) -> dict[str, float]:
        """SHUTDOWN (the AOF is flushed), stay down `down_for` seconds, start on the same port and directory."""
        t0 = time.monotonic()
        self.redis_server.stop(timeout=30)  # redis-server treats SIGTERM as SHUTDOWN
        stopped = time.monotonic()
        time.sleep(down_for)
        self._start_redis()
        return {"stopping": t0, "stopped": stopped, "started": time.monotonic()}

    # --- processes on the stack -------------------------------------------------------------
    def daphne(self, *, wait: bool = True, **env: str) -> Child:
        """daphne on a free port; `wait=False` returns at once (call `.wait_port(60)` before using it)."""
        port = free_port()
        svc = Child("daphne", daphne_argv(port), self.env(**env), port=port, log=self._log("daphne"))
        self.children.append(svc)
        svc.start()
        return svc.wait_port(timeout=60) if wait else svc

    def celery_worker(self, **env: str) -> Child:
        """A real worker on the stack's queue (solo pool, as tests/alerts/conftest.py runs it); it logs
        "ready." once it consumes."""
        e = self.env(**env)
        svc = Child("celery", worker_argv(e["CELERY_QUEUE"], f"bwrel-{os.getpid()}@%h", solo=True, loglevel="INFO"),
                    e, log=self._log("celery"))
        self.children.append(svc)
        return svc.start()

    def _log(self, name: str) -> Path:
        return self.log_dir / f"{name}-{time.monotonic_ns()}.log"

    # --- teardown ---------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every process this stack started and remove its directory; never raises."""
        stop_all(self.children, timeout=5)  # all at once: each takes a second or more to shut down
        self.redis_server.kill()
        if (self.pg_data / "postmaster.pid").exists():
            self._pg_ctl("-m", "immediate", "-w", "stop", check=False)
        if os.environ.get("BW_KEEP_STACK"):
            print(f"fault-test stack kept in {self.root}")  # noqa: T201 - the only way to find it afterwards
            return
        shutil.rmtree(self.root, ignore_errors=True)

