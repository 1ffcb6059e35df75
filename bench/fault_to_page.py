"""bench/fault_to_page: one injected XID fault sample → the webhook page at a local receiver, on two paths.

Both paths watch the same dcgm-exporter-format data (a GPU whose DCGM_FI_DEV_XID_ERRORS turns to 79, "GPU has
fallen off the bus") and page the same kind of local receiver (alerts/receiver.py). Each trial is timed from
the instant the fault is visible at its source to the instant the webhook naming that GPU arrives:

- Breakwater: a scratch database, the real ASGI server (daphne), real Celery workers (one for paging) and beat, the way
  `./dev up` starts them, and the shipped alerting defaults (alerts.defaults.install_defaults) wired to the
  receiver. Beside the trials the simulator ticks a whole fleet (--gpus, 16,384 by default) every 10 s through
  the same daphne, worker, beat and database, as a live site loads them. A trial POSTs one host's scrape text
  carrying the fault to /api/v1/ingest/prometheus; the clock starts just before the POST. Nothing is tuned for
  the bench.
- Prometheus + Alertmanager from Debian's packages with their documented default intervals (scrape and rule
  evaluation every 1 m, group_wait 30 s): Prometheus scrapes a local exporter that serves the same text, the
  rule is `DCGM_FI_DEV_XID_ERRORS > 0` with no `for`, Alertmanager groups per GPU and posts a webhook. The
  clock starts when the exporter begins serving the fault. The trials start at seeded random offsets spread
  over two minutes (so the fault lands at every phase of the scrape tick) and run in parallel, alongside the
  Breakwater trials. A second Prometheus + Alertmanager pair runs the same way with Alertmanager's group_wait
  set to our critical route's (0 s), so the figure beside the ratio is not Alertmanager's 30-s default alone.

Ends with `RESULT fault_to_page p95_s=<ours> ratio=<Prometheus p95 / ours> gpus=<simulated beside>
ratio_same_group_wait=<…> ... PASS|FAIL`.
Targets: Breakwater p95 ≤ 5 s and at least 10× faster than the Prometheus path. docs/fault-to-page.md has
the method and the numbers.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from _common import (
    LOG_DIR,
    daphne_server,
    drop_database,
    median,
    p95,
    procs,
    recreate_database,
    say,
    scratch_database_url,
    setup_django,
    simulate_once,
    simulator_ticking,
)

TARGET_P95_S = 5.0
TARGET_RATIO = 10.0
XID = 79  # "GPU has fallen off the bus": the catalogue says drain the node, the shipped rules page at once
GPUS_PER_HOST = 8
BW_TIMEOUT_S = 60.0
PROM_TIMEOUT_S = 300.0  # the defaults allow at most 60 s + 60 s + 30 s; anything past this is broken
PROMETHEUS = "/usr/bin/prometheus"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"

# (metric, type, HELP as dcgm-exporter writes it, value for GPU index i at time t). ~10 series per GPU, the
# shape of a default dcgm-exporter scrape; the energy counter only grows, so no sample looks like a GPU reset.
METRICS = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", lambda i, t: 1980),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", lambda i, t: 2619),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda i, t: 41 + i),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", lambda i, t: 48 + i),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda i, t: f"{612.5 + i:.3f}"),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ).",
     lambda i, t: int(t * 612_500)),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda i, t: 97),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", lambda i, t: 2213),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", lambda i, t: 79_003),
)
XID_HELP = "Value of the last XID error encountered."


# ----------------------------------------------------------------------------------------------- shared parts
class Fleet:
    """Hosts of 8 GPUs each and every GPU's last XID; renders dcgm-exporter scrape text."""

    def __init__(self, prefix: str, hosts: int, rnd: random.Random):
        self.hosts = {f"{prefix}-{h:04d}": [f"GPU-{uuid.UUID(int=rnd.getrandbits(128))}"
                                             for _ in range(GPUS_PER_HOST)] for h in range(hosts)}
        self.xid = {u: 0 for gpus in self.hosts.values() for u in gpus}

    def text(self, hosts: list[str] | None = None) -> str:
        """One scrape as dcgm-exporter writes it: HELP/TYPE once per metric, a line per GPU, no timestamps."""
        t = time.time()
        names = hosts or list(self.hosts)
        xid = dict(self.xid)  # one consistent snapshot: the flipping thread may write meanwhile
        out = []
        for metric, kind, help_, value in (*METRICS, ("DCGM_FI_DEV_XID_ERRORS", "gauge", XID_HELP, None)):
            out.append(f"# HELP {metric} {help_}\n# TYPE {metric} {kind}\n")
            for host in names:
                for i, gpu in enumerate(self.hosts[host]):
                    v = xid[gpu] if value is None else value(i, t)
                    out.append(f'{metric}{{gpu="{i}",UUID="{gpu}",pci_bus_id="00000000:{0x18 + i:02X}:00.0",'
                               f'device="nvidia{i}",modelName="NVIDIA H100 80GB HBM3",Hostname="{host}",'
                               f'DCGM_FI_DRIVER_VERSION="570.124.06"}} {v}\n')
        return "".join(out)


@dataclass
class Trial:
    """One injected fault: which GPU, when it became visible, when the page naming it arrived."""

    gpu: str
    start: float = 0.0
    page: float | None = None

    @property
    def latency(self) -> float:
        return self.page - self.start if self.page is not None else math.inf


class Pager:
    """A local receiver that records the first page mentioning each watched GPU UUID.

    A page counts when its JSON says `"status": "firing"` (Breakwater's payload and Alertmanager's both do)
    and names the GPU: its UUID appears in the body (both carry the alert's labels; UUIDs never contain one
    another). With a secret, every request must also carry a valid Breakwater signature.
    """

    def __init__(self, secret: str = ""):
        from alerts.receiver import Receiver

        self.first: dict[str, float] = {}
        self.watch: dict[str, Trial] = {}
        self.bad_signatures = 0
        self._cond = threading.Condition()
        self.receiver = Receiver(secret=secret, on_request=self._seen)

    def _seen(self, rec) -> None:
        body = rec.body.decode("utf-8", "replace")
        try:
            firing = json.loads(body).get("status") == "firing"  # both payloads say so at the top level
        except (ValueError, AttributeError):
            firing = False
        with self._cond:
            self.bad_signatures += bool(self.receiver.secret) and rec.signature_ok is not True
            for gpu in self.watch if firing else ():
                if gpu not in self.first and gpu in body:
                    self.first[gpu] = rec.at
            self._cond.notify_all()

    def watch_for(self, trials: list[Trial]) -> None:
        with self._cond:  # the receiver's threads iterate the watch list
            self.watch.update({t.gpu: t for t in trials})

    def wait(self, gpu: str, deadline: float) -> float | None:
        """Arrival time of the first page naming `gpu`, or None at the deadline (time.time() clock)."""
        with self._cond:
            while gpu not in self.first:
                left = deadline - time.time()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 1.0))
            return self.first[gpu]


# ------------------------------------------------------------------------------------- Prometheus baseline
# Left out on purpose: scrape_interval, scrape_timeout and evaluation_interval, so Prometheus' documented
# defaults apply (1m, 10s, 1m). That is what an unconfigured installation does.
PROM_CONFIG = """\
rule_files: ["{rules}"]
alerting:
  alertmanagers:
    - static_configs:
        - targets: ["127.0.0.1:{am_port}"]
scrape_configs:
  - job_name: dcgm-exporter
    static_configs:
      - targets: ["127.0.0.1:{exporter_port}"]
"""
# No `for`: the alert fires on the first evaluation that sees the fault.
PROM_RULES = """\
groups:
  - name: gpu-faults
    rules:
      - alert: GpuXidError
        expr: DCGM_FI_DEV_XID_ERRORS > 0
        labels:
          severity: critical
"""
# Left out on purpose: group_wait, group_interval and repeat_interval, so Alertmanager's documented defaults
# apply (30s, 5m, 4h). Grouped per GPU (host + index), so no trial waits on another's group_interval.
AM_CONFIG = """\
route:
  receiver: pager
  group_by: [alertname, Hostname, gpu]{group_wait}
receivers:
  - name: pager
    webhook_configs:
      - url: "{url}"
"""


class Exporter:
    """Serves the fleet's current scrape text on /metrics, like dcgm-exporter."""

    def __init__(self, fleet: Fleet):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's naming
                body = fleet.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def prometheus_stack(tmp: Path, exporter_port: int, webhook_url: str, group_wait_s: float | None = None):
    """Debian's prometheus and prometheus-alertmanager on free loopback ports; yields Prometheus' base URL.
    `group_wait_s` None keeps Alertmanager's default (30 s); a number sets the route's group_wait."""
    prom_port, am_port = procs.free_port(), procs.free_port()
    tmp.mkdir(exist_ok=True)
    tag = "" if group_wait_s is None else f"-gw{group_wait_s:g}"
    (tmp / "rules.yml").write_text(PROM_RULES)
    (tmp / "prometheus.yml").write_text(PROM_CONFIG.format(rules=tmp / "rules.yml", am_port=am_port,
                                                           exporter_port=exporter_port))
    wait = "" if group_wait_s is None else f"\n  group_wait: {group_wait_s:g}s"
    (tmp / "alertmanager.yml").write_text(AM_CONFIG.format(url=webhook_url, group_wait=wait))
    with ExitStack() as stack:
        # No cluster listener: a lone Alertmanager sends at once instead of waiting for peers to settle.
        am = procs.Child("alertmanager", [
            ALERTMANAGER, f"--config.file={tmp / 'alertmanager.yml'}", f"--storage.path={tmp / 'am'}",
            f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
            port=am_port, log=LOG_DIR / f"bench-alertmanager{tag}.log").start()
        stack.callback(am.stop, 20)
        am.wait_http("/-/ready", timeout=60)
        prom = procs.Child("prometheus", [
            PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}"],
            port=prom_port, log=LOG_DIR / f"bench-prometheus{tag}.log").start()
        stack.callback(prom.stop, 20)
        prom.wait_http("/-/ready", timeout=60)
        yield prom.url


def _rfc3339(text: str) -> float:
    # Go writes nanoseconds; Python's parser takes at most microseconds.
    return datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", text.replace("Z", "+00:00"))).timestamp()


def prometheus_phase(prom_url: str) -> float | None:
    """Seconds from a scrape to the next rule evaluation: fixed for a run (both offsets are hashes)."""
    try:
        with urllib.request.urlopen(f"{prom_url}/api/v1/targets", timeout=5) as resp:
            scraped = _rfc3339(json.load(resp)["data"]["activeTargets"][0]["lastScrape"])
        with urllib.request.urlopen(f"{prom_url}/api/v1/rules", timeout=5) as resp:
            evaluated = _rfc3339(json.load(resp)["data"]["groups"][0]["lastEvaluation"])
    except (OSError, KeyError, IndexError, ValueError):
        return None
    return (evaluated - scraped) % 60.0


class PrometheusRun(threading.Thread):
    """Flips one GPU's XID per trial at its offset, then waits for every page; prints as it goes."""

    def __init__(self, fleet: Fleet, pager: Pager, offsets: list[float], label: str = "prometheus"):
        super().__init__(daemon=True)
        self.label = label
        gpus = [fleet.hosts[h][i % GPUS_PER_HOST] for i, h in enumerate(fleet.hosts)]
        self.fleet, self.pager, self.offsets = fleet, pager, offsets
        self.trials = [Trial(g) for g in gpus[:len(offsets)]]
        pager.watch_for(self.trials)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._flip_all()
            self._collect()
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def _flip_all(self) -> None:
        t0 = time.time()
        for n, (offset, trial) in enumerate(zip(self.offsets, self.trials, strict=True)):  # offsets are sorted
            time.sleep(max(0.0, t0 + offset - time.time()))
            self.fleet.xid[trial.gpu] = XID
            trial.start = time.time()
            say(f"{self.label}: trial {n + 1}/{len(self.trials)}: XID {XID} served at +{offset:.0f} s")

    def _collect(self) -> None:
        done: set[int] = set()
        last_note = time.time()
        while len(done) < len(self.trials):
            for n, trial in enumerate(self.trials):
                if n in done:
                    continue
                trial.page = self.pager.wait(trial.gpu, time.time() + 0.5)
                if trial.page is not None or time.time() > trial.start + PROM_TIMEOUT_S:
                    done.add(n)
                    say(f"{self.label}: trial {n + 1}/{len(self.trials)}: "
                        + (f"paged after {trial.latency:.1f} s" if trial.page else "NO PAGE (timed out)"))
            if time.time() - last_note > 30 and len(done) < len(self.trials):
                last_note = time.time()
                say(f"{self.label}: {len(done)}/{len(self.trials)} paged, waiting for the rest")


# ------------------------------------------------------------------------------------------ Breakwater path
@contextmanager
def celery_processes(tmp: Path, queue: str):
    """The workers and beat as `./dev up` runs them (prefork, concurrency 2, and one for the paging queue), on
    the bench's own queues."""
    # The paging queue's own worker, as `./dev up` starts it.
    alerts = procs.Child("alerts-worker", procs.worker_argv(queue, f"{queue}-alerts@%h", concurrency=1,
                                                           alerts_only=True),
                         log=LOG_DIR / "bench-fault_to_page-alerts-worker.log").start()
    worker = procs.Child("worker", procs.worker_argv(queue, f"{queue}@%h", concurrency=2),
                         log=LOG_DIR / "bench-fault_to_page-worker.log").start()
    beat = procs.Child("beat", procs.beat_argv(tmp / "celerybeat-schedule"),
                       log=LOG_DIR / "bench-fault_to_page-beat.log").start()
    try:
        yield
    finally:
        beat.stop(timeout=20)
        worker.stop(timeout=20)
        alerts.stop(timeout=20)


def post_scrape(base: str, token: str, text: str) -> None:
    host, port = base.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/api/v1/ingest/prometheus", body=text.encode(),
                 headers={"Authorization": f"Bearer {token}", "Content-Type": "text/plain; version=0.0.4"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"ingest answered {resp.status}: {data[:300]!r}")


def breakwater_trial(base: str, token: str, fleet: Fleet, pager: Pager, host: str, gpu: str) -> Trial:
    """Serve the fault in one host's scrape, POST it, and wait for the page that names the GPU."""
    trial = Trial(gpu)
    pager.watch_for([trial])
    fleet.xid[gpu] = XID
    text = fleet.text([host])
    trial.start = time.time()
    post_scrape(base, token, text)
    trial.page = pager.wait(gpu, trial.start + BW_TIMEOUT_S)
    return trial


def breakwater_run(base: str, token: str, fleet: Fleet, pager: Pager, trials: int, warmup: int,
                   rnd: random.Random) -> list[Trial]:
    """Two healthy scrapes of the whole fleet, `warmup` untimed fault trials, then the timed ones."""
    say(f"breakwater: warm-up, {len(fleet.hosts) * GPUS_PER_HOST} GPUs on {len(fleet.hosts)} hosts reporting healthy")
    for _ in range(2):
        post_scrape(base, token, fleet.text())
        time.sleep(0.5)
    results = []
    for n, host in enumerate(fleet.hosts):
        gpu = fleet.hosts[host][n % GPUS_PER_HOST]
        trial = breakwater_trial(base, token, fleet, pager, host, gpu)
        shown = f"{trial.latency:.2f} s" if trial.page else f"NO PAGE within {BW_TIMEOUT_S:.0f} s"
        if n < warmup:
            say(f"breakwater: warm-up fault {n + 1}/{warmup}: {shown} (not counted: starts the worker's imports)")
        else:
            results.append(trial)
            say(f"breakwater: trial {len(results)}/{trials}: {shown}")
        # A random pause: trials land at every phase of beat's 5 s and 10 s ticks.
        time.sleep(rnd.uniform(0.5, 3.0))
    return results


def configure_breakwater(receiver_url: str, secret: str) -> str:
    """The shipped alerting defaults, wired to the receiver, and a collector token; returns the token."""
    from alerts.defaults import install_defaults
    from alerts.models import Route, Rule
    from telemetry.actions import do_create_collector_token

    install_defaults(receiver_url, secret)
    rule = Rule.objects.filter(kind="xid", severity="critical", enabled=True).first()
    routes = ", ".join(f"{r.name} (group_wait {r.group_wait_s} s)" for r in Route.objects.all())
    say(f"breakwater: shipped defaults installed: rule {rule.name if rule else 'NONE'} "
        f"(xid {rule.xid_codes or rule.xid_actions if rule else '-'}), routes {routes}")
    return do_create_collector_token("bench-fault-to-page", replace=True)


# ---------------------------------------------------------------------------------------------- the report
@dataclass
class Summary:
    """One path's figures; missed trials count as infinitely late."""

    name: str
    trials: list[Trial] = field(default_factory=list)

    @property
    def missed(self) -> int:
        return sum(t.page is None for t in self.trials)

    def stat(self, fn) -> float:
        xs = [t.latency for t in self.trials]
        return fn(xs) if xs else math.nan

    def row(self) -> str:
        if not self.trials:
            return f"{self.name:<44} {'skipped':>7}"
        return (f"{self.name:<44} {len(self.trials):>7} {self.stat(median):>8.2f} {self.stat(p95):>8.2f} "
                f"{self.stat(max):>8.2f} {self.missed:>7}")


def report(ours: Summary, prom: Summary, same_wait: Summary, phases: dict[str, float | None],
           bad_signatures: int, gpus: int) -> None:
    print(f"\n{'path':<44} {'trials':>7} {'p50 s':>8} {'p95 s':>8} {'max s':>8} {'missed':>7}")
    for path in (ours, prom, same_wait):
        print(path.row())
    for label, phase in phases.items():
        if phase is not None:
            say(f"{label}: this run, rule evaluation ran {phase:.1f} s after each scrape "
                "(a hash-chosen phase: it moves the baseline by up to a minute from run to run)")
    ours_p95 = ours.stat(p95)

    def ratio_to(path: Summary) -> float:
        return path.stat(p95) / ours_p95 if path.trials and not path.missed and ours_p95 > 0 else math.nan

    ratio, ratio_same = ratio_to(prom), ratio_to(same_wait)
    if not prom.trials:
        say("no Prometheus baseline was measured (--no-prometheus): the ratio target is unmet, so FAIL")
    elif prom.missed:
        say(f"{prom.missed} Prometheus trial(s) never paged: the baseline is broken, no ratio, so FAIL")
    if bad_signatures:
        say(f"{bad_signatures} Breakwater webhook(s) failed the HMAC check")
    passed = (ours_p95 <= TARGET_P95_S and not ours.missed and not bad_signatures
              and not math.isnan(ratio) and ratio >= TARGET_RATIO)
    print(f"RESULT fault_to_page p95_s={ours_p95:.2f} ratio={ratio:.1f} gpus={gpus} prom_p95_s={prom.stat(p95):.1f} "
          f"ratio_same_group_wait={ratio_same:.1f} prom_same_group_wait_p95_s={same_wait.stat(p95):.1f} "
          f"target_p95_s={TARGET_P95_S:g} target_ratio={TARGET_RATIO:g} missed={ours.missed} "
          f"{'PASS' if passed else 'FAIL'}", flush=True)


# -------------------------------------------------------------------------------------------------- main
def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20, help="timed Breakwater trials")
    ap.add_argument("--warmup", type=int, default=2, help="untimed Breakwater fault trials first")
    ap.add_argument("--prom-trials", type=int, default=10, help="Prometheus trials, run in parallel")
    ap.add_argument("--spread", type=float, default=120.0, help="seconds over which Prometheus trials start")
    ap.add_argument("--no-prometheus", action="store_true",
                    help="skip the baseline (the result is then FAIL: the ratio is not measured)")
    ap.add_argument("--gpus", type=int, default=16384,
                    help="GPUs the simulator ticks every 10 s through the same stack during the trials (0: idle)")
    ap.add_argument("--seed", type=int, default=6)
    ap.add_argument("--keep", action="store_true", help="keep the scratch database for inspection")
    return ap.parse_args()


def our_group_wait_s() -> float:
    """The group_wait of the shipped route that pages an XID 79 (critical): the same-wait baseline's."""
    from alerts.defaults import CRITICAL_GROUP_WAIT_S

    return float(CRITICAL_GROUP_WAIT_S)


def start_prometheus(stack: ExitStack, tmp: Path, args, rnd: random.Random,
                     group_wait_s: float | None, label: str) -> tuple[PrometheusRun, str]:
    missing = [b for b in (PROMETHEUS, ALERTMANAGER) if not shutil.which(b)]
    if missing:
        sys.exit(f"{' and '.join(missing)} missing: install Debian's prometheus and prometheus-alertmanager "
                 "(`./dev bench fault_to_page` does), or pass --no-prometheus")
    fleet = Fleet(f"{label}-node", args.prom_trials, rnd)
    pager = Pager()
    stack.enter_context(pager.receiver)
    exporter = Exporter(fleet)
    stack.callback(exporter.stop)
    prom_url = stack.enter_context(prometheus_stack(tmp / label, exporter.port, pager.receiver.url("/alertmanager"),
                                                    group_wait_s))
    wait = "default group_wait (30 s)" if group_wait_s is None else f"group_wait {group_wait_s:g} s"
    say(f"{label}: {PROMETHEUS} and {ALERTMANAGER} up with default intervals, {wait}; {args.prom_trials} trials "
        f"start at random offsets over {args.spread:.0f} s and run in parallel (about 4-5 minutes)")
    run = PrometheusRun(fleet, pager, sorted(rnd.uniform(0, args.spread) for _ in range(args.prom_trials)), label)
    run.start()
    return run, prom_url


def run_breakwater(stack: ExitStack, tmp: Path, url: str, args, rnd: random.Random) -> tuple[list[Trial], int]:
    secret = uuid.uuid4().hex
    pager = Pager(secret=secret)
    stack.enter_context(pager.receiver)
    token = configure_breakwater(pager.receiver.url(), secret)
    stack.enter_context(celery_processes(tmp, os.environ["CELERY_QUEUE"]))
    base = stack.enter_context(daphne_server(url))
    if args.gpus:
        # A live site's load on the same daphne, worker, beat and database: every GPU every 10 s, with the
        # alert evaluation, scoring and rollups that follow. The trials' hosts are apart from it.
        simulate_once(base, args.gpus)
        stack.enter_context(simulator_ticking(base, args.gpus))
    fleet = Fleet("bw-node", args.warmup + args.trials, rnd)
    return breakwater_run(base, token, fleet, pager, args.trials, args.warmup, rnd), pager.bad_signatures


def main() -> None:
    args = parse_args()
    rnd = random.Random(args.seed)
    # The bench's own Celery queue and channel prefix: a `./dev up` or a test run on the same Redis never
    # takes its tasks. Children (daphne, worker, beat) inherit these.
    os.environ["CELERY_QUEUE"] = f"bench-fault_to_page-{os.getpid()}"
    os.environ["BREAKWATER_CHANNEL_PREFIX"] = f"benchf2p{os.getpid()}"
    # The receiver listens on loopback, which the webhook SSRF guard refuses unless the allowlist names it
    # (as `./dev up` names its own receiver): without this every page was refused and every trial missed.
    os.environ["OUTBOUND_URL_ALLOWLIST"] = "127.0.0.1"
    url = scratch_database_url("fault_to_page")
    setup_django(url)  # connects lazily: the database is made below, while Prometheus starts its trials
    ours, prom, bad = Summary("Breakwater"), Summary("Prometheus + Alertmanager (defaults)"), 0
    same_wait = Summary("Prometheus + Alertmanager (our group_wait)")
    phases: dict[str, float | None] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bw-fault-to-page-") as tmpdir, ExitStack() as stack:
            tmp = Path(tmpdir)
            runs = []
            if not args.no_prometheus:
                wait = our_group_wait_s()
                same_wait.name = f"Prometheus + Alertmanager (group_wait {wait:g} s)"
                runs = [(prom, *start_prometheus(stack, tmp, args, rnd, None, "prometheus")),
                        (same_wait, *start_prometheus(stack, tmp, args, rnd, wait, "prometheus-same-wait"))]
            recreate_database(url)
            ours.trials, bad = run_breakwater(stack, tmp, url, args, rnd)
            for summary, run, prom_url in runs:
                say(f"breakwater: done; waiting for the {run.label} trials to finish")
                run.join()
                if run.error:
                    raise run.error
                summary.trials, phases[run.label] = run.trials, prometheus_phase(prom_url)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            drop_database(url)
    report(ours, prom, same_wait, phases, bad, args.gpus)


if __name__ == "__main__":
    main()
