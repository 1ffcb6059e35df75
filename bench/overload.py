"""bench/overload: offered twice what it can sustain, the ingest API sheds load with 429 + Retry-After,
and once the load ends every sample the agents made is in the database — counted exactly.

1. Phase 1 measures the sustainable rate: closed loop, --clients connections posting realistic agent
   batches (one 8-GPU node × 30 fields, gzip) back to back; sustainable_rps = 200 answers per second.
2. Phase 2 offers --factor × that rate for --seconds, open loop: simulated agents, each the real
   telemetry.agent.pusher.Pusher with its own spool directory, tick on a fixed schedule whether or not
   the server keeps up (a tick that falls behind still makes its batch: the pusher spools it).
3. The load stops; every pusher drains its spool (honouring the Retry-After it is given).
4. Every sample has a unique (GPU, time), so the count is exact: generated = in the database, with
   the acknowledgements (from the answers' "accepted"), the spool and the drops reported beside it.

Memory: the daphne process's RSS is read from /proc every second. "Bounded" = the peak during
overload and drain is at most --rss-limit-mb above the phase-1 peak. The admitted work is the same in
both phases (INGEST_MAX_INFLIGHT running, INGEST_MAX_WAITING queued), so what may grow is only the
per-connection state of the many more agents knocking at once (socket buffers, a Request, a refused
body: a few tens of KB each, so ~10-20 MB for a few hundred agents) plus allocator slack. 64 MB allows
that with room, while an unbounded backlog, the failure this guards against, holds every waiting
batch: at 2× the sustainable rate it adds sustainable_rps × 30 KB of bodies (plus their requests)
every second, past 64 MB within about a minute on any server worth measuring, and without end.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import logging
import math
import os
import random
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

from _common import daphne_server, drop_database, recreate_database, say, scratch_database_url, setup_django
from ingest import FIELDS, QUIET

GPUS_PER_NODE = 8


def make_batch(node: int, t: datetime, rnd: random.Random, report: dict | None = None) -> dict:
    """One node's agent batch at instant `t` (rows form, as the agent sends it)."""
    from telemetry.fields import COUNTER, KINDS

    spec = KINDS["gpu"].by_name
    stamp = t.isoformat()
    gpus = []
    for g in range(GPUS_PER_NODE):
        # Counters grow with the sample time, so no batch looks like a counter reset.
        vals = {f: 0 if f in QUIET else (int(t.timestamp()) * 10 + g if spec[f].kind == COUNTER else
                                         round(rnd.uniform(0, 100), 2)) for f in FIELDS}
        gpus.append({"host": f"ovl-{node:05d}", "uuid": f"GPU-ovl-{node:05d}-{g}", "index": g,
                     "model": "NVIDIA H100 80GB HBM3", "time": stamp, "fields": vals})
    batch = {"time": stamp, "gpus": gpus}
    if report is not None:
        batch["agent"] = {"host": f"ovl-{node:05d}", **report}
    return batch


def samples_of(batch: dict) -> int:
    return sum(len(g["fields"]) for g in batch["gpus"])


class Rss:
    """Samples one process's resident set size every second, labelled with the current phase."""

    def __init__(self, pid: int):
        self.pid, self.phase, self.peaks = pid, "start", Counter()
        self.last = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def read(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.last = self.read()
            except OSError:
                return
            self.peaks[self.phase] = max(self.peaks[self.phase], self.last)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def daphne_pid() -> int:
    """The daphne process this script started (the one child whose command line names daphne)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (proc / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"daphne" in cmd:
            return int(proc.name)
    raise RuntimeError("the daphne process was not found among this script's children")


# --- phase 1: closed loop ----------------------------------------------------------------------

def closed_loop(base: str, tokens: list[str], *, pool: int, clients: int, seconds: float, t0: datetime,
                statuses: Counter) -> int:
    """`clients` connections posting batches back to back for `seconds`; returns the 200s."""
    host, port = base.split("//")[1].split(":")
    lock, seq, ok = threading.Lock(), [0], [0]
    end = time.monotonic() + seconds

    def client(c: int) -> None:
        rnd, conn = random.Random(c), http.client.HTTPConnection(host, int(port), timeout=60)
        while time.monotonic() < end:
            with lock:
                n = seq[0]
                seq[0] += 1
            node = n % pool
            body = gzip.compress(json.dumps(make_batch(node, t0 + timedelta(seconds=n // pool), rnd)).encode(), 1)
            conn.request("POST", "/api/v1/ingest", body=body, headers={
                "Authorization": f"Bearer {tokens[node]}", "Content-Type": "application/json",
                "Content-Encoding": "gzip"})
            resp = conn.getresponse()
            data = resp.read()
            with lock:
                statuses[resp.status] += 1
                ok[0] += resp.status == 200 and time.monotonic() <= end
            if resp.status == 429:
                time.sleep(float(resp.headers.get("Retry-After") or 1))
            elif resp.status != 200:
                raise RuntimeError(f"ingest answered {resp.status}: {data[:300]!r}")
        conn.close()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ok[0]


# --- phase 2: open loop through the real Pusher -------------------------------------------------

def counting_pusher_class(statuses: Counter, lock: threading.Lock):
    from telemetry.agent.pusher import Pusher, PushError

    class CountingPusher(Pusher):
        """The real Pusher; only its answers are tallied (0 = no answer: timeout or refused connection)."""

        def _post(self, body: bytes) -> None:
            try:
                super()._post(body)
            except PushError as exc:
                with lock:
                    statuses[exc.status] += 1
                raise
            with lock:
                statuses[200] += 1

    return CountingPusher


class Agent:
    """One simulated node agent: a batch per tick on a fixed schedule, pushed with the real Pusher."""

    def __init__(self, node: int, pusher, *, first_tick: float, interval: float, t0: datetime):
        self.node, self.pusher, self.first_tick, self.interval, self.t0 = node, pusher, first_tick, interval, t0
        self.batches = self.samples = 0
        self.rnd = random.Random(node)

    def run(self, end: float) -> None:
        k = 0
        while (due := self.first_tick + k * self.interval) < end:
            if (wait := due - time.monotonic()) > 0:
                time.sleep(wait)
            h = self.pusher.health
            report = {"sent_batches": h.sent_batches, "spooled_batches": h.spooled_batches}
            # The sample time is the tick number: unique per GPU whatever the wall clock did.
            batch = make_batch(self.node, self.t0 + timedelta(seconds=k), self.rnd, report)
            self.batches += 1
            self.samples += samples_of(batch)
            self.pusher.push(batch)
            k += 1

    def drain(self, deadline: float) -> None:
        while not self.pusher.drain() and time.monotonic() < deadline:
            time.sleep(0.2)


def run_threads(targets: list, progress, every: float = 5.0) -> None:
    threads = [threading.Thread(target=t) for t in targets]
    for t in threads:
        t.start()
    next_report = time.monotonic() + every
    while any(t.is_alive() for t in threads):
        time.sleep(0.2)
        if time.monotonic() >= next_report:
            progress()
            next_report += every


def db_counts(t0: datetime, t1: datetime) -> tuple[int, int]:
    """(rows, field values) stored for the simulated agents' GPUs between t0 and t1."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*), coalesce(sum(num_nonnulls({', '.join(FIELDS)})), 0) "
                    "FROM telemetry_gpu_sample s JOIN telemetry_gpu g ON g.id = s.gpu_id "
                    "WHERE g.uuid LIKE 'GPU-ovl-%%' AND s.time >= %s AND s.time < %s", [t0, t1])
        rows, values = cur.fetchone()
    return rows, int(values)


def table(statuses: Counter) -> None:
    total = sum(statuses.values()) or 1
    say("  status   requests   share")
    for code in sorted(statuses):
        say(f"  {code or 'none':>6} {statuses[code]:>10} {statuses[code] / total:>7.1%}")


def main() -> None:  # noqa: PLR0915  (one linear script: phases in order)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60, help="length of the overload (phase 2)")
    ap.add_argument("--phase1-seconds", type=float, default=20)
    ap.add_argument("--clients", type=int, default=12, help="phase-1 connections (3x the default 4 slots)")
    ap.add_argument("--factor", type=float, default=2.0, help="offered rate / sustainable rate")
    ap.add_argument("--pool", type=int, default=400, help="simulated nodes (agents) at most")
    ap.add_argument("--rss-limit-mb", type=float, default=64)
    ap.add_argument("--drain-timeout", type=float, default=600)
    ap.add_argument("--keep", action="store_true", help="keep the scratch database for inspection")
    args = ap.parse_args()
    url = scratch_database_url("overload")
    recreate_database(url)
    setup_django(url)
    # Each refused push logs a warning in the agent: hundreds a second here, drowning the progress lines.
    logging.getLogger("telemetry.agent.pusher").setLevel(logging.ERROR)
    from telemetry.actions import do_create_collector_token

    tokens = [do_create_collector_token(f"agent-ovl-{n:05d}") for n in range(args.pool)]
    now = datetime.now(UTC).replace(microsecond=0)
    t_warm, t_p1, t_p2 = now - timedelta(hours=4), now - timedelta(hours=3), now - timedelta(hours=1)
    p1_status, p2_status, lock = Counter(), Counter(), threading.Lock()
    try:
        with daphne_server(url) as base, tempfile.TemporaryDirectory(prefix="bw-overload-") as spools:
            rss = Rss(daphne_pid())
            say(f"warm-up: registering {args.pool} nodes ({args.pool * GPUS_PER_NODE} GPUs)")
            warm(base, tokens, t_warm)
            rss.phase = "phase1"
            say(f"phase 1: closed loop, {args.clients} connections, {args.phase1_seconds:.0f} s")
            ok = closed_loop(base, tokens, pool=args.pool, clients=args.clients, seconds=args.phase1_seconds,
                             t0=t_p1, statuses=p1_status)
            sustainable = ok / args.phase1_seconds
            say(f"phase 1: {ok} batches stored = {sustainable:.1f} batches/s sustainable "
                f"({sustainable * GPUS_PER_NODE * len(FIELDS):,.0f} samples/s); daphne RSS peak "
                f"{rss.peaks['phase1']:.0f} MB")
            table(p1_status)

            offered = args.factor * sustainable
            n_agents = max(1, min(args.pool, math.ceil(offered)))
            interval = n_agents / offered
            pusher_cls = counting_pusher_class(p2_status, lock)
            start = time.monotonic() + 1.0
            rnd = random.Random(2)
            agents = [Agent(n, pusher_cls(base, tokens[n], Path(spools) / f"agent-{n:05d}"),
                            first_tick=start + rnd.uniform(0, interval), interval=interval, t0=t_p2)
                      for n in range(n_agents)]
            end = start + args.seconds
            rss.phase = "phase2"
            say(f"phase 2: {n_agents} agents, one batch each every {interval:.2f} s = {offered:.1f} batches/s "
                f"offered ({args.factor:g}x) for {args.seconds:.0f} s, open loop")

            def progress() -> None:
                spooled = sum(a.pusher.health.spooled_batches for a in agents)
                with lock:
                    seen = dict(sorted(p2_status.items()))
                say(f"  t={time.monotonic() - start:5.0f} s  made {sum(a.batches for a in agents):6d} batches  "
                    f"answers {seen}  spooled {spooled}  daphne RSS {rss.last:.0f} MB")

            run_threads([lambda a=a: a.run(end) for a in agents], progress)
            elapsed = time.monotonic() - start
            made = sum(a.batches for a in agents)
            with lock:
                goodput = p2_status[200] / elapsed
            say(f"under overload the server stored {goodput:.1f} batches/s ({goodput / sustainable:.0%} of phase 1; "
                f"here the {n_agents} agents share the same CPUs with it)")
            offered_rps = made / args.seconds
            say(f"load stopped after {elapsed:.0f} s; draining {sum(a.pusher.health.spooled_batches for a in agents)}"
                f" spooled batches")
            rss.phase = "drain"
            deadline = time.monotonic() + args.drain_timeout
            run_threads([lambda a=a: a.drain(deadline) for a in agents], progress)
            rss.stop()
            with lock:
                table(p2_status)
            generated = sum(a.samples for a in agents)
            acked = sum(a.pusher.health.acked_samples for a in agents)
            spooled = sum(a.pusher.health.spooled_batches for a in agents)
            dropped = sum(sum(a.pusher.health.dropped_samples.values()) for a in agents)
            rows, stored = db_counts(t_p2, t_p2 + timedelta(days=1))
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            drop_database(url)
    lost = generated - stored
    peak1, peak2 = rss.peaks["phase1"], max(rss.peaks["phase2"], rss.peaks["drain"])
    growth = peak2 - peak1
    refused = p2_status[429] / max(1, sum(p2_status.values()))
    say(f"samples: generated {generated:,}  acknowledged {acked:,} (duplicates acked {acked - stored:,})  "
        f"still spooled {spooled} batches  dropped {dropped:,}  in the database {stored:,} ({rows:,} rows)")
    say(f"429 share of phase-2 requests: {refused:.1%}; 5xx: {sum(v for k, v in p2_status.items() if k >= 500)}")
    say(f"daphne RSS: phase-1 peak {peak1:.0f} MB, overload+drain peak {peak2:.0f} MB, growth {growth:.0f} MB "
        f"(limit {args.rss_limit_mb:g} MB)")
    passed = lost == 0 and spooled == 0 and growth <= args.rss_limit_mb and p2_status[429] > 0
    print(f"RESULT overload sustainable_rps={sustainable:.1f} offered_rps={offered_rps:.1f} lost={lost} "
          f"rss_growth_mb={growth:.1f} target=lost=0 {'PASS' if passed else 'FAIL'}", flush=True)


def warm(base: str, tokens: list[str], t: datetime) -> None:
    """One batch per node, so phase 1 measures steady ingest, not first-time GPU registration."""
    host, port = base.split("//")[1].split(":")
    rnd = random.Random(0)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    for node, token in enumerate(tokens):
        conn.request("POST", "/api/v1/ingest", body=json.dumps(make_batch(node, t, rnd)),
                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"warm-up answered {resp.status}: {data[:300]!r}")
    conn.close()


if __name__ == "__main__":
    main()
