"""Delivery of agent batches to the ingest API, surviving server outages.

1. A batch is serialised once (JSON, gzip level 1) and POSTed to /api/v1/ingest.
2. Connection errors, 5xx, 429 and 503 are retried a few times with exponential backoff and full
   jitter (a Retry-After header is honoured), so a fleet of agents does not retry in lockstep.
3. If the server is still unreachable, the batch is written to the spool directory (atomically:
   temp file + rename), and later batches queue behind it in order. A Retry-After on the last
   refusal (an overloaded server's 429) holds the pusher off for that long: batches made in the
   meantime go straight to the spool instead of knocking again.
4. Before each new batch, the spool is drained oldest first; the first failure stops the drain.
5. The spool is bounded in bytes: when full, the oldest spooled batches are dropped and their
   samples counted as dropped — never silently.
6. A batch the server refuses as malformed (4xx other than 408/429) is dropped and counted too:
   retrying cannot fix it.

Only the standard library is used: the agent runs on GPU nodes with a small dependency set.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import random
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

RETRYABLE_STATUS = {408, 425, 429, 500, 502, 503, 504}


class PushError(Exception):
    """A push failed; `retryable` says whether trying again later can succeed; `status` is the
    HTTP status, 0 when no answer came."""

    def __init__(self, message: str, *, retryable: bool, retry_after: float | None = None, status: int = 0):
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
        self.status = status


@dataclass
class Health:
    """The agent's own delivery health, reported with every batch it sends."""

    sent_batches: int = 0
    sent_samples: int = 0
    acked_samples: int = 0  # what the server's answers say they stored ("accepted")
    spooled_batches: int = 0
    dropped_samples: dict[str, int] = field(default_factory=dict)
    last_error: str = ""
    last_success: float | None = None

    def drop(self, reason: str, samples: int) -> None:
        self.dropped_samples[reason] = self.dropped_samples.get(reason, 0) + samples


def count_samples(batch: dict) -> int:
    """Field values in a batch (rows or columnar form), the unit the server counts."""
    total = 0
    for key in ("gpus", "migs", "ports", "power"):
        coll = batch.get(key) or []
        if isinstance(coll, dict):
            total += sum(sum(v is not None for v in col) for col in (coll.get("fields") or {}).values())
        else:
            total += sum(len(r.get("fields") or {}) + len(r.get("extra") or {}) for r in coll)
    return total


class Pusher:
    """Sends batches to one Breakwater server, spooling to disk while it is away."""

    def __init__(self, server: str, token: str, spool_dir: Path, *, max_spool_bytes: int = 256 * 1024 * 1024,
                 timeout: float = 10.0, attempts: int = 3, base_delay: float = 0.5, max_delay: float = 10.0):
        self.url = server.rstrip("/") + "/api/v1/ingest"
        self.token = token
        self.spool_dir = Path(spool_dir)
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        self.max_spool_bytes = max_spool_bytes
        self.timeout = timeout
        self.attempts = attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.health = Health(spooled_batches=len(self._spooled()))
        self._seq = 0
        self._hold_until = 0.0  # monotonic time before which the server asked not to be called

    # --- public ---------------------------------------------------------------------------
    def push(self, batch: dict) -> bool:
        """Deliver `batch` now, or spool it. True when it (and any backlog) reached the server."""
        body = gzip.compress(json.dumps(batch, separators=(",", ":")).encode(), compresslevel=1)
        samples = count_samples(batch)
        # Behind a backlog, a new batch waits its turn: the server sees batches in order.
        outcome = self._send_with_retries(body, samples) if self.drain() else "unreachable"
        if outcome == "unreachable":
            self._spool(body, samples)
        return outcome == "sent"

    def drain(self) -> bool:
        """Send spooled batches oldest first; True when the spool is empty afterwards."""
        if time.monotonic() < self._hold_until:
            return not self._spooled()
        for path in self._spooled():
            samples = _samples_in_name(path)
            try:
                self._post(path.read_bytes())
            except PushError as exc:
                self._note_error(exc)
                if exc.retryable:
                    return False
                self.health.drop("refused", samples)
            except OSError as exc:  # unreadable spool file: count it, never stall on it
                self.health.drop("spool_unreadable", samples)
                log.warning("dropping unreadable spool file %s: %s", path, exc)
            else:
                self._sent(samples)
            path.unlink(missing_ok=True)
            self.health.spooled_batches = max(0, self.health.spooled_batches - 1)
        return True

    # --- sending --------------------------------------------------------------------------
    def _send_with_retries(self, body: bytes, samples: int) -> str:
        """"sent", "refused" (dropped and counted) or "unreachable" (the caller spools)."""
        if time.monotonic() < self._hold_until:
            return "unreachable"
        for attempt in range(self.attempts):
            try:
                self._post(body)
            except PushError as exc:
                self._note_error(exc)
                if not exc.retryable:
                    self.health.drop("refused", samples)
                    return "refused"
                if attempt + 1 < self.attempts:
                    time.sleep(self._delay(attempt, exc.retry_after))
                continue
            self._sent(samples)
            return "sent"
        return "unreachable"

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        # Full jitter (AWS architecture blog): spreads a fleet's retries over the whole window.
        cap = min(self.max_delay, self.base_delay * 2**attempt)
        delay = random.uniform(0, cap)
        return max(delay, min(retry_after or 0, self.max_delay))

    def _post(self, body: bytes) -> None:
        req = urllib.request.Request(self.url, data=body, method="POST", headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json",
            "Content-Encoding": "gzip", "User-Agent": "breakwater-agent",
        })
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 (configured server)
                self.health.acked_samples += _accepted(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode(errors="replace")
            retry_after = _retry_after(exc.headers.get("Retry-After"))
            raise PushError(f"HTTP {exc.code}: {detail}", retryable=exc.code in RETRYABLE_STATUS,
                            retry_after=retry_after, status=exc.code) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
            raise PushError(f"cannot reach {self.url}: {getattr(exc, 'reason', exc)}", retryable=True) from None

    def _sent(self, samples: int) -> None:
        self.health.sent_batches += 1
        self.health.sent_samples += samples
        self.health.last_success = time.time()

    def _note_error(self, exc: PushError) -> None:
        self.health.last_error = str(exc)
        if exc.retryable and exc.retry_after:
            self._hold_until = time.monotonic() + min(exc.retry_after, self.max_delay)
        log.warning("push failed (%s): %s", "will retry" if exc.retryable else "dropped", exc)

    # --- the spool ------------------------------------------------------------------------
    def _spooled(self) -> list[Path]:
        return sorted(self.spool_dir.glob("*.json.gz"))

    def _spool(self, body: bytes, samples: int) -> None:
        self._seq += 1
        name = f"{time.time_ns():020d}-{os.getpid()}-{self._seq:06d}-{samples}.json.gz"
        tmp = self.spool_dir / (name + ".tmp")
        tmp.write_bytes(body)
        os.replace(tmp, self.spool_dir / name)  # atomic: a crash never leaves half a batch
        self.health.spooled_batches += 1
        self._enforce_bound()

    def _enforce_bound(self) -> None:
        files = self._spooled()
        total = sum(p.stat().st_size for p in files)
        while files and total > self.max_spool_bytes:
            oldest = files.pop(0)
            total -= oldest.stat().st_size
            self.health.drop("spool_full", _samples_in_name(oldest))
            oldest.unlink(missing_ok=True)
            self.health.spooled_batches -= 1
            log.error("spool over %d bytes: dropped %s", self.max_spool_bytes, oldest.name)


def _samples_in_name(path: Path) -> int:
    try:
        return int(path.name.split(".")[0].rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return 0


def _accepted(ack: bytes) -> int:
    try:
        return int(json.loads(ack).get("accepted", 0))
    except (ValueError, TypeError, AttributeError):
        return 0


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None
