"""Celery tasks: scoring every minute, retraining daily. Both take an optional ISO `now` so a
replay or a test can run them as of a fixed time; both are safe to run twice."""

from __future__ import annotations

from datetime import datetime

from celery import shared_task
from django.db import OperationalError
from django.utils import timezone


def _parse_now(now: str | None) -> datetime:
    return datetime.fromisoformat(now) if now else timezone.now()


# No retries: beat runs the next pass in a minute, which is the retry. expires: a pass that
# waited in the queue past the next one is stale, so it is dropped rather than run late.
@shared_task(name="anomaly.tasks.score", acks_late=True, expires=55)
def score(now: str | None = None) -> dict:
    """Run every detector and the failure model as of `now`; returns what each recorded."""
    from anomaly.lifecycle import score_all

    return score_all(_parse_now(now))


@shared_task(name="anomaly.tasks.train_models", acks_late=True, autoretry_for=(OperationalError,), max_retries=3,
             retry_backoff=60)
def train_models(now: str | None = None, missing_only: bool = False) -> dict:
    """Retrain every model kind that has enough data (or only kinds with no active version);
    promote each only if no worse on its holdout."""
    from anomaly.lifecycle import train_all

    return train_all(_parse_now(now), missing_only=missing_only)
