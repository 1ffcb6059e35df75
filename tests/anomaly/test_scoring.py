"""The per-minute scoring pass end to end on the real database: rollup rows in, anomaly events,
current scores, the overview and the heatmap out."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from django.core.management import call_command

from anomaly.features import history_buckets
from anomaly.grouping import HOLD
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


def test_an_anomaly_is_extended_while_it_lasts_held_open_a_while_and_closed_as_of_its_last_finding(fleet):
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
    # Gone from the scores at once, but the event waits out the hold: a condition that comes back
    # within it is the same event, not a new one.
    assert counts["closed"] == 0 and a.ended_at is None
    assert EntityScore.objects.get(entity_kind="gpu", entity_id="GPU-node-a-3").anomaly_score is None
    _minute(fleet, AT + 2 * MIN + HOLD)
    assert score_fleet(AT + 2 * MIN + HOLD)["closed"] == 1
    a.refresh_from_db()
    assert a.ended_at == AT + 2 * MIN  # as of the last time it was seen


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


def _history(gpus, at, jitter=None, seed=0):
    """A day of history windows before the pass at `at`, each GPU at LEVELS with a little noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for bucket in history_buckets(at):
        for k, g in enumerate(gpus):
            rows.append((g.id, bucket, {**LEVELS, "gpu_temp_avg": 62.0 + (k % 3) * 0.5 + rng.normal() * 0.5,
                                        "memory_temp_avg": 70.0 + rng.normal() * 0.5,
                                        "power_w_avg": 650.0 + rng.normal() * 10, **(jitter or {})}))
    insert_rollup("gpu", "1m", rows)


def test_a_gpu_is_flagged_against_its_own_day_of_history_in_the_job_it_runs(fleet):
    _history(fleet, AT)
    # +8 °C: under the 10 °C the peers need, ~16σ of the GPU's own day. node-a's GPUs joined their job
    # two hours ago: too few windows of that job to judge them on, so GPU 3 goes unjudged.
    _minute(fleet, AT, {3: {"memory_temp_avg": 78.0}, 10: {"memory_temp_avg": 78.0}})
    score_fleet(AT)
    a = Anomaly.objects.get()
    assert (a.kind, a.entity_kind, a.entity_id, a.host) == (AnomalyKind.BASELINE, "gpu", "GPU-node-b-2", "node-b")
    top = a.contributions[0]
    assert (top["field"], top["value"], top["basis"]) == ("memory_temp", 78.0, "own history")
    assert top["expected"] == pytest.approx(70.0, abs=0.5) and top["deviation"] > 6
    assert a.summary.startswith("memory temperature +") and "σ vs own history" in a.summary
    assert EntityScore.objects.get(entity_kind="gpu", entity_id="GPU-node-b-2").anomaly_score == pytest.approx(a.score)
    _minute(fleet, AT + HOLD)  # back to its normal for the hold: the event closes as of its last finding
    assert score_fleet(AT + HOLD)["closed"] == 1 and Anomaly.objects.get().ended_at == AT


def test_fewer_errors_than_its_own_usual_is_not_an_anomaly_but_more_is(fleet):
    _history(fleet, AT, {"ecc_sbe_vol_delta": 200})  # 200 SBE/min on every GPU, all day
    _minute(fleet, AT, {k: {"ecc_sbe_vol_delta": 200} for k in range(16)} | {9: {"ecc_sbe_vol_delta": 0},
                                                                             11: {"ecc_sbe_vol_delta": 2000}})
    score_fleet(AT)
    base = Anomaly.objects.get(kind=AnomalyKind.BASELINE)
    assert base.entity_id == "GPU-node-b-3" and base.contributions[0]["field"] == "ecc_sbe_vol"
    assert base.contributions[0]["expected"] == 200.0 and base.contributions[0]["value"] == 2000.0


def test_own_history_reads_each_window_like_the_pass_reads_its_own():
    from anomaly.features import HISTORY_ROWS, OWN_GPU_FEATURES, own_history

    node = Node.objects.create(hostname="node-h")
    a, b = (Gpu.objects.create(uuid=f"GPU-h-{i}", node=node, index=i) for i in range(2))
    newest, oldest = history_buckets(AT)[:2], history_buckets(AT)[-2:]
    insert_rollup("gpu", "1m", [(a.id, newest[0], {"memory_temp_avg": 70.0, "ecc_sbe_vol_delta": 3}),
                                (a.id, newest[1], {"memory_temp_avg": 72.0, "ecc_sbe_vol_delta": 5}),
                                (a.id, oldest[0], {"memory_temp_avg": 60.0}),
                                (a.id, newest[0] + 5 * MIN, {"memory_temp_avg": 99.0}),  # between windows
                                (b.id, newest[1], {"memory_temp_avg": 65.0})])
    ids = np.array(sorted([a.id, b.id, 99999]))
    H = own_history("gpu", AT, ids, OWN_GPU_FEATURES)
    temp, sbe = [f.name for f in OWN_GPU_FEATURES].index("memory_temp"), 5
    assert H.shape == (3, HISTORY_ROWS, len(OWN_GPU_FEATURES)) and H.dtype == np.float32
    assert H[0, -1, temp] == 71.0 and H[0, -1, sbe] == 4.0  # mean of two buckets; 8 SBE over 2 minutes
    assert H[0, 0, temp] == 60.0 and np.isnan(H[0, 0, sbe])  # the oldest window; SBE not reported
    assert np.isnan(H[0, 1:-1]).all()  # the bucket between windows is not read
    assert H[1, -1, temp] == 65.0 and np.isnan(H[2]).all()  # a GPU with no rows: all NaN


def test_read_columns_returns_aligned_columns_and_nothing_for_no_rows():
    from anomaly.features import _read_columns

    sql = "SELECT g::int4, (g * 2)::int4, (g / 3.0)::float4 FROM generate_series(1, %(n)s) g"
    ids, doubled, thirds = _read_columns(sql, {"n": 1000}, ["int4", "int4", "float4"])
    order = np.argsort(ids)
    assert ids[order].tolist() == list(range(1, 1001))
    assert (doubled == 2 * ids).all() and np.array_equal(thirds, (ids / 3.0).astype(np.float32))
    assert [len(c) for c in _read_columns(sql, {"n": 0}, ["int4", "int4", "float4"])] == [0, 0, 0]
    with pytest.raises(ValueError, match="NULL"):
        _read_columns("SELECT NULL::int4 FROM generate_series(1, 2)", {}, ["int4"])


def test_history_read_in_chunks_of_entities_equals_one_read(fleet, monkeypatch):
    from anomaly import features as F

    buckets = history_buckets(AT)
    windows = [buckets[2 * k] for k in range(len(buckets) // 2)]  # the first bucket of each history window
    insert_rollup("gpu", "1m", [(g.id, windows[(7 * k + j) % len(windows)], {"memory_temp_avg": 50.0 + k + j})
                                for k, g in enumerate(fleet) for j in range(5)])
    ids = np.array(sorted(g.id for g in fleet))
    whole = F.own_history("gpu", AT, ids, F.OWN_GPU_FEATURES)
    monkeypatch.setattr(F, "HISTORY_CHUNK", 3)
    chunked = F.own_history("gpu", AT, ids, F.OWN_GPU_FEATURES)
    assert np.isfinite(whole).sum() == 16 * 5  # five windows of one metric per GPU
    np.testing.assert_array_equal(whole, chunked)


def test_job_history_marks_the_windows_a_job_held_and_the_one_it_started_in(fleet):
    from anomaly.features import HISTORY_ROWS, job_history

    # node-a's job started at 10:00, between the windows 09:57-09:59 and 10:12-10:14: the newest 7
    # windows are the job's, the older ones had no job. GPU 8's job starts inside the 9th window
    # from the end, which then mixes two workloads.
    ninth = history_buckets(AT)[2 * 8]
    job = Job.objects.create(source="slurm", external_id="99", state="running", start_time=ninth + SECOND * 30)
    Allocation.objects.create(job=job, node=fleet[8].node, gpu=fleet[8], gpu_index=0, start=ninth + SECOND * 30)
    ids = np.array(sorted(g.id for g in fleet))
    codes, keys = job_history(AT, ids)
    assert codes.shape == (16, HISTORY_ROWS) and set(keys) == {"slurm:4242", "slurm:99"}
    a, b = codes[list(ids).index(fleet[0].id)], codes[list(ids).index(fleet[8].id)]
    assert (a[-7:] == keys["slurm:4242"]).all() and (a[:-7] == 0).all()
    assert (b[-8:] == keys["slurm:99"]).all() and b[-9] == -1 and (b[:-9] == 0).all()
    assert (codes[list(ids).index(fleet[9].id)] == 0).all()


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


@pytest.fixture
def fabric_and_racks():
    """A leaf with three ports (one downlink each), and two racks fed by an A/B pair of PDUs each."""
    from telemetry.models import Hall, Port, PowerDevice, Rack, Row, Site, Switch

    leaf = Switch.objects.create(name="leaf-01", role="leaf")
    ports = [Port.objects.create(switch=leaf, name=f"p{i}", speed_gbps=400) for i in range(1, 4)]
    row = Row.objects.create(hall=Hall.objects.create(site=Site.objects.create(name="dc1"), name="h1"), name="row-1")
    racks = [Rack.objects.create(row=row, name=f"r0{i}") for i in (1, 2)]
    pdus = []
    for rack in racks:
        for side in "ab":
            pdu = PowerDevice.objects.create(name=f"pdu-{rack.name}-{side}", kind="pdu")
            pdu.racks.add(rack)
            pdus.append(pdu)
    rng = np.random.default_rng(2)
    port_rows, power_rows = [], []
    # A day of history (a symbol error now and then, steady racks) for passes at AT and AT + 2 min: a
    # port's refit group (its id modulo 5) decides whether the second pass refits on the later windows.
    for bucket in sorted(set(history_buckets(AT)) | set(history_buckets(AT + 2 * MIN))):
        port_rows += [(p.id, bucket, {"xmit_data_bytes_delta": 10**9, "symbol_errors_delta": int(rng.poisson(1))})
                      for p in ports]
        power_rows += [(d.id, bucket, {"watts_avg": 6000.0 + rng.normal() * 50,
                                       "inlet_temp_avg": 24.0 + rng.normal() * 0.2}) for d in pdus]
    insert_rollup("port", "1m", port_rows)
    insert_rollup("power", "1m", power_rows)
    return ports, racks, pdus


def _fabric_minute(ports, pdus, at, *, port_errors=None, inlet=None):
    """The scoring window's buckets: errors {port index: per minute}, inlet {pdu index: °C}."""
    port_rows, power_rows, port_errors = [], [], port_errors or {}
    for bucket in (at - 3 * MIN, at - 2 * MIN):
        port_rows += [(p.id, bucket, {"xmit_data_bytes_delta": 10**9, "symbol_errors_delta": port_errors.get(k, 1)})
                      for k, p in enumerate(ports)]
        power_rows += [(d.id, bucket, {"watts_avg": 6000.0, "inlet_temp_avg": (inlet or {}).get(k, 24.0)})
                       for k, d in enumerate(pdus)]
    insert_rollup("port", "1m", port_rows)
    insert_rollup("power", "1m", power_rows)


def test_ports_and_racks_open_and_close_own_history_events_of_their_own(fabric_and_racks):
    from anomaly.features import rack_matrix

    ports, racks, pdus = fabric_and_racks
    _fabric_minute(ports, pdus, AT, port_errors={1: 400}, inlet={2: 31.0, 3: 31.0})  # r02's inlet air +7 °C
    m = rack_matrix(AT)
    assert [str(n) for n in m.context["name"]] == ["r01", "r02"] and m.X[:, 0].tolist() == [12000.0, 12000.0]
    score_fleet(AT)
    events = {(a.kind, a.entity_kind, a.entity_id): a for a in Anomaly.objects.all()}
    port, rack = ((AnomalyKind.BASELINE, "port", str(ports[1].id)), (AnomalyKind.BASELINE, "rack", "r02"))
    assert set(events) >= {port, rack} and not any(k[0] == AnomalyKind.BASELINE and k[2] in (str(ports[0].id), "r01")
                                                   for k in events)
    assert events[port].host == "leaf-01:p2" and events[port].contributions[0]["field"] == "symbol_errors"
    assert events[rack].contributions[0]["field"] == "inlet_temp" and events[rack].contributions[0]["value"] == 31.0
    assert events[rack].summary.startswith("inlet temperature +")
    # Two minutes later the port still errs and the rack has cooled down: one event extends, the other
    # waits out the hold; once the hold is over it closes as of its last finding.
    _fabric_minute(ports, pdus, AT + 2 * MIN, port_errors={1: 400})
    counts = score_fleet(AT + 2 * MIN)
    assert counts["extended"] == 1 and counts["closed"] == 0
    _fabric_minute(ports, pdus, AT + HOLD, port_errors={1: 400})
    counts = score_fleet(AT + HOLD)
    ended = dict(Anomaly.objects.filter(kind=AnomalyKind.BASELINE).values_list("entity_kind", "ended_at"))
    assert ended == {"port": None, "rack": AT} and counts["closed"] == 1
