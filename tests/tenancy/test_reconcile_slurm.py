"""Reconciliation with the scheduler's own accounting on the real local Slurm: GPU jobs of different sizes run
across a minute boundary, are synced through the poller (squeue, scontrol -d, sacct), metered, and each job's
GPU-hours must equal sacct's AllocTRES gres/gpu x ElapsedRaw (within 0.1 %; they come out exact). The minutes
before the boundary are idle-held in the 1-minute rollup, so the busy / idle-held split is checked to the second.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from telemetry.models import Allocation, Job
from telemetry.slurm.parse import parse_slurm_time
from telemetry.slurm.poll import poll_slurm
from tenancy.metering import ceil_hour, floor_hour, meter_hours
from tenancy.models import UsageHour
from tests.slurm.harness import SlurmCluster
from tests.tenancy.metering_factories import gpu_minutes, make_node, make_tenant

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]

MINUTE = timedelta(minutes=1)
JOBS = [("-J", "whole-node", "--gres=gpu:4"), ("-J", "two-nodes", "-N2", "--gres=gpu:1"),
        ("-J", "pair", "--gres=gpu:2"), ("-J", "single", "--gres=gpu:1")]


@pytest.fixture(scope="module")
def slurm_cluster():
    """A cluster of this module's own (3 nodes x 4 GPUs); a cluster that cannot start fails the test, with logs."""
    cluster = SlurmCluster(nodes=3)
    try:
        cluster.start()
    except Exception as exc:  # noqa: BLE001 - whatever broke, the run must fail with the logs
        cluster.stop()
        pytest.fail(f"local Slurm did not start: {type(exc).__name__}: {exc}", pytrace=False)
    yield cluster
    cluster.stop()


def _seconds_to_next_minute() -> float:
    now = datetime.now(UTC)
    return 60 - now.second - now.microsecond / 1e6


def _submit_across_a_minute_boundary(c: SlurmCluster) -> tuple[list[str], datetime]:
    """Submit the jobs so that each starts before the next minute boundary and ends after it."""
    if _seconds_to_next_minute() > 40:
        time.sleep(_seconds_to_next_minute() - 25)
    left = _seconds_to_next_minute()
    boundary = (datetime.now(UTC) + timedelta(seconds=left)).replace(microsecond=0)
    ids = [c.sbatch("-A", "bwacct", *args, wrap=f"sleep {math.ceil(left) + 6 + 2 * k}") for k, args in enumerate(JOBS)]
    return ids, boundary


def _sacct(c: SlurmCluster, ids: list[str]) -> dict[str, dict]:
    text = c.sacct_text("JobID", "State", "AllocTRES", "ElapsedRaw", "Start", "End", extra=("-j", ",".join(ids)))
    out = {}
    for line in text.splitlines():
        job_id, state, tres, elapsed, start, end = line.split("|")
        gpus = next((int(p.split("=")[1]) for p in tres.split(",") if p.startswith("gres/gpu=")), 0)
        out[job_id] = {"state": state.split()[0], "gpus": gpus, "elapsed": int(elapsed),
                       "start": parse_slurm_time(start), "end": parse_slurm_time(end)}
    return out


@pytest.mark.timeout(300)
def test_gpu_hours_per_job_match_sacct(slurm_cluster: SlurmCluster) -> None:
    c = slurm_cluster
    make_tenant("bw", ("slurm", "bwacct"))
    gpus = [g for name in c.node_names for g in make_node(name, c.gpus_per_node, "H100")[1]]

    def run(argv: list[str]) -> str:
        return c.run(*argv).stdout

    ids, boundary = _submit_across_a_minute_boundary(c)
    c.wait_for("all running", lambda: set(ids) <= set(c.run("squeue", "-h", "-t", "R", "-o", "%i").stdout.split()),
               20)
    # The poller also asks sacct for the last hour's jobs, and sacct answers that query with a "Nothing found"
    # error until slurmdbd has recorded the jobs as eligible: wait for the same query to list them.
    since = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    c.wait_for("slurmdbd lists them", lambda: set(ids) <= set(
        c.run("sacct", "-a", "-X", "-n", "-P", "-o", "JobID", "-S", since).stdout.split()), 20)
    poll_slurm(run, now=datetime.now(UTC))
    # The minutes before the boundary idle, the ones after work: every held GPU, in the 1-minute rollup.
    for g in gpus:
        gpu_minutes(g, boundary - 2 * MINUTE, 2, gr_engine_active_avg=0.01)
        gpu_minutes(g, boundary, 2, gr_engine_active_avg=0.6)
    c.wait_for("sacct has them completed",
               lambda: all(j["state"] == "COMPLETED" for j in _sacct(c, ids).values()) and len(_sacct(c, ids)) == 4,
               90)
    poll_slurm(run, now=datetime.now(UTC))
    acct = _sacct(c, ids)
    assert not Allocation.objects.filter(end__isnull=True).exists()

    first, last = min(a["start"] for a in acct.values()), max(a["end"] for a in acct.values())
    meter_hours(floor_hour(first), ceil_hour(last))
    figures = []
    for job_id, a in acct.items():
        assert a["start"] < boundary < a["end"], f"job {job_id} does not span the minute boundary"
        job = Job.objects.get(source="slurm", external_id=job_id)
        rows = UsageHour.objects.filter(job=job)
        metered = sum((r.gpu_hours for r in rows), Decimal(0))
        expected = Decimal(a["gpus"] * a["elapsed"]) / 3600
        assert expected > 0 and abs(metered - expected) <= expected * Decimal("0.001"), (job_id, metered, expected)
        idle = sum((r.idle_held_hours for r in rows), Decimal(0))
        expected_idle = Decimal(a["gpus"] * int((boundary - a["start"]).total_seconds())) / 3600
        assert abs(idle - expected_idle) <= Decimal("0.000001") * rows.count(), (job_id, idle, expected_idle)
        assert sum((r.busy_hours + r.idle_held_hours + r.unmeasured_hours + r.lost_hours for r in rows), Decimal(0)) \
            == metered
        assert {r.tenant.slug for r in rows} == {"bw"} and {r.gpu_model for r in rows} == {"H100"}
        figures.append(f"{job_id}: {a['gpus']} GPU x {a['elapsed']} s = {expected:.6f} h, metered {metered:.6f} h "
                       f"(idle-held {idle:.6f})")
    print("\nslurm reconciliation: " + "; ".join(figures))
