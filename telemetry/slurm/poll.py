"""Polling a Slurm cluster through its CLI: live jobs from squeue, GPU indexes from scontrol -d,
and jobs that ended since the last poll from sacct (squeue forgets them within minutes)."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable
from datetime import datetime, timedelta

from telemetry.slurm.parse import parse_sacct_json, parse_scontrol_show_job_detail, parse_squeue_json
from telemetry.slurm.sync import do_sync_slurm

Runner = Callable[[list[str]], str]


class SlurmCommandError(RuntimeError):
    """A Slurm command failed; the message carries the command and its stderr."""


def cli_runner(prefix: str = "", timeout: float = 30) -> Runner:
    """Run Slurm commands locally, or through a prefix such as `ssh slurm-head` or `nsenter --net=…`."""
    head = shlex.split(prefix)

    def run(argv: list[str]) -> str:
        cmd = [*head, *argv]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                                 env={"TZ": "UTC", "PATH": "/usr/local/bin:/usr/bin:/bin"})
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmCommandError(f"{' '.join(cmd)}: {exc}") from exc
        if res.returncode != 0:
            raise SlurmCommandError(f"{' '.join(cmd)} exited {res.returncode}: {res.stderr.strip()[:500]}")
        return res.stdout

    return run


def poll_slurm(run: Runner, *, now: datetime, lookback: timedelta = timedelta(hours=1)) -> dict[str, int]:
    """One sync: jobs known to squeue plus those sacct saw end within `lookback`."""
    live = {j.job_id: j for j in parse_squeue_json(run(["squeue", "--json"]))}
    allocations = parse_scontrol_show_job_detail(run(["scontrol", "show", "job", "-d"]))
    since = (now - lookback).strftime("%Y-%m-%dT%H:%M:%S")
    for job in parse_sacct_json(run(["sacct", "--json", "-a", "-S", since])):
        if job.end is not None or job.job_id not in live:  # accounting has the final word on ended jobs
            live[job.job_id] = job
    return do_sync_slurm(list(live.values()), allocations, now=now)
