"""A tiny client a training job calls once per step, per rank (stdlib only; never raises into training).

    from telemetry.agent.training import TrainingReporter
    reporter = TrainingReporter("https://breakwater:8000", token, job="slurm:" + os.environ["SLURM_JOB_ID"],
                                rank=int(os.environ["RANK"]))
    reporter.step(step, step_time_s=dt, compute_time_s=compute, loss=loss.item(), grad_norm=gn)
    reporter.close()

Steps are buffered and sent every `flush_every` steps (or `flush_seconds`), in the background of
the training loop's own thread: a failed send keeps the buffer (bounded) for the next flush.
"""

from __future__ import annotations

import json
import logging
import math
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime

log = logging.getLogger(__name__)


class TrainingReporter:
    """Buffers per-step metrics of one rank and posts them to /api/v1/training."""

    def __init__(self, server: str, token: str, *, job: str, rank: int, flush_every: int = 20,
                 flush_seconds: float = 10.0, max_buffer: int = 10_000, timeout: float = 5.0):
        self.url = server.rstrip("/") + "/api/v1/training"
        self.token, self.job, self.rank = token, job, rank
        self.flush_every, self.flush_seconds = flush_every, flush_seconds
        self.max_buffer, self.timeout = max_buffer, timeout
        self.buffer: list[dict] = []
        self.dropped = 0
        self._last_flush = time.monotonic()

    def step(self, step: int, *, step_time_s: float | None = None, compute_time_s: float | None = None,
             loss: float | None = None, grad_norm: float | None = None, tokens_per_s: float | None = None,
             nan_count: int = 0, inf_count: int = 0) -> None:
        """Record one step; NaN/Inf values are counted (the divergence signal) and sent as missing.

        `compute_time_s` is this rank's forward and backward without the time spent waiting in
        collectives (docs/training.md measures it with CUDA events): in a synchronous job every
        rank's step time is the same, and only this shows which rank the others wait for."""
        rec = {"rank": self.rank, "step": step, "time": datetime.now(UTC).isoformat(),
               "nan_count": nan_count, "inf_count": inf_count}
        for key, value in (("step_time_s", step_time_s), ("compute_time_s", compute_time_s), ("loss", loss),
                           ("grad_norm", grad_norm), ("tokens_per_s", tokens_per_s)):
            if value is not None and not math.isfinite(value):
                rec["nan_count" if math.isnan(value) else "inf_count"] += 1
                value = None
            rec[key] = value
        self.buffer.append(rec)
        if len(self.buffer) > self.max_buffer:  # server away for long: keep the newest, count the rest
            self.dropped += len(self.buffer) - self.max_buffer
            del self.buffer[: len(self.buffer) - self.max_buffer]
        if len(self.buffer) >= self.flush_every or time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()

    def flush(self) -> bool:
        """Send the buffer now; False (buffer kept) when the server did not take it."""
        self._last_flush = time.monotonic()
        if not self.buffer:
            return True
        body = json.dumps({"job": self.job, "records": self.buffer}).encode()
        req = urllib.request.Request(self.url, data=body, method="POST", headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 (configured server)
                resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code < 500 and exc.code not in (408, 429):
                log.error("training metrics refused (HTTP %s): dropping %d steps", exc.code, len(self.buffer))
                self.dropped += len(self.buffer)
                self.buffer.clear()
            return False
        except (urllib.error.URLError, OSError) as exc:
            log.warning("training metrics not sent (%s); will retry", exc)
            return False
        self.buffer.clear()
        return True

    def close(self) -> None:
        self.flush()
