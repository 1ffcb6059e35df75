"""Ingest bookkeeping: collector tokens, the per-batch log, scrape targets, rollup watermarks."""

from __future__ import annotations

import hashlib
import secrets

from django.db import models

from core.api import COLLECTOR_TOKEN_PREFIX


class CollectorToken(models.Model):
    """A per-collector ingest credential; only its SHA-256 is stored."""

    name = models.CharField(max_length=128, unique=True)
    prefix = models.CharField(max_length=12, help_text="First characters, to recognise a token in logs")
    token_hash = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    TOKEN_PREFIX = COLLECTOR_TOKEN_PREFIX

    @staticmethod
    def hash(raw: str) -> str:
        # Tokens carry 256 bits of randomness, so a fast unsalted hash is enough: nobody can
        # brute-force the preimage, and lookup by hash stays an index probe.
        return hashlib.sha256(raw.encode()).hexdigest()

    @classmethod
    def generate(cls) -> str:
        return cls.TOKEN_PREFIX + secrets.token_urlsafe(32)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class IngestBatch(models.Model):
    """One accepted ingest request: what it wrote and how long it took (hypertable)."""

    time = models.DateTimeField()
    batch_id = models.UUIDField()
    collector = models.CharField(max_length=128)
    format = models.CharField(max_length=16)
    samples = models.IntegerField()
    rejected = models.IntegerField()
    body_bytes = models.IntegerField()
    duration_ms = models.FloatField()
    pk = models.CompositePrimaryKey("batch_id", "time")

    class Meta:
        db_table = "telemetry_ingest_batch"


class ScrapeTarget(models.Model):
    """A dcgm-exporter /metrics endpoint the beat scraper pulls."""

    # Not a URLField: its validator refuses bare cluster hostnames such as http://gpu-0001:9400.
    url = models.CharField(max_length=500, unique=True, help_text="e.g. http://gpu-0001:9400/metrics")
    enabled = models.BooleanField(default=True)
    hostname = models.CharField(
        max_length=253, blank=True, help_text="Used when the exporter emits no Hostname label"
    )
    last_scrape = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_samples = models.IntegerField(default=0)

    def __str__(self) -> str:
        return self.url


class RollupWatermark(models.Model):
    """How far one rollup has been filled: every bucket before `done_until` is final."""

    name = models.CharField(max_length=64, unique=True)
    done_until = models.DateTimeField()
    updated = models.DateTimeField(auto_now=True)
    last_rows = models.IntegerField(default=0)
    last_ms = models.FloatField(default=0)
    # The `now` of the last recomputation of the open buckets (telemetry.rollups.OPEN_REFRESH).
    open_refreshed_at = models.DateTimeField(null=True, blank=True)
    # What that recomputation of a 1m rollup covered, up to `refreshed_until`, and the oldest transaction it
    # might not have seen (its snapshot's xmin, a 64-bit xid): the final pass redoes a bucket only if a
    # raw row in it was written by that transaction or a later one (telemetry.rollups._unchanged_since_refresh).
    refreshed_until = models.DateTimeField(null=True, blank=True)
    refresh_xmin = models.BigIntegerField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} until {self.done_until:%Y-%m-%d %H:%M}"


class AgentStatus(models.Model):
    """The newest self-report of one node agent: delivery health and which sources work."""

    hostname = models.CharField(max_length=253, unique=True)
    collector = models.CharField(max_length=128)
    reported_at = models.DateTimeField()
    health = models.JSONField(default=dict)

    def __str__(self) -> str:
        return f"{self.hostname} @ {self.reported_at:%Y-%m-%d %H:%M:%S}"
