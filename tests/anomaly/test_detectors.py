"""The fleet detectors: scikit-learn's estimator contract and hand-made cases with known answers."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from anomaly.detectors._robust import MAD_TO_SIGMA, grouped_median_mad
from anomaly.detectors.cohort import CohortIsolationForest
from anomaly.detectors.peer import PeerDeviation

RNG = np.random.default_rng(7)


def _node_fleet(n_nodes=32, per=8, f=3):
    X = 60 + RNG.normal(size=(n_nodes * per, f))
    groups = np.repeat(np.arange(n_nodes), per)
    return X, groups


@pytest.mark.parametrize("est, fit_args", [
    (PeerDeviation(min_peers=3, z_threshold=5.0, min_delta=[1, 2, 3], floor_fraction=0.1, scale_floor=0.5), ()),
    (CohortIsolationForest(n_estimators=20, quantile=0.01, margin=0.0, min_rows=10, random_state=3), ("cohort",)),
])
def test_estimators_keep_params_fit_returns_self_and_refuse_to_score_unfitted(est, fit_args):
    X, groups = _node_fleet()
    args = {"cohort": np.array(["h100"] * len(X))}
    params = est.get_params()
    with pytest.raises(NotFittedError):
        est.deviations(X, groups)
    fitted = est.fit(X, *[args[a] for a in fit_args])
    assert fitted is est
    assert est.get_params() == params  # keyword-only params are stored unchanged
    assert clone(est).get_params() == params
    assert any(k.endswith("_") and not k.startswith("_") for k in vars(est))  # learned state in *_ attributes


def test_peer_deviation_flags_the_hot_gpu_with_the_z_computed_by_hand():
    X = np.array([[60.0], [61.0], [59.0], [60.0], [62.0], [58.0], [60.0], [75.0]])  # one node of 8
    det = PeerDeviation(min_peers=4, z_threshold=6.0).fit(X)
    z, expected = det.deviations(X, np.zeros(8))
    # median 60; |x - 60| = 0,1,1,0,2,2,0,15 -> MAD 1 -> σ 1.4826; (75 - 60) / 1.4826 = 10.12
    assert expected[7, 0] == 60.0
    assert z[7, 0] == pytest.approx(15 / MAD_TO_SIGMA, rel=1e-6)
    scores = det.score_samples(X, np.zeros(8))
    assert scores[7] == pytest.approx(min(1.0, 0.5 * (15 / MAD_TO_SIGMA) / 6.0))
    assert (scores[:7] < 0.5).all()


def test_peer_deviation_ignores_small_groups_and_differences_below_min_delta():
    X = np.array([[1.0], [1.0], [1.0], [9.0], [1.0], [1.0], [2.0]])
    groups = np.array([0, 0, 0, 0, 1, 1, 1])  # group 1 has 3 members
    z, _ = PeerDeviation(min_peers=4, min_delta=[10.0]).fit(X).deviations(X, groups)
    assert np.isnan(z[4:]).all()  # too few peers to judge
    assert z[3, 0] == 0.0  # 8 above the median, but min_delta is 10
    z2, _ = PeerDeviation(min_peers=4, min_delta=[1.0], scale_floor=2.0).fit(X).deviations(X, groups)
    assert z2[3, 0] == pytest.approx(8 / 2.0)  # MAD is 0: the absolute floor of 2 is the scale


def test_grouped_median_mad_matches_numpy_per_group_for_mixed_group_sizes():
    X = RNG.normal(size=(23, 2))
    groups = RNG.integers(0, 5, size=23)
    med, mad, size = grouped_median_mad(X, groups)
    for g in np.unique(groups):
        rows = X[groups == g]
        m = np.median(rows, axis=0)
        assert np.allclose(med[groups == g], m)
        assert np.allclose(mad[groups == g], np.median(np.abs(rows - m), axis=0) * MAD_TO_SIGMA)
        assert (size[groups == g] == len(rows)).all()


def test_cohort_forest_flags_an_impossible_combination_and_explains_it():
    n = 2000
    power = RNG.uniform(200, 700, size=n)
    temp = 30 + power * 0.06 + RNG.normal(size=n)  # temperature follows power
    X = np.column_stack([power, temp])
    cohorts = np.array(["h100"] * n)
    det = CohortIsolationForest(n_estimators=100, quantile=0.001, margin=0.02, random_state=0).fit(X, cohorts)
    assert det.predict(X, cohorts).mean() <= 0.002  # about the chosen share of training rows
    odd = np.array([[650.0, 30.0], [400.0, 54.0]])  # full power on a cold die; an ordinary GPU
    assert det.predict(odd, np.array(["h100", "h100"])).tolist() == [1, 0]
    z, _ = det.deviations(odd, np.array(["h100", "h100"]))
    assert abs(z[0, 1]) > abs(z[0, 0]) and z[0, 1] < -2  # the temperature is what is off (too cold)
    assert np.isnan(det.score_samples(odd, np.array(["a100", "a100"]))).all()  # unknown cohort: not scored


def test_cohort_forest_is_deterministic_for_a_seed():
    X = RNG.normal(size=(300, 4))
    c = np.array(["x"] * 300)
    a = CohortIsolationForest(n_estimators=30, random_state=5).fit(X, c).score_samples(X, c)
    b = CohortIsolationForest(n_estimators=30, random_state=5).fit(X, c).score_samples(X, c)
    assert np.array_equal(a, b)
