"""Celery tasks owned by telemetry; beat schedules them (see CELERY_BEAT_SCHEDULE in settings).

Tasks only parse their arguments and call one function that does the work. Every task is safe
to run twice (acks_late redelivers a task whose worker died): rollups redo buckets by
overwriting them and skip a rollup another worker is filling, and dropping already-dropped
chunks is a no-op.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime

from celery import shared_task

from telemetry import rollups


def _parse_now(now: str | None) -> datetime | None:
    """`now` travels as ISO 8601 (a datetime is not JSON); it must carry its timezone."""
    if now is None:
        return None
    parsed = datetime.fromisoformat(now)
    if parsed.tzinfo is None:
        raise ValueError(f"now={now!r} has no timezone; send an aware ISO 8601 timestamp")
    return parsed


@shared_task(name="telemetry.tasks.run_rollups", acks_late=True)
def run_rollups(now: str | None = None) -> list[dict]:
    """Fill the 1m and 1h rollups up to `now` (default: the current time)."""
    runs = rollups.run_rollups(_parse_now(now))
    return [{**asdict(r), "done_until": r.done_until and r.done_until.isoformat()} for r in runs]


@shared_task(name="telemetry.tasks.apply_retention", acks_late=True)
def apply_retention(now: str | None = None) -> dict[str, int]:
    """Drop chunks past their retention; returns the chunks dropped per table."""
    return rollups.apply_retention(_parse_now(now))


# --- Scraping --------------------------------------------------------------------------------
# `telemetry.tasks.scrape_targets` (beat: every 15 s) goes here: it pulls the enabled
# ScrapeTarget endpoints through the ingest path.
