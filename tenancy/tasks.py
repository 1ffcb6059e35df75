"""Celery tasks of the tenancy app; beat schedules them (CELERY_BEAT_SCHEDULE in settings).

Tasks parse their arguments and call one function. Metering recomputes whole hours under a lock, so a task
run twice (acks_late redelivery, or beat overlapping a manual run) writes the same rows twice, no more.
"""

from __future__ import annotations

from datetime import datetime

from celery import shared_task
from django.utils import timezone

from tenancy.metering import run_metering


def _aware(value: str | None, name: str) -> datetime | None:
    """A datetime travels as ISO 8601 (JSON has none); it must carry its timezone."""
    if value is None:
        return None
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"{name}={value!r} has no timezone; send an aware ISO 8601 timestamp")
    return parsed


# No retries: beat runs the next pass in 5 minutes, which re-meters the same hours.
@shared_task(name="tenancy.tasks.meter", acks_late=True)
def meter(now: str | None = None, since: str | None = None) -> dict:
    """Meter the complete hours up to `now` (default: the current time), from `since` if given."""
    out = run_metering(_aware(now, "now") or timezone.now(), since=_aware(since, "since"))
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in out.items()}
