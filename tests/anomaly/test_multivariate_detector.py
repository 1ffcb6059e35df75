"""RobustMultivariateDetector: the scikit-learn estimator contract, detection and explanation."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.utils.estimator_checks import check_estimator

from anomaly.detectors.multivariate import RobustMultivariateDetector, pot_threshold

INJECTED_FEATURE = 3
INJECTED_ROWS = slice(300, 310)


def _normal_rows(n: int, seed: int) -> np.ndarray:
    """Six metrics around 0.5 in [0, 1] units (like a min-max scaled machine), σ = 0.03."""
    return np.random.default_rng(seed).normal(0.5, 0.03, size=(n, 6))


@pytest.fixture(scope="module")
def train() -> np.ndarray:
    return _normal_rows(3000, seed=0)


@pytest.fixture(scope="module")
def test_rows() -> np.ndarray:
    rows = _normal_rows(600, seed=1)
    rows[INJECTED_ROWS, INJECTED_FEATURE] += 0.5  # one metric jumps for ten rows
    return rows


def test_passes_scikit_learn_check_estimator():
    check_estimator(RobustMultivariateDetector())


def test_fit_returns_self_and_leaves_params_unchanged(train):
    detector = RobustMultivariateDetector(top_k=2, threshold="quantile", threshold_level=0.99)
    before = detector.get_params()
    assert detector.fit(train) is detector
    assert detector.get_params() == before
    assert detector.n_features_in_ == 6


@pytest.mark.parametrize("method", ["score_samples", "decision_function", "predict", "explain"])
def test_scoring_before_fit_raises_not_fitted(method, train):
    with pytest.raises(NotFittedError):
        getattr(RobustMultivariateDetector(), method)(train)


def test_clone_copies_params_without_learned_state(train):
    fitted = RobustMultivariateDetector(clip=5.0).fit(train)
    copy = clone(fitted)
    assert copy.get_params() == fitted.get_params()
    assert not hasattr(copy, "threshold_")


def test_same_data_gives_same_model(train, test_rows):
    a = RobustMultivariateDetector().fit(train)
    b = RobustMultivariateDetector().fit(train)
    assert a.threshold_ == b.threshold_
    np.testing.assert_array_equal(a.score_samples(test_rows), b.score_samples(test_rows))


def test_injected_anomaly_is_flagged_and_normal_rows_mostly_not(train, test_rows):
    detector = RobustMultivariateDetector().fit(train)
    flags = detector.predict(test_rows)
    assert flags[INJECTED_ROWS].all()
    normal = np.ones(len(test_rows), dtype=bool)
    normal[INJECTED_ROWS] = False
    assert flags[normal].mean() < 0.01
    # higher score = more anomalous; decision_function is the score minus the threshold
    scores = detector.score_samples(test_rows)
    assert scores[INJECTED_ROWS].min() > 3 * np.median(scores)
    np.testing.assert_allclose(detector.decision_function(test_rows), scores - detector.threshold_)


def test_explain_names_the_injected_feature_with_positive_sigma(train, test_rows):
    detector = RobustMultivariateDetector().fit(train)
    features, z = detector.explain(test_rows[INJECTED_ROWS], top=3)
    assert features.shape == z.shape == (10, 3)
    assert (features[:, 0] == INJECTED_FEATURE).all()
    assert (z[:, 0] > 10).all()  # 0.5 above a metric whose robust σ is about 0.03


def test_explain_sign_says_below_expected(train, test_rows):
    rows = test_rows[:5].copy()
    rows[:, 1] -= 0.4
    features, z = RobustMultivariateDetector().fit(train).explain(rows, top=1)
    assert (features[:, 0] == 1).all()
    assert (z[:, 0] < -10).all()


def test_level_that_persists_becomes_the_new_normal(train):
    rows = _normal_rows(1000, seed=2)
    rows[100:, 0] += 0.4  # metric 0 moves to a new level and stays there
    drifting = RobustMultivariateDetector(baseline_window=200, baseline_refresh=10).fit(train).predict(rows)
    frozen = RobustMultivariateDetector(baseline_window=0).fit(train).predict(rows)
    assert drifting[100:110].all() and frozen[100:110].all()  # the jump itself is caught by both
    assert drifting[400:].mean() < 0.01  # a trailing median has absorbed the new level
    assert frozen[400:].mean() > 0.99  # a train-only reference keeps alarming


@pytest.mark.parametrize("params", [
    {"top_k": 0}, {"clip": -1.0}, {"tail_quantile": 1.5}, {"threshold": "magic"}, {"threshold_risk": 0.0},
    {"baseline_window": -1}, {"smoothing_window": 2.5}, {"scale_floor": 0},
])
def test_invalid_params_raise_on_fit(params, train):
    with pytest.raises(ValueError):
        RobustMultivariateDetector(**params).fit(train)


def test_pot_threshold_recovers_exponential_tail_quantile():
    # for Exp(1), P(X > t) = e^-t, so the 1e-3 exceedance level is ln(1000) = 6.91
    scores = np.random.default_rng(0).exponential(size=50_000)
    assert pot_threshold(scores, level=0.98, risk=1e-3) == pytest.approx(np.log(1000), abs=0.5)


def test_pot_threshold_falls_back_to_max_without_a_tail():
    scores = np.arange(100, dtype=float)  # 0.98 quantile leaves only 2 excesses
    assert pot_threshold(scores, level=0.98, risk=1e-3) == 99.0
