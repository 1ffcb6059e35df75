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
from django.conf import settings
from django.db import OperationalError
from django.utils import timezone

from telemetry import rollups
from telemetry.ingest.scrape import scrape_target
from telemetry.live import publish_on_health_change
from telemetry.models import ScrapeTarget
from telemetry.slurm.poll import cli_runner, poll_slurm


def _parse_now(now: str | None) -> datetime | None:
    """`now` travels as ISO 8601 (a datetime is not JSON); it must carry its timezone."""
    if now is None:
        return None
    parsed = datetime.fromisoformat(now)
    if parsed.tzinfo is None:
        raise ValueError(f"now={now!r} has no timezone; send an aware ISO 8601 timestamp")
    return parsed


# No retries: beat runs the next pass in 30 s, which is the retry.
@shared_task(name="telemetry.tasks.run_rollups", acks_late=True)
def run_rollups(now: str | None = None) -> list[dict]:
    """Fill the 1m and 1h rollups up to `now` (default: the current time)."""
    runs = rollups.run_rollups(_parse_now(now))
    return [{**asdict(r), "done_until": r.done_until and r.done_until.isoformat()} for r in runs]


# Hourly, so a dropped database connection is worth a few bounded retries before the next run.
@shared_task(
    name="telemetry.tasks.apply_retention", acks_late=True,
    autoretry_for=(OperationalError,), max_retries=3, retry_backoff=30,
)
def apply_retention(now: str | None = None) -> dict[str, int]:
    """Drop chunks past their retention; returns the chunks dropped per table."""
    return rollups.apply_retention(_parse_now(now))


# --- Scraping --------------------------------------------------------------------------------
@shared_task(name="telemetry.tasks.scrape_targets", acks_late=True)
def scrape_targets() -> int:
    """Fan out one scrape task per enabled dcgm-exporter target; returns how many were queued."""
    ids = list(ScrapeTarget.objects.filter(enabled=True).values_list("id", flat=True))
    for target_id in ids:
        scrape_one.delay(target_id)
    return len(ids)


# A scrape older than one beat interval is worthless: the next beat brings a fresher one.
@shared_task(name="telemetry.tasks.scrape_one", acks_late=True, expires=15)
def scrape_one(target_id: int) -> int:
    """Scrape one target through the ingest path; returns the samples stored (0 on error)."""

    target = ScrapeTarget.objects.filter(pk=target_id, enabled=True).first()
    if target is None:
        return 0
    result = scrape_target(target)
    return result.accepted if result else 0


# --- Schedulers ------------------------------------------------------------------------------
@shared_task(name="telemetry.tasks.sync_slurm", acks_late=True)
def sync_slurm() -> dict[str, int]:
    """Poll Slurm (squeue, scontrol -d, sacct) into jobs and the allocation ledger."""
    return poll_slurm(cli_runner(settings.SLURM_COMMAND_PREFIX), now=timezone.now())


@shared_task(name="telemetry.tasks.publish_health_changes", expires=2)
def publish_health_changes() -> bool:
    """Push live pages when a state changed with time alone (a GPU gone silent): `telemetry.live`."""
    return publish_on_health_change()
