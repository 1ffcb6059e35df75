"""Celery tasks: scoring every minute, retraining daily. Both take an optional ISO `now` so a
replay or a test can run them as of a fixed time; both are safe to run twice."""

from __future__ import annotations

from datetime import datetime

from celery import shared_task
from django.db import OperationalError
from django.utils import timezone

from anomaly.lifecycle import score_all, train_all


def _parse_now(now: str | None) -> datetime:
    if not now:
        return timezone.now()
    at = datetime.fromisoformat(now)
    if at.tzinfo is None:
        raise ValueError(f"now={now!r} has no time zone: give an ISO 8601 time with one, e.g. 2026-11-30T12:00Z")
    return at


# No retries and a short expiry: every pass scores each minute not yet scored (anomaly.lifecycle.score_all keeps
# a watermark per kind), so the next minute's pass is the retry, and a pass lost to a killed worker or dropped
# from the queue as stale costs a delay, not a minute. `now` is for replays and tests; beat sends none.
@shared_task(name="anomaly.tasks.score", acks_late=True, expires=55)
def score(now: str | None = None) -> dict:
    """Score every minute up to `now` that the detectors and the failure model have not scored; returns what
    each recorded, or "skipped" when another worker holds the scoring lock."""
    return score_all(_parse_now(now))


@shared_task(name="anomaly.tasks.train_models", acks_late=True, autoretry_for=(OperationalError,), max_retries=3,
             retry_backoff=60)
def train_models(now: str | None = None, missing_only: bool = False) -> dict:
    """Retrain every model kind that has enough data (or only kinds with no active version);
    promote each only if no worse on its holdout."""
    return train_all(_parse_now(now), missing_only=missing_only)
