"""Own-history findings (AnomalyKind.BASELINE) from arrays alone: GPUs, switch ports and racks against
their own history through RobustMultivariateDetector.fit_many, with no database."""

from __future__ import annotations

import numpy as np
import pytest

from anomaly import features as F
from anomaly.detectors.multivariate import RobustMultivariateDetector
from anomaly.detectors.own_history import OwnHistory
from anomaly.models import AnomalyKind
from anomaly.scoring import fit_gpu_history, gpu_findings, gpu_regimes, own_findings

ROWS = F.HISTORY_ROWS
GPU_NAMES = [f.name for f in F.GPU_FEATURES]
OWN = [f.name for f in F.OWN_GPU_FEATURES]
# A busy GPU's own levels, and how much each wanders between 2-minute windows over a day.
LEVEL = {"gpu_temp": 62.0, "memory_temp": 70.0, "power_w": 650.0, "sm_clock": 1980.0, "mem_clock": 2619.0,
         "ecc_sbe_vol": 4.0, "pcie_replay": 0.0, "nvlink_crc_flit_errors": 0.0, "nvlink_replay_errors": 0.0,
         "nvlink_recovery_errors": 0.0}
NOISE = {"gpu_temp": 0.5, "memory_temp": 0.5, "power_w": 10.0, "sm_clock": 15.0}


def _gpus(n: int, *, jobs=None, seed: int = 0):
    """A matrix of n busy GPUs at their usual levels, and a day of own history around them."""
    rng = np.random.default_rng(seed)
    H = np.empty((n, ROWS, len(OWN)))
    for j, name in enumerate(OWN):
        H[:, :, j] = LEVEL[name] + rng.normal(size=(n, ROWS)) * NOISE.get(name, 0.0)
    H[:, :, OWN.index("ecc_sbe_vol")] = rng.poisson(8, size=(n, ROWS)) / 2  # ~4 SBE/min over 2 minutes
    X = np.zeros((n, len(GPU_NAMES)))
    X[:, GPU_NAMES.index("gpu_util")] = 95.0
    for name in OWN:
        X[:, GPU_NAMES.index(name)] = LEVEL[name]
    context = {"uuid": np.array([f"GPU-{i}" for i in range(n)], dtype=object),
               "host": np.array([f"node-{i // 8}" for i in range(n)], dtype=object),
               "node": np.arange(n) // 8, "rack": np.zeros(n), "cohort": np.array(["H100"] * n, dtype=object),
               "job": np.array(jobs or [""] * n, dtype=object), "settled": np.ones(n, dtype=bool)}
    return F.Matrix(np.arange(10, 10 + n, dtype=np.int64), X, F.GPU_FEATURES, context), H


def _fit(m, H, codes=None, jobs=None):
    busy = np.ones(H.shape[:2], dtype=bool)
    return fit_gpu_history(m, H, busy, np.zeros(H.shape[:2], dtype=np.int32) if jobs is None else jobs, codes or {})


def _set(m, i, name, value):
    m.X[i, GPU_NAMES.index(name)] = value


def test_a_gpu_whose_memory_runs_8_sigma_above_its_own_history_is_flagged_with_memory_temp_first():
    m, H = _gpus(4)
    own = _fit(m, H)
    _set(m, 1, "memory_temp", LEVEL["memory_temp"] + 8 * NOISE["memory_temp"])
    found = own_findings(own, m, F.OWN_GPU_FEATURES, "gpu", regimes=gpu_regimes(m))
    assert [(f.kind, f.entity_kind, f.entity_id, f.host) for f in found] == [
        (AnomalyKind.BASELINE, "gpu", "GPU-1", "node-0")]
    top = found[0].contributions[0]
    assert (top.field, top.label, top.basis, top.value) == ("memory_temp", "memory temperature", "own history", 74.0)
    assert top.deviation > 6 and top.expected == pytest.approx(70.0, abs=0.3)
    assert found[0].text().startswith("memory temperature +") and "σ vs own history" in found[0].text()
    assert 0.5 <= found[0].score <= 1.0


def test_the_pass_runs_own_history_with_the_peers_and_quiet_gpus_are_not_flagged():
    m, H = _gpus(16)
    own = _fit(m, H)
    assert not [f for f in gpu_findings(m, own=[own], cohort=None) if f.kind == AnomalyKind.BASELINE]
    _set(m, 9, "memory_temp", 78.0)  # +8 °C: under the peers' 10 °C minimum, far beyond its own day
    found = gpu_findings(m, own=[own], cohort=None)
    assert [(f.kind, f.entity_id) for f in found] == [(AnomalyKind.BASELINE, "GPU-9")]


def test_fewer_errors_than_usual_is_not_flagged_though_the_bare_detector_would():
    m, H = _gpus(4)
    sbe = OWN.index("ecc_sbe_vol")
    H[2, :, sbe] = np.random.default_rng(5).poisson(200, size=ROWS) / 2  # a GPU that logs ~100 SBE/min all day
    own = _fit(m, H)
    _set(m, 2, "ecc_sbe_vol", 0.0)  # logs none
    assert not own_findings(own, m, F.OWN_GPU_FEATURES, "gpu", regimes=gpu_regimes(m))
    # The same row without the rule is beyond the GPU's threshold: the rule is what keeps it quiet.
    det = RobustMultivariateDetector().fit_many(H[2:3])
    row = m.X[2:3, [GPU_NAMES.index(n) for n in OWN]]
    assert det.score_many(row[:, None, :])[0, 0] > det.thresholds_[0]
    _set(m, 2, "ecc_sbe_vol", 400.0)  # and more errors than usual is
    found = own_findings(own, m, F.OWN_GPU_FEATURES, "gpu", regimes=gpu_regimes(m))
    assert [f.entity_id for f in found] == ["GPU-2"] and found[0].contributions[0].field == "ecc_sbe_vol"
    assert found[0].contributions[0].deviation > 0


def test_a_gpu_with_too_little_history_in_its_regime_is_not_scored():
    m, H = _gpus(3)
    H[0, :-20] = np.nan  # 20 windows: fewer than the detector's min_rows
    own = _fit(m, H)
    assert own.ids_.tolist() == [11, 12] and own.n_entities_ == 3 and np.isfinite(own.thresholds_).all()
    for i in range(3):
        _set(m, i, "memory_temp", 95.0)
    assert sorted(f.entity_id for f in own_findings(own, m, F.OWN_GPU_FEATURES, "gpu", regimes=gpu_regimes(m))) == [
        "GPU-1", "GPU-2"]


def test_a_gpu_is_judged_only_on_history_from_the_job_it_runs_now():
    m, H = _gpus(2, jobs=["slurm:7", "slurm:7"])
    jobs = np.zeros((2, ROWS), dtype=np.int32)
    jobs[:, -40:] = 1  # slurm:7 for the last 40 windows; before that the GPUs ran cooler, with no job
    H[:, :-40, OWN.index("memory_temp")] -= 15.0
    own = _fit(m, H, codes={"slurm:7": 1}, jobs=jobs)
    assert not own_findings(own, m, F.OWN_GPU_FEATURES, "gpu", regimes=gpu_regimes(m))  # 70 °C is this job's normal
    m.context["job"] = np.array(["slurm:8", "slurm:7"], dtype=object)  # GPU 0 moved to another job
    _set(m, 0, "memory_temp", 90.0)
    _set(m, 1, "memory_temp", 90.0)
    assert [f.entity_id for f in own_findings(own, m, F.OWN_GPU_FEATURES, "gpu", regimes=gpu_regimes(m))] == ["GPU-1"]
    m.context["settled"] = np.array([True, False])  # and one changing jobs inside the window is not scored
    assert not own_findings(own, m, F.OWN_GPU_FEATURES, "gpu", regimes=gpu_regimes(m))


def test_ports_and_racks_are_flagged_against_their_own_history_under_their_own_names():
    rng = np.random.default_rng(3)
    port_names = [f.name for f in F.PORT_FEATURES]
    Hp = np.zeros((3, ROWS, len(F.OWN_PORT_FEATURES)))
    Hp[:, :, 0] = rng.poisson(2, size=(3, ROWS))  # a few symbol errors a minute is these links' normal
    ports = F.Matrix(np.array([101, 102, 103]), np.zeros((3, len(port_names))), F.PORT_FEATURES,
                     {"name": np.array(["leaf-1:p1", "leaf-1:p2", "leaf-1:p3"], dtype=object)})
    ports.X[:, port_names.index("symbol_errors")] = 2.0
    ports.X[1, port_names.index("link_downed")] = 3.0  # a link that never went down, down three times
    own = OwnHistory(positive_only=[0, 1, 2, 3]).fit(ports.ids, Hp)
    found = own_findings(own, ports, F.OWN_PORT_FEATURES, "port")
    assert [(f.kind, f.entity_kind, f.entity_id, f.host) for f in found] == [
        (AnomalyKind.BASELINE, "port", "102", "leaf-1:p2")]
    assert found[0].contributions[0].field == "link_downed" and found[0].contributions[0].deviation > 0

    Hr = np.stack([30000 + rng.normal(size=(2, ROWS)) * 300, 24 + rng.normal(size=(2, ROWS)) * 0.3], axis=2)
    racks = F.Matrix(np.array([5, 6]), np.array([[30000.0, 24.0], [30100.0, 31.0]]), F.RACK_FEATURES,
                     {"name": np.array(["r01", "r02"], dtype=object)})
    found = own_findings(OwnHistory().fit(racks.ids, Hr), racks, F.RACK_FEATURES, "rack")
    assert [(f.entity_kind, f.entity_id, f.contributions[0].field) for f in found] == [("rack", "r02", "inlet_temp")]
    assert found[0].text().startswith("inlet temperature +")


def test_blocks_and_row_order_do_not_change_what_is_found():
    m, H = _gpus(9, seed=4)
    for i in (0, 4, 8):
        _set(m, i, "memory_temp", 80.0 + i)
    one = _fit(m, H)
    order = np.random.default_rng(1).permutation(9)
    shuffled = F.Matrix(m.ids[order], m.X[order], m.features, {k: v[order] for k, v in m.context.items()})
    small = OwnHistory(positive_only=one.positive_only, block=2).fit(m.ids[order], H[order], gpu_regimes(m)[order])
    a = {(f.entity_id, f.score, f.contributions) for f in own_findings(one, m, F.OWN_GPU_FEATURES, "gpu",
                                                                       regimes=gpu_regimes(m))}
    b = {(f.entity_id, f.score, f.contributions) for f in own_findings(small, shuffled, F.OWN_GPU_FEATURES, "gpu",
                                                                       regimes=gpu_regimes(shuffled))}
    assert {e for e, _, _ in a} == {"GPU-0", "GPU-4", "GPU-8"} and a == b


def test_each_refit_group_is_refitted_every_ten_minutes_in_a_pass_of_its_own():
    from datetime import UTC, datetime, timedelta

    from anomaly.scoring import _own_models

    m, _ = _gpus(10)
    calls: list[tuple[str, int, list[int]]] = []

    def fitter(kind, minute):
        def fit(sub):
            calls.append((kind, minute, sub.ids.tolist()))
            return OwnHistory().fit(sub.ids, np.full((len(sub), ROWS, 1), np.nan))
        return fit

    noon = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    for minute in range(21):
        for kind in ("gpu", "port"):
            models = _own_models(kind, noon + timedelta(minutes=minute), m, fitter(kind, minute))
            assert sorted(i for own in models for i in own.ids_.tolist()) == []  # no history: nothing fitted
    first = [c for c in calls if c[1] == 0]
    assert len(first) == 10 and sorted(i for kind, _, ids in first if kind == "gpu" for i in ids) == list(range(10, 20))
    later = [(kind, minute, ids) for kind, minute, ids in calls if minute > 0]
    # A new process fits everything at once; after that one group a pass, GPUs on even minutes and
    # ports on odd ones, each group again ten minutes after its last refit.
    assert [(kind, minute) for kind, minute, _ in later] == [
        ("gpu" if minute % 2 == 0 else "port", minute) for minute in range(1, 21)]
    gpu = {minute: ids for kind, minute, ids in later if kind == "gpu"}
    assert gpu[2] == gpu[12] == [11, 16] and gpu[10] == gpu[20] == [10, 15] and gpu[4] == [12, 17]
