"""A small fleet's seeded failure history, and the expected figures worked out from it in Python.

The expected figures follow the documented rule (failing kinds and reset/RMA XIDs; one GPU's failure
events less than an hour apart are one failure), so tests compare the selector with the seed, not
with numbers typed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from telemetry.health import FAILING_EVENT_KINDS, RESET_OR_RMA_XIDS
from telemetry.models import Gpu, GpuEvent
from telemetry.selectors.reliability import SAME_FAILURE
from telemetry.topology import do_import_topology, load_topology_file
from tests.conftest import FIXED_NOW

TOPOLOGY = Path(__file__).resolve().parents[1] / "fixtures" / "topology" / "good.yaml"
NOW = FIXED_NOW
DAY = timedelta(days=1)


@dataclass(frozen=True)
class Seed:
    """One seeded fault event on GPU `index` of `host`."""

    host: str
    index: int
    kind: str
    code: int
    at: datetime


SEED = (
    # XID 79 reported twice over (the Xid line and the off-the-bus line): one failure.
    Seed("gpu-0001", 2, "xid", 79, NOW - 40 * DAY),
    Seed("gpu-0001", 2, "fallen_off_bus", 79, NOW - 40 * DAY + timedelta(seconds=30)),
    Seed("gpu-0001", 2, "ecc_dbe", 0, NOW - 10 * DAY),  # the same GPU again, days later: a second failure
    Seed("gpu-0002", 0, "row_remap_failure", 0, NOW - 25 * DAY),
    Seed("gpu-0001", 0, "xid", 13, NOW - 20 * DAY),  # an application fault: not a failure
    Seed("gpu-0001", 0, "xid", 48, NOW - 5 * DAY),  # a DBE by XID: a failure
    Seed("gpu-0001", 1, "nvlink_errors", 0, NOW - 3 * DAY),  # degrades, does not fail
    Seed("gpu-0003", 0, "xid", 79, NOW - 2 * DAY),
)
FIRST_SEEN = {"gpu-0003": NOW - 15 * DAY}  # the rest joined 60 days ago
JOINED = NOW - 60 * DAY


def seed_fleet() -> dict[tuple[str, int], Gpu]:
    """The fixture topology with its GPUs' first sightings set and SEED's events; {(host, index): GPU}."""
    do_import_topology(load_topology_file(TOPOLOGY))
    Gpu.objects.update(first_seen=JOINED)
    for host, at in FIRST_SEEN.items():
        Gpu.objects.filter(node__hostname=host).update(first_seen=at)
    for s in SEED:
        gpu = Gpu.objects.get(node__hostname=s.host, index=s.index)
        GpuEvent.objects.create(gpu=gpu, kind=s.kind, code=s.code, first_seen=s.at, last_seen=s.at, source="kmsg")
    return {(g.node.hostname, g.index): g for g in Gpu.objects.select_related("node__rack")}


def is_failure(s: Seed) -> bool:
    return s.kind in FAILING_EVENT_KINDS or (s.kind == "xid" and s.code in RESET_OR_RMA_XIDS)


def expected_failures() -> list[Seed]:
    """The first event of each run of a GPU's failure events closer than SAME_FAILURE."""
    out, last = [], {}
    for s in sorted((s for s in SEED if is_failure(s)), key=lambda s: s.at):
        key = (s.host, s.index)
        if key not in last or s.at - last[key] >= SAME_FAILURE:
            out.append(s)
        last[key] = s.at
    return out


def gpu_days(gpus, start=None, stop=NOW) -> float:
    """GPU-days observed in [start, stop)."""
    total = timedelta()
    for g in gpus:
        begin = max(g.first_seen, start) if start else g.first_seen
        total += max(timedelta(), stop - begin)
    return total.total_seconds() / 86400


def month_start(t: datetime) -> datetime:
    return t.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_month(t: datetime) -> datetime:
    return (t.replace(day=28) + 4 * DAY).replace(day=1)
