"""Jobs and allocations synced from the real local Slurm match `sacct`: same jobs, GPU counts, times."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from telemetry.models import Allocation, Job, JobStateChange
from telemetry.slurm.parse import parse_sacct_json, parse_scontrol_show_job_detail, parse_slurm_time, parse_squeue_json
from telemetry.slurm.sync import do_sync_slurm
from tests.slurm.harness import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]


@pytest.fixture(scope="module")
def slurm_cluster():
    """A cluster of this module's own: pytest-django runs these DB tests first, and their jobs must
    not share slurmctld's and slurmdbd's queues with the parser tests' workload."""
    from tests.slurm.harness import SlurmCluster

    with SlurmCluster(nodes=3) as cluster:
        yield cluster


def test_ledger_from_live_slurm_matches_sacct(slurm_cluster: SlurmCluster) -> None:
    c = slurm_cluster
    ids = [c.sbatch("--gres=gpu:2", "-J", "sync-a", wrap="sleep 3"),
           c.sbatch("-N2", "--gres=gpu:1", "-J", "sync-b", wrap="sleep 3")]
    c.wait_for("both running", lambda: len(c.run("squeue", "-h", "-t", "R", "-o", "%i").stdout.split()) >= 2, 20)
    now = datetime.now(UTC)
    running = [j for j in parse_squeue_json(c.squeue_json()) if j.job_id in ids]
    detail = [a for a in parse_scontrol_show_job_detail(c.scontrol("show", "job", "-d")) if a.job_id in ids]
    do_sync_slurm(running, detail, now=now)
    assert Allocation.objects.filter(end__isnull=True).count() == 4  # 2 GPUs on one node + 1 on each of two

    def ended() -> bool:
        rows = [r.split("|") for r in c.sacct_text("JobID", "State", extra=("-j", ",".join(ids))).split()]
        return len(rows) == 2 and all(r[1].split()[0] == "COMPLETED" for r in rows)

    c.wait_for("sacct has both completed", ended, 30)
    done = [j for j in parse_sacct_json(c.sacct_json("-j", ",".join(ids))) if j.job_id in ids]
    do_sync_slurm(done, [], now=datetime.now(UTC))
    text = c.sacct_text("JobID", "Start", "End", "AllocTRES", extra=("-j", ",".join(ids)))
    for line in text.splitlines():
        job_id, start, end, tres = line.split("|")
        job = Job.objects.get(source="slurm", external_id=job_id)
        gpus = int(next(p.split("=")[1] for p in tres.split(",") if p.startswith("gres/gpu=")))
        assert job.gpu_count == gpus and job.state == "completed"
        assert job.start_time == parse_slurm_time(start) and job.end_time == parse_slurm_time(end)
        assert job.allocations.filter(end=job.end_time).count() == gpus  # every GPU closed at the job's end
    assert JobStateChange.objects.filter(state="completed").count() == 2


def test_poller_syncs_live_slurm_through_the_cli(slurm_cluster: SlurmCluster) -> None:
    from telemetry.slurm.poll import poll_slurm

    c = slurm_cluster
    job_id = c.sbatch("--gres=gpu:3", "-J", "polled", wrap="sleep 2")

    def run(argv: list[str]) -> str:
        return c.run(*argv).stdout

    c.wait_for("running", lambda: job_id in c.run("squeue", "-h", "-t", "R", "-o", "%i").stdout.split(), 20)
    poll_slurm(run, now=datetime.now(UTC))
    job = Job.objects.get(source="slurm", external_id=job_id)
    assert job.state == "running" and job.allocations.filter(end__isnull=True).count() == 3
    c.wait_for("recorded as completed",
               lambda: "COMPLETED" in c.sacct_text("JobID", "State", extra=("-j", job_id)), 30)
    poll_slurm(run, now=datetime.now(UTC))
    job.refresh_from_db()
    assert job.state == "completed" and not job.allocations.filter(end__isnull=True).exists()
