"""The per-minute scoring pass: every detector on the fleet as of `at`, findings stored as events.

1. Load the GPU, port and rack feature matrices as of `at` (`anomaly.features`).
2. GPUs: peers in the same node running the same job (or idle together), else peers in the same
   job; their own history; the active cohort model (if trained).
3. Ports: each switch port against the other ports of its switch (a link against its leaf), and
   against its own history.
4. Racks: power against the rack's cap, and power and inlet air against the rack's own history.
   Jobs: stragglers and divergence (`anomaly.jobs`).
5. Record all findings in one `do_record_findings` call, so events open, extend and close together.
Detector code stays pure; this module only moves arrays between the loaders and the actions.

Own history (AnomalyKind.BASELINE) is the detector `anomaly_eval` measures, with its settings,
through `anomaly.detectors.own_history.OwnHistory`: fitted on each entity's last day
(`features.own_history`) at most every REFIT_EVERY per process (in groups spread over the passes),
and between refits each pass scores the entity's newest row against its own threshold. A GPU is
compared only with its own rows from the job and busy/idle state it is in now (its regime):
temperatures, power and clocks follow the work, and a GPU that started a new job is not a GPU that
changed.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

import numpy as np
from sklearn.exceptions import NotFittedError

from anomaly import features as F
from anomaly import jobs as job_detectors
from anomaly.actions import do_record_findings
from anomaly.detectors._robust import grouped_median_mad
from anomaly.detectors.own_history import OwnHistory
from anomaly.detectors.peer import PeerDeviation
from anomaly.findings import Contribution, Finding
from anomaly.models import AnomalyKind
from anomaly.registry import load_active
from telemetry.selectors.power import power_overview

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
Z_THRESHOLD = 6.0
TOP = 3
OWN_BASIS = "own history"
REFIT_EVERY = timedelta(minutes=10)
# A refit of 16k GPUs costs ~20 s of CPU and a read of ~3M rollup rows, one of 64k ports several
# times the read: done in one pass, it would hold up that minute's scoring. So each kind is refitted
# in groups of entities (by id), each group in its own pass, and GPUs and ports in different passes:
# the GPU groups at minutes 0, 2, 4, 6, 8 of every ten, the port groups at 1, 3, 5, 7, 9.
REFIT_GROUPS = {"gpu": 5, "port": 5, "rack": 1}
REFIT_OFFSET = {"gpu": timedelta(0), "port": timedelta(minutes=1), "rack": timedelta(0)}


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
    m = F.gpu_matrix(at)
    kinds = {AnomalyKind.PEER_NODE, AnomalyKind.PEER_JOB, AnomalyKind.BASELINE}
    active = load_active("cohort")
    if active is not None:  # without a model its events are left as they are, not closed
        kinds.add(AnomalyKind.COHORT)
    if not len(m):
        return [], kinds
    own = _own_models("gpu", at, m, lambda sub: fit_gpu_history(sub, *_gpu_history(at, sub)))
    return gpu_findings(m, own=own, cohort=active and active[1]), kinds


def gpu_findings(m: F.Matrix, *, own: list[OwnHistory], cohort) -> list[Finding]:
    """Every GPU detector on one feature matrix: pure arrays in, findings out (what bench/anomaly times)."""
    found = gpu_peer_findings(m)
    regimes = gpu_regimes(m) if own else None
    for models in own:
        found += own_findings(models, m, F.OWN_GPU_FEATURES, "gpu", regimes=regimes)
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


# --- own history -------------------------------------------------------------------------------

_OWN_CACHE: dict[str, tuple] = {}


def clear_caches() -> None:
    """Forget the memoised own-history models and inventory (tests, and a replay that moves to other data)."""
    _OWN_CACHE.clear()
    F._MEMO.clear()


def _own_models(kind: str, at: datetime, m: F.Matrix, fit) -> list[OwnHistory]:
    """The own-history models of the entities of `m`, one OwnHistory per refit group (entity id
    modulo REFIT_GROUPS[kind]), each refitted by `fit(sub-matrix)` at most every REFIT_EVERY per
    process, in the pass its turn falls in (a new process fits every group in its first pass)."""
    n = REFIT_GROUPS[kind]
    cache = _OWN_CACHE.setdefault(kind, {})
    for g in range(n):
        slot = (at - REFIT_OFFSET[kind] - g * REFIT_EVERY / n).timestamp() // REFIT_EVERY.total_seconds()
        if g in cache and cache[g][0] == slot:
            continue
        cache.pop(g, None)  # the old models go before the new ones are fitted: never both in memory
        rows = m.ids % n == g
        t = time.process_time()
        model = fit(F.Matrix(m.ids[rows], m.X[rows], m.features, {k: v[rows] for k, v in m.context.items()}))
        logger.info("own history, %s group %d/%d: %d of %d have enough history; fitted in %.1f s CPU", kind, g + 1,
                    n, int(np.isfinite(model.thresholds_).sum()), model.n_entities_, time.process_time() - t)
        cache[g] = (slot, model)
    return [cache[g][1] for g in range(n)]


def gpu_regimes(m: F.Matrix) -> np.ndarray:
    """Each GPU's regime: its job (or none) and whether it is busy; "" while it is changing jobs."""
    util = m.X[:, [f.name for f in m.features].index("gpu_util")]
    busy = np.where(np.nan_to_num(util, nan=0.0) >= F.BUSY_UTIL, "|busy", "|idle")
    return np.where(m.context["settled"], np.char.add(m.context["job"].astype(str), busy), "").astype(object)


def _gpu_history(at: datetime, m: F.Matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    """(H of OWN_GPU_FEATURES, busy (E, rows), job codes (E, rows), {job: code}) for the GPUs of `m`."""
    H = F.own_history("gpu", at, m.ids, F.OWN_GPU_FEATURES + F.GPU_STATE)
    jobs, codes = F.job_history(at, m.ids)
    return H[:, :, :-1], np.nan_to_num(H[:, :, -1], nan=0.0) >= F.BUSY_UTIL, jobs, codes


def fit_gpu_history(m: F.Matrix, H: np.ndarray, busy: np.ndarray, jobs: np.ndarray,
                    codes: dict[str, int]) -> OwnHistory:
    """Own-history models of the GPUs of `m` (ids sorted), each on its history rows in its current
    regime (H's rows from other regimes are set to NaN in place: a copy would be ~60 MB at 16k GPUs)."""
    regimes = gpu_regimes(m)
    job_now = np.array([codes.get(j, -2) if j else 0 for j in m.context["job"]])
    busy_now = np.char.endswith(regimes.astype(str), "|busy")
    same = (jobs == job_now[:, None]) & (busy == busy_now[:, None]) & (regimes != "")[:, None]
    H[~same] = np.nan
    return OwnHistory(positive_only=_rates(F.OWN_GPU_FEATURES)).fit(m.ids, H, regimes)


def _rates(features: tuple[F.Feature, ...]) -> list[int]:
    """Counter-rate columns: fewer errors than usual is never a problem."""
    return [j for j, f in enumerate(features) if f.how == "rate"]


def own_findings(own: OwnHistory, m: F.Matrix, features: tuple[F.Feature, ...], entity_kind: str, *,
                 regimes: np.ndarray | None = None) -> list[Finding]:
    """BASELINE findings for the rows of `m` beyond their own threshold, explained by the features
    that deviate most from the entity's own history."""
    names = [f.name for f in m.features]
    X = m.X[:, [names.index(f.name) for f in features]]
    hit = own.flag(m.ids, X, regimes)
    out = []
    for k, i in enumerate(hit.rows):
        # Recorded only when a metric is Z_THRESHOLD σ or more from what the entity's own history
        # expected, the rule every fleet finding follows: the detector's 10⁻³ risk per row is its
        # measured setting, but fitted on a day of 15-minute windows (96 rows) the threshold is a
        # small-sample estimate that lets ~0.6 % of noise-only GPUs through each pass (bench/anomaly),
        # ~100 events a minute at 16k GPUs. A positive-only feature below its expectation was scored
        # at it (z 0), so it is never a reason.
        top = [(int(j), float(z)) for j, z in zip(hit.features[k], hit.z[k], strict=True)
               if np.isfinite(z) and abs(z) >= Z_THRESHOLD]
        if not top:
            continue
        contributions = tuple(Contribution(features[j].name, features[j].label, float(X[i, j]),
                                           float(hit.expected[k, j]), z, OWN_BASIS) for j, z in top)
        entity, host = _entity(m, i, entity_kind)
        # 0.5 at the threshold, 1 at twice it; a threshold under 1 counts as 1 (a constant history's is 0).
        unit = max(float(hit.thresholds[k]), 1.0)
        score = min(1.0, 0.5 + 0.5 * (float(hit.scores[k]) - float(hit.thresholds[k])) / unit)
        out.append(Finding(AnomalyKind.BASELINE, entity_kind, entity, score, contributions, host=host))
    return out


def _entity(m: F.Matrix, i: int, entity_kind: str) -> tuple[str, str]:
    """(entity id, host) as the other detectors of the kind name them: a GPU's UUID, a port's
    database id (its switch and name as host), a rack's name."""
    if entity_kind == "gpu":
        return str(m.context["uuid"][i]), str(m.context["host"][i])
    if entity_kind == "port":
        return str(m.ids[i]), str(m.context["name"][i])
    return str(m.context["name"][i]), ""


def _cohort_findings(m: F.Matrix, det) -> list[Finding]:
    """Cohort outliers among GPUs in a steady state: busy, or idle with no job. A job's GPU that is
    nearly idle (warming up, checkpointing, waiting on data) or changing jobs matches neither cohort
    and is judged by the peer and straggler detectors instead (scenario_eval's quiet 16k-GPU hour:
    every unexplained event came from such GPUs in the idle cohort). A flag its job explains is
    dropped and the rest are explained against the job (`_job_levels`)."""
    every = F.state_cohorts(m.X, m.context["cohort"])
    busy = np.char.endswith(every.astype(str), "busy")
    steady = m.context["settled"] & (busy | (m.context["job"] == ""))
    rows = np.flatnonzero(det.predict(m.X, every) & steady)
    if not len(rows):
        return []
    z, expected = det.deviations(m.X[rows], every[rows])
    level = _job_levels(m, every, steady, rows)
    in_job = np.isfinite(level)
    off_job = (m.X[rows] - level) / np.array([det.scale_[str(c)] for c in every[rows]])
    strong = np.nan_to_num(np.abs(z), nan=0.0) >= Z_THRESHOLD
    # Every metric the GPU is far off its cohort on is where its job is too: the job's doing.
    shared = in_job.any(axis=1) & strong.any(axis=1) & ~(
        strong & (~in_job | (np.abs(np.nan_to_num(off_job, nan=0.0)) >= Z_THRESHOLD))).any(axis=1)
    z, expected = np.where(in_job, off_job, z), np.where(in_job, level, expected)
    keep = ~shared
    rows, z, expected, in_job = rows[keep], z[keep], expected[keep], in_job[keep]
    if not len(rows):
        return []
    cohorts = every[rows]
    forest = det.score_samples(m.X[rows], cohorts) - np.array([det.thresholds_[str(c)] for c in cohorts])
    dist = det.distances(m.X[rows], cohorts) / np.array([det.distance_thresholds_[str(c)] for c in cohorts]) - 1
    # 0.5 at either threshold; 1 at 0.1 beyond the forest's, or twice the distance threshold.
    scores = 0.5 + 0.5 * np.clip(np.maximum(forest / 0.1, dist), 0.0, 1.0)
    out = []
    for k, i in enumerate(rows):
        a = np.nan_to_num(np.abs(z[k]), nan=0.0)
        cohort = str(cohorts[k])
        out.append(Finding(AnomalyKind.COHORT, "gpu", str(m.context["uuid"][i]),
                           float(scores[k]), tuple(
            Contribution(m.features[j].name, m.features[j].label, m.X[i, j], expected[k, j], float(z[k, j]),
                         "its job's GPUs" if in_job[k, j] else f"{cohort} cohort")
            for j in np.argsort(-a)[:TOP]), host=str(m.context["host"][i])))
    return out


# A median over the job's GPUs is the job's own level only when the flagged GPU cannot be half of it.
JOB_LEVEL_MIN_GPUS = 3


def _job_levels(m: F.Matrix, every: np.ndarray, steady: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(len(rows), features): the median of each flagged GPU's job over its steady GPUs of the same
    cohort, NaN where it has no job, fewer than `JOB_LEVEL_MIN_GPUS` such GPUs, or none reports the
    metric. A job sets what its GPUs do (a checkpoint pause drops every rank's utilisation at once;
    an embedding job moves little over NVLink), and a workload the cohort rarely saw is not a fault
    of the GPU running it: a flag stands only where the GPU is `Z_THRESHOLD` σ (its cohort's σ) off
    its job's median on a metric it is that far off its cohort on, and it is explained by what sets
    it apart from its job (NVLink errors its peers do not have), not by the job's workload. Quiet
    scenario-free runs: the unexplained cohort findings were GPUs that looked like the rest of their
    job, and one true NVLink error burst that the job's low traffic pushed out of its explanation."""
    out = np.full((len(rows), m.X.shape[1]), np.nan)
    jobs = m.context["job"]
    wanted = {j for j in jobs[rows] if j}
    if not wanted:
        return out
    # Only the GPUs of the flagged GPUs' jobs are grouped (the flagged ones are steady, so among them).
    theirs = np.flatnonzero(steady & np.fromiter((j in wanted for j in jobs), dtype=bool, count=len(jobs)))
    keys = np.char.add(np.char.add(jobs[theirs].astype(str), "|"), every[theirs].astype(str))
    level, _, size = grouped_median_mad(m.X[theirs], keys)
    at = {int(i): k for k, i in enumerate(theirs)}
    for k, i in enumerate(rows):
        p = at.get(int(i))
        if p is not None and size[p] >= JOB_LEVEL_MIN_GPUS:
            out[k] = level[p]
    return out


# --- ports, racks, jobs ---------------------------------------------------------------------

def _port_findings(at: datetime) -> tuple[list[Finding], set[str]]:
    kinds = {AnomalyKind.PEER_LEAF, AnomalyKind.BASELINE}
    m = F.port_matrix(at)
    if not len(m):
        return [], kinds
    own = _own_models("port", at, m, lambda sub: OwnHistory(positive_only=_rates(F.OWN_PORT_FEATURES)).fit(
        sub.ids, F.own_history("port", at, sub.ids, F.OWN_PORT_FEATURES)))
    return port_peer_findings(m) + [f for models in own for f in own_findings(models, m, F.OWN_PORT_FEATURES,
                                                                                "port")], kinds


def port_peer_findings(m: F.Matrix) -> list[Finding]:
    """Leaf uplinks: PortXmitWait against every leaf uplink of the fleet (ECMP spreads load evenly,
    and a congested leaf backs up all its uplinks at once, so its own leaf is no yardstick for
    waiting) and utilisation against the other uplinks of the same leaf. Every other switch port
    (downlinks carry their node's job; a spine's ports carry different leaves) is judged on its
    error counters only, against the other ports of its switch on the same side."""
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
    return out


def _rack_findings(at: datetime) -> tuple[list[Finding], set[str]]:
    out = []
    for r in power_overview(now=at)["racks"]:
        pct = r.get("pct_of_cap")
        if pct is None or pct <= 100:
            continue
        c = Contribution("rack_power", "rack power", r["draw_w"], r["cap_w"], (pct - 100) / 5, "its cap")
        out.append(Finding(AnomalyKind.RACK_POWER, "rack", r["name"], float(min(1.0, 0.5 + (pct - 100) / 20)), (c,),
                           summary=f"rack power {pct:.0f}% of its {r['cap_w'] / 1000:.1f} kW cap"))
    m = F.rack_matrix(at)
    if len(m):
        own = _own_models("rack", at, m, lambda sub: OwnHistory().fit(sub.ids, F.rack_history(at, sub.ids)))
        out += [f for models in own for f in own_findings(models, m, F.RACK_FEATURES, "rack")]
    return out, {AnomalyKind.RACK_POWER, AnomalyKind.BASELINE}


def _job_findings(at: datetime) -> tuple[list[Finding], set[str]]:
    return job_detectors.job_findings(at), set(job_detectors.KINDS)
