"""Jobs selectors: the job list, a job's ranks, stragglers, locality, history and step series."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from telemetry.models import SAMPLE_MODELS, Allocation, Gpu, Job, JobState, JobStateChange, Node, TrainingStep
from telemetry.selectors import job_detail, job_list, job_step_series
from telemetry.topology import do_import_topology
from tests.conftest import FIXED_NOW

pytestmark = pytest.mark.django_db

NOW = FIXED_NOW
HOSTS = ("a1", "a2", "b1", "b2")


def cluster_doc() -> dict:
    """Two racks of two 4-GPU nodes, each rack one NVL domain under its own rail-0 leaf, except b2,
    cabled across to rack a's leaf; every node also reaches a shared rail-1 leaf. The rail-1 HCA
    sorts first by name on purpose."""

    def node(host: str, rack: str) -> dict:
        n = HOSTS.index(host)
        return {
            "hostname": host, "u": 1 + 4 * (n % 2), "u_height": 4, "nvlink_domain": f"nvl-{rack}",
            "gpus": [{"index": i, "uuid": f"GPU-{n:08x}-0000-0000-0000-{i:012x}", "serial": f"99{n}{i}"}
                     for i in range(4)],
            "hcas": [{"name": "mlx5_0/1", "rail": 1}, {"name": "mlx5_1/1", "rail": 0}],
        }

    def rack(name: str, hosts: tuple[str, ...]) -> dict:
        return {"name": name, "nodes": [node(h, name) for h in hosts],
                "switches": [{"name": f"leaf-{name}", "role": "leaf", "u": 40, "port_count": 4}]}

    links = [[f"{h}:mlx5_1/1", f"leaf-r{h[0]}:p{HOSTS.index(h) % 2 + 1}"] for h in HOSTS[:3]]
    links.append(["b2:mlx5_1/1", "leaf-ra:p3"])
    links += [[f"{h}:mlx5_0/1", f"leaf-rail1:p{HOSTS.index(h) + 1}"] for h in HOSTS]
    return {
        "version": 1,
        "sites": [{"name": "dc1", "halls": [{"name": "h1", "rows": [
            {"name": "row-a", "racks": [rack("ra", ("a1", "a2"))]},
            {"name": "row-b", "racks": [rack("rb", ("b1", "b2"))]},
        ]}]}],
        "switches": [{"name": "leaf-rail1", "role": "leaf", "port_count": 8}],
        "nvlink_domains": [{"name": "nvl-ra", "kind": "rack", "rack": "ra"},
                           {"name": "nvl-rb", "kind": "rack", "rack": "rb"}],
        "links": links,
    }


@pytest.fixture
def cluster():
    do_import_topology(cluster_doc())


def make_job(external_id: str, state: str = JobState.RUNNING, **kw) -> Job:
    defaults = {"name": f"train-{external_id}", "user": "alice", "account": "ml", "partition": "gpu",
                "submit_time": NOW - timedelta(hours=2), "start_time": NOW - timedelta(hours=1)}
    if state == JobState.PENDING:
        defaults["start_time"] = None
    return Job.objects.create(source="slurm", external_id=external_id, state=state, **{**defaults, **kw})


def allocate(job: Job, gang: list[tuple[str, list[int]]], start=NOW - timedelta(hours=1), end=None) -> None:
    for host, indexes in gang:
        node = Node.objects.get(hostname=host)
        for i in indexes:
            Allocation.objects.create(job=job, node=node, gpu=Gpu.objects.get(node=node, index=i), gpu_index=i,
                                      start=start, end=end)


def steps(job: Job, per_rank: dict[int, float], n: int = 30, every_s: float = 20.0, until=NOW) -> None:
    """`n` steps per rank ending at `until`, with a small deterministic wobble around its time."""
    rows = []
    for rank, step_time in per_rank.items():
        for k in range(n):
            wobble = 1 + 0.01 * ((k * 7 + rank * 3) % 5 - 2)
            rows.append(TrainingStep(job=job, rank=rank, time=until - timedelta(seconds=every_s * (n - k)),
                                     step=k, step_time_s=step_time * wobble))
    TrainingStep.objects.bulk_create(rows)


def _ranks(detail: dict) -> list[tuple]:
    return [(r["rank"], r["host"], r["gpu_index"]) for r in detail["ranks"]]


# --- Ranks ---------------------------------------------------------------------------------------

def test_ranks_follow_hostname_order_then_gpu_index(cluster):
    job = make_job("100")
    allocate(job, [("b1", [3, 2, 1, 0]), ("a2", [0, 1, 2, 3])])
    detail = job_detail(job.id, now=NOW)
    assert _ranks(detail) == [(r, "a2", r) for r in range(4)] + [(4 + r, "b1", r) for r in range(4)]
    first = detail["ranks"][0]
    assert first["gpu_uuid"] == "GPU-00000001-0000-0000-0000-000000000000"
    assert (first["rack"], first["row"], first["nvlink_domain"]) == ("ra", "row-a", "nvl-ra")


def test_ranks_of_a_partial_node_count_gpus_per_node_of_the_allocation(cluster):
    job = make_job("101")
    allocate(job, [("a1", [2, 3]), ("b2", [2, 3])])
    assert _ranks(job_detail(job.id, now=NOW)) == [(0, "a1", 2), (1, "a1", 3), (2, "b2", 2), (3, "b2", 3)]


def test_leaf_is_the_lowest_rail_and_every_leaf_is_listed(cluster):
    job = make_job("102")
    allocate(job, [("b1", [0])])
    rank = job_detail(job.id, now=NOW)["ranks"][0]
    assert rank["leaf"] == "leaf-rb"
    assert rank["leaves"] == ["leaf-rb", "leaf-rail1"]


def test_open_allocations_win_over_closed_ones(cluster):
    job = make_job("103")
    allocate(job, [("a1", [0, 1])], start=NOW - timedelta(hours=3), end=NOW - timedelta(hours=2))
    allocate(job, [("b2", [0, 1])])
    assert [r["host"] for r in job_detail(job.id, now=NOW)["ranks"]] == ["b2", "b2"]


def test_an_ended_job_shows_its_last_run(cluster):
    job = make_job("104", JobState.COMPLETED, end_time=NOW - timedelta(minutes=10))
    allocate(job, [("a1", [0])], start=NOW - timedelta(hours=5), end=NOW - timedelta(hours=4))
    allocate(job, [("a2", [1]), ("b1", [1])], start=NOW - timedelta(hours=1), end=NOW - timedelta(minutes=10))
    assert _ranks(job_detail(job.id, now=NOW)) == [(0, "a2", 1), (1, "b1", 1)]


def test_rank_tiles_show_latest_values_and_health(cluster):
    job = make_job("105")
    allocate(job, [("a1", [0, 1])])
    gpu = Gpu.objects.get(node__hostname="a1", index=0)
    SAMPLE_MODELS["gpu"]["latest"].objects.create(gpu_id=gpu.id, time=NOW - timedelta(seconds=10),
                                                  gpu_util=97.0, gpu_temp=91.0, power_w=640.0)
    ranks = job_detail(job.id, now=NOW)["ranks"]
    assert (ranks[0]["gpu_util"], ranks[0]["gpu_temp"], ranks[0]["power_w"]) == (97.0, 91.0, 640.0)
    assert ranks[0]["health"] == "degraded"  # 91 °C is past the slowdown temperature
    assert ranks[1]["gpu_util"] is None and ranks[1]["health"] == "stale"


# --- Stragglers ----------------------------------------------------------------------------------

def test_one_slow_rank_alone_is_a_straggler(cluster):
    job = make_job("200")
    allocate(job, [("a1", [0, 1, 2, 3]), ("a2", [0, 1, 2, 3])])
    steps(job, {r: (1.5 if r == 5 else 1.0) for r in range(8)})
    detail = job_detail(job.id, now=NOW)
    assert [r["rank"] for r in detail["ranks"] if r["straggler"]] == [5]
    assert detail["gang"]["stragglers"] == [5]
    assert detail["gang"]["median_step_time_s"] == pytest.approx(1.0, rel=0.02)
    slow = detail["ranks"][5]
    assert slow["step_time_ratio"] == pytest.approx(1.5, rel=0.03) and slow["steps"] == 30


def test_a_lock_step_gang_is_judged_on_compute_time_where_its_ranks_report_it(cluster):
    job = make_job("205")
    allocate(job, [("a1", [0, 1, 2, 3]), ("a2", [0, 1, 2, 3])])
    steps(job, {r: 1.2 for r in range(8)})  # every rank waits for the slow one: the same wall time
    assert job_detail(job.id, now=NOW)["gang"]["stragglers"] == []
    for rank in range(8):
        TrainingStep.objects.filter(job=job, rank=rank).update(compute_time_s=1.15 if rank == 6 else 0.95)
    detail = job_detail(job.id, now=NOW)
    assert detail["gang"]["stragglers"] == [6] and detail["ranks"][6]["step_time_s"] == pytest.approx(1.15)
    series = job_step_series(job.id, NOW - timedelta(minutes=15), NOW)
    assert {r["rank"]: max(r["step_time_s"]) for r in series["ranks"]}[6] == pytest.approx(1.15)


def test_a_uniform_gang_has_no_straggler(cluster):
    job = make_job("201")
    allocate(job, [("a1", [0, 1, 2, 3]), ("a2", [0, 1, 2, 3])])
    steps(job, {r: 1.0 + 0.005 * r for r in range(8)})
    detail = job_detail(job.id, now=NOW)
    assert not any(r["straggler"] for r in detail["ranks"])
    assert detail["gang"]["stragglers"] == [] and detail["gang"]["threshold_s"] > 1.0


def test_steps_outside_the_window_do_not_count(cluster):
    job = make_job("202")
    allocate(job, [("a1", [0, 1, 2, 3])])
    steps(job, {0: 5.0, 1: 1.0, 2: 1.0, 3: 1.0}, until=NOW - timedelta(hours=1))  # an old slow patch
    steps(job, {r: 1.0 for r in range(4)}, n=10)
    detail = job_detail(job.id, now=NOW, window=timedelta(minutes=5))
    assert detail["gang"]["stragglers"] == [] and detail["ranks"][0]["steps"] == 10


def test_an_ended_job_is_judged_on_the_window_before_its_end(cluster):
    end = NOW - timedelta(hours=2)
    job = make_job("203", JobState.COMPLETED, start_time=end - timedelta(hours=1), end_time=end)
    allocate(job, [("b1", [0, 1, 2, 3])], start=end - timedelta(hours=1), end=end)
    steps(job, {0: 1.0, 1: 1.0, 2: 2.0, 3: 1.0}, until=end)
    detail = job_detail(job.id, now=NOW)
    assert detail["window"]["end"] == end.isoformat() and detail["gang"]["stragglers"] == [2]


def test_steps_from_ranks_without_a_known_gpu_are_still_listed(cluster):
    job = make_job("204")
    allocate(job, [("a1", [0, 1, 2])])
    steps(job, {0: 1.0, 1: 1.0, 2: 1.0, 3: 3.0})
    detail = job_detail(job.id, now=NOW)
    assert [(r["rank"], r["host"], r["straggler"]) for r in detail["ranks"]][-1] == (3, None, True)
    assert detail["locality"]["gpus"] == 3


# --- Locality ------------------------------------------------------------------------------------

def test_locality_of_a_gang_split_across_two_nvlink_domains(cluster):
    job = make_job("300")
    allocate(job, [("a1", [0, 1, 2, 3]), ("b1", [0, 1, 2, 3])])
    assert job_detail(job.id, now=NOW)["locality"] == {"nvlink": 0.5, "leaf": 0.5, "racks": 2, "nodes": 2,
                                                       "gpus": 8}


def test_locality_of_a_gang_mostly_in_one_rack_under_one_leaf(cluster):
    job = make_job("301")
    allocate(job, [("a1", [0, 1, 2, 3]), ("a2", [0, 1, 2, 3]), ("b2", [0, 1])])
    loc = job_detail(job.id, now=NOW)["locality"]
    assert (loc["nvlink"], loc["leaf"], loc["racks"]) == (pytest.approx(0.8), 1.0, 2)


# --- History, queue time, no data ----------------------------------------------------------------

def test_preemptions_and_requeues_are_counted_from_history(cluster):
    job = make_job("400", preempt_count=0, requeue_count=0)
    for minutes, state in ((90, "running"), (70, "preempted"), (69, "pending"), (60, "running")):
        JobStateChange.objects.create(job=job, time=NOW - timedelta(minutes=minutes), state=state,
                                      reason="PreemptedByHigherPriority" if state == "preempted" else "")
    detail = job_detail(job.id, now=NOW)
    assert [h["state"] for h in detail["history"]] == ["running", "preempted", "pending", "running"]
    assert [h["preemption"] for h in detail["history"]] == [False, True, False, False]
    assert detail["history"][1]["reason"] == "PreemptedByHigherPriority"
    assert (detail["job"]["preempt_count"], detail["job"]["requeue_count"]) == (1, 1)


def test_queue_time_is_start_minus_submit_or_still_waiting():
    running = make_job("500", submit_time=NOW - timedelta(minutes=30), start_time=NOW - timedelta(minutes=20))
    pending = make_job("501", JobState.PENDING, submit_time=NOW - timedelta(minutes=10))
    done = make_job("502", JobState.COMPLETED, submit_time=NOW - timedelta(hours=3),
                    start_time=NOW - timedelta(hours=2), end_time=NOW - timedelta(hours=1))
    by_id = {j["external_id"]: j for j in job_list(now=NOW)["jobs"]}
    assert (by_id["500"]["queued_s"], by_id["500"]["runtime_s"]) == (600.0, 1200.0)
    assert (by_id["501"]["queued_s"], by_id["501"]["runtime_s"]) == (600.0, None)
    assert (by_id["502"]["queued_s"], by_id["502"]["runtime_s"]) == (3600.0, 3600.0)
    assert job_detail(pending.id, now=NOW)["job"]["queued_s"] == 600.0
    assert job_detail(f"slurm:{running.external_id}", now=NOW)["job"]["id"] == running.id
    assert done.id in {j["id"] for j in job_list(state="completed", now=NOW)["jobs"]}


def test_a_job_without_allocations_or_steps_has_empty_ranks():
    job = make_job("600", JobState.PENDING)
    detail = job_detail(job.id, now=NOW)
    assert detail["ranks"] == [] and detail["history"] == []
    assert detail["gang"] == {"ranks_reporting": 0, "median_step_time_s": None, "mad_s": None,
                              "threshold_s": None, "stragglers": []}
    assert detail["locality"] == {"nvlink": None, "leaf": None, "racks": 0, "nodes": 0, "gpus": 0}
    json.dumps(detail)


def test_unknown_jobs_are_none():
    assert job_detail(12345, now=NOW) is None
    assert job_detail("slurm:nope", now=NOW) is None
    assert job_detail("not-an-id", now=NOW) is None
    assert job_step_series(12345, NOW - timedelta(hours=1), NOW) is None


def test_detail_is_json_ready(cluster):
    job = make_job("601")
    allocate(job, [("a1", [0]), ("b1", [0])])
    steps(job, {0: 1.0, 1: 1.1})
    detail = job_detail(job.id, now=NOW)
    assert json.loads(json.dumps(detail))["job"]["key"] == "slurm:601"
    assert detail["gang"]["threshold_s"] is None  # two ranks are too few to name a straggler


# --- The job list --------------------------------------------------------------------------------

def _list_ids(**kw) -> list[str]:
    return [j["external_id"] for j in job_list(now=NOW, **kw)["jobs"]]


def test_list_shows_running_then_pending_then_ended_newest_first():
    hours = lambda h: NOW - timedelta(hours=h)  # noqa: E731
    make_job("r-old", start_time=hours(5))
    make_job("r-new", start_time=hours(1))
    make_job("p", JobState.PENDING, submit_time=hours(3))
    make_job("done-new", JobState.COMPLETED, start_time=hours(2), end_time=hours(1))
    make_job("failed-old", JobState.FAILED, start_time=hours(9), end_time=hours(8))
    make_job("done-mid", JobState.COMPLETED, start_time=hours(4), end_time=hours(3))
    make_job("never-ran", JobState.CANCELLED, start_time=None, submit_time=hours(1), end_time=hours(1))
    assert _list_ids() == ["r-new", "r-old", "p", "done-new", "done-mid", "failed-old", "never-ran"]
    assert _list_ids(limit=3, offset=2) == ["p", "done-new", "done-mid"]
    assert job_list(limit=3, offset=2, now=NOW)["total"] == 7


def test_list_filters_and_dropdowns():
    make_job("1", account="ml", partition="gpu", user="alice")
    make_job("2", account="vision", partition="big", user="bob")
    make_job("3", JobState.FAILED, account="ml", partition="gpu", user="bob", end_time=NOW)
    out = job_list(account="ml", now=NOW)
    assert [j["external_id"] for j in out["jobs"]] == ["1", "3"] and out["total"] == 2
    assert out["jobs"][0]["tenant"] == "ml" and out["jobs"][0]["colour"] == JobState.colour("running")
    assert out["filters"]["accounts"] == ["ml", "vision"]
    assert out["filters"]["partitions"] == ["big", "gpu"]
    assert [(s["value"], s["count"]) for s in out["filters"]["states"]] == [("running", 1), ("failed", 1)]
    assert _list_ids(user="bob", state="failed") == ["3"]
    assert _list_ids(partition="big") == ["2"]
    assert _list_ids(source="k8s") == []
    assert _list_ids(state="no-such-state") == []


def test_list_search_by_key_prefix_and_name():
    make_job("4242", name="llama-70b")
    make_job("4243", name="bert")
    make_job("99", name="llama-8b")
    assert _list_ids(q="slurm:4242") == ["4242"]
    assert set(_list_ids(q="424")) == {"4242", "4243"}
    assert set(_list_ids(q="LLAMA")) == {"4242", "99"}
    assert _list_ids(q="50%") == []


def test_list_of_an_empty_database():
    assert job_list(now=NOW) == {"total": 0, "limit": 200, "offset": 0, "jobs": [],
                                 "filters": {"states": [], "accounts": [], "partitions": []}}


# --- Step series ---------------------------------------------------------------------------------

def test_step_series_buckets_per_rank_and_breaks_at_gaps():
    job = make_job("700")
    start = NOW - timedelta(minutes=10)
    rows = [TrainingStep(job=job, rank=r, time=start + timedelta(seconds=10 * k), step=k, step_time_s=1.0 + r)
            for r in (0, 1) for k in range(60) if not (r == 1 and 20 <= k < 40)]  # rank 1 silent 200 s
    TrainingStep.objects.bulk_create(rows)
    out = job_step_series(job.id, start, NOW, max_points=60)
    assert out["bucket_s"] == 10.0
    rank0, rank1 = out["ranks"]
    assert rank0["rank"] == 0 and len(rank0["times"]) == 60 and None not in rank0["step_time_s"]
    assert rank1["step_time_s"].count(None) == 1 and len(rank1["times"]) == 41
    gap = rank1["step_time_s"].index(None)
    assert rank1["times"][gap] == (start + timedelta(seconds=200)).isoformat()
    assert out["gang_median"]["step_time_s"][0] == 1.5
    json.dumps(out)


def test_step_series_averages_into_wider_buckets():
    job = make_job("701")
    start = NOW - timedelta(minutes=10)
    TrainingStep.objects.bulk_create([
        TrainingStep(job=job, rank=0, time=start + timedelta(seconds=10 * k), step=k, step_time_s=float(k % 2))
        for k in range(60)
    ])
    out = job_step_series(f"slurm:{job.external_id}", start, NOW, max_points=10)
    assert out["bucket_s"] == 60.0 and out["ranks"][0]["step_time_s"] == [0.5] * 10


def test_step_series_of_a_job_without_steps_is_empty():
    job = make_job("702")
    out = job_step_series(job.id, NOW - timedelta(hours=1), NOW)
    assert out["ranks"] == [] and out["gang_median"] == {"times": [], "step_time_s": []}
    with pytest.raises(ValueError):
        job_step_series(job.id, NOW, NOW - timedelta(hours=1))
