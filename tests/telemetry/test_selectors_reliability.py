"""This fleet's failure history: counts, rates per 1,000 GPU-days, causes and places, from seeded GPU events.

The expected figures are worked out from the seed (`tests.telemetry.reliability_seed`), not typed in.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime

import pytest

from telemetry.selectors.reliability import fleet_reliability
from tests.telemetry.reliability_seed import (
    JOINED,
    NOW,
    SEED,
    expected_failures,
    gpu_days,
    month_start,
    next_month,
    seed_fleet,
)


@pytest.fixture
def seeded(db):
    return seed_fleet()


@pytest.mark.django_db
def test_fleet_totals_match_the_seeded_events(seeded):
    fleet = fleet_reliability(NOW)
    failures, days = expected_failures(), gpu_days(seeded.values())
    assert (fleet["gpus"], fleet["failures"]) == (len(seeded), len(failures))
    assert fleet["failed_gpus"] == len({(f.host, f.index) for f in failures})
    assert fleet["gpu_days"] == pytest.approx(days, abs=0.01)
    assert fleet["per_1000_gpu_days"] == pytest.approx(1000 * len(failures) / days, abs=1e-3)
    assert fleet["mtbf_gpu_days"] == pytest.approx(days / len(failures), abs=0.1)


@pytest.mark.django_db
def test_fleet_failures_per_month_and_week_use_the_gpu_days_of_each_period(seeded):
    fleet = fleet_reliability(NOW)
    failures = expected_failures()
    start = month_start(JOINED)
    months = []
    while start <= NOW:
        stop = next_month(start)
        n = sum(start <= f.at < stop for f in failures)
        months.append((start.date().isoformat(), n, round(gpu_days(seeded.values(), start, min(stop, NOW)), 2)))
        start = stop
    assert [(m["start"][:10], m["failures"], m["gpu_days"]) for m in fleet["by_month"]] == months
    assert sum(w["failures"] for w in fleet["by_week"]) == len(failures)
    assert sum(w["gpu_days"] for w in fleet["by_week"]) == pytest.approx(gpu_days(seeded.values()), abs=0.1)
    assert all(datetime.fromisoformat(w["start"]).weekday() == 0 for w in fleet["by_week"])  # ISO weeks


@pytest.mark.django_db
def test_fleet_causes_name_each_xid_and_say_which_count_as_failures(seeded):
    causes = {(c["kind"], c["code"]): c for c in fleet_reliability(NOW)["causes"]}
    seeded_causes = Counter((s.kind, s.code if s.kind == "xid" else 0) for s in SEED)
    assert {k: c["events"] for k, c in causes.items()} == dict(seeded_causes)
    assert causes[("xid", 79)]["label"] == "XID 79: GPU has fallen off the bus" and causes[("xid", 79)]["failure"]
    assert "application" in causes[("xid", 13)]["meaning"].lower() and not causes[("xid", 13)]["failure"]
    assert causes[("row_remap_failure", 0)]["failure"] and not causes[("nvlink_errors", 0)]["failure"]


@pytest.mark.django_db
def test_fleet_failures_by_node_and_rack_and_the_newest_failures(seeded):
    fleet = fleet_reliability(NOW)
    failures = expected_failures()
    per_node = Counter(f.host for f in failures)
    assert {n["name"]: n["failures"] for n in fleet["nodes"]} == dict(per_node)
    node = next(n for n in fleet["nodes"] if n["name"] == "gpu-0001")
    gpus = [g for (host, _), g in seeded.items() if host == "gpu-0001"]
    assert node["gpus"] == len(gpus)
    assert node["per_1000_gpu_days"] == pytest.approx(1000 * per_node["gpu-0001"] / gpu_days(gpus), abs=1e-3)
    per_rack = Counter(seeded[(f.host, f.index)].node.rack.name for f in failures)
    assert {r["name"]: r["failures"] for r in fleet["racks"]} == dict(per_rack)
    newest = sorted(failures, key=lambda f: f.at, reverse=True)
    assert [(r["gpu"], r["url"]) for r in fleet["recent"]] == [
        (f"GPU {f.index} of {f.host}", f"/gpus/{seeded[(f.host, f.index)].uuid}/") for f in newest]
    assert fleet["recent"][0]["what"] == "XID 79: GPU has fallen off the bus"


@pytest.mark.django_db
def test_fleet_without_gpus_has_no_rate(db):
    fleet = fleet_reliability(NOW)
    assert (fleet["gpus"], fleet["failures"], fleet["per_1000_gpu_days"], fleet["by_week"]) == (0, 0, None, [])
