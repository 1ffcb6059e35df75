"""The soak harness shared by bench/soak.py (30 minutes at 16,384 GPUs) and tests/reliability/test_soak.py (CI).

It runs the production process set against a database the caller prepared, and watches it:

1. Start daphne, a Celery worker (prefork, two children, as `./dev up`) and paging's own worker, Celery beat
   with a fresh schedule file and `manage.py simulate` on the caller's cluster size and interval
   (tests/procs.py's command lines and process handling). Every process gets the caller's queue and channel
   prefix, so nothing reaches (or takes work from) another Breakwater on the same Redis.
2. After the simulator's first tick, send every periodic task once (training aside) so that each code path has
   run before the warm-up ends: a first run that fills a cache is not a leak. Then open the websocket clients,
   all in one asyncio loop (aiohttp), subscribed as the fleet, heatmap and job pages subscribe. With
   `train_models`, the warm-up also trains the first models (see `ModelWarmup`) and lasts until they score.
3. Every `sample_s`: the memory of each process tree from /proc (RSS, and RssAnon, the private part), the
   PostgreSQL backends on our database, the Redis keys under our prefix, the Celery queue and the rollup lag;
   and, for each simulator tick printed since, the tick's commits from the ingest log (telemetry_ingest_batch).
4. At the end, figures per window: ingest lag = the tick's last commit − its sample time; page-update latency =
   a message's arrival − the tick's last commit, for the first message that reflects that commit (a fleet
   message whose `generated_at` is after it; for the other pages, the first message after the first such
   publish, since every publish sends the fleet summary and the tick those pages recompute on). A pass already
   running when that publish arrives can make a heatmap or job sample early by at most one pass.
5. The verdict compares the first window after the warm-up with the last one (see `Tolerance`).
"""

from __future__ import annotations

import asyncio
import bisect
import json
import os
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from core.queue import paging_queue
from tests.procs import Child, beat_argv, daphne_argv, free_port, simulator_argv, stop_all, worker_argv

REPO = Path(__file__).resolve().parents[2]
TICK_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT[0-9:.]+(?:Z|[+-]\d\d:\d\d)) gpus=")
HEATMAP_METRICS = ("gpu_util", "gpu_temp", "power_w", "memory_temp", "fb_used")
# Roles whose memory the verdict judges; "redis" here is the bytes of our own keys, not the shared server.
JUDGED = ("daphne", "worker", "alerts-worker", "beat", "simulator", "postgres", "redis")
MB = 1024 * 1024


@dataclass
class Tolerance:
    """How much a figure may rise from the first window after the warm-up to the last one.

    Memory: `rss_pct` of the start or `rss_floor_mb`, whichever is larger. The floor absorbs what a healthy
    process does once (pymalloc arenas reaching their high-water mark, a memo of the heatmap layout, a first
    model loaded), which is tens of MB whatever the size; a leak of one tick's body per tick (several MB at
    16k GPUs) passes it within minutes. Judged on private memory (RssAnon): PostgreSQL backends map
    shared_buffers, and their RSS grows with every page they touch without owning it.
    Lag and latency: the last window's p95 may exceed the first's by `rise_pct` or `rise_floor_s`, whichever
    is larger; the floor is there because p95 over a few dozen ticks on a shared machine moves by a second
    from other people's load alone, while a backlog adds its delay every tick and passes any floor.
    """

    rss_pct: float = 10.0
    rss_floor_mb: float = 50.0
    rise_pct: float = 50.0
    rise_floor_s: float = 2.0
    queue_rise: int = 20  # Celery messages waiting; beat sends a handful every 10 s
    rollup_rise_s: float = 90.0  # the rollup runs every 30 s and finishes buckets a minute old
    # Share of the expected ticks each window must commit. The simulator skips a tick it cannot start on time,
    # so a stack that cannot keep the interval shows fewer ticks, not more lag: judged on growth alone, a run at
    # half the rate (3 ticks a minute of 6, lag flat at 25-30 s) read as a PASS. 0.95 allows one late tick in
    # a 5-minute window of 30.
    min_tick_share: float = 0.95


@dataclass
class Targets:
    """What a site of this size must get, whatever the first window measured (issue 29's figures at 16,384 GPUs
    on half of a 2-core machine's worth of a server): every page kind's update p95, the ingest lag p95, and the
    stack's CPU (STACK_ROLES: everything but the simulator and the soak's own clients) over the measured part."""

    update_p95_s: float = 2.0
    lag_p95_s: float = 5.0
    stack_cores: float = 1.0


@dataclass
class SoakConfig:
    database_url: str
    token: str  # collector token (the simulator's)
    collector: str  # its name, as the ingest log records it
    session_cookie: str  # an operator's sessionid
    queue: str
    channel_prefix: str
    gpus: int = 16384
    interval_s: float = 10.0
    clients: int = 50
    warmup_s: float = 120.0
    duration_s: float = 1800.0  # measured, after the warm-up
    window_s: float = 300.0
    sample_s: float = 10.0
    progress_s: float = 60.0
    log_dir: Path = REPO / "var" / "log"
    scenarios: tuple[str, ...] = ()
    tolerance: Tolerance = field(default_factory=Tolerance)
    targets: Targets | None = None  # None: growth alone is judged (a short run on a shared CI machine)
    say: object = print
    train_models: bool = False  # train the first models in the warm-up and start measuring once they score
    models_settle_s: float = 150.0  # after the models are active: two scoring passes with them loaded
    models_wait_s: float = 900.0  # give up waiting for them (and say so) after this much of the warm-up


# --- processes ---------------------------------------------------------------------------------------------

def start_processes(cfg: SoakConfig, run_dir: Path,
                    on_simulator_line: Callable[[str, float], None]) -> tuple[dict[str, Child], str]:
    """daphne, worker, beat and the simulator, in that order, each in a process group of its own (a Celery
    worker's pool goes with it) and logging to `cfg.log_dir`/soak-<name>.log; the simulator's stdout lines go
    to `on_simulator_line` as they arrive (and to its log). Returns the processes and the server's host:port."""
    env = {**os.environ, "DATABASE_URL": cfg.database_url, "CELERY_QUEUE": cfg.queue,
           "BREAKWATER_CHANNEL_PREFIX": cfg.channel_prefix, "DEBUG": "false", "LOG_LEVEL": "WARNING",
           "PYTHONUNBUFFERED": "1"}
    port = free_port()
    procs: dict[str, Child] = {}

    def start(name: str, argv: list[str], **kwargs) -> Child:
        procs[name] = Child(name, argv, env, log=cfg.log_dir / f"soak-{name}.log", **kwargs).start()
        return procs[name]

    try:
        daphne = start("daphne", daphne_argv(port), port=port)
        start("worker", worker_argv(cfg.queue, f"soak-{os.getpid()}@%h", concurrency=2, loglevel="info"))
        start("alerts-worker", worker_argv(cfg.queue, f"soak-alerts-{os.getpid()}@%h", concurrency=1,
                                           loglevel="info", alerts_only=True))
        schedule = run_dir / "celerybeat-schedule"
        for old in run_dir.glob("celerybeat-schedule*"):
            old.unlink()
        start("beat", beat_argv(schedule, loglevel="info"))
        daphne.wait_port(timeout=60)
        token_file = run_dir / "simulator_token"
        token_file.write_text(cfg.token)
        token_file.chmod(0o600)
        sim = simulator_argv(daphne.url, "--token-file", str(token_file), "--gpus", str(cfg.gpus),
                             "--interval", f"{cfg.interval_s:g}")
        for s in cfg.scenarios:
            sim += ["--scenario", s]
        start("simulator", sim, on_stdout=on_simulator_line)
    except BaseException:
        stop_processes(procs)
        raise
    return procs, f"127.0.0.1:{port}"


def stop_processes(procs: dict[str, Child]) -> None:
    # The simulator first, so no batch is cut off by its server going away; the rest together.
    if "simulator" in procs:
        procs["simulator"].stop(timeout=20)
    stop_all([p for name, p in procs.items() if name != "simulator"], timeout=20)


def kick_periodic_tasks(queue: str) -> list[str]:
    """Send every periodic task once now (model training aside: minutes of CPU, not a steady-state path)."""
    from django.conf import settings

    from dashboard.celery import app

    sent = []
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        if entry["task"].endswith("train_models"):
            continue
        app.send_task(entry["task"], kwargs=entry.get("kwargs") or {}, queue=queue)
        sent.append(entry["task"])
    return sent


class ModelWarmup:
    """Trains the first models during the warm-up, through the worker, as the ten-minute beat entry would.

    A site keeps active models from its first ten minutes on, and every scoring pass then runs them: that is
    the steady state. Left to the beat, the first training lands ten minutes into the run, inside the
    measured part, and the step it makes once (each worker child's high-water mark rises by ~50 MB at 16k
    GPUs when scoring first runs with the models loaded; the models themselves are 0.5 MB) would be read
    as growth against a first window that had no models. So the task is sent as soon as a 1-minute rollup
    exists (the cohort model learns from them), resent every 90 s until both kinds are active, and the
    measurement starts `models_settle_s` after that.
    """

    KINDS = 2  # cohort, failure

    def __init__(self, cfg: SoakConfig, db):
        self.cfg, self.db = cfg, db
        self.sent_at: float | None = None
        self.ready_at: float | None = None
        self.gave_up = False

    @property
    def done(self) -> bool:
        return self.ready_at is not None

    def step(self, now: float, t0: float) -> None:
        if self.done:
            return
        active = self.db.execute(
            "SELECT count(DISTINCT kind) FROM anomaly_model_version WHERE status = 'active'").fetchone()[0]
        if active >= self.KINDS:
            self.ready_at = now
            self.cfg.say(f"models active {now - t0:.0f} s into the warm-up; measuring from "
                         f"{self.cfg.models_settle_s:.0f} s later")
        elif now - t0 > self.cfg.models_wait_s:
            self.gave_up, self.ready_at = True, now  # measure from now, without them
            self.cfg.say(f"models not active after {self.cfg.models_wait_s:.0f} s ({active} of {self.KINDS}); "
                         "measuring without them")
        elif (self.sent_at is None or now - self.sent_at > 90) and self.db.execute(
                "SELECT EXISTS (SELECT 1 FROM telemetry_gpu_sample_1m)").fetchone()[0]:
            from dashboard.celery import app

            app.send_task("anomaly.tasks.train_models", kwargs={"missing_only": True}, queue=self.cfg.queue)
            self.sent_at = now
            self.cfg.say(f"sent the first model training {now - t0:.0f} s into the warm-up")

    def start(self, planned: float) -> float:
        if self.ready_at is None:
            return planned
        return max(planned, self.ready_at + (0.0 if self.gave_up else self.cfg.models_settle_s))


class TickReader:
    """Reads the simulator's output, fed line by line as it arrives (`start_processes`' `on_simulator_line`):
    one line per tick starting with its sample time."""

    def __init__(self):
        self.ticks: list[tuple[float, float]] = []  # (sample time, when its line arrived), epoch seconds
        self.skipped = 0
        self.errors = 0

    def feed(self, line: str, arrived: float) -> None:
        if m := TICK_LINE.match(line):
            self.ticks.append((datetime.fromisoformat(m.group(1)).timestamp(), arrived))
        elif "skipping" in line:
            self.skipped += int(re.search(r"skipping (\d+)", line).group(1))
        elif line.lstrip().startswith("error:"):
            self.errors += 1


# --- memory ------------------------------------------------------------------------------------------------

def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (which may hold spaces and parentheses): [0] is the state,
    [1] the parent, [11]/[12] user/system time and [13]/[14] those of waited-for children, in clock ticks."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                ppid = int(_stat(int(entry.name))[1])
            except OSError:
                continue
            kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def _tree(root: int, kids: dict[int, list[int]]) -> list[int]:
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, ()))
    return out


TICKS_PER_S = os.sysconf("SC_CLK_TCK")
CPU_ROLES = ("daphne", "worker", "alerts-worker", "beat", "simulator", "postgres", "redis", "clients")
# The stack a site runs: "redis" is the whole Redis server's CPU (shared with anyone else on it; nothing else
# uses it during a soak), "postgres" the whole cluster's.
STACK_ROLES = ("daphne", "worker", "alerts-worker", "beat", "postgres", "redis")


def cpu_of(pids: list[int], reaped: bool = False) -> float:
    """CPU seconds (user + system) used by `pids`; with `reaped`, also by the children they have waited for,
    which for the postmaster is every backend and worker that has exited (connections come and go, so the
    live processes alone would lose their time)."""
    total = 0
    for pid in pids:
        try:
            f = _stat(pid)
        except OSError:
            continue
        total += int(f[11]) + int(f[12]) + (int(f[13]) + int(f[14]) if reaped else 0)
    return total / TICKS_PER_S


def machine_cpu(stat: str | None = None) -> dict[str, float]:
    """The whole machine's CPU seconds so far by state, from /proc/stat (or `stat`, its text) (steal: taken by the
    hypervisor; busy: work done here, i.e. user, nice, system, irq and softirq, without idle, I/O wait and steal)."""
    text = Path("/proc/stat").read_text() if stat is None else stat
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in text.split("\n", 1)[0].split()[1:9])
    return {"idle": idle / TICKS_PER_S, "iowait": iowait / TICKS_PER_S, "steal": steal / TICKS_PER_S,
            "busy": (user + nice + system + irq + softirq) / TICKS_PER_S}


def memory_of(pids: list[int]) -> tuple[float, float]:
    """(RSS, RssAnon) in MB summed over `pids`; a process gone meanwhile counts as nothing."""
    rss = anon = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1])
                elif line.startswith("RssAnon:"):
                    anon += int(line.split()[1])
        except OSError:
            continue
    return rss / 1024, anon / 1024


# --- websocket clients -------------------------------------------------------------------------------------

@dataclass
class Client:
    """One simulated page: what it subscribed to and when each message arrived."""

    idx: int
    kind: str  # fleet | heatmap | jobs-list | jobs-job
    path: str
    subscribe: dict | None
    arrivals: list[float] = field(default_factory=list)
    generated: list[float] = field(default_factory=list)  # fleet messages: generated_at, epoch seconds
    bytes: int = 0
    errors: list[str] = field(default_factory=list)
    reconnects: int = 0


def plan_clients(n: int, job_keys: list[str]) -> list[Client]:
    """A mix like an operations room's: 40 % fleet, 30 % heatmap (five metrics), 30 % jobs (list and pages).

    At least one fleet client always: its `generated_at` dates the publishes the other pages react to.
    """
    kinds = []
    for i in range(n):
        r = i % 10
        kinds.append("fleet" if r in (0, 3, 6, 9) else "heatmap" if r in (1, 4, 7) else "jobs")
    out = []
    since = (datetime.now(UTC) - timedelta(minutes=15)).isoformat()
    for i, kind in enumerate(kinds):
        if kind == "fleet":
            out.append(Client(i, kind, "/ws/fleet/", None))
        elif kind == "heatmap":
            out.append(Client(i, kind, "/ws/heatmap/", {"subscribe": HEATMAP_METRICS[i % len(HEATMAP_METRICS)]}))
        elif job_keys and i % 20 != 2:
            key = job_keys[i % len(job_keys)]
            out.append(Client(i, "jobs-job", "/ws/jobs/",
                              {"subscribe": "job", "sub": 1, "key": key, "since": since, "bucket_s": 15}))
        else:
            out.append(Client(i, "jobs-list", "/ws/jobs/",
                              {"subscribe": "list", "sub": 1, "state": "running", "limit": 50, "offset": 0}))
    return out


async def run_client(session, host: str, cookie: str, client: Client, stop: asyncio.Event) -> None:
    """Connect, subscribe, record every message; reconnect after a second if the server closes (as live.js)."""
    import aiohttp

    headers = {"Origin": f"http://{host}", "Cookie": f"sessionid={cookie}"}
    while not stop.is_set():
        try:
            async with session.ws_connect(f"ws://{host}{client.path}", headers=headers, max_msg_size=0) as ws:
                if client.subscribe:
                    await ws.send_str(json.dumps(client.subscribe))
                async for msg in ws:
                    if msg.type != aiohttp.WSMsgType.TEXT:
                        break
                    client.arrivals.append(time.time())
                    client.bytes += len(msg.data)
                    head = msg.data[:60]
                    if client.kind == "fleet":
                        doc = json.loads(msg.data)
                        client.generated.append(datetime.fromisoformat(doc["generated_at"]).timestamp())
                    elif '"type": "error"' in head:
                        client.errors.append(msg.data[:200])
                if ws.close_code and ws.close_code >= 4000:
                    client.errors.append(f"refused: closed {ws.close_code}")
                    return
                if not stop.is_set():
                    client.errors.append(f"server closed the socket ({ws.close_code})")
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            client.errors.append(f"{type(exc).__name__}: {exc}")
        if stop.is_set():
            return
        client.reconnects += 1
        await asyncio.sleep(1.0)


# --- sampling ----------------------------------------------------------------------------------------------

_TICK_SQL = """
SELECT count(*), max(time), coalesce(sum(samples), 0) FROM telemetry_ingest_batch
WHERE collector = %s AND time >= %s AND time <= %s
"""
_BACKENDS_SQL = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
# Cluster-wide write figures: WAL volume and full-page images (a page's first change after a checkpoint is
# logged whole, so scattered index inserts cost far more WAL right after each checkpoint), and who wrote dirty
# buffers out (the checkpointer, the background writer, or a backend that needed a free buffer).
_WAL_SQL = """
SELECT w.wal_bytes, w.wal_fpi, b.checkpoints_timed + b.checkpoints_req, b.buffers_checkpoint,
       b.buffers_clean, b.buffers_backend, (SELECT sum(blks_read) FROM pg_stat_database)
FROM pg_stat_wal w, pg_stat_bgwriter b
"""
# The one-minute rollups only: an hourly one is up to two hours behind by design.
_ROLLUP_SQL = ("SELECT extract(epoch FROM now() - min(done_until))::float8 FROM telemetry_rollupwatermark "
               "WHERE name LIKE '%_1m'")


class Sampler:
    """Memory, queue and rollup figures every `sample_s`, and each finished tick's commits."""

    def __init__(self, cfg: SoakConfig, procs: dict[str, Child], reader: TickReader):
        import psycopg
        import redis

        self.cfg, self.procs, self.reader = cfg, procs, reader
        self.db = psycopg.connect(cfg.database_url, autocommit=True)
        self.redis = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:56379/0"))
        self.samples: list[dict] = []
        self.ticks: list[dict] = []  # sample time, last commit, batches, samples
        self._seen = 0
        # The postmaster (a backend's parent) accounts for every PostgreSQL process of the cluster, ours or not:
        # during a soak nothing else runs on it.
        self.postmaster = int(_stat(self.db.info.backend_pid)[1])
        self.redis_pid = int(self.redis.info("server")["process_id"])

    def close(self) -> None:
        self.db.close()
        self.redis.close()

    def sample(self) -> dict:
        kids = _children()
        row: dict = {"t": time.time()}
        for name, proc in self.procs.items():
            row[name] = memory_of(_tree(proc.pid, kids))
        backends = [r[0] for r in self.db.execute(_BACKENDS_SQL).fetchall()]
        row["postgres"] = memory_of(backends)
        row["pg_backends"] = len(backends)
        row["redis_server_mb"] = int(self.redis.info("memory")["used_memory_rss"]) / MB
        ours = sum(self.redis.memory_usage(k) or 0 for k in self.redis.scan_iter(f"{self.cfg.channel_prefix}*"))
        queues = (self.cfg.queue, paging_queue(self.cfg.queue))  # the general queue and paging's
        ours += sum(self.redis.memory_usage(q) or 0 for q in queues)
        row["redis"] = (ours / MB, ours / MB)
        row["queue"] = sum(self.redis.llen(q) for q in queues)
        row["rollup_lag_s"] = self.db.execute(_ROLLUP_SQL).fetchone()[0]
        row["clients_mb"] = memory_of([os.getpid()])[0]
        cpu = {name: cpu_of(_tree(proc.pid, kids), reaped=True) for name, proc in self.procs.items()}
        cpu["postgres"] = cpu_of(_tree(self.postmaster, kids), reaped=True)
        cpu["redis"] = cpu_of([self.redis_pid])
        cpu["clients"] = cpu_of([os.getpid()])
        row["cpu"], row["machine"] = cpu, machine_cpu()
        wal = self.db.execute(_WAL_SQL).fetchone()
        row["wal"] = dict(zip(("bytes", "fpi", "checkpoints", "buf_checkpoint", "buf_clean", "buf_backend",
                               "blks_read"), map(float, wal), strict=True))
        self.samples.append(row)
        self._collect_ticks()
        return row

    def _collect_ticks(self) -> None:
        # The simulator sends a tick's requests, then prints its line: every commit of tick T lies
        # between T and that line, and the next tick starts after it.
        ticks = self.reader.ticks
        while self._seen < len(ticks):
            t, line_at = ticks[self._seen]
            n, last, samples = self.db.execute(
                _TICK_SQL, [self.cfg.collector, datetime.fromtimestamp(t, UTC),
                            datetime.fromtimestamp(line_at + 0.5, UTC)]).fetchone()
            self.ticks.append({"t": t, "commit": last.timestamp() if last else None, "batches": n,
                               "samples": samples, "lag": last.timestamp() - t if last else None})
            self._seen += 1


# --- figures -----------------------------------------------------------------------------------------------

def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def update_latencies(ticks: list[dict], clients: list[Client], horizon_s: float = 900.0) -> list[dict]:
    """One row per (tick, client) that received the tick: {"t", "kind", "latency"} (see the module's step 4).

    The horizon only stops a late message from being matched to a tick long past: a backlogged push path
    delivers fleet summaries a minute after they were computed, and that must show as latency, not vanish.
    """
    publishes = sorted(g for c in clients if c.kind == "fleet" for g in c.generated)
    out = []
    for tick in ticks:
        c = tick["commit"]
        if c is None:
            continue
        i = bisect.bisect_left(publishes, c)
        if i == len(publishes):
            continue
        published = publishes[i]
        for client in clients:
            w = _first_update(client, c, published)
            if w is not None and w - c <= horizon_s:
                out.append({"t": tick["t"], "kind": client.kind, "client": client.idx, "latency": w - c})
    return out


def _first_update(client: Client, commit: float, published: float) -> float | None:
    if client.kind == "fleet":
        # Summaries from two processes can arrive out of order: the first one computed after the commit.
        for j in range(bisect.bisect_left(client.arrivals, commit), len(client.arrivals)):
            if client.generated[j] >= commit:
                return client.arrivals[j]
        return None
    j = bisect.bisect_left(client.arrivals, published)
    return client.arrivals[j] if j < len(client.arrivals) else None


def windows(cfg: SoakConfig, start: float, end: float) -> list[tuple[float, float]]:
    """Back-to-back windows of `window_s` from `start`; a last part shorter than half a window joins the one
    before it, so the last window never rests on a handful of ticks."""
    edges = [start]
    while edges[-1] + cfg.window_s < end - 1e-6:
        edges.append(edges[-1] + cfg.window_s)
    if len(edges) > 1 and end - edges[-1] < cfg.window_s / 2:
        edges.pop()
    edges.append(end)
    return list(zip(edges, edges[1:], strict=False))


def summarise(cfg: SoakConfig, sampler: Sampler, clients: list[Client], start: float, end: float,
              reader: TickReader) -> dict:
    """Per-window figures, the start/end memory of every process and the verdict."""
    lat = update_latencies(sampler.ticks, clients)
    rows = []
    for a, b in windows(cfg, start, end):
        lags = [t["lag"] for t in sampler.ticks if a <= t["t"] < b and t["lag"] is not None]
        ls = [x["latency"] for x in lat if a <= x["t"] < b]
        mem = [s for s in sampler.samples if a <= s["t"] < b]
        rows.append({
            "from_s": a - start, "to_s": b - start, "ticks": len(lags),
            "expected_ticks": int((b - a) // cfg.interval_s),
            "lag_p50": pct(lags, 50), "lag_p95": pct(lags, 95), "lag_max": max(lags, default=None),
            "update_p50": pct(ls, 50), "update_p95": pct(ls, 95), "updates": len(ls),
            "queue": _median([s["queue"] for s in mem]), "rollup_lag_s": _median([s["rollup_lag_s"] for s in mem]),
            "pg_backends": _median([s["pg_backends"] for s in mem]),
            "mem": {r: (_median([s[r][0] for s in mem]), _median([s[r][1] for s in mem])) for r in JUDGED},
            **_rates(mem),
        })
    measured = [x for x in lat if start <= x["t"] < end]
    # The job list changes only when a job starts or ends, so a list page may rightly hear nothing for minutes;
    # every other page changes with every tick.
    idle = [c.idx for c in clients if c.kind != "jobs-list" and not any(w >= start for w in c.arrivals)]
    report = {
        "windows": rows, "latencies": lat,
        "update_p95_ms": (pct([x["latency"] for x in measured], 95) or 0) * 1000,
        "lag_p95_s": pct([t["lag"] for t in sampler.ticks if start <= t["t"] < end and t["lag"] is not None], 95),
        "idle_clients": idle, "clients": len(clients),
        "unanswered": [c.idx for c in clients if not c.arrivals],
        "client_errors": sum(len(c.errors) for c in clients), "reconnects": sum(c.reconnects for c in clients),
        "skipped_ticks": reader.skipped, "sim_errors": reader.errors,
        "per_kind_p95_ms": {k: _ms(pct([x["latency"] for x in measured if x["kind"] == k], 95))
                            for k in sorted({c.kind for c in clients})},
    }
    report["stack_cores"] = stack_cores([s for s in sampler.samples if start <= s["t"] <= end])
    report.update(verdict(cfg.tolerance, rows))
    if cfg.targets is not None:
        report["failures"] += target_failures(cfg.targets, report)
    return report


def stack_cores(samples: list[dict]) -> float | None:
    """Cores the stack (STACK_ROLES) used on average between the first and the last of `samples`."""
    have = [s for s in samples if "cpu" in s]
    if len(have) < 2 or have[-1]["t"] <= have[0]["t"]:
        return None
    a, b = have[0], have[-1]
    return sum(b["cpu"][r] - a["cpu"][r] for r in STACK_ROLES if r in a["cpu"] and r in b["cpu"]) / (b["t"] - a["t"])


def target_failures(targets: Targets, report: dict) -> list[str]:
    """The absolute targets a full-size run is judged on, beside the growth verdict."""
    out = []
    for kind, p95_ms in report["per_kind_p95_ms"].items():
        if p95_ms is not None and p95_ms > targets.update_p95_s * 1000:
            out.append(f"{kind} page-update p95 {p95_ms / 1000:.2f} s > {targets.update_p95_s:g} s")
    lag = report["lag_p95_s"]
    if lag is None or lag > targets.lag_p95_s:
        out.append(f"ingest lag p95 {_fmt(lag)} s > {targets.lag_p95_s:g} s")
    cores = report["stack_cores"]
    if cores is None or cores > targets.stack_cores:
        out.append(f"the stack used {_fmt(cores)} cores > {targets.stack_cores:g}")
    return out


def _rates(mem: list[dict]) -> dict:
    """Where the machine's time went in a window: each role's share of one core, the machine's idle and steal
    (as a share of all its cores), and PostgreSQL's write figures per second. Descriptive, not judged: they
    say why a window's lag rose, which the figures above only show."""
    if len(mem) < 2 or "cpu" not in mem[0] or "cpu" not in mem[-1]:
        return {"cpu": {}, "machine": {}, "wal": {}}
    a, b = mem[0], mem[-1]
    dt = b["t"] - a["t"]
    cores = os.cpu_count() or 1
    return {
        "cpu": {r: (b["cpu"][r] - a["cpu"][r]) / dt for r in CPU_ROLES if r in a["cpu"] and r in b["cpu"]},
        "machine": {k: (b["machine"][k] - a["machine"][k]) / dt / cores for k in ("idle", "iowait", "steal")},
        "wal": {"mb_s": (b["wal"]["bytes"] - a["wal"]["bytes"]) / dt / MB,
                **{k: (b["wal"][k] - a["wal"][k]) / dt for k in ("fpi", "buf_checkpoint", "buf_clean",
                                                                  "buf_backend", "blks_read")},
                "checkpoints": b["wal"]["checkpoints"] - a["wal"]["checkpoints"]},
    }


def _median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def verdict(tol: Tolerance, rows: list[dict]) -> dict:
    """Growth of every figure from the first window to the last, and which ones broke their tolerance."""
    first, last = rows[0], rows[-1]
    growth, failures = {}, []
    for role in JUDGED:
        a, b = first["mem"][role][1], last["mem"][role][1]
        if a is None or b is None:
            failures.append(f"{role}: no memory samples")
            continue
        growth[role] = {"start_mb": a, "end_mb": b, "pct": 100 * (b - a) / a if a else 0.0,
                        "start_rss_mb": first["mem"][role][0], "end_rss_mb": last["mem"][role][0]}
        if b - a > max(tol.rss_pct / 100 * a, tol.rss_floor_mb):
            failures.append(f"{role} private memory {a:.0f} → {b:.0f} MB")
    for name, fig in (("ingest lag p95", "lag_p95"), ("page-update p95", "update_p95")):
        a, b = first[fig], last[fig]
        if a is None or b is None:
            failures.append(f"{name}: no samples in the {'first' if a is None else 'last'} window")
        elif b - a > max(tol.rise_pct / 100 * a, tol.rise_floor_s):
            failures.append(f"{name} {a:.2f} → {b:.2f} s")
    if (last["queue"] or 0) - (first["queue"] or 0) > tol.queue_rise:
        failures.append(f"Celery queue {first['queue']} → {last['queue']} messages")
    if (last["rollup_lag_s"] or 0) - (first["rollup_lag_s"] or 0) > tol.rollup_rise_s:
        failures.append(f"rollup lag {first['rollup_lag_s']:.0f} → {last['rollup_lag_s']:.0f} s")
    for w in rows:
        if w["expected_ticks"] and w["ticks"] < tol.min_tick_share * w["expected_ticks"]:
            failures.append(f"interval not kept: {w['ticks']} of {w['expected_ticks']} ticks committed in minutes "
                            f"{w['from_s'] / 60:.1f}-{w['to_s'] / 60:.1f}")
    judged = [g["pct"] for r, g in growth.items() if r != "redis"]
    return {"growth": growth, "failures": failures, "rss_growth_pct": max(judged, default=0.0)}


# --- the run -----------------------------------------------------------------------------------------------

def run_soak(cfg: SoakConfig, run_dir: Path) -> dict:
    """Start everything, wait for the first tick, open the clients, soak, stop; returns `summarise()`'s report."""
    run_dir.mkdir(parents=True, exist_ok=True)
    reader = TickReader()
    procs, host = start_processes(cfg, run_dir, reader.feed)
    sampler = None
    try:
        deadline = time.monotonic() + max(300.0, 10 * cfg.interval_s)
        while not reader.ticks:
            for p in procs.values():
                p.check()
            if time.monotonic() > deadline:
                raise RuntimeError("the simulator sent no tick in time; see var/log/soak-simulator.log")
            time.sleep(0.2)
        cfg.say(f"first tick at {datetime.fromtimestamp(reader.ticks[0][0], UTC):%H:%M:%S}; "
                f"sent {len(kick_periodic_tasks(cfg.queue))} periodic tasks once")
        sampler = Sampler(cfg, procs, reader)
        jobs = [r[0] for r in sampler.db.execute(
            "SELECT source || ':' || external_id FROM telemetry_job WHERE state = 'running' ORDER BY id LIMIT 20")]
        clients = plan_clients(cfg.clients, jobs)
        start, end = asyncio.run(_soak(cfg, host, procs, sampler, clients))
        sampler.sample()  # the last tick's commits
    finally:
        stop_processes(procs)
        if sampler:
            sampler.close()
    return {**summarise(cfg, sampler, clients, start, end, reader), "samples": sampler.samples, "client_objs": clients,
            "ticks": sampler.ticks, "start": start, "end": end}


async def _soak(cfg: SoakConfig, host: str, procs: dict[str, Child], sampler: Sampler,
                clients: list[Client]) -> tuple[float, float]:
    import aiohttp

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    t0 = time.time()
    start, end = t0 + cfg.warmup_s, t0 + cfg.warmup_s + cfg.duration_s
    models = ModelWarmup(cfg, sampler.db) if cfg.train_models else None
    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.create_task(run_client(session, host, cfg.session_cookie, c, stop)) for c in clients]
        cfg.say(f"{len(clients)} websocket clients: " + ", ".join(
            f"{sum(c.kind == k for c in clients)} {k}" for k in sorted({c.kind for c in clients})))
        next_progress = t0 + cfg.progress_s
        try:
            while (now := time.time()) < end:
                for p in procs.values():
                    p.check()
                if models is not None and not models.done:
                    await loop.run_in_executor(None, models.step, now, t0)
                    # The warm-up lasts until the models are active (or waiting was given up) and settled.
                    start = models.start(t0 + cfg.warmup_s) if models.done else max(start, now + cfg.sample_s)
                    end = start + cfg.duration_s
                row = await loop.run_in_executor(None, sampler.sample)
                if now >= next_progress:
                    cfg.say(progress_line(cfg, sampler, clients, row, now - t0, now < start))
                    next_progress += cfg.progress_s
                await asyncio.sleep(max(0.0, min(cfg.sample_s - (time.time() - now), end - time.time())))
        finally:
            stop.set()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return start, end


def progress_line(cfg: SoakConfig, sampler: Sampler, clients: list[Client], row: dict, elapsed: float,
                  warming: bool) -> str:
    since = time.time() - cfg.progress_s
    # Ticks committed in the last period (their sample time may be well before it when ingest lags).
    recent = [t for t in sampler.ticks if t["commit"] is not None and t["commit"] >= since - cfg.interval_s]
    lags = [t["lag"] for t in recent]
    lat = [x["latency"] for x in update_latencies(recent, clients)]
    msgs = sum(1 for c in clients for w in c.arrivals if w >= since)
    mem = " ".join(f"{r}={row[r][1]:.0f}" for r in ("daphne", "worker", "beat", "simulator", "postgres"))
    p95 = pct(lat, 95)
    past = [s for s in sampler.samples if s["t"] <= since]
    cpu = ""
    if past and "cpu" in row:
        r = _rates([past[-1], row])
        cpu = " cpu " + " ".join(f"{k}={v:.2f}" for k, v in r["cpu"].items())
        cpu += f" idle={100 * r['machine']['idle']:.0f}%"
    return (f"{int(elapsed // 60):02d}:{int(elapsed % 60):02d}{' warm-up' if warming else ''} "
            f"ticks={len(lags)} lag_p95={_fmt(pct(lags, 95))}s update_p95="
            f"{'-' if p95 is None else f'{p95 * 1000:.0f}'}ms msgs/min={msgs} private_MB {mem} "
            f"pg_backends={row['pg_backends']} queue={row['queue']} rollup_lag={_fmt(row['rollup_lag_s'], 0)}s{cpu}")


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1000


def _fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def report_lines(report: dict) -> list[str]:
    """The per-window table, the memory of each process at the start and the end, and what failed."""
    out = ["window        ticks  lag p50/p95/max s     update p50/p95 ms   queue  rollup_lag_s  pg_backends"]
    for w in report["windows"]:
        lag = f"{_fmt(w['lag_p50'])}/{_fmt(w['lag_p95'])}/{_fmt(w['lag_max'])}"
        update = f"{_fmt(_ms(w['update_p50']), 0)}/{_fmt(_ms(w['update_p95']), 0)}"
        out.append(f"{w['from_s'] / 60:5.1f}-{w['to_s'] / 60:<5.1f}m {w['ticks']:3d}/{w['expected_ticks']:<3d} "
                   f"{lag:<22}{update:<20}{_fmt(w['queue'], 0):>5}  {_fmt(w['rollup_lag_s'], 0):>12}  "
                   f"{_fmt(w['pg_backends'], 0):>11}")
    out.append("CPU per window (share of one core; the machine's idle and steal as a share of all its cores) and "
               "PostgreSQL writes (WAL MB/s, full-page images/s, checkpoints, blocks read/s)")
    for w in report["windows"]:
        if not w.get("cpu"):
            continue
        cpu = " ".join(f"{r} {w['cpu'][r]:.2f}" for r in CPU_ROLES if r in w["cpu"])
        wal = w["wal"]
        out.append(f"{w['from_s'] / 60:5.1f}-{w['to_s'] / 60:<5.1f}m {cpu} | idle {100 * w['machine']['idle']:.0f} % "
                   f"steal {100 * w['machine']['steal']:.1f} % | WAL {wal['mb_s']:.1f} MB/s fpi {wal['fpi']:.0f}/s "
                   f"checkpoints {wal['checkpoints']:.0f} read {wal['blks_read']:.0f}/s")
    out.append("memory (median of first vs last window): private MB (RssAnon) and RSS MB")
    for role, g in report["growth"].items():
        label = "redis (our keys)" if role == "redis" else role
        out.append(f"  {label:<17} private {g['start_mb']:8.1f} → {g['end_mb']:8.1f} ({g['pct']:+.1f} %)   "
                   f"RSS {g['start_rss_mb']:8.1f} → {g['end_rss_mb']:8.1f}")
    server = [s["redis_server_mb"] for s in report["samples"]]
    if server:
        out.append(f"  redis server RSS (shared with everyone on this Redis, not judged) {server[0]:.0f} → "
                   f"{server[-1]:.0f} MB")
    out.append("update p95 by page: " + ", ".join(f"{k} {_fmt(v, 0)} ms" for k, v in report["per_kind_p95_ms"].items()))
    out.append(f"the stack ({', '.join(STACK_ROLES)}) over the measured part: {_fmt(report['stack_cores'])} cores")
    out.append(f"pages with no update after the warm-up {report['idle_clients']} (job lists aside), "
               f"never answered {report['unanswered']}, "
               f"client errors {report['client_errors']}, reconnects {report['reconnects']}, "
               f"simulator ticks skipped {report['skipped_ticks']}, simulator errors {report['sim_errors']}")
    errors = sorted({e for c in report["client_objs"] for e in c.errors})
    out += [f"client error: {e}" for e in errors[:5]]
    out += [f"FAIL: {f}" for f in report["failures"]]
    return out


def dump_raw(report: dict, path: Path) -> None:
    """Every tick, memory sample and message time, for a second look at a run without running it again."""
    clients = [{"idx": c.idx, "kind": c.kind, "subscribe": c.subscribe, "arrivals": c.arrivals,
                "generated": c.generated, "bytes": c.bytes, "errors": c.errors} for c in report["client_objs"]]
    raw = {k: report[k] for k in ("start", "end", "ticks", "samples", "windows")}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**raw, "clients": clients}, default=float))


def write_chart(report: dict, path: Path, title: str) -> None:
    """Ingest lag per tick, page-update p95 per minute and private memory per process, in one HTML file that
    carries its own plotly.js (no CDN, no kaleido)."""
    from plotly.subplots import make_subplots

    start = report["start"]
    fig = make_subplots(rows=4, cols=1, shared_xaxes=True, vertical_spacing=0.05,
                        subplot_titles=("Ingest lag per tick (s): last commit − sample time",
                                        "Page-update latency p95 per minute (ms)", "Private memory (MB, RssAnon)",
                                        "CPU per minute (share of one core)"))
    ticks = [t for t in report["ticks"] if t["lag"] is not None]
    fig.add_scatter(x=[(t["t"] - start) / 60 for t in ticks], y=[t["lag"] for t in ticks], name="ingest lag",
                    mode="lines+markers", row=1, col=1)
    by_minute: dict[tuple[str, int], list[float]] = {}
    for x in report["latencies"]:
        by_minute.setdefault((x["kind"], int((x["t"] - start) // 60)), []).append(x["latency"] * 1000)
    for kind in sorted({k for k, _ in by_minute}):
        minutes = sorted(m for k, m in by_minute if k == kind)
        fig.add_scatter(x=[m + 0.5 for m in minutes], y=[pct(by_minute[(kind, m)], 95) for m in minutes],
                        name=f"{kind} p95", mode="lines+markers", row=2, col=1)
    for role in JUDGED:
        fig.add_scatter(x=[(s["t"] - start) / 60 for s in report["samples"]],
                        y=[s[role][1] for s in report["samples"]], name=f"{role} MB", mode="lines", row=3, col=1)
    minutes: list[dict] = []  # one sample a minute, whatever the sampling period
    for sample in report["samples"]:
        if "cpu" in sample and (not minutes or sample["t"] - minutes[-1]["t"] >= 60):
            minutes.append(sample)
    for role in CPU_ROLES:
        pts = [((b["t"] - start) / 60, (b["cpu"][role] - a["cpu"][role]) / (b["t"] - a["t"]))
               for a, b in zip(minutes, minutes[1:], strict=False) if role in a["cpu"] and role in b["cpu"]]
        fig.add_scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], name=f"{role} CPU", mode="lines", row=4, col=1)
    for a in report["windows"]:
        fig.add_vline(x=a["from_s"] / 60, line_dash="dot", line_color="grey")
    fig.update_xaxes(title_text="minutes after the warm-up", row=4, col=1)
    fig.update_layout(title=title, height=1300, template="plotly_white")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(str(path), include_plotlyjs=True, full_html=True)


def prepare_site(collector: str, password_dir: Path) -> tuple[str, str]:
    """On the database Django is configured for: the simulator's collector token, an operator and their
    session, and what `./dev up` installs (default alert rules and routing, the demo tenants that own the
    simulator's accounts, so metering has work). Returns (token, sessionid)."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client as DjangoClient

    from telemetry.actions import do_create_collector_token

    token = do_create_collector_token(collector, replace=True)
    user_model = get_user_model()
    user = user_model.objects.filter(username="soak").first() or user_model.objects.create_superuser(
        "soak", "soak@example.com", None)
    browser = DjangoClient()
    browser.force_login(user)
    password_dir.mkdir(parents=True, exist_ok=True)
    with open(os.devnull, "w") as quiet:
        call_command("alerts_defaults", stdout=quiet)
        call_command("tenancy_demo", password_dir=str(password_dir), stdout=quiet)
    return token, browser.cookies["sessionid"].value
