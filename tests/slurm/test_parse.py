"""Slurm parsers against the real captures in shared/data/slurm (Slurm 20.11 to 26.05) and broken inputs.

No database: these are pure functions.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from telemetry.slurm.parse import (
    GresItem,
    SlurmParseError,
    expand_hostlist,
    gpu_count,
    normalize_state,
    parse_duration,
    parse_gres,
    parse_sacct_json,
    parse_scontrol_show_job_detail,
    parse_sinfo_gres,
    parse_slurm_time,
    parse_slurmrestd_jobs,
    parse_squeue_json,
    parse_tres,
)
from tests.conftest import SHARED_DATA

SLURM = SHARED_DATA / "slurm"
SCKYZO = SLURM / "sckyzo-slurm-exporter"
LCROWN = SLURM / "lcrownover-slurmrestd-json"


def _read(path: Path) -> str:
    if not path.is_file():
        pytest.fail(f"capture missing: {path}")
    return path.read_text()


def _ts(epoch: int) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


# ----------------------------------------------------------------------------- GRES strings
@pytest.mark.parametrize(("text", "expected"), [
    ("gpu:h100:8(S:0-1)", [GresItem("gpu", "h100", 8, None, [0, 1])]),
    ("gpu:a100:2(IDX:0,3)", [GresItem("gpu", "a100", 2, [0, 3])]),
    ("gres/gpu:4", [GresItem("gpu", None, 4)]),
    ("gres/gpu:h100=4", [GresItem("gpu", "h100", 4)]),
    ("gpu:rtxpro6000:8(IDX:0-7)", [GresItem("gpu", "rtxpro6000", 8, list(range(8)))]),
    ("gpu:0", [GresItem("gpu", None, 0)]),
    ("gpu:(null):0(IDX:N/A)", [GresItem("gpu", None, 0, [])]),
    ("gpu(IDX:0-1)", [GresItem("gpu", None, 2, [0, 1])]),  # old GRES_IDX= form: count comes from IDX
    ("gpu:model_a:0(IDX:N/A),gpu:model_b:1(IDX:2)", [GresItem("gpu", "model_a", 0, []),
                                                     GresItem("gpu", "model_b", 1, [2])]),
    ("gpu:nvidia_a100_80gb:8,mig:nvidia_a100_3g.40gb:7", [GresItem("gpu", "nvidia_a100_80gb", 8),
                                                         GresItem("mig", "nvidia_a100_3g.40gb", 7)]),
    ("(null)", []),
    ("", []),
])
def test_parse_gres(text: str, expected: list[GresItem]) -> None:
    assert parse_gres(text) == expected


@pytest.mark.parametrize("bad", ["gpu:h100:x:3", "gpu:2(IDX:3-1)", "gpu:2(IDX:0,3", ":4", "gpu:a:b:c"])
def test_parse_gres_rejects_garbage(bad: str) -> None:
    with pytest.raises(SlurmParseError, match="GRES|range|unbalanced"):
        parse_gres(bad)


def test_truncated_sinfo_column_is_still_parsed() -> None:
    # 23.11.10-2/sinfo_gpus_total.txt: sinfo cut "shard:h100:N" at 20 characters; the GPU part is intact.
    lines = parse_sinfo_gres(_read(SCKYZO / "slurm-23.11.10-2" / "sinfo_gpus_total.txt"))
    shard_line = next(ln for ln in lines if "shard" in ln.fields[1])
    assert gpu_count(shard_line.gres[0]) == 1


# ----------------------------------------------------------------------------- sinfo GRES reports
# (file, expected sum over lines of node_count * GPUs in each GRES column)
SINFO_TOTALS = [
    ("slurm-20.11.8/sinfo_gpus_total.txt", [48]),
    ("slurm-20.11.8/sinfo_gpus_allocated.txt", [7]),
    ("slurm-20.11.8/sinfo_gpus_idle.txt", [48, 7]),
    ("slurm-21.08.5/sinfo_gpus_total.txt", [16]),
    ("slurm-21.08.5/sinfo_gpus_idle.txt", [16, 0]),
    ("slurm-23.11.10/sinfo_gpus_total.txt", [232]),
    ("slurm-23.11.10/sinfo_gpus_allocated.txt", [33]),
    ("slurm-23.11.10-2/sinfo_gpus_allocated.txt", [6]),
    ("slurm-23.11.10-2/sinfo_gpus_idle.txt", [10, 6]),
    ("slurm-23.11.10-2/sinfo_gpus_total.txt", [10]),
    ("slurm-25.05/sinfo_gpus_total.txt", [4232]),
    ("slurm-25.05/sinfo_gpus_allocated.txt", [4226]),
    ("slurm-25.05/sinfo_gpus_idle.txt", [4232, 4226]),
    ("slurm-25.11.1-1/sinfo_gpus_total.txt", [154]),
    ("slurm-25.11.1-1/sinfo_gpus_allocated.txt", [78]),
    ("slurm-25.11.1-1/sinfo_gpus_idle.txt", [101, 77]),
    ("gpus_snapshot.txt", [64, 18]),
    ("slurm-24.11.7/gpus_snapshot.txt", [40, 0]),
    ("slurm-26.05.2/gpus_snapshot.txt", [40, 0]),
    ("gpus_snapshot_long_gres.txt", [52]),
    ("partitions_gpu_long_gres.txt", [40, 10]),
    ("slurm-24.11.7/partitions_gpu.txt", [40, 0]),
    ("slurm-26.05.2/partitions_gpu.txt", [40, 0]),
    ("slurm-25.11.1-1/partitions_gpu.txt", None),
    ("slurm-25.05/node_detail_gres.txt", None),
    ("slurm-25.11.2/node_detail_gres_multitype.txt", [4, 1]),
    ("slurm-24.11.7/node_detail.txt", None),
    ("slurm-26.05.2/node_detail.txt", None),
]


@pytest.mark.parametrize(("rel", "totals"), SINFO_TOTALS, ids=[r for r, _ in SINFO_TOTALS])
def test_sinfo_gres_captures(rel: str, totals: list[int] | None) -> None:
    lines = parse_sinfo_gres(_read(SCKYZO / rel))
    for line in lines:
        for items in line.gres:
            for item in items:
                # IDX lists always name exactly `count` devices; N/A only with a zero count.
                if item.indexes is not None:
                    assert len(item.indexes) == item.count, (rel, line.line_no, item)
    if totals is not None:
        ncols = len(totals)
        got = [sum((ln.node_count or 1) * gpu_count(ln.gres[c]) for ln in lines if len(ln.gres) > c)
               for c in range(ncols)]
        assert got == totals


def test_empty_sinfo_allocated_capture() -> None:
    # slurm-21.08.5: `sinfo -t alloc` printed nothing because no GPU was allocated.
    text = _read(SCKYZO / "slurm-21.08.5" / "sinfo_gpus_allocated.txt")
    assert text == ""
    with pytest.raises(SlurmParseError, match="empty input"):
        parse_sinfo_gres(text)
    assert parse_sinfo_gres(text, allow_empty=True) == []


def test_datadog_sinfo_gres_used_2505() -> None:
    lines = parse_sinfo_gres(_read(SLURM / "datadog-integrations-core" / "sinfo_gres_2505.txt"))
    assert [ln.fields[2] for ln in lines] == ["slurm-rtx-pro-129-015", "slurm-rtx-pro-134-237"]
    cfg, used = lines[0].gres
    assert cfg == [GresItem("gpu", "nvidia_rtx_pro_6000_blackwell_server_edition", 8, None, [0, 1])]
    assert used[0].indexes == [0, 4, 5] and used[0].count == 3
    assert lines[1].gres[1][0].indexes == []


def test_sinfo_without_gres_column_names_line() -> None:
    with pytest.raises(SlurmParseError, match="line 1: no GRES column"):
        parse_sinfo_gres(_read(SCKYZO / "cpus.txt"))


@pytest.mark.parametrize("rel", ["scontrol_nodes.txt", "slurm-24.11.7/scontrol_nodes.txt",
                                 "slurm-26.05.2/scontrol_nodes.txt"])
def test_scontrol_nodes_gres_and_tres(rel: str) -> None:
    nodes = [dict(w.split("=", 1) for w in line.split() if "=" in w)
             for line in _read(SCKYZO / rel).splitlines() if line.startswith("NodeName=")]
    assert nodes
    for node in nodes:
        cfg = parse_tres(node["CfgTRES"])
        assert cfg["cpu"] == int(node["CPUTot"])
        parse_tres(node.get("AllocTRES", ""))
        # scontrol_nodes never lists gres/gpu in CfgTRES here (not in AccountingStorageTRES); Gres= still parses.
        assert gpu_count(parse_gres(node["Gres"])) in {0, 4}


# ----------------------------------------------------------------------------- node JSON GRES/TRES
@pytest.mark.parametrize("rel", ["lcrownover-slurmrestd-json/V0040OpenapiNodesResp.json",
                                 "telegraf-slurmrestd/responses/nodes.json",
                                 "rivosinc-prometheus-slurm-exporter/sinfo_out.json"])
def test_node_json_gres_matches_tres(rel: str) -> None:
    for node in json.loads(_read(SLURM / rel))["nodes"]:
        configured = gpu_count(parse_gres(node["gres"]))
        used = parse_gres(node["gres_used"])
        assert parse_tres(node["tres"]).get("gres/gpu", 0) == configured, node["name"]
        assert gpu_count(used) <= configured
        assert parse_tres(node.get("tres_used") or "").get("gres/gpu", 0) == gpu_count(used)


def test_v0040_nodes_gpu_inventory() -> None:
    nodes = json.loads(_read(LCROWN / "V0040OpenapiNodesResp.json"))["nodes"]
    n0160 = next(n for n in nodes if n["name"] == "n0160")
    assert parse_gres(n0160["gres_used"]) == [GresItem("gpu", "nvidia_a100_80gb_pcie", 1, [0])]


# ----------------------------------------------------------------------------- squeue / slurmrestd jobs
def test_squeue_json_2108_rivosinc() -> None:
    jobs = parse_squeue_json(_read(SLURM / "rivosinc-prometheus-slurm-exporter" / "squeue_out.json"))
    running, pending = jobs
    assert (running.job_id, running.state, running.user, running.account, running.partition) == (
        "26515966", "RUNNING", "bkd", "account1", "hw-l")
    assert running.start == _ts(1684114921) and running.submit == _ts(1684114900) and running.end is None
    assert running.nodes == ["cs75"] and running.requeue is True and running.restart_count == 0
    assert pending.job_id == "58948420_[1-10]" and pending.state == "PENDING"
    assert pending.start is None and pending.nodes == []


def test_slurmrestd_v0038_telegraf() -> None:
    jobs = parse_slurmrestd_jobs(_read(SLURM / "telegraf-slurmrestd" / "responses" / "jobs.json"))
    assert [(j.job_id, j.state) for j in jobs] == [("20464", "RUNNING"), ("20468", "RUNNING"),
                                                    ("23772", "COMPLETED")]
    done = jobs[2]
    assert done.end is not None and done.start is not None and done.end > done.start
    assert all(j.gpu_count == 0 and j.priority and j.priority > 0 for j in jobs)


def test_slurmrestd_v0040_lcrownover() -> None:
    task, rest = parse_slurmrestd_jobs(_read(LCROWN / "V0040OpenapiJobInfoResp.json"))
    assert task.job_id == "7725337_411" and task.raw_job_id == 7745162 and task.state == "RUNNING"
    assert task.start == _ts(1722274361) and task.nodes == ["n0180"] and task.priority == 169465
    assert rest.job_id == "7725337_[412-9999]" and rest.state == "PENDING" and rest.start is None


def test_slurmrestd_v0041_generated_example() -> None:
    # This capture is the openapi generator's example: strings hold their own field names and every number
    # is {"infinite": true}. The parser must say which key is wrong, and cope once the strings are fixed.
    doc = json.loads(_read(LCROWN / "V0041OpenapiJobInfoResp.json"))
    with pytest.raises(SlurmParseError, match=r"jobs\[0\]\.tres_alloc_str"):
        parse_slurmrestd_jobs(json.dumps(doc))
    for job in doc["jobs"]:
        job.update(tres_alloc_str="cpu=7,gres/gpu:h100=2", tres_req_str="cpu=7,gres/gpu=2", nodes="g[01-02]")
    job = parse_slurmrestd_jobs(json.dumps(doc))[0]
    # Infinite numbers carry no value, so array_job_id/array_task_id are unknown and the plain id is used.
    assert job.job_id == "4" and job.state == "PENDING" and job.state_flags == ["PENDING"]
    assert job.submit is None and job.priority is None
    assert (job.gpu_count, job.gpus_requested, job.nodes) == (2, 2, ["g01", "g02"])
    assert job.restart_count == 3


# ----------------------------------------------------------------------------- sacct
SACCT_2205 = {  # trimmed from `sacct --json` of the local Slurm 22.05.8 cluster (test_local_slurm)
    "meta": {"plugin": {"type": "openapi/dbv0.0.38"}}, "errors": [],
    "jobs": [
        {"account": "bwacct", "allocation_nodes": 2, "array": {"job_id": 0, "task": None, "task_id": None},
         "het": {"job_id": 0, "job_offset": None}, "job_id": 2, "name": "multi", "nodes": "node[1-2]",
         "partition": "gpu", "priority": 4294901758, "qos": "normal",
         "state": {"current": "COMPLETED", "reason": "None"}, "user": "root",
         "time": {"elapsed": 2, "end": 1796001501, "start": 1796001499, "submission": 1796001496},
         "tres": {"allocated": [{"type": "cpu", "name": None, "id": 1, "count": 2},
                                {"type": "gres", "name": "gpu", "id": 1001, "count": 4}],
                  "requested": [{"type": "gres", "name": "gpu", "id": 1001, "count": 4}]}},
        {"account": "root", "allocation_nodes": 1, "array": {"job_id": 3, "task": None, "task_id": 1},
         "het": {"job_id": 0, "job_offset": None}, "job_id": 4, "name": "arr", "nodes": "node1",
         "partition": "gpu", "priority": 1, "qos": "normal", "state": {"current": "PREEMPTED"}, "user": "root",
         "time": {"end": 0, "start": 1796001499, "submission": 1796001496}, "tres": {"allocated": []}},
    ],
}


def test_sacct_json_shapes() -> None:
    multi, task = parse_sacct_json(json.dumps(SACCT_2205))
    assert (multi.job_id, multi.nodes, multi.node_count, multi.gpu_count) == ("2", ["node1", "node2"], 2, 4)
    assert multi.start == _ts(1796001499) and multi.end == _ts(1796001501)
    assert task.job_id == "3_1" and task.raw_job_id == 4 and task.preempted and task.end is None


# ----------------------------------------------------------------------------- scontrol show job -d
SCONTROL_D = """JobId=2 JobName=multi
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   Priority=4294901758 Nice=0 Account=bwacct QOS=normal
   JobState=RUNNING Reason=None Dependency=(null)
   StartTime=2026-11-30T01:20:06 EndTime=2026-11-30T01:30:06 Deadline=N/A
   NodeList=node[1-2]
   NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   TRES=cpu=2,node=2,billing=2,gres/gpu=4
   JOB_GRES=gpu:h100:4
     Nodes=node1 CPU_IDs=1 Mem=0 GRES=gpu:h100:2(IDX:1-2)
     Nodes=node2 CPU_IDs=0 Mem=0 GRES=gpu:h100:2(IDX:0-1)
   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0
   Command=(null)

JobId=4 ArrayJobId=3 ArrayTaskId=1 JobName=arr JobState=COMPLETED StartTime=2026-11-30T01:20:06 \
EndTime=2026-11-30T01:20:07 NodeList=node1 JOB_GRES=gpu:h100:1   Nodes=node1 CPU_IDs=2 Mem=0 \
GRES=gpu:h100:1(IDX:3) MinCPUsNode=1
"""


def test_scontrol_show_job_detail() -> None:
    allocs = parse_scontrol_show_job_detail(SCONTROL_D)
    start = datetime(2026, 11, 30, 1, 20, 6, tzinfo=UTC)
    assert [(a.job_id, a.node, a.gpu_indexes, a.start, a.end) for a in allocs] == [
        ("2", "node1", [1, 2], start, None),  # running: EndTime is only the time-limit projection
        ("2", "node2", [0, 1], start, None),
        ("3_1", "node1", [3], start, start + timedelta(seconds=1)),
    ]


def test_scontrol_local_zone() -> None:
    from zoneinfo import ZoneInfo

    allocs = parse_scontrol_show_job_detail(SCONTROL_D, tz=ZoneInfo("Europe/Paris"))
    assert allocs[0].start == datetime(2026, 11, 30, 0, 20, 6, tzinfo=UTC)


# ----------------------------------------------------------------------------- text columns
@pytest.mark.parametrize("rel", ["queue_all_states.txt", "slurm-24.11.7/queue_all_states.txt",
                                 "slurm-26.05.2/queue_all_states.txt", "slurm-24.11.7/queue_default_states.txt",
                                 "slurm-26.05.2/queue_default_states.txt"])
def test_squeue_text_states(rel: str) -> None:
    states = {normalize_state(line.split("|")[1])[0] for line in _read(SCKYZO / rel).splitlines() if line}
    assert states and states <= {"RUNNING", "PENDING", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",
                                 "SUSPENDED", "COMPLETING", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY",
                                 "BOOT_FAIL", "DEADLINE", "REQUEUED", "CONFIGURING", "STOPPED"}


@pytest.mark.parametrize("rel", ["squeue_jobs.txt", "slurm-24.11.7/squeue_jobs.txt",
                                 "slurm-26.05.2/squeue_jobs.txt"])
def test_squeue_text_tres_alloc(rel: str) -> None:
    for line in _read(SCKYZO / rel).splitlines():
        cols = line.split("|")
        tres = parse_tres(cols[7])
        if tres:  # pending jobs have no allocation yet
            assert tres["cpu"] == int(cols[6]) and tres["node"] == int(cols[5])


def test_sacct_efficiency_durations() -> None:
    rows = [line.split("|") for line in _read(SCKYZO / "sacct_efficiency.txt").splitlines() if line]
    for row in rows:
        elapsed, total_cpu, cpu_time = (parse_duration(c) for c in row[4:7])
        assert elapsed and cpu_time and total_cpu is not None
        assert cpu_time == elapsed * int(row[3])  # CPUTime = Elapsed x AllocCPUS, by definition
    assert parse_duration("1-02:03:04") == timedelta(days=1, hours=2, minutes=3, seconds=4)
    assert parse_duration("UNLIMITED") is None


# ----------------------------------------------------------------------------- small helpers
@pytest.mark.parametrize(("text", "hosts"), [
    ("gpu[001-004,010]", ["gpu001", "gpu002", "gpu003", "gpu004", "gpu010"]),
    ("node[1-2],login1", ["node1", "node2", "login1"]),
    ("rack[1-2]-n[08-09]", ["rack1-n08", "rack1-n09", "rack2-n08", "rack2-n09"]),
    ("(null)", []),
    ("", []),
])
def test_expand_hostlist(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


def test_times_and_states() -> None:
    assert parse_slurm_time("2026-11-30T01:20:06") == datetime(2026, 11, 30, 1, 20, 6, tzinfo=UTC)
    assert parse_slurm_time("Unknown") is None and parse_slurm_time("None") is None
    assert normalize_state("CANCELLED by 0") == ("CANCELLED", [])
    assert normalize_state("PD") == ("PENDING", [])
    assert normalize_state(["PENDING", "REQUEUED"]) == ("PENDING", ["REQUEUED"])


# ----------------------------------------------------------------------------- broken input
@pytest.mark.parametrize(("call", "arg", "match"), [
    (parse_squeue_json, "", "empty input"),
    (parse_sacct_json, "   \n", "empty input"),
    (parse_slurmrestd_jobs, '{"jobs": [', r"invalid JSON at line 1"),
    (parse_sacct_json, '{"meta": {}}', "no 'jobs' list"),
    (parse_squeue_json, '{"jobs": [], "errors": [{"error": "Unable to contact slurm controller"}]}',
     "errors and no jobs"),
    (parse_squeue_json, '{"jobs": [{"job_id": 1}]}', r"jobs\[0\]: missing key 'job_state'"),
    (parse_squeue_json, '{"jobs": [{"job_id": 1, "job_state": "WEIRD"}]}', "unknown job state 'WEIRD'"),
    (parse_sacct_json, '{"jobs": [{"job_id": "x", "state": {}, "time": {}}]}', r"jobs\[0\]\.job_id"),
    (parse_scontrol_show_job_detail, "", "empty input"),
    (parse_scontrol_show_job_detail, "No jobs in the system\n", "line 1 does not start with JobId="),
    (expand_hostlist, "node[1-3", "unbalanced"),
    (expand_hostlist, "node[3-1]", "descending range"),
    (parse_slurm_time, "30/11/2026", "bad Slurm time"),
    (parse_duration, "abc", "bad Slurm duration"),
    (parse_tres, "cpu=two", "bad TRES value"),
])
def test_broken_inputs_raise(call, arg: str, match: str) -> None:
    with pytest.raises(SlurmParseError, match=match):
        call(arg)
