"""Retention drops whole chunks past each resolution's retention and keeps the rest.

Chunk intervals (migration 0002): raw 6 h, narrow raw and ingest log 1 day, 1m 7 days,
1h 90 days. Retention (settings.RETENTION): raw 7 days, 1m 90 days, 1h 730 days. Old rows sit
well past their retention plus one chunk, new rows well inside it, so the outcome does not
depend on where chunk boundaries fall.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from telemetry import tasks
from telemetry.models import RollupWatermark
from telemetry.rollups import RETENTION_TABLES, apply_retention
from tests.telemetry.factories import count_rows, insert_narrow, insert_rollup, insert_sample

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)

# resolution -> (an age past retention + one chunk, an age well inside retention)
AGES = {"raw": (10 * DAY, DAY), "1m": (120 * DAY, 30 * DAY), "1h": (1000 * DAY, 400 * DAY)}


def _times(table: str, column: str) -> list[datetime]:
    with connection.cursor() as cur:
        cur.execute(f"SELECT {column} FROM {table} ORDER BY 1")
        return [t for (t,) in cur.fetchall()]


def _fill_gpu_everywhere() -> None:
    old, new = AGES["raw"]
    insert_sample("gpu", 1, NOW - old, gpu_util=1.0)
    insert_sample("gpu", 1, NOW - new, gpu_util=2.0)
    for res in ("1m", "1h"):
        old, new = AGES[res]
        insert_rollup("gpu", res, [(1, NOW - old, {}), (1, NOW - new, {})])


@pytest.mark.django_db
def test_each_resolution_keeps_only_its_retention():
    _fill_gpu_everywhere()
    dropped = apply_retention(NOW)
    assert _times("telemetry_gpu_sample", "time") == [NOW - AGES["raw"][1]]
    assert _times("telemetry_gpu_sample_1m", "bucket") == [NOW - AGES["1m"][1]]
    assert _times("telemetry_gpu_sample_1h", "bucket") == [NOW - AGES["1h"][1]]
    assert dropped["telemetry_gpu_sample"] == 1
    assert dropped["telemetry_gpu_sample_1m"] == 1 and dropped["telemetry_gpu_sample_1h"] == 1
    assert set(dropped) == {t for t, _ in RETENTION_TABLES}
    assert apply_retention(NOW)["telemetry_gpu_sample"] == 0  # nothing left to drop


@pytest.mark.django_db
def test_narrow_and_ingest_log_follow_the_raw_retention():
    insert_narrow("node", 1, "node_load1", NOW - 10 * DAY, 1.0)
    insert_narrow("node", 1, "node_load1", NOW - DAY, 2.0)
    with connection.cursor() as cur:
        for age in (10 * DAY, DAY):
            cur.execute(
                "INSERT INTO telemetry_ingest_batch (time, batch_id, collector, format, samples,"
                " rejected, body_bytes, duration_ms) VALUES (%s, %s, 'c', 'json', 1, 0, 10, 1.0)",
                [NOW - age, uuid.uuid4()],
            )
    apply_retention(NOW)
    assert _times("telemetry_narrow_sample", "time") == [NOW - DAY]
    assert _times("telemetry_ingest_batch", "time") == [NOW - DAY]


@pytest.mark.django_db
def test_chunks_a_rollup_has_not_read_are_kept():
    _fill_gpu_everywhere()
    # The 1m rollup is stuck 12 days back: raw data from 10 days ago is still unrolled.
    RollupWatermark.objects.create(name="gpu_1m", done_until=NOW - 12 * DAY)
    apply_retention(NOW)
    assert count_rows("telemetry_gpu_sample") == 2
    assert count_rows("telemetry_gpu_sample_1m") == 1  # no hold on the 1m table


@pytest.mark.django_db
def test_task_applies_retention_at_the_given_time():
    _fill_gpu_everywhere()
    assert tasks.apply_retention(NOW.isoformat())["telemetry_gpu_sample"] == 1
    with pytest.raises(ValueError, match="no timezone"):
        tasks.apply_retention("2026-11-30T12:00:00")
