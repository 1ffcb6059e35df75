"""GPU failure prediction: the estimator, time splits, metrics, calibration, the registry's promotion
rules, the database loader on a hand-made history, scoring, and the simulated history against the
database's reading of the same telemetry."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import orjson
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from anomaly.failure import (
    EVENT_CLASSES,
    FEATURE_NAMES,
    HISTORY_FIELDS,
    Events,
    FailureFrame,
    FailurePredictor,
    event_history,
    failure_episodes,
    failure_features,
    failure_labels,
    failure_metrics,
    lead_times,
    precision_recall_at,
    time_split,
)
from anomaly.failure_data import build_training_frame, load_history
from anomaly.failure_families import FAMILIES
from anomaly.failure_pipeline import (
    NotEnoughFailures,
    bootstrap_failure_model,
    fit_and_register,
    score_failure_risk,
    train_failure_model,
)
from anomaly.models import Anomaly, EntityScore, ModelStatus, ModelVersion
from anomaly.registry import do_rollback, load_active
from telemetry.models import Gpu, GpuEvent, Hall, Node, Rack, Row, Site
from tests.conftest import FIXED_NOW
from tests.telemetry.factories import insert_rollup

T = FIXED_NOW  # hour-aligned
H = 3600.0
DAY = timedelta(days=1)


# --- synthetic frames: failures announced by SBE bursts in the 3 hours before them ------------------
def _synthetic_frame(*, seed: int = 0, gpus: int = 150, hours: int = 120, scramble_before: float | None = None,
                     ) -> FailureFrame:
    """Hourly rows of `gpus` GPUs; 60 fail once, their sbe_1h jumps in the 3 h before. Rows before
    `scramble_before` (epoch s) get their SBE columns shuffled: a history with no signal to learn."""
    rng = np.random.default_rng(seed)
    t0 = T.timestamp()
    fail_gpu = rng.choice(gpus, 60, replace=False)
    fail_time = t0 + rng.uniform(10, hours + 20, 60) * H
    events = Events.from_rows([(int(g), float(f), "ecc_dbe", 0) for g, f in zip(fail_gpu, fail_time, strict=True)])
    fails_at = np.full(gpus, np.nan)
    fails_at[fail_gpu] = fail_time
    frames = []
    for k in range(hours):
        t, rows = t0 + k * H, np.arange(gpus)
        with np.errstate(invalid="ignore"):
            near = (fails_at > t) & (fails_at <= t + 3 * H)
        sbe = np.where(near, rng.poisson(40, gpus), rng.poisson(0.3, gpus)).astype(float)
        hist = {name: np.zeros(gpus) for name in HISTORY_FIELDS}
        hist.update(sbe_1h=sbe, sbe_24h=sbe + rng.poisson(2, gpus), gpu_index=rows % 8.0)
        frames.append(FailureFrame(hist, rows, np.full(gpus, t), failure_labels(rows, events, t, 24 * H),
                                   np.ones(gpus)))
    frame = FailureFrame.concat(frames)
    if scramble_before is not None:
        early = np.flatnonzero(frame.time < scramble_before)
        for name in ("sbe_1h", "sbe_24h"):
            frame.history[name][early] = rng.permutation(frame.history[name][early])
    frame.episodes = failure_episodes(events, 24 * H)
    return frame


@pytest.fixture(scope="module")
def informative():
    return _synthetic_frame(seed=1)


@pytest.fixture(scope="module")
def informative_model(informative):
    train, _ = time_split(informative.time, gap=24 * H)
    return FailurePredictor(calibration_gap=24 * H).fit(informative.X[train], informative.y[train],
                                                        times=informative.time[train])


# --- the estimator --------------------------------------------------------------------------------
def test_failure_predictor_follows_the_estimator_contract(informative):
    model = FailurePredictor(max_iter=30, calibration="sigmoid", random_state=7)
    assert model.get_params()["max_iter"] == 30 and clone(model).get_params() == model.get_params()
    with pytest.raises(NotFittedError):
        model.predict_proba(informative.X[:5])
    train, test = time_split(informative.time, gap=24 * H)
    X, y, times = informative.X, informative.y, informative.time
    assert model.fit(X[train], y[train], times=times[train]) is model
    assert model.get_params()["max_iter"] == 30 and model.alert_threshold is None  # params untouched
    assert model.n_features_in_ == len(FEATURE_NAMES) and 0.05 <= model.threshold_ <= 0.95
    again = clone(model).fit(X[train], y[train], times=times[train])
    np.testing.assert_array_equal(model.predict_proba(X[test]), again.predict_proba(X[test]))  # seeded
    assert set(np.unique(model.predict(X[test]))) <= {0, 1}
    with pytest.raises(ValueError, match="calibration must be"):
        FailurePredictor(calibration="platt").fit(X[train], y[train], times=times[train])
    with pytest.raises(ValueError, match="features"):
        model.predict_proba(X[:3, :-1])
    with pytest.raises(ValueError, match=r"needs the \d+ FEATURES columns"):
        FailurePredictor().fit(X[train][:, :5], y[train])


def test_precursors_can_only_raise_the_risk(informative):
    # Rows whose only difference is a hotter GPU: the monotone trees may not score them lower.
    train, _ = time_split(informative.time, gap=24 * H)
    X, y, times = informative.X, informative.y, informative.time
    hot = FEATURE_NAMES.index("gpu_temp_max_24h")
    X = X.copy()
    X[:, hot] = np.where(y == 1, 60.0, 80.0)  # a spurious "cooler fails" pattern in the history
    model = FailurePredictor(max_iter=40).fit(X[train], y[train], times=times[train])
    cool, warm = X[:200].copy(), X[:200].copy()
    cool[:, hot], warm[:, hot] = 60.0, 80.0
    assert (model.predict_proba(warm)[:, 1] >= model.predict_proba(cool)[:, 1] - 1e-12).all()
    free = FailurePredictor(max_iter=40, monotonic_cst=None).fit(X[train], y[train], times=times[train])
    assert (free.predict_proba(warm)[:, 1] < free.predict_proba(cool)[:, 1]).mean() > 0.9  # it would learn it


def test_time_split_never_trains_on_a_row_later_than_validation():
    rng = np.random.default_rng(3)
    times = rng.choice(np.arange(100) * 600.0, 2000)
    train, test = time_split(times, test_fraction=0.3, gap=1800)
    assert times[train].max() < times[test].min() - 1800
    assert not set(times[train]) & set(times[test])  # a cut time is never split across both sides
    assert len(np.unique(times[test])) == 30 and set(train) | set(test) < set(range(len(times)))
    with pytest.raises(ValueError, match="nothing left to train"):
        time_split(times, gap=1e9)


# --- metrics, by hand -----------------------------------------------------------------------------------
def test_precision_recall_and_pr_auc_match_the_hand_computation():
    y, p = np.array([1, 0, 1, 0, 0]), np.array([0.9, 0.8, 0.7, 0.2, 0.1])
    assert precision_recall_at(y, p, 0.75) == (0.5, 0.5)  # alerts 0.9 (hit) and 0.8 (false)
    assert precision_recall_at(y, p, 0.95) == (0.0, 0.0)
    frame = FailureFrame({n: np.zeros(5) for n in HISTORY_FIELDS}, np.arange(5), np.zeros(5), y, np.ones(5))
    # AP: precision at each hit, in rank order: 1/1 at 0.9, 2/3 at 0.7 -> (1 + 2/3) / 2
    assert failure_metrics(frame, p, 0.75, 24 * H)["pr_auc"] == round((1 + 2 / 3) / 2, 4)


def test_lead_time_runs_from_the_first_crossing_to_the_failure():
    f = 100 * H
    gpu = np.array([1] * 6 + [2] * 3 + [3] * 2 + [4])
    time = np.array([f - 6 * H, f - 5 * H, f - 4 * H, f - 3 * H, f - 2 * H, f - 1 * H,  # GPU 1
                     f - 3 * H, f - 2 * H, f - 1 * H,  # GPU 2: never alerted
                     f - 2 * H, f - 1 * H,  # GPU 3: alerted from its first row
                     f + 5 * H])  # GPU 4: only a row after its failure
    p = np.array([0.1, 0.2, 0.9, 0.3, 0.8, 0.95, 0.1, 0.2, 0.3, 0.9, 0.9, 0.9])
    episodes = (np.array([1, 2, 3, 4]), np.array([f, f, f, f]))
    leads = lead_times(gpu, time, p, 0.5, episodes, 5 * H)
    # GPU 1: rows from f-5h count (horizon 5 h); first >= 0.5 at f-4h -> 4 h (the dip at f-3h does not reset it).
    np.testing.assert_array_equal(leads, [4 * H, np.nan, np.inf, ])
    frame = FailureFrame({n: np.zeros(len(p)) for n in HISTORY_FIELDS}, gpu, time,
                         ((time < f) & (time >= f - 5 * H)).astype(int), np.ones(len(p)), episodes)
    m = failure_metrics(frame, p, 0.5, 5 * H)
    assert (m["failures"], m["caught"], m["lead_times_seen"], m["lead_time_median_h"]) == (3, 2, 1, 4.0)


def test_failures_of_one_gpu_within_a_horizon_are_one_episode():
    events = Events.from_rows([(7, 10 * H, "ecc_dbe", 0), (7, 10.75 * H, "xid", 79), (7, 40 * H, "xid", 48),
                               (8, 11 * H, "xid", 13), (8, 12 * H, "fallen_off_bus", 0)])
    gpus, times = failure_episodes(events, 24 * H)
    assert list(zip(gpus.tolist(), (times / H).tolist(), strict=True)) == [(7, 10.0), (8, 12.0), (7, 40.0)]


# --- calibration ---------------------------------------------------------------------------------------
def test_calibration_gives_probabilities_that_match_observed_rates():
    rng = np.random.default_rng(5)
    n = 24_000
    X = np.zeros((n, len(FEATURE_NAMES)))
    X[:, 0] = rng.normal(size=n)
    truth = 1 / (1 + np.exp(-(2.0 * X[:, 0] - 3.0)))
    y = (rng.random(n) < truth).astype(int)
    fit, test = slice(0, 16_000), slice(16_000, None)
    # Balanced class weights inflate the trees' raw probabilities; the calibration must undo it.
    model = FailurePredictor(class_weight="balanced", max_iter=50).fit(X[fit], y[fit])
    p = model.predict_proba(X[test])[:, 1]
    raw = model.trees_.predict_proba(X[test])[:, 1]
    assert p.min() >= 0 and p.max() <= 1

    def ece(q):  # expected calibration error over ten equal-width bins of the prediction
        idx = np.minimum((q * 10).astype(int), 9)
        return sum(abs(q[idx == b].mean() - y[test][idx == b].mean()) * (idx == b).mean()
                   for b in np.unique(idx))

    assert ece(p) < 0.02 < 0.1 < ece(raw)
    assert abs(p.mean() - y[test].mean()) < 0.02


# --- registry: promotion, rejection, rollback ------------------------------------------------------------
@pytest.mark.django_db
def test_better_candidate_is_promoted_worse_rejected_and_rollback_restores_the_previous():
    noise = _synthetic_frame(seed=2, scramble_before=float("inf"))
    v1, p1 = fit_and_register(noise, horizon=DAY, params={"trained_on": "test"}, now=T)
    assert p1.promoted and v1.status == ModelStatus.ACTIVE
    good = _synthetic_frame(seed=2)
    v2, p2 = fit_and_register(good, horizon=DAY, params={"trained_on": "test"}, now=T + DAY)
    v1.refresh_from_db()
    assert p2.promoted and v2.metrics["pr_auc"] > v2.metrics["versus"]["pr_auc"] == v1.metrics["pr_auc"]
    assert v1.status == ModelStatus.RETIRED and v1.metrics["holdout_end"] == v2.metrics["holdout_end"]
    # Learns from a scrambled past, judged on the informative holdout: worse than v2 there.
    _, hold = time_split(good.time, gap=24 * H)
    worse_frame = _synthetic_frame(seed=2, scramble_before=good.time[hold].min())
    v3, p3 = fit_and_register(worse_frame, horizon=DAY, params={"trained_on": "test"}, now=T + 2 * DAY)
    assert not p3.promoted and v3.status == ModelStatus.REJECTED and "worse than active v2" in v3.note
    assert load_active("failure")[0].pk == v2.pk
    assert v3.metrics["versus"] == {"version": 2, **{k: ModelVersion.objects.get(pk=v2.pk).metrics[k]
                                                     for k in v3.metrics["versus"] if k != "version"}}
    assert do_rollback("failure", now=T + 3 * DAY).pk == v1.pk
    assert ModelVersion.objects.get(pk=v2.pk).status == ModelStatus.RETIRED
    assert v1.params["horizon_h"] == 24 and v1.features == list(FEATURE_NAMES)


# --- the database loader on a hand-made history --------------------------------------------------------
def _inventory() -> dict[str, Gpu]:
    site = Site.objects.create(name="dc1")
    hall = Hall.objects.create(site=site, name="hall-a")
    Row.objects.create(hall=hall, name="row-01")
    rack = Rack.objects.create(row=Row.objects.create(hall=hall, name="row-02"), name="r02-03", position=3)
    node = Node.objects.create(hostname="gpu-0009", rack=rack, u_position=10)
    loose = Node.objects.create(hostname="gpu-0099")
    gpus = {"a": Gpu.objects.create(uuid="GPU-a", node=node, index=2),
            "b": Gpu.objects.create(uuid="GPU-b", node=node, index=5),
            "c": Gpu.objects.create(uuid="GPU-c", node=loose, index=0)}
    Gpu.objects.filter(uuid="GPU-a").update(first_seen=T - 10 * DAY)
    return gpus


def _event(gpu, kind, at, code=0):
    GpuEvent.objects.create(gpu=gpu, kind=kind, code=code, first_seen=at, last_seen=at, source="api")


@pytest.mark.django_db
def test_loader_reads_the_hand_made_history_into_the_expected_features_and_labels():
    g = _inventory()
    a, b, c = g["a"].id, g["b"].id, g["c"].id
    m = timedelta(minutes=1)
    insert_rollup("gpu", "1m", [
        (a, T - 40 * m, {"ecc_sbe_agg_delta": 100}),  # before the last hour; its hour is the 1h row below
        (a, T - 20 * m, {"ecc_sbe_agg_delta": 5, "nvlink_crc_flit_errors_delta": 3}),
        (a, T + 10 * m, {"ecc_sbe_vol_delta": 7, "ecc_sbe_agg_last": 4990, "remapped_rows_correctable_delta": 1,
                         "remapped_rows_correctable_last": 4, "gpu_temp_max": 86, "nvlink_crc_data_errors_delta": 2,
                         "power_w_min": 300, "gpu_util_max": 90}),  # busy: not an idle reading
        (a, T + 29 * m, {"ecc_sbe_agg_delta": 11, "ecc_sbe_agg_last": 5000, "gpu_temp_max": 90, "pcie_replay_delta": 1,
                         "row_remap_pending_last": 1, "retired_sbe_last": 2}),
        (c, T + 5 * m, {"gpu_temp_max": 60}),
    ])
    insert_rollup("gpu", "1h", [
        (a, T - 25 * timedelta(hours=1), {"ecc_sbe_agg_delta": 1000, "gpu_temp_max": 99}),  # outside the day
        (a, T - 5 * timedelta(hours=1), {"ecc_sbe_agg_delta": 20, "gpu_temp_max": 88, "memory_temp_max": 80,
                                         "remapped_rows_correctable_delta": 2, "remapped_rows_correctable_last": 3,
                                         "pcie_replay_delta": 4, "ecc_dbe_agg_last": 1,
                                         "power_w_min": 80, "gpu_util_max": 0}),  # its newest idle hour
        (a, T - timedelta(hours=1), {"ecc_sbe_agg_delta": 50, "gpu_temp_max": 70, "memory_temp_max": 96,
                                     "remapped_rows_uncorrectable_delta": 1, "nvlink_crc_flit_errors_delta": 10,
                                     "ecc_sbe_agg_last": 4980}),
        (b, T - timedelta(hours=1), {"ecc_sbe_agg_delta": 3}),  # B did not report in the last hour
    ])
    for kind, at, code in [("xid", T - 2 * DAY, 13), ("xid", T - timedelta(hours=1), 48),
                           ("ecc_dbe", T - timedelta(hours=1), 0), ("xid", T - 8 * DAY, 79),
                           ("xid", T + timedelta(minutes=40), 31), ("xid", T + DAY + timedelta(hours=2), 94)]:
        _event(g["a"], kind, at, code)
    _event(g["b"], "fallen_off_bus", T + timedelta(hours=5))
    _event(g["c"], "row_remap_failure", T + timedelta(hours=23))

    t = T + 30 * m
    hist = load_history(t)
    assert hist.uuid == ["GPU-a", "GPU-c"] and hist.host == ["gpu-0009", "gpu-0099"]
    got = {name: hist.values[name][0] for name in HISTORY_FIELDS}
    assert got == pytest.approx({
        "sbe_1h": 5 + 7 + 11, "sbe_24h": 20 + 50 + 7 + 11, "sbe_total": 5000, "dbe_total": 1, "retired_pages": 2,
        "remapped_correctable": 4, "remapped_uncorrectable": np.nan, "remap_growth_24h": 2 + 1 + 1,
        "remap_pending": 1, "gpu_temp_max_24h": 90, "memory_temp_max_24h": 96, "hot_hours_24h": 3,
        "nvlink_crc_1h": 3 + 2, "nvlink_crc_24h": 10 + 2, "pcie_replay_24h": 4 + 1,
        "xid_memory_7d": 2, "xid_bus_7d": 0, "xid_nvlink_7d": 0, "xid_app_7d": 1, "xid_other_7d": 0,
        "failures_30d": 3, "age_days": 10 + 30 / 1440, "row_number": 2, "rack_position": 3, "u_position": 10,
        "gpu_index": 2, "idle_power_w": 80, "survival_log_hazard": np.nan,  # no survival version
        # B, its only peer, did not report in the last hour: nothing to compare with.
        "power_excess_1h": np.nan, "gpu_temp_excess_1h": np.nan, "memory_temp_excess_1h": np.nan}, nan_ok=True)
    loose = {name: hist.values[name][1] for name in ("sbe_1h", "gpu_temp_max_24h", "rack_position", "gpu_index")}
    assert loose == pytest.approx({"sbe_1h": np.nan, "gpu_temp_max_24h": 60, "rack_position": np.nan,
                                   "gpu_index": 0}, nan_ok=True)
    X = failure_features(hist.values)
    assert X[0, FEATURE_NAMES.index("sbe_trend")] == pytest.approx(np.log1p(23) - np.log1p(88 / 24))
    frame = build_training_frame(t, t + timedelta(minutes=30), horizon=DAY, step=timedelta(minutes=30))
    assert [(gid, y) for gid, y, tt in zip(frame.gpu, frame.y, frame.time, strict=True) if tt == t.timestamp()] \
        == [(a, 0), (c, 1)]
    assert list(zip(*frame.episodes, strict=True))[-2:] == [(b, (T + timedelta(hours=5)).timestamp()),
                                                            (c, (T + timedelta(hours=23)).timestamp())]


# --- scoring ---------------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_score_without_an_active_model_does_nothing_and_says_so():
    result = score_failure_risk(T)
    assert result["scored"] == 0 and result["version"] is None and "no active failure model" in result["skipped"]
    assert not EntityScore.objects.exists()


@pytest.mark.django_db
def test_score_stores_every_risk_and_a_failure_risk_event_for_the_risky_gpu_only(informative, informative_model):
    from anomaly.registry import do_promote_version, do_register_version

    version = do_register_version("failure", informative_model, params={"horizon_h": 24}, now=T,
                                  features=list(FEATURE_NAMES), metrics={"primary": "pr_auc", "pr_auc": 0.5})
    do_promote_version(version, now=T)
    g = _inventory()
    minutes = [T - timedelta(minutes=k) for k in range(1, 31)]
    insert_rollup("gpu", "1m", [(g["a"].id, b, {"ecc_sbe_agg_delta": 2, "gpu_temp_max": 70}) for b in minutes]
                  + [(g[k].id, b, {"ecc_sbe_agg_delta": 0, "gpu_temp_max": 70}) for k in "bc" for b in minutes])
    # ... and the hour they roll up into (at T, an hour boundary, the day is made of 1h buckets only).
    insert_rollup("gpu", "1h", [(g[k].id, T - timedelta(hours=1), {"ecc_sbe_agg_delta": 60 * (k == "a")})
                                for k in "abc"])
    result = score_failure_risk(T)
    assert (result["scored"], result["at_risk"], result["version"], result["opened"]) == (3, 1, 1, 1)
    risks = dict(EntityScore.objects.values_list("entity_id", "failure_risk"))
    assert set(risks) == {"GPU-a", "GPU-b", "GPU-c"} and risks["GPU-a"] >= result["threshold"] > risks["GPU-b"]
    (event,) = Anomaly.objects.all()
    assert (event.kind, event.entity_id, event.host, event.model_version_id) == ("failure_risk", "GPU-a", "gpu-0009",
                                                                                 version.pk)
    assert event.score == pytest.approx(risks["GPU-a"])
    top = event.contributions[0]
    assert (top["field"], top["value"], top["expected"], top["basis"]) == ("sbe_1h", 60, 0, "fleet")
    assert top["deviation"] == 60.0 and "risk of failure within 24 h" in event.summary
    assert EntityScore.objects.get(entity_id="GPU-b").risk_version == 1


@pytest.mark.django_db
def test_training_refuses_a_history_with_too_few_failures_and_says_how_many():
    g = _inventory()
    insert_rollup("gpu", "1h", [(g["a"].id, T - timedelta(hours=k), {"ecc_sbe_agg_delta": 1}) for k in range(48)])
    insert_rollup("gpu", "1m", [(g["a"].id, T - timedelta(hours=k, minutes=1), {"ecc_sbe_agg_delta": 0})
                                for k in range(48)])
    _event(g["a"], "xid", T - timedelta(hours=30), 79)
    with pytest.raises(NotEnoughFailures, match=r"found 1 failure between .* need at least 20") as exc:
        train_failure_model(T, window=2 * DAY, horizon=DAY, step=timedelta(hours=6))
    assert (exc.value.found, exc.value.needed) == (1, 20)
    assert not ModelVersion.objects.exists()


@pytest.mark.django_db
def test_training_on_a_site_history_registers_and_promotes_a_site_model():
    """Ten days of hourly rollups for 64 GPUs, 40 of which fail after eight hours of SBE bursts."""
    rng = np.random.default_rng(11)
    hall = Hall.objects.create(site=Site.objects.create(name="dc1"), name="hall-a")
    rack = Rack.objects.create(row=Row.objects.create(hall=hall, name="row-01"), name="r01-01", position=1)
    nodes = [Node.objects.create(hostname=f"gpu-{n:04d}", rack=rack, u_position=2 + 4 * n) for n in range(8)]
    gpus = [Gpu.objects.create(uuid=f"GPU-{k:02d}", node=nodes[k // 8], index=k % 8) for k in range(64)]
    hours = [T - timedelta(hours=k) for k in range(1, 10 * 24 + 1)]
    fails = {g.id: T - timedelta(hours=float(rng.uniform(2, 230))) for g in gpus[:40]}
    rows = []
    for g in gpus:
        f = fails.get(g.id)
        for b in hours:
            burst = f is not None and timedelta(0) < f - b <= timedelta(hours=8)
            rows.append((g.id, b, {"ecc_sbe_agg_delta": float(rng.poisson(40 if burst else 0.3)), "gpu_temp_max": 70}))
    insert_rollup("gpu", "1h", rows)
    for gid, f in fails.items():
        GpuEvent.objects.create(gpu_id=gid, kind="ecc_dbe", first_seen=f, last_seen=f, source="samples")
    version, promotion = train_failure_model(T, window=9 * DAY, horizon=DAY, step=timedelta(hours=1))
    assert promotion.promoted and version.params["trained_on"] == "site"
    assert (version.train_start, version.train_end) == (T - 9 * DAY, T - DAY)
    m = version.metrics
    assert m["pr_auc"] > 2 * m["base_rate"] and m["caught"] >= 3 and m["lead_time_median_h"] >= 1


# --- bootstrap from simulation -----------------------------------------------------------------------------
@pytest.mark.django_db
def test_bootstrap_trains_on_every_family_and_sets_its_threshold_by_false_alarms():
    version, promotion = bootstrap_failure_model(T, gpus=256, runs=3, failures=20, tick_s=600)
    assert promotion.promoted and version.params["trained_on"] == "simulation"
    assert version.train_start is None and "not on this site's failures" in version.params["note"]
    assert version.params["families"] == list(FAMILIES) and version.params["alert_rule"] == "false_alarms"
    model = load_active("failure")[1]
    stats = model.calibration_false_alarms_  # the threshold was chosen for <= 1 alarm per 1,000 GPU-days
    assert stats["gpu_days"] > 0 and stats["alarms"] <= max(1, stats["gpu_days"] / 1000)
    assert version.metrics["failures"] >= 3 and version.metrics["caught"] >= 1


# --- the simulated history reads like the database's ------------------------------------------------------
@pytest.mark.django_db
def test_simulated_history_matches_the_database_reading_of_the_same_telemetry():
    """The simulated fleet's ticks are ingested and rolled up for real; at cut times during and after a
    degrading GPU's story the loader and the simulated windows must give the same aggregates."""
    from anomaly.failure_sim import _sim_events, _SimRecorder, _SimWindows
    from telemetry.ingest.documents import parse_json
    from telemetry.ingest.schema import TimeParser
    from telemetry.ingest.writer import write_batch
    from telemetry.rollups import run_rollups
    from telemetry.simulator.dynamics import Cluster
    from telemetry.simulator.scenarios import ScenarioSet, Spec
    from telemetry.simulator.topology import build_layout, topology_document
    from telemetry.topology import do_import_topology

    layout = build_layout(16, 4)
    do_import_topology(topology_document(layout))
    # 6x, from minute 10: remaps from minute 20, the DBE at 32.5, off the bus at 40 (an hour before T).
    scenarios = ScenarioSet([Spec("gpu-degrading", 10.0, "gpu-0001/3")], seed=4, speed=6.0)
    cluster = Cluster(layout, seed=4, scenarios=scenarios)
    cluster.fabric.step = cluster.fabric.records = lambda *args: None
    t0, ticks = T - timedelta(minutes=100), 100
    recorder = _SimRecorder(cluster, ticks, key_base=0)
    parser = TimeParser(T, timedelta(minutes=5), timedelta(days=30))
    for k in range(ticks):
        tick = cluster.step(t0 + timedelta(minutes=k))
        recorder.tick(k, tick)
        for batch in tick.batches:
            write_batch(parse_json(orjson.dumps(tick.body(batch)), parser), collector="test", fmt="json")
    run_rollups(T + timedelta(minutes=5))
    windows, events = _SimWindows(recorder), _sim_events(recorder)
    truth, cols = scenarios.records[0], recorder.col
    for t in (t0 + timedelta(minutes=36), T):  # after the DBE (XID 48), then an hour after XID 79
        hist = load_history(t)
        rows, sim = windows.at(t.timestamp())
        sim.update(event_history(rows, events, t.timestamp()))
        assert sorted(cols[u] for u in hist.uuid) == rows.tolist()
        order = np.argsort([cols[u] for u in hist.uuid])
        for name in sim:
            # Gauge averages are stored in single precision: the peer excesses agree to a few µ-units.
            atol = 1e-4 if name.endswith("_excess_1h") else 0
            np.testing.assert_allclose(hist.values[name][order], sim[name], atol=atol, equal_nan=True, err_msg=name)
    assert truth["entity"] not in hist.uuid and len(hist) == 15  # silent for an hour: off the bus
    mine = events.gpu == cols[truth["entity"]]
    assert sorted(EVENT_CLASSES[k] for k in events.cls[mine]) == ["bus", "memory", "memory"]
    assert sorted(GpuEvent.objects.filter(gpu__uuid=truth["entity"]).values_list("kind", "code")) == [
        ("ecc_dbe", 0), ("xid", 48), ("xid", 79)]
