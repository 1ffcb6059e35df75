"""Job-level detectors: straggling ranks against their gang, diverging runs against their history,
and `anomaly.jobs.job_findings` over training steps in the database, simulated ones included."""

from __future__ import annotations

import random
from datetime import timedelta

import numpy as np
import pytest
from django.conf import settings
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from anomaly.actions import do_record_findings
from anomaly.detectors.training import (
    DIVERGENCE_FIELDS,
    MAD_TO_SIGMA,
    DivergenceDetector,
    StragglerDetector,
    group_median,
    group_quantile,
)
from anomaly.jobs import KINDS, job_findings
from anomaly.models import Anomaly
from telemetry.api.jobs import parse_snapshot
from telemetry.api.training import do_record_training_steps, parse_training
from telemetry.ingest.schema import TimeParser
from telemetry.models import SAMPLE_MODELS, Allocation, Gpu, Job, Node, TrainingStep
from telemetry.simulator.dynamics import Cluster
from telemetry.simulator.scenarios import ScenarioSet, parse_spec
from telemetry.simulator.topology import topology_document
from telemetry.slurm.sync import do_sync_slurm
from telemetry.topology import do_import_topology
from tests.conftest import FIXED_NOW

NOW = FIXED_NOW
MINUTE = timedelta(minutes=1)


def _gang(rng: np.random.Generator, n: int = 16, base: float = 0.8, jitter: float = 0.015, steps: int = 6):
    """Each rank's median over `steps` step times with `jitter` relative noise."""
    return np.median(base * (1 + jitter * rng.standard_normal((n, steps))), axis=1)


# --- the estimator contract ------------------------------------------------------------------------

@pytest.mark.parametrize("cls, params", [
    (StragglerDetector, {"sigmas": 5.0, "min_slowdown": 0.1, "sigma_floor": 0.02, "min_steps": 4, "min_ranks": 8}),
    (DivergenceDetector, {"sigmas": 4.0, "loss_min_rise": 0.5, "loss_alarm_ratio": 3.0, "grad_min_ratio": 2.0,
                          "sigma_floor": 0.05, "min_history": 5}),
])
def test_detector_params_are_keyword_only_and_stored_unchanged(cls, params):
    detector = cls(**params)
    assert {k: v for k, v in detector.get_params().items() if k in params} == params
    assert clone(detector).get_params() == detector.get_params()
    with pytest.raises(TypeError):
        cls(1.0)


@pytest.mark.parametrize("detector, name", [
    (StragglerDetector(min_ranks=2), "min_ranks"), (StragglerDetector(sigmas=-1.0), "sigmas"),
    (StragglerDetector(min_steps=1.5), "min_steps"), (DivergenceDetector(grad_min_ratio=0.5), "grad_min_ratio"),
    (DivergenceDetector(min_history=0), "min_history"), (DivergenceDetector(loss_alarm_ratio=1.0), "loss_alarm"),
])
def test_bad_params_are_refused_in_fit_naming_the_param(detector, name):
    with pytest.raises(ValueError, match=name):
        if isinstance(detector, StragglerDetector):
            detector.fit([1.0, 1.0, 1.0, 1.0], gang=[1, 1, 1, 1])
        else:
            detector.fit(np.ones((3, 4)), job=[1, 1, 1])


def test_scoring_before_fit_raises_not_fitted():
    with pytest.raises(NotFittedError):
        StragglerDetector().score_samples([1.0], gang=[1])
    with pytest.raises(NotFittedError):
        DivergenceDetector().predict(np.ones((1, 4)), job=[1])


def test_group_median_and_quantile_match_numpy_per_group_and_skip_nan():
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 5, 200)
    values = rng.normal(size=200)
    values[::7] = np.nan
    median, count = group_median(codes, values, 6)
    low, _ = group_quantile(codes, values, 6, 0.25)
    for g in range(5):
        mine = values[(codes == g) & ~np.isnan(values)]
        assert median[g] == pytest.approx(np.median(mine)) and count[g] == len(mine)
        assert low[g] == pytest.approx(np.quantile(mine, 0.25))
    assert np.isnan(median[5]) and count[5] == 0


# --- stragglers -------------------------------------------------------------------------------------

def test_rank_1_3x_slower_is_flagged_with_its_robust_z():
    values = _gang(np.random.default_rng(1))
    values[5] *= 1.3
    gang = np.full(16, 7)
    detector = StragglerDetector().fit(values, gang=gang)
    result = detector.evaluate(values, gang=gang)
    median = np.median(values)
    sigma = max(MAD_TO_SIGMA * np.median(np.abs(values - median)), 0.01 * median)
    z = (values[5] - median) / sigma
    assert list(np.flatnonzero(result.flagged)) == [5]
    assert result.z[5] == pytest.approx(z) and result.slowdown[5] == pytest.approx(values[5] / median - 1)
    e = min(z / 4.0, result.slowdown[5] / 0.08)  # the nearer gate, as a multiple of its threshold
    assert result.score[5] == pytest.approx(e / (1 + e)) and result.score[5] > 0.5
    assert (detector.predict(values, gang=gang) == result.flagged).all()


def test_three_percent_jitter_never_flags_over_many_gangs():
    rng = np.random.default_rng(2)
    values = np.concatenate([_gang(rng, jitter=0.03, base=rng.uniform(0.3, 3.0)) for _ in range(500)])
    gang = np.repeat(np.arange(500), 16)
    detector = StragglerDetector().fit(values, gang=gang)
    assert not detector.predict(values, gang=gang).any()
    assert detector.score_samples(values, gang=gang).max() < 0.5


def test_slightly_slower_rank_in_a_uniform_gang_is_below_min_slowdown():
    values = np.full(16, 1.0)
    values[3] = 1.05  # 5 σ of the floored σ, but only 5 % slower
    result = StragglerDetector().fit(values, gang=np.zeros(16)).evaluate(values, gang=np.zeros(16))
    assert result.z[3] == pytest.approx(5.0) and not result.flagged.any()


def test_warm_up_rank_with_too_few_steps_or_a_tiny_gang_is_not_flagged():
    values = _gang(np.random.default_rng(3))
    values[0] *= 3.0  # its first, compiling steps
    n_steps = np.full(16, 6)
    n_steps[0] = 2
    gang = np.zeros(16)
    result = StragglerDetector().fit(values, gang=gang, n_steps=n_steps).evaluate(values, gang=gang, n_steps=n_steps)
    assert not result.flagged.any() and result.score[0] == 0.0 and np.isnan(result.z[0])
    small = np.array([1.0, 1.0, 1.5])
    assert not StragglerDetector().fit(small, gang=[1, 1, 1]).predict(small, gang=[1, 1, 1]).any()


def test_a_gang_unseen_in_fit_is_not_scored():
    detector = StragglerDetector().fit(np.ones(8), gang=np.zeros(8))
    assert detector.score_samples([5.0], gang=[1]).tolist() == [0.0]


# --- divergence -------------------------------------------------------------------------------------

def _history(points: int = 12, loss: float = 2.0, seed: int = 4) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = np.zeros((points, 4))
    X[:, 0] = loss * (1 + 0.01 * rng.standard_normal(points))
    X[:, 1] = 1.0 + 0.05 * rng.standard_normal(points)
    return X


def test_loss_spike_is_flagged_with_its_robust_z():
    history, recent = _history(), _history(6, loss=3.0, seed=5)
    detector = DivergenceDetector().fit(history, job=np.zeros(12))
    result = detector.evaluate(recent, job=np.zeros(6))
    median = np.median(history[:, 0])
    sigma = max(MAD_TO_SIGMA * np.median(np.abs(history[:, 0] - median)), 0.02 * median)
    z = (np.median(recent[:, 0]) - median) / sigma
    assert result.flagged[0].tolist() == [True, False, False, False]
    assert result.z[0, 0] == pytest.approx(z) and result.expected[0, 0] == pytest.approx(median)
    e = min(z / 6.0, (np.median(recent[:, 0]) / median - 1) / 0.2)
    alarm = np.median(recent[:, 0]) / np.quantile(history[:, 0], 0.25) - 1  # 2x the low end is 1 of 1
    assert alarm < e and result.score[0] == pytest.approx(e / (1 + e))


def test_loss_that_keeps_climbing_stays_flagged_by_its_ratio_to_the_history_low_end():
    history, recent = np.zeros((6, 4)), np.zeros((3, 4))
    history[:, 0] = [1.0, 1.0, 2.0, 2.4, 2.95, 3.0]  # the climb has already widened the history
    recent[:, 0] = [4.0, 4.5, 4.8]
    result = DivergenceDetector().fit(history, job=np.zeros(6)).evaluate(recent, job=np.zeros(3))
    assert result.z[0, 0] < 6 and result.flagged[0, 0]
    e = 4.5 / np.quantile(history[:, 0], 0.25) - 1
    assert result.score[0] == pytest.approx(e / (1 + e))
    without = DivergenceDetector(loss_alarm_ratio=np.inf).fit(history, job=np.zeros(6))
    assert not without.predict(recent, job=np.zeros(3)).any()


def test_nan_in_the_recent_steps_is_flagged_with_score_one():
    recent = _history(6, seed=6)
    recent[-1, 0], recent[-1, 2] = np.nan, 3  # three ranks had a NaN loss
    detector = DivergenceDetector().fit(_history(), job=np.zeros(12))
    result = detector.evaluate(recent, job=np.zeros(6))
    assert result.flagged[0].tolist() == [False, False, True, False]
    assert result.score.tolist() == [1.0] and result.value[0, 2] == 3 and result.z[0, 2] == 3.0
    # A job with no history at all is still caught by its NaNs (and only by them).
    fresh = DivergenceDetector().fit(_history(), job=np.zeros(12)).evaluate(recent, job=np.ones(6))
    assert fresh.flagged[0].tolist() == [False, False, True, False] and np.isnan(fresh.z[0, 0])


def test_grad_norm_explosion_is_flagged():
    recent = _history(6, seed=7)
    recent[:, 1] *= 5.0
    assert DivergenceDetector().fit(_history(), job=np.zeros(12)).evaluate(recent, job=np.zeros(6)).flagged[0, 1]


def test_smoothly_decreasing_noisy_loss_is_not_flagged():
    rng = np.random.default_rng(8)
    t = np.arange(18)
    X = np.zeros((18, 4))
    X[:, 0] = (1.6 + 2.4 * np.exp(-t / 6)) * (1 + 0.02 * rng.standard_normal(18))
    X[:, 1] = 2.0 * np.exp(-t / 10)
    detector = DivergenceDetector().fit(X[:12], job=np.zeros(12))
    assert not detector.predict(X[12:], job=np.zeros(6)).any()
    assert detector.score_samples(X[12:], job=np.zeros(6))[0] == 0.0


# --- job_findings against the database --------------------------------------------------------------

def _place_job(external_id: str, start=NOW - timedelta(hours=1)) -> tuple[Job, list[Gpu]]:
    """A running job on two 8-GPU nodes; hosts named so that hostname order differs from creation order."""
    job = Job.objects.create(source="slurm", external_id=external_id, state="running", start_time=start)
    gpus = []
    for host in (f"zz-{external_id}", f"aa-{external_id}"):
        node = Node.objects.create(hostname=host)
        for i in range(8):
            gpu = Gpu.objects.create(node=node, index=i, uuid=f"GPU-{host}-{i}")
            Allocation.objects.create(job=job, node=node, gpu=gpu, gpu_index=i, start=start)
            gpus.append(gpu)
    gpus.sort(key=lambda g: (g.node.hostname, g.index))  # rank order: hostname, then GPU index
    return job, gpus


def _steps(job: Job, start, end, *, slow: dict[int, float] | None = None, loss=None, nan=None,
           every_s: int = 10, seed: int = 0) -> None:
    """A step every `every_s` per rank in (start, end], 1.5 % jitter; `loss(t)` and `nan(t, rank)`."""
    rng, rows, t = random.Random(seed), [], start + timedelta(seconds=every_s)
    while t <= end:
        for rank in range(16):
            factor = (slow or {}).get(rank, 1.0)
            rows.append(TrainingStep(
                job=job, rank=rank, time=t, step=int(t.timestamp()),
                step_time_s=0.8 * factor * (1 + 0.015 * rng.gauss(0, 1)),
                loss=None if loss is None else loss(t) * (1 + 0.01 * rng.gauss(0, 1)),
                grad_norm=1.0 + 0.05 * rng.gauss(0, 1), nan_count=nan(t, rank) if nan else 0))
        t += timedelta(seconds=every_s)
    TrainingStep.objects.bulk_create(rows)


@pytest.mark.django_db
def test_job_findings_name_the_slow_rank_its_host_gpu_and_deviation():
    job, gpus = _place_job("900")
    _steps(job, NOW - 3 * MINUTE, NOW, slow={11: 1.3})
    other, _ = _place_job("901")
    _steps(other, NOW - 3 * MINUTE, NOW, seed=1)
    (finding,) = job_findings(NOW)
    assert (finding.kind, finding.entity_kind, finding.entity_id) == ("straggler", "rank", "slurm:900#11")
    assert finding.host == "zz-900" == gpus[11].node.hostname and finding.extra == {"gpu_uuid": "GPU-zz-900-3"}
    recent = TrainingStep.objects.filter(job=job, time__gt=NOW - MINUTE, time__lte=NOW)
    per_rank = np.array([[s.step_time_s for s in recent.filter(rank=r).order_by("time")] for r in range(16)])
    medians = np.median(per_rank, axis=1)
    gang = np.median(medians)
    sigma = max(MAD_TO_SIGMA * np.median(np.abs(medians - gang)), 0.01 * gang)
    (c,) = finding.contributions
    assert (c.field, c.label, c.basis) == ("step_time_s", "step time", "gang median")
    assert c.value == pytest.approx(medians[11]) and c.expected == pytest.approx(gang)
    assert c.deviation == pytest.approx((medians[11] - gang) / sigma) and c.deviation > 10
    assert finding.text().startswith(f"step time +{c.deviation:.1f}σ vs gang median (1.3")


@pytest.mark.django_db
def test_straggler_anomaly_is_extended_then_closed_when_the_rank_recovers():
    from anomaly.grouping import HOLD

    job, _ = _place_job("902")
    _steps(job, NOW - 3 * MINUTE, NOW + MINUTE, slow={4: 1.4})
    _steps(job, NOW + MINUTE, NOW + 2 * MINUTE, seed=2)
    counts = [do_record_findings(job_findings(NOW + k * MINUTE), kinds=KINDS, at=NOW + k * MINUTE) for k in range(3)]
    # Recovered at +2 min; its event waits out the hold (anomaly.grouping), then closes as of its last finding.
    counts.append(do_record_findings([], kinds=KINDS, at=NOW + MINUTE + HOLD))
    assert [(c["opened"], c["extended"], c["closed"]) for c in counts] == [(1, 0, 0), (0, 1, 0), (0, 0, 0), (0, 0, 1)]
    (anomaly,) = Anomaly.objects.all()
    assert (anomaly.kind, anomaly.entity_id, anomaly.host) == ("straggler", "slurm:902#4", "aa-902")
    assert (anomaly.started_at, anomaly.last_seen, anomaly.ended_at) == (NOW, NOW + MINUTE, NOW + MINUTE)
    assert anomaly.contributions[0]["field"] == "step_time_s" and anomaly.contributions[0]["deviation"] > 10


@pytest.mark.django_db
def test_slow_warm_up_steps_after_the_job_start_are_left_out():
    start = NOW - timedelta(seconds=70)
    job, _ = _place_job("903", start=start)
    _steps(job, start, start + MINUTE, slow={2: 2.0})  # compiling, on one rank more than the others
    _steps(job, start + MINUTE, NOW, seed=3)
    assert job_findings(NOW) == []
    assert [f.entity_id for f in job_findings(NOW, warmup=timedelta(0))] == ["slurm:903#2"]


@pytest.mark.django_db
def test_loss_spike_then_nan_make_a_divergence_finding_that_can_be_stored():
    job, _ = _place_job("904")
    spike = NOW - timedelta(seconds=50)
    _steps(job, NOW - 3 * MINUTE, NOW, loss=lambda t: 2.0 if t < spike else 4.0,
           nan=lambda t, rank: int(t == NOW and rank < 3))
    (finding,) = job_findings(NOW)
    assert (finding.kind, finding.entity_kind, finding.entity_id, finding.score) == ("divergence", "job", "slurm:904",
                                                                                   1.0)
    fields = [c.field for c in finding.contributions]
    assert fields == ["loss", "nan_count"] and finding.host == "aa-904"
    loss = finding.contributions[0]
    assert loss.value == pytest.approx(4.0, rel=0.02) and loss.expected == pytest.approx(2.0, rel=0.02)
    assert finding.contributions[1].value == 3 and finding.text().startswith("loss not finite: 3 NaN, 0 Inf")
    do_record_findings([finding], kinds=KINDS, at=NOW)
    assert Anomaly.objects.get().contributions[1] == {
        "field": "nan_count", "label": "NaN count", "value": 3.0, "expected": 0.0, "deviation": 3.0,
        "basis": "own history"}


@pytest.mark.django_db
def test_steady_jobs_with_falling_loss_give_no_findings():
    for k in range(3):
        job, _ = _place_job(f"91{k}")
        _steps(job, NOW - 3 * MINUTE, NOW, loss=lambda t: 1.5 + (NOW - t).total_seconds() / 100, seed=k)
    assert job_findings(NOW) == []
    assert set(KINDS) == {"straggler", "divergence"} and len(DIVERGENCE_FIELDS) == 4


# --- lock-step jobs: compute time and the GPUs' own telemetry ----------------------------------------

GpuSample = SAMPLE_MODELS["gpu"]["raw"]


def _activity(gpus: list[Gpu], *, slow: dict[int, dict] | None = None, sm: float = 0.7, seed: int = 0,
              start=NOW - MINUTE, end=NOW, every_s: int = 10) -> None:
    """GPU samples every `every_s` in (start, end]: SM activity `sm` ± 1 %, clocks 1,755 MHz ± 0.5 %
    under the power cap; `slow[rank]` overrides fields of that rank's GPU."""
    rng, rows, t = random.Random(seed), [], start + timedelta(seconds=every_s)
    while t <= end:
        for rank, gpu in enumerate(gpus):
            fields = {"sm_active": sm * (1 + 0.01 * rng.gauss(0, 1)), "sm_clock": 1755 * (1 + 0.005 * rng.gauss(0, 1)),
                      "power_w": 690.0, "gpu_temp": 70.0, "throttle_reasons": 0x04, "nvlink_crc_flit_errors": 2,
                      "nvlink_replay_errors": 0, "pcie_replay": 1, **(slow or {}).get(rank, {})}
            rows.append(GpuSample(gpu_id=gpu.id, time=t, **fields))
        t += timedelta(seconds=every_s)
    GpuSample.objects.bulk_create(rows)


@pytest.mark.django_db
@pytest.mark.parametrize("evidence, cause", [
    ({"sm_clock": 1520, "throttle_reasons": 0x04 | 0x20}, "thermal throttling"),
    ({"sm_clock": 1520, "throttle_reasons": 0x04 | 0x80}, "power throttling"),
    ({"sm_clock": 1520}, "clocks held down with no throttle reason reported"),
    ({}, None),
])
def test_a_job_that_reports_nothing_has_its_slow_rank_found_by_sm_activity_and_its_cause_named(evidence, cause):
    job, gpus = _place_job("920")
    _activity(gpus, slow={11: {"sm_active": 0.7 * 1.13, **evidence}})
    other, other_gpus = _place_job("921")
    _activity(other_gpus, seed=1)
    (finding,) = job_findings(NOW)
    assert (finding.kind, finding.entity_kind, finding.entity_id) == ("straggler", "rank", "slurm:920#11")
    assert finding.extra == {"gpu_uuid": gpus[11].uuid} and finding.host == gpus[11].node.hostname
    primary = finding.contributions[0]
    assert (primary.field, primary.basis) == ("sm_active", "gang median") and primary.deviation > 4
    assert "computes 1.1" in finding.summary and "which wait for it in the collective" in finding.summary
    if cause is None:
        assert finding.summary.endswith("no cause visible in its GPU's telemetry") and len(finding.contributions) == 1
    else:
        assert finding.summary.endswith(f"likely cause: {cause}")
        clock = finding.contributions[1]
        assert (clock.field, clock.value) == ("sm_clock", 1520) and clock.expected == pytest.approx(1755, rel=0.01)


@pytest.mark.django_db
def test_nvlink_errors_rising_on_the_slow_rank_alone_are_named():
    job, gpus = _place_job("922")
    _activity(gpus, slow={3: {"sm_active": 0.8}})
    GpuSample.objects.filter(gpu_id=gpus[3].id, time=NOW).update(nvlink_crc_flit_errors=40)
    (finding,) = job_findings(NOW)
    assert finding.entity_id == "slurm:922#3" and finding.summary.endswith("likely cause: NVLink errors rising")
    assert [c.field for c in finding.contributions] == ["sm_active", "nvlink_crc_flit_errors"]


@pytest.mark.django_db
def test_a_busy_job_sharing_the_slow_ranks_node_is_named_as_a_noisy_neighbour():
    job, gpus = _place_job("925")
    _activity(gpus, slow={0: {"sm_active": 0.8}})
    neighbour = Job.objects.create(source="slurm", external_id="926", state="running", start_time=NOW - MINUTE * 60)
    node = gpus[0].node
    extra = Gpu.objects.create(node=node, index=8, uuid=f"GPU-{node.hostname}-8")
    Allocation.objects.create(job=neighbour, node=node, gpu=extra, gpu_index=8, start=NOW - MINUTE * 60)
    _activity([extra], sm=0.9, seed=3)
    (finding,) = job_findings(NOW)
    assert finding.entity_id == "slurm:925#0"
    assert finding.summary.endswith("likely cause: shares its node with 1 other busy job")


@pytest.mark.django_db
@pytest.mark.parametrize("case", ["uniform", "idle gang", "slower but within 8 %", "joined this minute"])
def test_gpu_activity_that_is_not_a_straggler_is_not_flagged(case):
    start = NOW - timedelta(seconds=30) if case == "joined this minute" else NOW - timedelta(hours=1)
    job, gpus = _place_job("923", start=start)
    slow = {"uniform": {}, "idle gang": {5: {"sm_active": 0.15}},
            "slower but within 8 %": {5: {"sm_active": 0.7 * 1.05}},
            "joined this minute": {5: {"sm_active": 0.95}}}[case]
    _activity(gpus, slow=slow, sm=0.1 if case == "idle gang" else 0.7)
    assert job_findings(NOW) == []


@pytest.mark.django_db
def test_compute_time_finds_the_rank_that_lock_step_step_times_hide_and_one_finding_per_rank():
    job, gpus = _place_job("924")
    rows, rng = [], random.Random(5)
    for k in range(1, 7):
        t, wall = NOW - MINUTE + timedelta(seconds=10 * k), 1.0 * (1 + 0.015 * rng.gauss(0, 1))
        for rank in range(16):
            compute = 0.8 * (1.15 if rank == 7 else 1.0) * (1 + 0.015 * rng.gauss(0, 1))
            rows.append(TrainingStep(job=job, rank=rank, time=t, step=k, compute_time_s=compute,
                                     step_time_s=wall * (1 + 0.001 * rng.gauss(0, 1))))
    TrainingStep.objects.bulk_create(rows)
    _activity(gpus, slow={7: {"sm_active": 0.7 * 1.13, "sm_clock": 1500, "throttle_reasons": 0x24}})
    (finding,) = job_findings(NOW)
    assert finding.entity_id == "slurm:924#7"
    primary = finding.contributions[0]
    assert (primary.field, primary.label) == ("compute_time_s", "compute time")
    assert primary.value / primary.expected == pytest.approx(1.15, rel=0.03)
    assert finding.summary.endswith("likely cause: thermal throttling")
    # Without compute times the same step times say nothing: every rank waited for rank 7.
    TrainingStep.objects.update(compute_time_s=None)
    GpuSample.objects.all().delete()
    assert job_findings(NOW) == []


# --- the simulator's scenarios, fed through the ingest actions ---------------------------------------

def _ingest(tick) -> None:
    """What the runner would POST, through the actions the jobs and training endpoints call."""
    if tick.jobs:
        jobs, allocations = parse_snapshot(tick.jobs)
        do_sync_slurm(jobs, allocations, now=tick.time, complete=tick.jobs.get("complete") is True)
    times = TimeParser(tick.time, settings.INGEST_MAX_FUTURE_SKEW, settings.RETENTION["raw"])
    for body in (*tick.steps, *tick.training):
        source, external, rows = parse_training(body, times)
        do_record_training_steps(source, external, rows)


@pytest.mark.django_db
def test_simulated_straggler_is_found_within_two_minutes_and_divergence_after_its_spike():
    scenarios = ScenarioSet([parse_spec("straggler@4"), parse_spec("divergence@1")], seed=11, speed=5)
    cluster = Cluster.build(64, seed=11, scenarios=scenarios)
    do_import_topology(topology_document(cluster.layout))
    passes = {}
    for k in range(6 * 7 + 1):  # seven minutes of 10 s ticks, scored every minute
        tick = cluster.step(NOW + timedelta(seconds=10 * k))
        _ingest(tick)
        if k % 6 == 0:
            passes[tick.time] = job_findings(tick.time)
    straggler, divergence = scenarios.records  # armed on the first tick
    started = NOW + 4 * MINUTE
    expected = f"slurm:sim-{straggler['entity']}#{straggler['details']['rank']}"
    stragglers = {at: [f for f in found if f.kind == "straggler"] for at, found in passes.items()}
    assert all(not found for at, found in stragglers.items() if at < started), "no rank straggles before it starts"
    flagged = [at for at, found in stragglers.items() if found]
    assert flagged and flagged[0] - started <= 2 * MINUTE
    assert {f.entity_id for found in stragglers.values() for f in found} == {expected}
    first = stragglers[flagged[0]][0]
    assert first.extra == {"gpu_uuid": straggler["details"]["gpu_uuid"]} and first.host == straggler["host"]
    assert first.contributions[0].value / first.contributions[0].expected == pytest.approx(
        straggler["details"]["slowdown"], rel=0.05)

    spike_at = NOW + MINUTE + timedelta(seconds=600 / 5)  # the story's spike (10 min at 5x), in real seconds
    story_end = NOW + MINUTE + timedelta(seconds=1200 / 5)
    assert spike_at.isoformat() == divergence["details"]["spike_at"].replace("Z", "+00:00")
    diverging = {at: [f for f in found if f.kind == "divergence"] for at, found in passes.items()}
    assert all(not found for at, found in diverging.items() if at < spike_at)
    later = [found for at, found in diverging.items() if spike_at + MINUTE <= at <= story_end]
    assert later and all([f.entity_id for f in found] == [divergence["details"]["training_job"]] for found in later)
