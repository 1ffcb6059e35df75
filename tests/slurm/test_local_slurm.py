"""Parsers against a real Slurm 22.05 started by the harness: sacct --json must agree with sacct -P text,
and scontrol show job -d must give each running job's per-node GPU indexes."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from telemetry.slurm.parse import (
    Job,
    expand_hostlist,
    parse_sacct_json,
    parse_scontrol_show_job_detail,
    parse_slurm_time,
    parse_squeue_json,
    parse_tres,
)
from tests.slurm.harness import SlurmCluster

pytestmark = pytest.mark.slurm

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}


@dataclass
class Workload:
    ids: dict[str, str]  # job name -> job id
    running_detail: str  # scontrol show job -d, captured while the jobs ran
    running_squeue: str


@pytest.fixture(scope="module")
def workload(slurm_cluster: SlurmCluster) -> Workload:
    """Three GPU jobs (one spanning two nodes) that sleep 2 s; waits until sacct records them all finished."""
    c = slurm_cluster
    ids = {
        "single": c.sbatch("--gres=gpu:2", "-J", "single", "-A", "bwacct"),
        "multi": c.sbatch("-N2", "--gres=gpu:2", "-J", "multi", "-A", "bwacct"),
        "one": c.sbatch("--gres=gpu:1", "-J", "one"),
    }
    # Other tests share this cluster (pytest-django runs DB tests first): look only at these jobs.
    mine = ",".join(ids.values())
    def running() -> int:
        return len(c.run("squeue", "-h", "-t", "R", "-j", mine, "-o", "%i").stdout.split())

    c.wait_for("jobs running", lambda: running() == 3, 20)
    detail = c.scontrol("show", "job", "-d")
    squeue = c.squeue_json()

    def all_recorded() -> bool:
        # squeue empties before slurmdbd has the end records: wait on sacct itself.
        rows = [r.split("|") for r in c.sacct_text("JobID", "State", "JobName", extra=("-j", mine)).split()]
        # slurmdbd can first store a fast job under a placeholder ("allocation", no partition) and
        # fill in the submit record later: wait for the real names too.
        return (len(rows) == 3 and all(r[1].split()[0] in TERMINAL for r in rows)
                and {r[2] for r in rows} == set(ids))

    c.wait_for("sacct records all jobs finished", all_recorded, 30)
    return Workload(ids, detail, squeue)


def test_sacct_json_matches_sacct_text(slurm_cluster: SlurmCluster, workload: Workload) -> None:
    mine = ",".join(workload.ids.values())
    jobs = {j.job_id: j for j in parse_sacct_json(slurm_cluster.sacct_json("-j", mine))}
    text = slurm_cluster.sacct_text("JobID", "JobName", "Start", "End", "AllocTRES", "NodeList", "State",
                                    extra=("-j", mine))
    rows = [line.split("|") for line in text.splitlines() if line]
    assert sorted(jobs) == sorted(r[0] for r in rows) == sorted(workload.ids.values())
    for job_id, name, start, end, alloc, nodelist, state in rows:
        job: Job = jobs[job_id]
        assert job.name == name and job.state == state.split()[0] == "COMPLETED"
        assert job.start == parse_slurm_time(start) and job.end == parse_slurm_time(end)  # harness sets TZ=UTC
        assert job.gpu_count == parse_tres(alloc)["gres/gpu"]
        assert job.nodes == expand_hostlist(nodelist)
    by_name = {j.name: j for j in jobs.values()}
    assert {n: j.gpu_count for n, j in by_name.items()} == {"single": 2, "multi": 4, "one": 1}
    assert by_name["multi"].node_count == 2 and by_name["single"].account == "bwacct"
    assert all(j.start and j.end and 1 <= (j.end - j.start).total_seconds() <= 10 for j in jobs.values())


def test_scontrol_detail_gives_per_node_gpu_indexes(workload: Workload) -> None:
    allocs = parse_scontrol_show_job_detail(workload.running_detail)
    per_job: dict[str, dict[str, list[int]]] = {}
    for a in allocs:
        per_job.setdefault(a.job_id, {})[a.node] = a.gpu_indexes
        assert a.end is None and a.start is not None  # captured while running
    ids = workload.ids
    assert sorted(per_job) == sorted(ids.values())
    assert len(per_job[ids["multi"]]) == 2 and all(len(ix) == 2 for ix in per_job[ids["multi"]].values())
    assert [len(ix) for ix in per_job[ids["single"]].values()] == [2]
    assert [len(ix) for ix in per_job[ids["one"]].values()] == [1]
    # The ledger must never hand one GPU to two jobs on a node, and indexes stay within the 4 configured.
    seen: set[tuple[str, int]] = set()
    for nodes in per_job.values():
        for node, indexes in nodes.items():
            assert all(0 <= i < 4 for i in indexes)
            assert not seen & {(node, i) for i in indexes}
            seen |= {(node, i) for i in indexes}


def test_squeue_json_while_running(workload: Workload) -> None:
    mine = set(workload.ids.values())
    jobs = {j.job_id: j for j in parse_squeue_json(workload.running_squeue) if j.job_id in mine}
    assert sorted(jobs) == sorted(mine)
    assert all(j.state == "RUNNING" and j.start and j.end is None for j in jobs.values())
    assert sorted(j.gpu_count for j in jobs.values()) == [1, 2, 4]
