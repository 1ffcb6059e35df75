"""A requeue ends the run that held the GPUs, and an empty sacct window is no error (found against the real
Slurm by the metering reconciliation; pinned here without it)."""

from datetime import timedelta

import pytest

from telemetry.models import Allocation, Job, JobState, JobStateChange
from telemetry.slurm import parse
from telemetry.slurm.sync import do_sync_slurm
from tests.conftest import FIXED_NOW

T0 = FIXED_NOW - timedelta(hours=1)


def _job(state: str, *, start=T0, restart_count=None) -> parse.Job:
    return parse.Job(job_id="77", raw_job_id=77, name="train", user="u", account="llm", partition="gpu", qos="normal",
                     priority=1, state=state, submit=T0 - timedelta(minutes=5), start=start, end=None,
                     nodes=["n1"], node_count=1, gpu_count=2, gpus_requested=2, requeue=True,
                     restart_count=restart_count, preempted=False)


@pytest.mark.django_db
def test_requeue_closes_the_first_runs_ledger_rows_and_counts_it():
    do_sync_slurm([_job("RUNNING")], [parse.Allocation("77", "n1", [0, 1], T0, None)], now=T0)
    requeued_at = T0 + timedelta(minutes=30)
    do_sync_slurm([_job("PENDING", start=None)], [], now=requeued_at)
    job = Job.objects.get(external_id="77")
    assert job.state == JobState.PENDING and job.requeue_count == 1
    assert list(Allocation.objects.values_list("end", flat=True)) == [requeued_at, requeued_at]
    change = JobStateChange.objects.get(job=job, state=JobState.PENDING, time=requeued_at)
    assert change.reason.startswith("requeued")
    # The second run gets its own ledger rows; the first run's stay closed.
    restart = requeued_at + timedelta(minutes=2)
    do_sync_slurm([_job("RUNNING", start=restart, restart_count=1)],
                  [parse.Allocation("77", "n1", [0, 1], restart, None)], now=restart)
    ends = sorted((a.start, a.end) for a in Allocation.objects.all())
    assert ends == [(T0, requeued_at)] * 2 + [(restart, None)] * 2
    assert Job.objects.get(external_id="77").requeue_count == 1


def test_sacct_nothing_found_is_an_empty_window():
    text = '{"jobs": [], "errors": [{"error_number": 9003, "error": "Nothing found", "description": "Nothing found"}]}'
    assert parse.parse_sacct_json(text) == []
    with pytest.raises(parse.SlurmParseError, match="errors and no jobs"):
        parse.parse_sacct_json('{"jobs": [], "errors": [{"error_number": 1, "description": "Unspecified error"}]}')
