"""Pull side of Prometheus ingest: fetch a dcgm-exporter /metrics endpoint and write it through
the same validated batch writer as a push."""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime

from django.conf import settings
from django.utils import timezone

from telemetry.ingest.exposition import parse_dcgm_exposition
from telemetry.ingest.schema import BatchError, TimeParser
from telemetry.ingest.writer import WriteResult, write_batch
from telemetry.models import ScrapeTarget

log = logging.getLogger(__name__)


class ScrapeError(Exception):
    """The endpoint could not be fetched or its text was malformed."""


def fetch(url: str, timeout: float, limit: int) -> bytes:
    req = urllib.request.Request(
        url, headers={"Accept": "text/plain;version=0.0.4", "User-Agent": "breakwater-scraper"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (operator-configured URL)
            body = resp.read(limit + 1)
    except urllib.error.HTTPError as exc:
        raise ScrapeError(f"HTTP {exc.code} from {url}") from exc
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise ScrapeError(f"cannot fetch {url}: {getattr(exc, 'reason', exc)}") from exc
    if len(body) > limit:
        raise ScrapeError(f"{url} returned more than {limit} bytes")
    return body


def scrape_target(target: ScrapeTarget) -> WriteResult | None:
    """Scrape one target; the outcome (samples or the error) is recorded on the target."""
    t0 = time.perf_counter()
    try:
        body = fetch(target.url, settings.SCRAPE_TIMEOUT_SECONDS, settings.INGEST_MAX_BODY_BYTES)
        times = TimeParser(datetime.now(UTC), settings.INGEST_MAX_FUTURE_SKEW, settings.RETENTION["raw"])
        batch, _blanks = parse_dcgm_exposition(body, times, target.hostname or None)
        result = write_batch(batch, collector=f"scrape:{target.url}"[:128], fmt="prometheus", body_bytes=len(body))
    except (ScrapeError, BatchError) as exc:
        log.warning("scrape of %s failed: %s", target.url, exc)
        ScrapeTarget.objects.filter(pk=target.pk).update(
            last_scrape=timezone.now(), last_error=str(exc)[:2000], last_samples=0
        )
        return None
    ScrapeTarget.objects.filter(pk=target.pk).update(
        last_scrape=timezone.now(), last_error="", last_samples=result.accepted
    )
    log.info("scraped %s: %d samples in %.0f ms", target.url, result.accepted, (time.perf_counter() - t0) * 1000)
    return result
