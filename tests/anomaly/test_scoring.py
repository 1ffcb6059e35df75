"""The per-minute scoring pass end to end on the real database: rollup rows in, anomaly events,
current scores, the overview and the heatmap out."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command

from anomaly.models import Anomaly, AnomalyKind, EntityScore
from anomaly.scoring import score_fleet
from telemetry.models import Allocation, Gpu, Job, Node
from telemetry.selectors import fleet_summary
from telemetry.selectors.racks import heatmap_values
from tests.conftest import FIXED_NOW
from tests.telemetry.factories import insert_rollup

pytestmark = pytest.mark.django_db
MIN = timedelta(minutes=1)
SECOND = timedelta(seconds=1)
AT = FIXED_NOW  # 12:00; the pass reads the buckets 11:57 and 11:58
LEVELS = {"gpu_util_avg": 95.0, "sm_clock_avg": 1980.0, "mem_clock_avg": 2619.0, "gpu_temp_avg": 62.0,
          "memory_temp_avg": 70.0, "power_w_avg": 650.0, "fb_used_avg": 70000.0, "sm_active_avg": 0.8,
          "tensor_active_avg": 0.5, "ecc_sbe_vol_delta": 0, "pcie_replay_delta": 0}


@pytest.fixture
def fleet():
    """Two nodes of 8 H100s; node-a runs one job on all eight."""
    gpus = []
    for host in ("node-a", "node-b"):
        node = Node.objects.create(hostname=host)
        gpus += [Gpu.objects.create(uuid=f"GPU-{host}-{i}", node=node, index=i, model="NVIDIA H100 80GB HBM3")
                 for i in range(8)]
    job = Job.objects.create(source="slurm", external_id="4242", state="running", start_time=AT - timedelta(hours=2))
    for g in gpus[:8]:
        Allocation.objects.create(job=job, node=g.node, gpu=g, gpu_index=g.index, start=AT - timedelta(hours=2))
    return gpus


def _minute(gpus, at, overrides=None):
    """The two rollup buckets a pass at `at` reads; overrides are {gpu index: {column: value}}."""
    rows = []
    for bucket in (at - 3 * MIN, at - 2 * MIN):
        for k, g in enumerate(gpus):
            values = {**LEVELS, "gpu_temp_avg": 62.0 + (k % 3) * 0.5, **(overrides or {}).get(k, {})}
            rows.append((g.id, bucket, values))
    insert_rollup("gpu", "1m", rows)


def test_a_hot_gpu_is_flagged_against_its_node_peers_with_the_deviation_named(fleet):
    _minute(fleet, AT, {3: {"memory_temp_avg": 84.0}})
    counts = score_fleet(AT)
    a = Anomaly.objects.get()
    assert (a.kind, a.entity_kind, a.entity_id, a.host) == (AnomalyKind.PEER_NODE, "gpu", "GPU-node-a-3", "node-a")
    top = a.contributions[0]
    assert top["field"] == "memory_temp" and top["value"] == 84.0 and top["expected"] == 70.0
    # peers agree exactly: MAD 0, so the σ is the absolute floor of 2 °C -> 14 / 2 = +7σ
    assert top["deviation"] == pytest.approx(7.0)
    assert a.summary.startswith("memory temperature +7.0σ vs peers in node")
    assert counts["opened"] == 1 and a.started_at == AT and a.ended_at is None
    score = EntityScore.objects.get(entity_kind="gpu", entity_id="GPU-node-a-3")
    assert score.anomaly_score == pytest.approx(a.score) and score.anomaly_score >= 0.5


def test_an_anomaly_is_extended_while_it_lasts_and_closed_when_it_ends(fleet):
    _minute(fleet, AT, {3: {"memory_temp_avg": 84.0}})
    score_fleet(AT)
    _minute(fleet, AT + MIN * 2, {3: {"memory_temp_avg": 86.0}})
    counts = score_fleet(AT + MIN * 2)
    assert counts["extended"] == 1 and Anomaly.objects.count() == 1
    a = Anomaly.objects.get()
    assert a.last_seen == AT + 2 * MIN and a.contributions[0]["value"] == 86.0  # the worse moment is kept
    _minute(fleet, AT + MIN * 4)
    counts = score_fleet(AT + MIN * 4)
    a.refresh_from_db()
    assert counts["closed"] == 1 and a.ended_at == AT + 4 * MIN
    assert EntityScore.objects.get(entity_kind="gpu", entity_id="GPU-node-a-3").anomaly_score is None


def test_a_healthy_fleet_has_no_anomalies_but_counts_as_scored(fleet):
    _minute(fleet, AT)
    assert heatmap_values("anomaly_score", now=AT)["note"]  # never scored yet
    assert score_fleet(AT)["findings"] == 0
    assert not Anomaly.objects.exists()
    hm = heatmap_values("anomaly_score", now=AT)
    assert hm["values"] == {} and hm["note"] is None  # scored, and nothing is abnormal


def test_a_slow_rank_is_flagged_against_its_job_across_the_node_and_shows_on_the_overview(fleet):
    _minute(fleet, AT, {5: {"gpu_util_avg": 55.0, "sm_active_avg": 0.45, "tensor_active_avg": 0.28}})
    score_fleet(AT)
    a = Anomaly.objects.get(entity_id="GPU-node-a-5")
    assert {c["field"] for c in a.contributions} >= {"gpu_util", "sm_active"}
    assert all(c["deviation"] < 0 for c in a.contributions)  # slower than its peers, not faster
    summary = fleet_summary(now=AT)["anomalies"]
    assert summary["open"] == 1 and summary["top"][0]["entity_id"] == "GPU-node-a-5"
    assert summary["top"][0]["url"] == "/gpus/GPU-node-a-5/"
    values = heatmap_values("anomaly_score", now=AT)["values"]
    assert list(values) == [fleet[5].id]


def test_an_sbe_storm_is_flagged_against_the_gpus_own_history(fleet):
    # An hour of quiet history at this hour of day, 2 SBE/min on GPU node-b-2 as its normal.
    history = [(g.id, AT - timedelta(minutes=m), {"ecc_sbe_vol_delta": 2 if g.uuid == "GPU-node-b-2" else 0})
               for g in fleet for m in range(10, 60, 5)]
    insert_rollup("gpu", "1m", history)
    _minute(fleet, AT, {10: {"ecc_sbe_vol_delta": 40}, 11: {"ecc_sbe_vol_delta": 2}})
    score_fleet(AT)
    kinds = set(Anomaly.objects.filter(entity_id="GPU-node-b-2").values_list("kind", flat=True))
    assert AnomalyKind.BASELINE in kinds
    base = Anomaly.objects.get(kind=AnomalyKind.BASELINE)
    assert base.contributions[0]["field"] == "ecc_sbe_vol" and base.contributions[0]["expected"] == 2.0
    assert not Anomaly.objects.filter(entity_id="GPU-node-b-3").exists()  # its normal 2/min is normal


def test_own_history_reads_the_same_hour_on_past_days_and_the_last_hour_with_gaps_as_nan(fleet):
    import numpy as np

    from anomaly.features import BASELINE_FEATURES, baseline_history

    a, b = fleet[0], fleet[1]
    # Yesterday's 12:00 hour: 120 SBE over 60 minutes = 2/min; PCIe replays never reported (NaN).
    insert_rollup("gpu", "1h", [(a.id, AT - timedelta(days=1), {"ecc_sbe_vol_delta": 120})])
    # The last hour before the scoring window, one 10-minute chunk: 3 and 5 SBE over 2 minutes = 4/min.
    insert_rollup("gpu", "1m", [(b.id, AT - timedelta(minutes=40), {"ecc_sbe_vol_delta": 3, "pcie_replay_delta": 1}),
                                (b.id, AT - timedelta(minutes=39), {"ecc_sbe_vol_delta": 5})])
    X, ids, slots = baseline_history(AT)
    rows = {int(i): (int(s), list(x)) for i, s, x in zip(ids, slots, X, strict=True)}
    sbe, pcie = BASELINE_FEATURES.index("ecc_sbe_vol"), BASELINE_FEATURES.index("pcie_replay")
    assert set(rows) == {a.id, b.id} and X.shape == (2, len(BASELINE_FEATURES)) and X.dtype == np.float64
    assert rows[a.id][0] == 12 and rows[a.id][1][sbe] == 2.0 and np.isnan(rows[a.id][1][pcie])
    assert rows[b.id][0] == AT.hour and rows[b.id][1][sbe] == 4.0 and rows[b.id][1][pcie] == 0.5
    assert ids.dtype == np.int64


def test_own_history_of_an_empty_store_is_empty_arrays():
    from anomaly.features import BASELINE_FEATURES, baseline_history

    X, ids, slots = baseline_history(AT)
    assert X.shape == (0, len(BASELINE_FEATURES)) and len(ids) == 0 and len(slots) == 0


def test_the_score_command_and_task_run_a_pass(fleet, capsys):
    from anomaly.tasks import score

    _minute(fleet, AT, {3: {"memory_temp_avg": 84.0}})
    call_command("score", "--now", AT.isoformat())
    out = capsys.readouterr().out
    assert "detectors: 1 findings" in out and "GPU-node-a-3" in out and "memory temperature" in out
    assert "no active failure model" in out
    result = score.apply(kwargs={"now": (AT + MIN).isoformat()}).get()
    assert result["detectors"]["extended"] == 1


def test_gpus_that_changed_jobs_inside_the_window_are_not_compared_with_either_job(fleet):
    # node-b's eight GPUs start a job at 11:57:30, inside the window the pass averages (11:57-11:59):
    # half idle, half busy. Compared with idle peers or with the job's, they would all look odd.
    job = Job.objects.create(source="slurm", external_id="5151", state="running", start_time=AT - 150 * SECOND)
    for g in fleet[8:]:
        Allocation.objects.create(job=job, node=g.node, gpu=g, gpu_index=g.index, start=AT - 150 * SECOND)
    _minute(fleet, AT, {k: {"gpu_util_avg": 10.0 * (k - 7), "power_w_avg": 100.0 * (k - 7)} for k in range(8, 16)})
    score_fleet(AT)
    assert not Anomaly.objects.filter(host="node-b").exists()


def test_a_pass_where_every_gpu_is_still_settling_finds_nothing_and_does_not_fail(fleet):
    Allocation.objects.update(start=AT - 150 * SECOND)  # node-a's job started inside the window
    for g in fleet[8:]:
        g.node.allocations.create(job=Job.objects.get(), gpu=g, gpu_index=g.index, start=AT - 150 * SECOND)
    _minute(fleet, AT, {3: {"memory_temp_avg": 84.0}})
    assert score_fleet(AT)["findings"] == 0
