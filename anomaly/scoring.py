"""The per-minute scoring pass: every detector on the fleet as of `at`, findings stored as events.

1. Load the GPU and port feature matrices as of `at` (`anomaly.features`).
2. GPUs: peers in the same node running the same job (or idle together), else peers in the same
   job; their own time-of-day baseline for error rates; the active cohort model (if trained).
3. Ports: each switch port against the other ports of its switch (a link against its leaf).
4. Racks: power against the rack's cap. Jobs: stragglers and divergence (`anomaly.jobs`).
5. Record all findings in one `do_record_findings` call, so events open, extend and close together.
Detector code stays pure; this module only moves arrays between the loaders and the actions.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime

import numpy as np
from sklearn.exceptions import NotFittedError

from anomaly import features as F
from anomaly.actions import do_record_findings
from anomaly.detectors.baseline import SeasonalRobustBaseline
from anomaly.detectors.peer import PeerDeviation
from anomaly.findings import Contribution, Finding
from anomaly.models import AnomalyKind

logger = logging.getLogger(__name__)
INF = float("inf")

# A feature must differ from its peers by at least this much, as well as by z_threshold σ, so a
# group that agrees to the last digit does not flag noise. inf: not compared with peers (XIDs and
# throttling are fault events and states with their own alerts, not peer deviations).
GPU_MIN_DELTA = {
    "gpu_util": 20.0, "sm_clock": 200.0, "mem_clock": 200.0, "gpu_temp": 10.0, "memory_temp": 10.0, "power_w": 80.0,
    "fb_used": 8192.0, "sm_active": 0.2, "sm_occupancy": 0.2, "tensor_active": 0.2, "dram_active": 0.2,
    # Traffic depends on a rank's role in its collectives, so peers legitimately differ.
    "nvlink_tx_bps": INF, "pcie_tx_bps": INF, "ecc_sbe_vol": 5.0, "pcie_replay": 5.0, "nvlink_crc_flit_errors": 5.0,
    "nvlink_replay_errors": 5.0, "nvlink_recovery_errors": 1.0, "throttle_reasons": INF, "xid_events": INF,
}
# Absolute σ floors: the smallest spread a feature is ever judged against.
GPU_SCALE_FLOOR = {
    # Temperatures: GPUs in one chassis sit in different airflow, a couple of °C apart when healthy.
    "gpu_util": 2.0, "sm_clock": 20.0, "mem_clock": 20.0, "gpu_temp": 2.0, "memory_temp": 2.0, "power_w": 5.0,
    "fb_used": 512.0, "sm_active": 0.02, "sm_occupancy": 0.02, "tensor_active": 0.02, "dram_active": 0.02,
    "nvlink_tx_bps": 1e8, "pcie_tx_bps": 1e8, "ecc_sbe_vol": 1.0, "pcie_replay": 1.0, "nvlink_crc_flit_errors": 1.0,
    "nvlink_replay_errors": 1.0, "nvlink_recovery_errors": 0.5, "throttle_reasons": 1.0, "xid_events": 1.0,
}
PORT_SCALE_FLOOR = {"link_util": 2.0, "xmit_wait": 1e5, "symbol_errors": 1.0, "link_error_recovery": 0.5,
                    "link_downed": 0.5, "rcv_errors": 1.0}
PORT_MIN_DELTA = {"link_util": 25.0, "xmit_wait": 1e6, "symbol_errors": 5.0, "link_error_recovery": 1.0,
                  "link_downed": 1.0, "rcv_errors": 5.0}
# Error rates compared with the GPU's own history: σ floors in errors per minute.
BASELINE_FLOOR = {"ecc_sbe_vol": 1.0, "pcie_replay": 1.0, "nvlink_crc_flit_errors": 1.0, "nvlink_replay_errors": 1.0,
                  "nvlink_recovery_errors": 0.5}
Z_THRESHOLD = 6.0
TOP = 3


def score_fleet(at: datetime) -> dict:
    """Run every detector on the state as of `at`, store the findings; returns counts and timings."""
    t0 = time.perf_counter()
    findings, kinds, timings = [], set(), {}
    for name, step in (("gpu", _gpu_findings), ("port", _port_findings), ("rack", _rack_findings),
                       ("job", _job_findings)):
        t = time.perf_counter()
        found, ran = step(at)
        findings += found
        kinds |= ran
        timings[name] = round((time.perf_counter() - t) * 1000, 1)
    counts = do_record_findings(findings, kinds=kinds, at=at)
    counts.update(findings=len(findings), ms=round((time.perf_counter() - t0) * 1000, 1), timings=timings)
    logger.info("scored fleet as of %s: %s", at.isoformat(), counts)
    return counts


# --- GPUs ---------------------------------------------------------------------------------------

def _gpu_findings(at: datetime) -> tuple[list[Finding], set[str]]:
    from anomaly.registry import load_active

    m = F.gpu_matrix(at)
    kinds = {AnomalyKind.PEER_NODE, AnomalyKind.PEER_JOB, AnomalyKind.BASELINE}
    active = load_active("cohort")
    if active is not None:  # without a model its events are left as they are, not closed
        kinds.add(AnomalyKind.COHORT)
    if not len(m):
        return [], kinds
    return gpu_findings(m, baseline=_baseline(at), cohort=active and active[1], hour=at.hour), kinds


def gpu_findings(m: F.Matrix, *, baseline: SeasonalRobustBaseline | None, cohort, hour: int) -> list[Finding]:
    """Every GPU detector on one feature matrix: pure arrays in, findings out (what bench/anomaly times)."""
    found = gpu_peer_findings(m)
    if baseline is not None:
        found += _baseline_findings(m, baseline, hour)
    if cohort is not None:
        try:
            found += _cohort_findings(m, cohort)
        except NotFittedError as exc:  # an artefact saved by older code: retrain replaces it
            logger.warning("the active cohort model cannot score (%s); run train_models", exc)
    return found


def gpu_peer_findings(m: F.Matrix) -> list[Finding]:
    """Peers in the node on the same job (or idle together); a GPU not flagged there is compared
    with the GPUs of its job across nodes. GPUs that changed jobs during the window are left out:
    their averages mix two workloads."""
    if not m.context["settled"].all():
        keep = m.context["settled"]
        m = F.Matrix(m.ids[keep], m.X[keep], m.features, {k: v[keep] for k, v in m.context.items()})
    if not len(m):
        return []  # every GPU is changing jobs (a cluster filling up): nothing to compare yet
    names = [f.name for f in m.features]
    det = PeerDeviation(min_delta=[GPU_MIN_DELTA[n] for n in names], scale_floor=[GPU_SCALE_FLOOR[n] for n in names],
                        z_threshold=Z_THRESHOLD).fit(m.X)
    node_groups = np.array([f"{n}|{j}" for n, j in zip(m.context["node"], m.context["job"], strict=True)])
    z_node, exp_node = det.deviations(m.X, node_groups)
    out = _flag(m, z_node, exp_node, AnomalyKind.PEER_NODE, "peers in node")
    flagged = {f.entity_id for f in out}
    running = m.context["job"] != ""
    if running.any():
        z_job, exp_job = det.deviations(m.X[running], m.context["job"][running])
        sub = F.Matrix(m.ids[running], m.X[running], m.features, {k: v[running] for k, v in m.context.items()})
        out += [f for f in _flag(sub, z_job, exp_job, AnomalyKind.PEER_JOB, "peers in job")
                if f.entity_id not in flagged]
    return out


def _flag(m: F.Matrix, z: np.ndarray, expected: np.ndarray, kind: str, basis: str) -> list[Finding]:
    """Findings for rows with any |z| >= Z_THRESHOLD, explained by their largest deviations."""
    a = np.nan_to_num(np.abs(z), nan=0.0)
    rows = np.flatnonzero(a.max(axis=1) >= Z_THRESHOLD) if a.size else []
    out = []
    for i in rows:
        top = [j for j in np.argsort(-a[i])[:TOP] if a[i, j] >= Z_THRESHOLD]
        contributions = tuple(Contribution(m.features[j].name, m.features[j].label, m.X[i, j], expected[i, j],
                                           float(z[i, j]), basis) for j in top)
        ctx = {k: v[i] for k, v in m.context.items()}
        out.append(Finding(kind, "gpu" if "uuid" in ctx else "port", str(ctx.get("uuid") or m.ids[i]),
                           float(min(1.0, 0.5 * a[i].max() / Z_THRESHOLD)), contributions,
                           host=str(ctx.get("host") or ctx.get("name") or "")))
    return out


_BASELINE_CACHE: dict[str, tuple] = {}


def clear_caches() -> None:
    """Forget the memoised baseline and inventory (tests, and a replay that moves to other data)."""
    _BASELINE_CACHE.clear()
    F._MEMO.clear()


def _baseline(at: datetime) -> SeasonalRobustBaseline | None:
    """The fitted own-history baseline, refitted at most every 10 minutes per process."""
    key = at.strftime("%Y%m%d%H") + str(at.minute // 10)
    hit = _BASELINE_CACHE.get("fit")
    if hit and hit[0] == key:
        return hit[1]
    X, ids, slots = F.baseline_history(at)
    det = None
    if len(X):
        det = SeasonalRobustBaseline(min_points=3, z_threshold=Z_THRESHOLD,
                                     scale_floor=[BASELINE_FLOOR[f] for f in F.BASELINE_FEATURES]).fit(X, ids, slots)
    _BASELINE_CACHE["fit"] = (key, det)
    return det


def _baseline_findings(m: F.Matrix, det: SeasonalRobustBaseline, hour: int) -> list[Finding]:
    cols = [next(i for i, f in enumerate(m.features) if f.name == n) for n in F.BASELINE_FEATURES]
    X = m.X[:, cols]
    z, expected = det.deviations(X, m.ids, np.full(len(m), hour))
    z = np.where(X > expected, z, 0.0)  # fewer errors than usual is never a problem
    sub = F.Matrix(m.ids, X, tuple(m.features[c] for c in cols), m.context)
    return _flag(sub, z, expected, AnomalyKind.BASELINE, "own baseline")


def _cohort_findings(m: F.Matrix, det) -> list[Finding]:
    """Cohort outliers among GPUs in a steady state: busy, or idle with no job. A job's GPU that is
    nearly idle (warming up, checkpointing, waiting on data) or changing jobs matches neither cohort
    and is judged by the peer and straggler detectors instead (scenario_eval's quiet 16k-GPU hour:
    every unexplained event came from such GPUs in the idle cohort)."""
    every = F.state_cohorts(m.X, m.context["cohort"])
    busy = np.char.endswith(every.astype(str), "busy")
    steady = m.context["settled"] & (busy | (m.context["job"] == ""))
    rows = np.flatnonzero(det.predict(m.X, every) & steady)
    if not len(rows):
        return []
    cohorts = every[rows]
    forest = det.score_samples(m.X[rows], cohorts) - np.array([det.thresholds_[str(c)] for c in cohorts])
    dist = det.distances(m.X[rows], cohorts) / np.array([det.distance_thresholds_[str(c)] for c in cohorts]) - 1
    # 0.5 at either threshold; 1 at 0.1 beyond the forest's, or twice the distance threshold.
    scores = 0.5 + 0.5 * np.clip(np.maximum(forest / 0.1, dist), 0.0, 1.0)
    z, expected = det.deviations(m.X[rows], cohorts)
    out = []
    for k, i in enumerate(rows):
        a = np.nan_to_num(np.abs(z[k]), nan=0.0)
        cohort = str(cohorts[k])
        out.append(Finding(AnomalyKind.COHORT, "gpu", str(m.context["uuid"][i]),
                           float(scores[k]), tuple(
            Contribution(m.features[j].name, m.features[j].label, m.X[i, j], expected[k, j], float(z[k, j]),
                         f"{cohort} cohort") for j in np.argsort(-a)[:TOP]), host=str(m.context["host"][i])))
    return out


# --- ports, racks, jobs ---------------------------------------------------------------------

def _port_findings(at: datetime) -> tuple[list[Finding], set[str]]:
    """Leaf uplinks: PortXmitWait against every leaf uplink of the fleet (ECMP spreads load evenly,
    and a congested leaf backs up all its uplinks at once, so its own leaf is no yardstick for
    waiting) and utilisation against the other uplinks of the same leaf. Every other switch port
    (downlinks carry their node's job; a spine's ports carry different leaves) is judged on its
    error counters only, against the other ports of its switch on the same side."""
    m = F.port_matrix(at)
    if not len(m):
        return [], {AnomalyKind.PEER_LEAF}
    names = [f.name for f in m.features]
    det = PeerDeviation(min_delta=[PORT_MIN_DELTA[n] for n in names], scale_floor=[PORT_SCALE_FLOOR[n] for n in names],
                        z_threshold=Z_THRESHOLD).fit(m.X)
    leaf_up = m.context["uplink"] & m.context["leaf"]
    side = np.char.add(m.context["switch"].astype(str), np.where(m.context["uplink"], "/up", "/down"))
    z_fleet, e_fleet = det.deviations(m.X, np.where(leaf_up, "leaf uplinks", side))
    z_side, e_side = det.deviations(m.X, side)
    util, wait = names.index("link_util"), names.index("xmit_wait")
    z, expected = z_side.copy(), e_side.copy()
    z[:, wait], expected[:, wait] = np.where(leaf_up, z_fleet[:, wait], 0.0), e_fleet[:, wait]
    z[:, util] = np.where(leaf_up, z_side[:, util], 0.0)
    z = np.where(m.X > expected, z, 0.0)  # a quiet link is not a problem; a busy or erroring one is
    out = []
    for basis, rows in (("leaf uplinks", leaf_up), ("ports on its switch", ~leaf_up)):
        sub = F.Matrix(m.ids[rows], m.X[rows], m.features, {k: v[rows] for k, v in m.context.items()})
        out += _flag(sub, z[rows], expected[rows], AnomalyKind.PEER_LEAF, basis)
    return out, {AnomalyKind.PEER_LEAF}


def _rack_findings(at: datetime) -> tuple[list[Finding], set[str]]:
    from telemetry.selectors.power import power_overview

    out = []
    for r in power_overview(now=at)["racks"]:
        pct = r.get("pct_of_cap")
        if pct is None or pct <= 100:
            continue
        c = Contribution("rack_power", "rack power", r["draw_w"], r["cap_w"], (pct - 100) / 5, "its cap")
        out.append(Finding(AnomalyKind.RACK_POWER, "rack", r["name"], float(min(1.0, 0.5 + (pct - 100) / 20)), (c,),
                           summary=f"rack power {pct:.0f}% of its {r['cap_w'] / 1000:.1f} kW cap"))
    return out, {AnomalyKind.RACK_POWER}


def _job_findings(at: datetime) -> tuple[list[Finding], set[str]]:
    try:
        from anomaly import jobs
    except ImportError:  # the job detectors are optional until their module lands
        return [], set()
    return jobs.job_findings(at), set(jobs.KINDS)
