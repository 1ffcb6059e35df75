"""The series selector: resolution by range, point limits, gaps, counter rates, bad input."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from telemetry.series import series
from tests.telemetry.factories import insert_narrow, insert_rollup, insert_samples, insert_series

END = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SEC = timedelta(seconds=1)
MIN = timedelta(minutes=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


def _gauge_buckets(start: datetime, n: int, step: timedelta) -> list:
    return [
        (1, start + i * step, {"gpu_util_min": 10.0, "gpu_util_avg": 20.0 + i % 3,
                               "gpu_util_max": 40.0, "gpu_util_last": 20.0})
        for i in range(n)
    ]


@pytest.mark.django_db
def test_one_hour_range_reads_raw_samples():
    start = END - HOUR
    readings = [(start + i * 10 * SEC, float(i % 100)) for i in range(360)]
    insert_series("gpu", 1, "gpu_util", readings)
    s = series("gpu", 1, "gpu_util", start, END)
    assert (s.resolution, s.kind, s.unit, s.step) == ("raw", "gauge", "%", 10 * SEC)
    assert len(s.points) == 360 and s.band is None
    assert s.points[5] == (start + 50 * SEC, 5.0)


@pytest.mark.django_db
def test_two_day_range_reads_1m_widened_to_fit_max_points():
    start = END - 2 * DAY
    insert_rollup("gpu", "1m", _gauge_buckets(start, 2 * 24 * 60, MIN))
    s = series("gpu", 1, "gpu_util", start, END)
    # 2880 one-minute buckets do not fit in 2000 points: read as 2-minute points.
    assert (s.resolution, s.step) == ("1m", 2 * MIN)
    assert len(s.points) == 1440 and None not in (v for _, v in s.points)
    assert s.points[0] == (start, 20.5)
    assert s.band[0] == (10.0, 40.0)
    wide = series("gpu", 1, "gpu_util", start, END, max_points=5000)
    assert (wide.step, len(wide.points), wide.points[2][1]) == (MIN, 2880, 22.0)


@pytest.mark.django_db
def test_thirty_day_range_reads_1h():
    start = END - 30 * DAY
    insert_rollup("gpu", "1h", _gauge_buckets(start, 30 * 24, HOUR))
    s = series("gpu", 1, "gpu_util", start, END)
    assert (s.resolution, s.step, len(s.points)) == ("1h", HOUR, 720)
    assert len(series("gpu", 1, "gpu_util", start, END, max_points=100).points) <= 100


@pytest.mark.django_db
def test_forced_resolution_is_used_whatever_the_range():
    insert_rollup("gpu", "1h", _gauge_buckets(END - HOUR, 1, HOUR))
    s = series("gpu", 1, "gpu_util", END - HOUR, END, resolution="1h")
    assert (s.resolution, s.points) == ("1h", [(END - HOUR, 20.0)])


@pytest.mark.django_db
def test_raw_with_too_many_samples_falls_up_to_1m():
    start = END - HOUR
    insert_series("gpu", 1, "gpu_util", [(start + i * 10 * SEC, 1.0) for i in range(360)])
    insert_rollup("gpu", "1m", _gauge_buckets(start, 60, MIN))
    s = series("gpu", 1, "gpu_util", start, END, max_points=100)
    assert (s.resolution, len(s.points)) == ("1m", 60)
    with pytest.raises(ValueError, match="more than 100 raw samples"):
        series("gpu", 1, "gpu_util", start, END, resolution="raw", max_points=100)


@pytest.mark.django_db
def test_gaps_come_back_as_none_points():
    start = END - HOUR
    times = [start + i * 10 * SEC for i in range(30)]
    times += [start + 10 * MIN + i * 10 * SEC for i in range(30)]
    insert_series("gpu", 1, "gpu_temp", [(t, 50.0) for t in times])
    s = series("gpu", 1, "gpu_temp", start, END)
    gaps = [i for i, (_, v) in enumerate(s.points) if v is None]
    assert gaps == [30] and s.points[30][0] == times[29] + 10 * SEC
    minutes = (0, 1, 2, 9, 10)
    insert_rollup("gpu", "1m", [(2, start + m * MIN, {"gpu_temp_avg": 1.0}) for m in minutes])
    rolled = series("gpu", 2, "gpu_temp", start, END, resolution="1m")
    assert [v for _, v in rolled.points] == [1.0, 1.0, 1.0, None, 1.0, 1.0]
    assert rolled.band[3] == (None, None)


@pytest.mark.django_db
def test_raw_counter_becomes_a_rate_with_resets_handled():
    start = END - HOUR
    readings = [(-10, 100), (0, 110), (10, 120), (20, 5), (30, 15)]  # the first is before start
    insert_series("gpu", 1, "energy_mj", [(start + s * SEC, v) for s, v in readings])
    s = series("gpu", 1, "energy_mj", start, END)
    assert (s.kind, s.unit) == ("counter", "mJ/s")
    assert s.points == [(start, 1.0), (start + 10 * SEC, 1.0), (start + 20 * SEC, 0.5),
                        (start + 30 * SEC, 1.0)]


@pytest.mark.django_db
def test_rollup_counter_becomes_delta_per_second():
    start = END - 2 * DAY
    insert_rollup("gpu", "1m", [(1, start + i * MIN, {"energy_mj_delta": 120.0}) for i in range(3)])
    s = series("gpu", 1, "energy_mj", start, start + 3 * MIN, resolution="1m")
    assert [v for _, v in s.points] == [2.0, 2.0, 2.0] and s.band is None


@pytest.mark.django_db
def test_bitmask_state_shows_any_bit_raised_in_the_bucket_and_codes_their_last():
    start = END - 30 * DAY
    insert_rollup("gpu", "1h", [(1, start, {"throttle_reasons_or": 6, "throttle_reasons_last": 0,
                                            "xid_or": 127, "xid_last": 79})])
    assert series("gpu", 1, "throttle_reasons", start, END).points == [(start, 6.0)]
    # An XID is a code, not bits: the bucket shows the last one.
    assert series("gpu", 1, "xid", start, END).points == [(start, 79.0)]


@pytest.mark.django_db
def test_field_outside_the_registry_reads_the_narrow_table():
    start = END - HOUR
    for i in range(3):
        insert_narrow("gpu", 1, "DCGM_FI_PROF_NEW_THING", start + i * 30 * SEC, float(i))
    insert_narrow("gpu", 2, "DCGM_FI_PROF_NEW_THING", start, 99.0)
    s = series("gpu", 1, "DCGM_FI_PROF_NEW_THING", start, END)
    assert (s.resolution, s.kind, [v for _, v in s.points]) == ("raw", "gauge", [0.0, 1.0, 2.0])
    insert_narrow("node", 7, "node_load1", start, 0.5)
    assert series("node", 7, "node_load1", start, END).points == [(start, 0.5)]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("kind", "field", "message"),
    [
        ("toaster", "gpu_util", "unknown kind 'toaster'"),
        ("gpu", "gpu_util; DROP TABLE telemetry_gpu_sample", "unknown field"),
        ("port", "gpu_util", "unknown field 'gpu_util' for port 1"),
    ],
)
def test_unknown_kind_or_field_is_rejected(kind, field, message):
    insert_samples("gpu", [(1, END - MIN, {"gpu_util": 1.0})])
    with pytest.raises(ValueError, match=message):
        series(kind, 1, field, END - HOUR, END)


@pytest.mark.django_db
def test_bad_ranges_are_rejected():
    naive = datetime(2026, 11, 30, 11, 0)  # noqa: DTZ001 - the point of the test
    with pytest.raises(ValueError, match="timezone-aware"):
        series("gpu", 1, "gpu_util", naive, END)
    with pytest.raises(ValueError, match="empty range"):
        series("gpu", 1, "gpu_util", END, END)
    with pytest.raises(ValueError, match="unknown resolution"):
        series("gpu", 1, "gpu_util", END - HOUR, END, resolution="5m")
