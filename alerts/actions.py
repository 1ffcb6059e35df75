"""Writes of the alerts app outside the lifecycle: triggering rule evaluation from ingest.

Ingest drives evaluation, so an XID reaches an alert within seconds, not at the next poll. Every ingest
commit calls `schedule_evaluation()`; at 16k GPUs that is many commits a second, so the trigger is
debounced through Redis:

1. a trigger sets the flag with `SET key NX EX` and, only if it set it, queues one `evaluate` task;
   triggers while the flag stands do nothing (one Redis round trip each);
2. the evaluation clears the flag as it starts, before it reads anything, so a commit that lands during a
   running evaluation sets the flag again and queues exactly one more run, which sees that commit;
3. the flag expires on its own (FLAG_TTL_S), so a lost task (a worker killed, Redis restarted) cannot stall
   evaluation for longer than that; the beat's evaluate every 10 s is the backstop;
4. a triggered run starts no sooner than PACE times its predecessor's duration after that one started
   (at most MAX_PACING_S later), so evaluation keeps to about 1/PACE of a worker slot (and of the
   database's time, where most of a pass is spent) however fast commits come. On bench/fault_to_page's
   176 GPUs a pass took 0.05 s, so the pacing is the minimum spacing below. At 16k GPUs commits arrive
   all through each 10 s tick: unpaced runs went back to back (75 a minute, 35-55 s of a worker's minute)
   and the 2-core soak fell behind on ingest. With PACE 2 the 2026-12-02 soak still ran ~55 passes a
   minute averaging 0.45 s, ~25 s of every minute, mostly in PostgreSQL, re-reading a fleet whose samples
   arrive every 10 s; PACE 6 holds a 0.45-s pass to one every ~2.7 s. A commit reaches a run at most
   MAX_PACING_S plus one pass later, which keeps fault-to-page inside its 5 s target at any size.
   And never sooner than MIN_SPACING_S after its predecessor started: once a 16k-GPU pass fell to ~0.2 s
   (rate rules on their own cadence), pacing by duration alone let ~110 runs a minute through;
5. a commit that opened a new fault event (an XID, a double-bit ECC error) is urgent: its run is queued at
   once, unpaced, even while a paced run waits, debounced by a flag of its own. New faults are rare beside
   samples, so this costs little; under the 16k simulator's load the pacing alone put fault-to-page's p95
   at 6.6 s against its 5-s target.
"""

from __future__ import annotations

import logging
import time

import redis
from django.conf import settings

from core.queue import enqueue
from core.redis_client import shared_client

logger = logging.getLogger(__name__)

FLAG_TTL_S = 30
PACE = 6.0
MIN_SPACING_S = 1.0
MAX_PACING_S = 3.0


def evaluation_flag_key() -> str:
    """Per Celery queue, so the test suite and a `./dev up` on the same Redis never share the flag."""
    return f"{settings.CELERY_TASK_DEFAULT_QUEUE}:alerts:evaluation-queued"


def urgent_flag_key() -> str:
    return f"{settings.CELERY_TASK_DEFAULT_QUEUE}:alerts:evaluation-urgent"


def pacing_key() -> str:
    return f"{settings.CELERY_TASK_DEFAULT_QUEUE}:alerts:evaluation-last"


def record_evaluation(started: float, duration_s: float) -> None:
    """Remember when the last evaluation started (epoch seconds) and how long it took. Never raises."""
    try:
        shared_client().set(pacing_key(), f"{started:.3f} {duration_s:.3f}", ex=FLAG_TTL_S)
    except redis.RedisError as exc:
        logger.warning("could not record the alert evaluation's duration: %s", exc)


def pacing_delay(now: float) -> float:
    """Seconds the next triggered evaluation should wait (0 when the last one is long enough ago)."""
    raw = shared_client().get(pacing_key())
    try:
        started, duration = map(float, raw.split())
    except (AttributeError, ValueError):  # none recorded yet (or not ours to read): no pacing
        return 0.0
    return min(MAX_PACING_S, max(0.0, started + max(PACE * duration, MIN_SPACING_S) - now))


def schedule_evaluation(*, urgent: bool = False) -> None:
    """Queue one rule evaluation unless one is already queued; `urgent` (a new fault event): queue it now,
    unpaced, unless an urgent one is already queued. Never raises (it runs after ingest commits)."""
    key = urgent_flag_key() if urgent else evaluation_flag_key()
    try:
        if not shared_client().set(key, "1", nx=True, ex=FLAG_TTL_S):
            return
        delay = 0.0 if urgent else pacing_delay(time.time())
    except redis.RedisError as exc:
        logger.warning("alert evaluation not scheduled (Redis): %s", exc)
        return
    try:
        enqueue("alerts.tasks.evaluate", countdown=delay if delay >= 0.01 else None)
    except Exception:
        logger.exception("alert evaluation not scheduled (broker)")
        _clear(key)


def clear_evaluation_flag() -> None:
    """Called as an evaluation starts: later commits queue the next run, urgent or paced. Never raises."""
    _clear(evaluation_flag_key(), urgent_flag_key())


def _clear(*keys: str) -> None:
    try:
        shared_client().delete(*keys)
    except redis.RedisError as exc:
        logger.warning("could not clear the alert evaluation flag: %s", exc)
