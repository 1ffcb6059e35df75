"""The wall-clock loop behind ``manage.py simulate``.

1. Wait until the server answers HTTP (it may still be starting), saying so every attempt.
2. Optionally backfill: step and send the last N minutes at the interval, with a progress bar,
   so charts have history at once, and catch up on the minutes the backfill itself took.
3. Tick on wall-clock multiples of the interval (the first tick at the latest boundary, so a
   run starts at once); a tick steps the cluster and sends one request per rack. A tick that
   overruns the interval is not made up: the loop skips to the present and says so.
Each tick prints one line: time, GPUs, jobs, requests, accepted, rejected, build and send time.

After a tick's telemetry, the snapshot of the jobs that changed (`Tick.jobs`) goes to
``/api/v1/jobs``, then the training bodies (`Tick.training` from scenarios, `Tick.steps`, the
per-rank step times) to ``/api/v1/training``. Each endpoint has a client of its own, made from
the ingest client unless one is given (`close` closes the ones the runner made). Their failures
are reported, never fatal; a job snapshot the server could not take (no answer, 5xx) is sent
again, in order, before the next one, so no state change is skipped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime

from tqdm import tqdm

from telemetry.simulator.client import IngestClient, Summary
from telemetry.simulator.dynamics import Cluster, Tick

MAX_EVENT_LINES = 5
TRAINING_PATH = "/api/v1/training"
JOBS_PATH = "/api/v1/jobs"
MAX_JOB_BACKLOG = 360  # job snapshots kept while the server cannot take them: an hour at 10 s


class ServerUnavailable(RuntimeError):
    """The server did not answer within the wait limit."""


class Runner:
    """Steps a `Cluster` on the clock and pushes each tick through an `IngestClient`."""

    def __init__(self, cluster: Cluster, client: IngestClient, *, interval: float,
                 write: Callable[[str], None], server: str = "",
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep, training: IngestClient | None = None,
                 jobs: IngestClient | None = None):
        self.cluster, self.client, self.interval = cluster, client, interval
        self.training = training or _for_endpoint(client, TRAINING_PATH)
        self.jobs = jobs or _for_endpoint(client, JOBS_PATH)
        self._made = [c for c, given in ((self.training, training), (self.jobs, jobs)) if c and not given]
        self.write, self.server, self.clock, self.sleep = write, server, clock, sleep
        self.last_sent: float | None = None
        self._reasons_shown: set[str] = set()
        self._job_backlog: list[dict] = []

    def close(self) -> None:
        """Close the clients the runner made (not the ones it was given)."""
        for client in self._made:
            client.close()

    def aligned(self, t: float) -> float:
        """The latest interval boundary at or before `t`."""
        return math.floor(t / self.interval) * self.interval

    def wait_for_server(self, timeout: float = 0.0) -> None:
        """Return once the server answers; raise ServerUnavailable after `timeout` s (0: never)."""
        started, delay = self.clock(), 1.0
        while (why := self.client.probe()) is not None:
            if timeout and self.clock() - started >= timeout:
                raise ServerUnavailable(
                    f"{self.server} did not answer within {timeout:.0f} s ({why})"
                )
            self.write(f"waiting for the server at {self.server} ({why}); "
                       f"retrying in {delay:.0f} s")
            self.sleep(delay)
            delay = min(delay * 2, 10.0)

    def backfill(self, minutes: float) -> Summary:
        """Send the ticks of the last `minutes` minutes, oldest first.

        The clock moves while the history goes out, so the backfill keeps going until it
        reaches the present, but sends at most twice its planned ticks: if the server is
        slower than real time it would never catch up, and live ticks matter more.
        """
        count = int(minutes * 60 // self.interval)
        t = self.aligned(self.clock()) - count * self.interval
        total, sent = Summary(), 0
        bar = tqdm(total=count, desc="backfill", unit="tick", disable=count == 0)
        while sent < 2 * count and t < self.aligned(self.clock()):
            summary, _ = self._send(t)
            total.merge(summary)
            sent, t = sent + 1, t + self.interval
            behind = int((self.aligned(self.clock()) - t) // self.interval)
            bar.total = max(bar.total, sent + behind)
            bar.set_postfix(accepted=total.accepted, rejected=total.rejected, failed=total.failed)
            bar.update()
        bar.close()
        self.write(f"backfill: {sent} ticks, {total.requests} requests, "
                   f"{total.accepted} accepted, {total.rejected} rejected, {total.failed} failed"
                   + (f" (first error: {total.errors[0]})" if total.errors else ""))
        self._show_rejections(total)
        return total

    def run(self, ticks: int | None = None) -> None:
        """Tick on the clock `ticks` times (forever when None)."""
        t = self.aligned(self.clock())
        if self.last_sent is not None and t <= self.last_sent:
            t = self.last_sent + self.interval
        done = 0
        while ticks is None or done < ticks:
            delay = t - self.clock()
            if delay > 0:
                self.sleep(delay)
            self.tick(t)
            done += 1
            t += self.interval
            behind = int((self.clock() - t) // self.interval)
            if behind >= 1 and (ticks is None or done < ticks):
                self.write(f"a tick took longer than the {self.interval:g} s interval; "
                           f"skipping {behind} tick(s) to catch up")
                t += behind * self.interval

    def tick(self, t: float) -> Summary:
        """Step, send and print one tick at epoch time `t`."""
        summary, tick = self._send(t)
        self.write(progress_line(tick, summary))
        for line in tick.events[:MAX_EVENT_LINES]:
            self.write(f"  event: {line}")
        if len(tick.events) > MAX_EVENT_LINES:
            self.write(f"  … and {len(tick.events) - MAX_EVENT_LINES} more events")
        for err in summary.errors[:3]:
            self.write(f"  error: {err}")
        if tick.stats.get("jobs_error"):
            self.write(f"  job snapshot not stored: {tick.stats['jobs_error']}")
        if tick.stats.get("training_error"):
            self.write(f"  training metrics not stored: {tick.stats['training_error']}")
        self._show_rejections(summary)
        return summary

    def _show_rejections(self, summary: Summary) -> None:
        # Rejection reasons repeat every tick (an unknown switch stays unknown): say each once.
        for reason in summary.rejections:
            if reason not in self._reasons_shown and len(self._reasons_shown) < 20:
                self._reasons_shown.add(reason)
                self.write(f"  rejected: {reason}" + ("" if "unknown" not in reason else
                           " (was the topology imported? run without --no-topology)"))

    def _send(self, t: float) -> tuple[Summary, Tick]:
        tick = self.cluster.step(datetime.fromtimestamp(t, UTC))
        started = time.perf_counter()
        summary = self.client.send_many([tick.body(b) for b in tick.batches if _has_records(b)])
        self._send_jobs(tick)
        training = tick.training + tick.steps
        if self.training is not None and training:
            sent = self.training.send_many(training)
            tick.stats["training_error"] = sent.errors[0] if sent.errors else ""
        tick.stats["send_ms"] = (time.perf_counter() - started) * 1000
        self.last_sent = t
        return summary, tick

    def _send_jobs(self, tick: Tick) -> None:
        """Send the waiting job snapshots oldest first; keep the rest when the server is away."""
        if self.jobs is None:
            return
        if tick.jobs:
            self._job_backlog.append(tick.jobs)
        del self._job_backlog[:-MAX_JOB_BACKLOG]
        while self._job_backlog:
            result = self.jobs.send(self._job_backlog[0])
            if not result.ok:
                tick.stats["jobs_error"] = result.error
                if not 400 <= result.status < 500:
                    return  # no answer or 5xx after the retries: try again next tick
            self._job_backlog.pop(0)  # stored, or refused for good (4xx)


def progress_line(tick: Tick, s: Summary) -> str:
    st = tick.stats
    line = (f"{tick.iso} gpus={st['gpus']} busy={st['busy_gpus']} jobs={st['jobs']} pending={st.get('pending', 0)} "
            f"it={st['it_kw']:.0f}kW requests={s.requests} accepted={s.accepted} "
            f"rejected={s.rejected} build={st['build_ms']:.0f}ms send={st.get('send_ms', 0):.0f}ms "
            f"sent={s.body_bytes / 1e6:.1f}MB")
    if s.failed or s.retries:
        line += f" failed={s.failed} retries={s.retries}"
    if st.get("down_nodes"):
        line += f" down_nodes={st['down_nodes']}"
    return line


def _for_endpoint(client: IngestClient, path: str) -> IngestClient | None:
    # Stand-ins for the HTTP edge (tests) post nowhere else.
    return client.for_endpoint(path) if isinstance(client, IngestClient) else None


def _has_records(batch: dict) -> bool:
    return bool(batch["gpus"] or batch["ports"] or batch["power"] or batch.get("events"))

