"""Power selectors: rack draw by source, totals, cooling loops and PUE now and over time."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from telemetry.ingest.documents import parse_json
from telemetry.ingest.schema import TimeParser
from telemetry.ingest.writer import write_batch
from telemetry.rollups import run_rollups
from telemetry.selectors import power_overview, pue_series
from telemetry.topology import do_import_topology
from tests.conftest import FIXED_NOW

MIN = timedelta(minutes=1)
HOUR = timedelta(hours=1)


def _rack(name: str, position: int, cap: float | None, *nodes: dict) -> dict:
    rack = {"name": name, "position": position, "nodes": list(nodes)}
    return rack | ({"power_cap_w": cap} if cap else {})


def _node(host: str, gpus: int) -> dict:
    return {"hostname": host, "gpus": [{"index": i, "uuid": f"GPU-{host}-{i}"} for i in range(gpus)]}


# r01 is fed by two PDUs, r02 has none (its GPUs are the fallback), r03's B feed is silent,
# r04 is an NVL72-style rack behind a power shelf and has no cap. loop-1 cools r01 and r02,
# loop-2 cools r03.
TOPOLOGY = {
    "version": 1,
    "sites": [{"name": "dc1", "halls": [
        {"name": "hall-a", "rows": [
            {"name": "row-01", "racks": [_rack("r01", 1, 40000, _node("n1", 2)),
                                         _rack("r02", 2, 20000, _node("n2", 1))]},
            {"name": "row-02", "racks": [_rack("r03", 1, 30000)]},
        ]},
        {"name": "hall-b", "rows": [{"name": "row-01", "racks": [_rack("r04", 1, None)]}]},
    ]}],
    "power": [
        {"name": "pdu-r01-a", "kind": "pdu", "racks": ["r01"]}, {"name": "pdu-r01-b", "kind": "pdu", "racks": ["r01"]},
        {"name": "pdu-r03-a", "kind": "pdu", "racks": ["r03"]}, {"name": "pdu-r03-b", "kind": "pdu", "racks": ["r03"]},
        {"name": "shelf-r04", "kind": "power_shelf", "racks": ["r04"]},
        {"name": "loop-1", "kind": "cooling_loop", "racks": ["r01", "r02"]},
        {"name": "loop-2", "kind": "cooling_loop", "racks": ["r03"]},
    ],
}


def _ingest(**collections: list[dict]) -> None:
    times = TimeParser(FIXED_NOW, timedelta(minutes=5), timedelta(days=7))
    batch = parse_json(json.dumps(collections).encode(), times)
    assert batch.rejected == 0, batch.rejections
    write_batch(batch, collector="test", fmt="json")


def _power(device: str, t, **fields) -> dict:
    return {"device": device, "time": t.isoformat(), "fields": fields}


def _gpu(host: str, index: int, t, **fields) -> dict:
    return {"host": host, "uuid": f"GPU-{host}-{index}", "index": index, "time": t.isoformat(), "fields": fields}


@pytest.fixture
def topology():
    do_import_topology(TOPOLOGY)


@pytest.fixture
def cluster(topology):
    t = FIXED_NOW - timedelta(seconds=30)
    _ingest(
        power=[
            _power("pdu-r01-a", t, watts=12000.0), _power("pdu-r01-b", t, watts=11000.0),
            _power("pdu-r03-a", t, watts=5000.0),
            _power("pdu-r03-b", FIXED_NOW - 10 * MIN, watts=4000.0),  # older than STALE_AFTER
            _power("shelf-r04", t, watts=15000.0),
            _power("loop-1", t, coolant_supply_temp=30.0, coolant_return_temp=40.0, flow_lpm=600.0, watts=2300.0,
                   facility_watts=31995.0),
            _power("loop-2", t, coolant_supply_temp=31.0, coolant_return_temp=39.5, flow_lpm=500.0,
                   facility_watts=9000.0),
        ],
        gpus=[_gpu("n1", 0, t, power_w=400.0), _gpu("n1", 1, t, power_w=400.0), _gpu("n2", 0, t, power_w=700.0)],
    )


@pytest.mark.django_db
def test_rack_draw_comes_from_complete_pdus_then_shelves_then_gpus(cluster):
    racks = {r["name"]: r for r in power_overview(FIXED_NOW)["racks"]}
    assert list(racks) == ["r01", "r02", "r03", "r04"]
    got = {n: (r["source"], r["draw_w"], r["cap_w"], r["pct_of_cap"]) for n, r in racks.items()}
    assert got == {
        "r01": ("pdu", 23000.0, 40000.0, 57.5),  # the GPUs' 800 W are not added on top
        "r02": ("gpus", 700.0, 20000.0, 3.5),
        "r03": (None, None, 30000.0, None),  # one feed silent, one stale, no GPUs to fall back on
        "r04": ("power_shelf", 15000.0, None, None),
    }
    assert (racks["r03"]["pdus"], racks["r03"]["pdus_reporting"]) == (2, 1)
    assert (racks["r01"]["gpus"], racks["r01"]["gpus_reporting"], racks["r01"]["hall"]) == (2, 2, "hall-a")


@pytest.mark.django_db
def test_rows_halls_and_total_sum_draw_and_share_of_cap(cluster):
    out = power_overview(FIXED_NOW)
    rows = {(r["hall"], r["row"]): (r["racks"], r["racks_reporting"], r["draw_w"], r["cap_w"], r["pct_of_cap"])
            for r in out["rows"]}
    assert rows == {
        ("hall-a", "row-01"): (2, 2, 23700.0, 60000.0, 39.5),
        ("hall-a", "row-02"): (1, 0, None, 30000.0, None),
        ("hall-b", "row-01"): (1, 1, 15000.0, None, None),
    }
    halls = {h["hall"]: (h["draw_w"], h["cap_w"], h["pct_of_cap"]) for h in out["halls"]}
    # The share of cap counts only racks with both a draw and a cap: 23.7 kW of 60 kW.
    assert halls == {"hall-a": (23700.0, 90000.0, 39.5), "hall-b": (15000.0, None, None)}
    assert out["total"] == {"racks": 4, "racks_reporting": 3, "draw_w": 38700.0, "cap_w": 90000.0,
                            "pct_of_cap": 39.5}


@pytest.mark.django_db
def test_cooling_loops_and_pue_now_use_only_devices_whose_racks_all_report(cluster):
    out = power_overview(FIXED_NOW)
    loop1, loop2 = out["cooling_loops"]
    assert loop1 | {"id": None} == {
        "id": None, "name": "loop-1", "racks": ["r01", "r02"], "time": (FIXED_NOW - timedelta(seconds=30)).isoformat(),
        "stale": False, "supply_c": 30.0, "return_c": 40.0, "delta_t_c": 10.0, "flow_lpm": 600.0,
        "pump_w": 2300.0, "facility_w": 31995.0,
    }
    assert (loop2["delta_t_c"], loop2["pump_w"]) == (8.5, None)
    # loop-2's rack has no draw, so only loop-1 counts: 31 995 W over r01 + r02 = 23 700 W.
    assert (out["pue"], out["facility_w"], out["it_w"]) == (pytest.approx(1.35, rel=1e-12), 31995.0, 23700.0)
    assert (out["pue_devices"], out["pue_devices_reporting"]) == (1, 2)


@pytest.mark.django_db
def test_stale_readings_leave_rack_and_loop_without_values(cluster):
    later = power_overview(FIXED_NOW + timedelta(minutes=10))
    assert {r["name"]: r["source"] for r in later["racks"]} == {"r01": None, "r02": None, "r03": None, "r04": None}
    assert later["cooling_loops"][0]["stale"] is True and later["cooling_loops"][0]["supply_c"] is None
    assert later["pue"] is None and later["total"]["draw_w"] is None


@pytest.mark.django_db
def test_empty_cluster_has_no_racks_and_no_pue():
    assert power_overview(FIXED_NOW) == {
        "generated_at": FIXED_NOW.isoformat(), "racks": [], "rows": [], "halls": [],
        "total": {"racks": 0, "racks_reporting": 0, "draw_w": None, "cap_w": None, "pct_of_cap": None},
        "cooling_loops": [], "pue": None, "facility_w": None, "it_w": None, "pue_devices": 0,
        "pue_devices_reporting": 0,
    }
    series = pue_series(FIXED_NOW - 10 * MIN, FIXED_NOW)
    assert (series["resolution"], series["step_s"], len(series["x"])) == ("1m", 60.0, 10)
    assert series["y"] == [None] * 10


def _minutes(start, count: int, device: str, **fields) -> list[dict]:
    """Readings every 30 s for `count` minutes from `start`."""
    return [_power(device, start + i * timedelta(seconds=30), **fields) for i in range(2 * count)]


@pytest.fixture
def pue_history(topology):
    """PUE 1.5 over 11:40-11:45, 1.2 over 11:50-11:55; at 11:47 loop-1 reports but the PDUs do
    not. loop-2 reports throughout, but its rack's PDUs never do, so it never counts."""
    t0 = FIXED_NOW - 20 * MIN
    pdus = _minutes(t0, 5, "pdu-r01-a", watts=12000.0) + _minutes(t0, 5, "pdu-r01-b", watts=11000.0)
    pdus += _minutes(t0 + 10 * MIN, 5, "pdu-r01-a", watts=12000.0)
    pdus += _minutes(t0 + 10 * MIN, 5, "pdu-r01-b", watts=11000.0)
    loops = _minutes(t0, 5, "loop-1", facility_watts=34500.0)
    loops += _minutes(t0 + 7 * MIN, 1, "loop-1", facility_watts=34500.0)
    loops += _minutes(t0 + 10 * MIN, 5, "loop-1", facility_watts=27600.0)
    loops += _minutes(t0, 16, "loop-2", facility_watts=9000.0)
    _ingest(power=pdus + loops)
    run_rollups(FIXED_NOW)
    return t0


@pytest.mark.django_db
def test_pue_series_is_gap_aware_per_minute(pue_history):
    s = pue_series(pue_history, pue_history + 16 * MIN)
    assert (s["resolution"], s["step_s"], s["unit"]) == ("1m", 60.0, "ratio")
    assert s["x"][0] == pue_history.isoformat() and len(s["x"]) == 16
    assert s["y"] == [pytest.approx(1.5)] * 5 + [None] * 5 + [pytest.approx(1.2)] * 5 + [None]


@pytest.mark.django_db
def test_pue_series_widens_buckets_to_fit_max_points(pue_history):
    s = pue_series(pue_history, pue_history + 16 * MIN, max_points=5)
    assert (s["step_s"], len(s["x"])) == (240.0, 4)
    assert s["y"] == [pytest.approx(1.5), pytest.approx(1.5), pytest.approx(1.2), pytest.approx(1.2)]


@pytest.mark.django_db
def test_pue_series_over_days_reads_hours(topology):
    start = FIXED_NOW - 48 * HOUR
    readings = []
    for h in range(48):
        if h in (10, 11):  # two hours without data
            continue
        t = start + h * HOUR
        for offset in (0 * MIN, 30 * MIN):
            readings += [_power("pdu-r01-a", t + offset, watts=12000.0), _power("pdu-r01-b", t + offset, watts=11000.0),
                         _power("loop-1", t + offset, facility_watts=27600.0)]
    _ingest(power=readings)
    run_rollups(FIXED_NOW)
    s = pue_series(start, FIXED_NOW)
    assert (s["resolution"], s["step_s"], len(s["y"])) == ("1h", 3600.0, 48)
    assert s["y"][9] == pytest.approx(1.2) and s["y"][10:12] == [None, None] and s["y"][47] == pytest.approx(1.2)


@pytest.mark.django_db
def test_pue_series_refuses_a_naive_or_empty_range():
    with pytest.raises(ValueError, match="timezone-aware"):
        pue_series(FIXED_NOW.replace(tzinfo=None), FIXED_NOW)
    with pytest.raises(ValueError, match="empty range"):
        pue_series(FIXED_NOW, FIXED_NOW)
