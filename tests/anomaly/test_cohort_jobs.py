"""The cohort model judges GPUs, not the workloads their jobs run: a GPU that looks exactly like the
rest of its job (a checkpoint pause, an embedding job's low NVLink traffic) is not a cohort finding;
one that stands out from its own job still is. Arrays only, no database."""

from __future__ import annotations

import numpy as np

from anomaly import features as F
from anomaly.detectors.cohort import CohortIsolationForest
from anomaly.models import AnomalyKind
from anomaly.scoring import GPU_SCALE_FLOOR, gpu_findings

NAMES = [f.name for f in F.GPU_FEATURES]
# A busy H100 of a training job, and how much each metric wanders from GPU to GPU.
LEVEL = {"gpu_util": 99.0, "sm_clock": 1980.0, "mem_clock": 2619.0, "gpu_temp": 62.0, "memory_temp": 70.0,
         "power_w": 650.0, "fb_used": 60000.0, "sm_active": 0.8, "sm_occupancy": 0.5, "tensor_active": 0.6,
         "dram_active": 0.4, "nvlink_tx_bps": 2.9e11, "pcie_tx_bps": 5e9}
NOISE = {"gpu_util": 0.4, "sm_clock": 10.0, "mem_clock": 1.0, "gpu_temp": 1.0, "memory_temp": 1.0, "power_w": 8.0,
         "fb_used": 300.0, "sm_active": 0.01, "sm_occupancy": 0.01, "tensor_active": 0.01, "dram_active": 0.01,
         "nvlink_tx_bps": 2e9, "pcie_tx_bps": 1e8}
# The whole job at a checkpoint: every rank nearly idle at once, still above the busy threshold.
PAUSE = {"gpu_util": 12.0, "sm_active": 0.1, "tensor_active": 0.07, "dram_active": 0.05, "nvlink_tx_bps": 3.5e10,
         "power_w": 250.0, "gpu_temp": 45.0, "memory_temp": 55.0}


def _rows(n: int, rng) -> np.ndarray:
    X = np.zeros((n, len(NAMES)))
    for name, level in LEVEL.items():
        X[:, NAMES.index(name)] = level + rng.normal(size=n) * NOISE[name]
    return X


def _matrix(X: np.ndarray, jobs: list[str]) -> F.Matrix:
    n = len(X)
    context = {"uuid": np.array([f"GPU-{i}" for i in range(n)], dtype=object),
               "host": np.array([f"node-{i // 8}" for i in range(n)], dtype=object), "node": np.arange(n) // 8,
               "rack": np.zeros(n), "cohort": np.array(["H100"] * n, dtype=object),
               "job": np.array(jobs, dtype=object), "settled": np.ones(n, dtype=bool)}
    return F.Matrix(np.arange(n, dtype=np.int64), X, F.GPU_FEATURES, context)


def _cohort(rng) -> CohortIsolationForest:
    X = _rows(2000, rng)
    floors = [GPU_SCALE_FLOOR[name] for name in NAMES]
    return CohortIsolationForest(random_state=0, scale_floor=floors).fit(
        X, F.state_cohorts(X, np.array(["H100"] * len(X))))


def _flagged(m: F.Matrix, det) -> set[int]:
    return {int(f.entity_id.removeprefix("GPU-")) for f in gpu_findings(m, own=[], cohort=det)
            if f.kind == AnomalyKind.COHORT}


def test_a_job_pausing_together_is_not_a_cohort_finding_but_a_gpu_apart_from_its_job_is():
    rng = np.random.default_rng(4)
    det = _cohort(rng)
    X = _rows(40, rng)
    jobs = ["slurm:pause"] * 16 + ["slurm:pair"] * 2 + ["slurm:steady"] * 16 + [""] * 6
    for name, level in PAUSE.items():  # 16 GPUs of one job, and both GPUs of a 2-GPU job
        X[:18, NAMES.index(name)] = level + rng.normal(size=18) * NOISE[name]
    X[3, NAMES.index("gpu_temp")] += 30.0  # one GPU of the pausing job runs hot against its job too
    X[20, NAMES.index("pcie_replay")] = 40.0  # a steady job's GPU with replays its peers do not have
    m = _matrix(X, jobs)

    without_jobs = _matrix(X, [""] * len(X))  # the same rows with no job to compare them with
    assert set(range(16)) <= _flagged(without_jobs, det)  # the cohort alone calls the whole pause strange

    flagged = _flagged(m, det)
    assert 3 in flagged and 20 in flagged
    assert not flagged & (set(range(16)) - {3})  # its job explains every other pausing GPU
    assert {16, 17} <= flagged  # two GPUs are too few to tell the job's level from the GPU's

    # Explained by what sets it apart from its job, not by the pause all its job shares.
    why = {f.entity_id: f.contributions[0] for f in gpu_findings(m, own=[], cohort=det) if f.kind == AnomalyKind.COHORT}
    assert (why["GPU-3"].field, why["GPU-3"].basis) == ("gpu_temp", "its job's GPUs")
    assert why["GPU-3"].deviation >= 6 and abs(why["GPU-3"].expected - PAUSE["gpu_temp"]) < 2
    assert why["GPU-20"].field == "pcie_replay"
    assert why["GPU-16"].basis == "H100 · busy cohort"  # no job level to compare with
