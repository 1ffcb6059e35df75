"""The evaluation metrics and NAB scoring on small hand-made label sequences (answers worked by hand)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from anomaly.evaluation.metrics import (
    average_scores,
    best_f1,
    detection_delays,
    event_f1,
    event_precision,
    event_recall,
    median_delay,
    pa_k_adjust,
    pa_k_auc,
    pa_k_curve,
    pa_k_f1,
    point_adjust,
    point_adjusted_f1,
    point_f1,
    score_series,
    segments,
)
from anomaly.evaluation.nab import (
    STANDARD_PROFILE,
    alert_onsets,
    combine,
    probation_length,
    scaled_sigmoid,
    scaled_values,
    window_rows,
)
from anomaly.evaluation.nab import (
    score_series as nab_score,
)

#          index: 0  1  2  3  4  5  6  7  8  9
TRUTH = np.array([0, 1, 1, 1, 0, 0, 1, 1, 0, 0])  # true events: rows 1-3 and rows 6-7
PRED = np.array([0, 0, 1, 0, 0, 1, 0, 0, 0, 1])  # predicted events: row 2, row 5, row 9


def test_segments_finds_runs_as_half_open_ranges():
    assert segments(TRUTH).tolist() == [[1, 4], [6, 8]]
    assert segments(np.zeros(4, dtype=int)).shape == (0, 2)


def test_point_f1_counts_every_row():
    # tp = 1 (row 2); predicted = 3; actual = 5 -> P = 1/3, R = 1/5, F1 = 2PR/(P+R) = (2/15)/(8/15) = 0.25
    assert point_f1(TRUTH, PRED) == pytest.approx(0.25)


def test_point_adjust_fills_only_detected_true_segments():
    # rows 1-3 hold a hit (row 2) so all three count; rows 6-7 hold none; false alarms stay as they are
    assert point_adjust(TRUTH, PRED).astype(int).tolist() == [0, 1, 1, 1, 0, 1, 0, 0, 0, 1]


def test_point_adjusted_f1_uses_adjusted_predictions():
    # adjusted: tp = 3, predicted = 5, actual = 5 -> P = R = 3/5 -> F1 = 0.6
    assert point_adjusted_f1(TRUTH, PRED) == pytest.approx(0.6)


def test_event_precision_counts_predicted_runs_touching_a_true_event():
    # predicted events {2}, {5}, {9}; only {2} overlaps a true event -> 1/3
    assert event_precision(TRUTH, PRED) == pytest.approx(1 / 3)


def test_event_recall_counts_true_events_with_any_hit():
    # true events {1,2,3} (hit at 2) and {6,7} (no hit) -> 1/2
    assert event_recall(TRUTH, PRED) == pytest.approx(0.5)


def test_detection_delay_is_first_hit_minus_event_start():
    # event {1,2,3}: first hit at row 2 -> delay 1; event {6,7}: undetected, no delay
    assert detection_delays(TRUTH, PRED).tolist() == [1]
    assert median_delay(TRUTH, PRED) == 1.0
    # two events detected after 0 and 3 rows -> median 1.5
    truth = [1, 1, 1, 1, 0, 1, 1, 1, 1, 1]
    pred = [1, 0, 0, 0, 0, 0, 0, 0, 1, 0]
    assert detection_delays(truth, pred).tolist() == [0, 3]
    assert median_delay(truth, pred) == 1.5


def test_metrics_without_predictions_are_zero_and_delay_nan():
    none = np.zeros_like(TRUTH)
    assert point_f1(TRUTH, none) == 0.0
    assert point_adjusted_f1(TRUTH, none) == 0.0
    assert event_precision(TRUTH, none) == 0.0
    assert event_recall(TRUTH, none) == 0.0
    assert math.isnan(median_delay(TRUTH, none))


def test_perfect_prediction_scores_one_everywhere():
    scores = score_series(TRUTH, TRUTH)
    ratios = {k: v for k, v in scores.as_dict().items() if k != "median_delay"}
    assert ratios == dict.fromkeys(ratios, 1.0)
    assert set(ratios) == {"f1", "pa_f1", "pa_k20", "pa_k_auc", "event_precision", "event_recall", "event_f1"}
    assert scores.median_delay == 0.0


def test_score_series_holds_the_hand_worked_figures():
    # f1 0.25, pa_f1 0.6 (above); event 1/3 and 1/2 -> event F1 0.4; the segment 1-3 is 1/3 flagged, so
    # it is credited at K = 20 (PA%K20 = PA-F1 = 0.6); the AUC is worked in test_pa_k_auc_...
    scores = score_series(TRUTH, PRED)
    assert (scores.f1, scores.pa_f1, scores.pa_k20) == pytest.approx((0.25, 0.6, 0.6))
    assert (scores.event_f1, scores.pa_k_auc) == pytest.approx((0.4, 0.36725))


def test_average_scores_means_ratios_and_pools_delays():
    a, b = score_series(TRUTH, PRED), score_series(TRUTH, TRUTH)
    overall = average_scores([a, b], [np.array([1]), np.array([0, 0])])
    assert overall.f1 == pytest.approx((0.25 + 1.0) / 2)
    assert overall.pa_f1 == pytest.approx((0.6 + 1.0) / 2)
    assert overall.pa_k20 == pytest.approx((0.6 + 1.0) / 2)
    assert overall.pa_k_auc == pytest.approx((0.36725 + 1.0) / 2)
    assert overall.event_f1 == pytest.approx((0.4 + 1.0) / 2)  # mean of the F1s, not F1 of the means
    assert overall.median_delay == 0.0  # median of the pooled delays [1, 0, 0]


# --- PA%K, event F1, best F1 -----------------------------------------------------------------------
#                index: 0  1  2  3  4  5  6  7  8  9 10 11
THIRTY = np.array([0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0])  # one true segment: rows 1-10 (10 rows)
THIRTY_PRED = np.array([0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 0, 1])  # 3 of its 10 rows (30 %) plus a false alarm


def test_pa_k_at_zero_is_point_adjusted_f1_and_at_hundred_is_point_f1():
    assert pa_k_f1(TRUTH, PRED, 0) == pytest.approx(point_adjusted_f1(TRUTH, PRED)) == pytest.approx(0.6)
    assert pa_k_f1(TRUTH, PRED, 100) == pytest.approx(point_f1(TRUTH, PRED)) == pytest.approx(0.25)
    assert pa_k_adjust(TRUTH, PRED, 0).tolist() == point_adjust(TRUTH, PRED).tolist()
    assert pa_k_adjust(TRUTH, PRED, 100).astype(int).tolist() == PRED.tolist()


def test_pa_k_credits_a_thirty_percent_segment_at_k20_not_at_k40():
    # K = 20: 30 % >= 20 % -> the 10 rows count: tp 10, predicted 10 + 1 false alarm = 11, actual 10 -> 20/21
    assert pa_k_adjust(THIRTY, THIRTY_PRED, 20).astype(int).tolist() == [0] + [1] * 10 + [1]
    assert pa_k_f1(THIRTY, THIRTY_PRED, 20) == pytest.approx(20 / 21)
    # K = 40: not credited: tp 3, predicted 4, actual 10 -> P 3/4, R 3/10 -> F1 = 2 * 3 / (4 + 10) = 3/7
    assert pa_k_adjust(THIRTY, THIRTY_PRED, 40).astype(int).tolist() == THIRTY_PRED.tolist()
    assert pa_k_f1(THIRTY, THIRTY_PRED, 40) == pytest.approx(3 / 7)
    # "at least K %": exactly 30 % counts at K = 30, not at K = 31
    assert pa_k_f1(THIRTY, THIRTY_PRED, 30) == pytest.approx(20 / 21)
    assert pa_k_f1(THIRTY, THIRTY_PRED, 31) == pytest.approx(3 / 7)


def test_pa_k_needs_a_flagged_row_even_at_k0():
    assert pa_k_f1(THIRTY, np.zeros_like(THIRTY), 0) == 0.0


def test_pa_k_curve_matches_adjust_then_f1_for_every_k():
    rng = np.random.default_rng(7)
    truth = (rng.random(400) < 0.2).astype(int)
    truth[50:90] = 1
    pred = (rng.random(400) < 0.3).astype(int)
    curve = pa_k_curve(truth, pred)
    expected = [point_f1(truth, pa_k_adjust(truth, pred, k)) for k in range(101)]
    assert curve.tolist() == pytest.approx(expected)
    assert np.all(np.diff(curve) <= 1e-12)  # crediting fewer segments never raises F1


def test_pa_k_auc_of_hand_worked_curve():
    # segment 1-3 has 1 of 3 rows flagged: credited for K <= 33.3 -> F1 0.6 for K = 0..33, 0.25 for K = 34..100
    # trapezoids: 33 * 0.6 + (0.6 + 0.25) / 2 + 66 * 0.25 = 19.8 + 0.425 + 16.5 = 36.725 -> / 100
    assert pa_k_auc(TRUTH, PRED) == pytest.approx(0.36725)


def test_pa_k_auc_is_one_for_a_perfect_detector_and_zero_for_none():
    assert pa_k_auc(TRUTH, TRUTH) == 1.0
    assert pa_k_auc(TRUTH, np.zeros_like(TRUTH)) == 0.0


@pytest.mark.parametrize("k", [-1, 100.5])
def test_pa_k_rejects_k_outside_zero_to_hundred(k):
    with pytest.raises(ValueError, match="K must be a percentage"):
        pa_k_f1(TRUTH, PRED, k)


def test_event_f1_is_harmonic_mean_of_event_precision_and_recall():
    # P = 1/3, R = 1/2 -> 2 * (1/6) / (5/6) = 0.4
    assert event_f1(TRUTH, PRED) == pytest.approx(0.4)
    assert event_f1(TRUTH, np.zeros_like(TRUTH)) == 0.0
    # two predicted runs, both on true events; one of two true events found -> P 1, R 1/2 -> 2/3
    assert event_f1([1, 1, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0]) == pytest.approx(2 / 3)


def test_best_f1_is_one_on_separable_scores():
    scores = np.where(TRUTH == 1, 0.9, 0.1) + np.linspace(0, 0.01, TRUTH.size)
    assert best_f1(TRUTH, scores) == 1.0


def test_best_f1_cannot_split_tied_scores():
    # one threshold flags both tied rows: tp 1, predicted 2, actual 1 -> 2 / 3 (not 1.0)
    assert best_f1([1, 0], [0.5, 0.5]) == pytest.approx(2 / 3)
    # labels 1 0 1 0, scores .9 .8 .8 .1: >= .9 -> 2/3; >= .8 -> tp 2, predicted 3 -> 4/5; >= .1 -> 4/6
    assert best_f1([1, 0, 1, 0], [0.9, 0.8, 0.8, 0.1]) == pytest.approx(0.8)


def test_best_f1_equals_brute_force_over_every_threshold():
    rng = np.random.default_rng(3)
    truth = (rng.random(300) < 0.15).astype(int)
    scores = np.round(rng.random(300) + truth * 0.3, 2)  # rounded: many ties
    brute = max(point_f1(truth, (scores >= s).astype(int)) for s in np.unique(scores))
    assert best_f1(truth, scores) == pytest.approx(brute)
    assert best_f1(np.zeros(5, dtype=int), np.arange(5.0)) == 0.0


def test_best_f1_rejects_mismatched_or_non_finite_scores():
    with pytest.raises(ValueError):
        best_f1(TRUTH, np.zeros(3))
    with pytest.raises(ValueError, match="finite"):
        best_f1([0, 1], [0.1, np.nan])


@pytest.mark.parametrize("y_pred", [[0, 1], [0, 2] + [0] * 8, [[0] * 10]])
def test_metrics_reject_bad_shapes_and_values(y_pred):
    with pytest.raises(ValueError):
        point_f1(TRUTH, y_pred)


# --- NAB -----------------------------------------------------------------------------------------
# scaled_sigmoid(p) = 2 / (1 + e^(5p)) - 1; S(-1) = 2/(1 + e^-5) - 1 = 0.986614 is NAB's maxTP.
MAX_TP = 2 / (1 + math.exp(-5)) - 1
WINDOW = [(5, 9)]  # rows 5..9 inclusive: width 5


def test_scaled_sigmoid_matches_nab_anchor_points():
    assert scaled_sigmoid(-1.0) == pytest.approx(0.98661, abs=1e-5)
    assert scaled_sigmoid(-0.5) == pytest.approx(0.84828, abs=1e-5)
    assert scaled_sigmoid(0.0) == 0.0
    assert scaled_sigmoid(1.0) == pytest.approx(-0.98661, abs=1e-5)
    assert scaled_sigmoid(3.0) == -1.0


def test_nab_detection_at_window_start_earns_full_true_positive():
    # position -(9 - 5 + 1)/5 = -1 -> S(-1)/maxTP = 1.0; null = -1 (one missed window), perfect = +1
    score = nab_score(_hits(20, [5]), WINDOW, probation=0)
    assert score.raw == pytest.approx(1.0)
    assert (score.null, score.perfect) == (-1.0, 1.0)
    assert score.normalized == pytest.approx(100.0)


def test_nab_late_detection_earns_less():
    # last row: position -(9 - 9 + 1)/5 = -0.2 -> S(-0.2) = 2/(1 + e^-1) - 1 = 0.462117; / maxTP = 0.468387
    score = nab_score(_hits(20, [9]), WINDOW, probation=0)
    assert score.raw == pytest.approx((2 / (1 + math.exp(-1)) - 1) / MAX_TP)
    assert score.raw == pytest.approx(0.468387, abs=1e-6)
    # normalised: 100 * (0.468387 + 1) / (1 + 1) = 73.42
    assert score.normalized == pytest.approx(73.4193, abs=1e-3)


def test_nab_window_counts_once_with_its_earliest_detection():
    score = nab_score(_hits(20, [6, 7, 8]), WINDOW, probation=0)
    # row 6: position -(9 - 6 + 1)/5 = -0.8 -> S(-0.8) = 2/(1 + e^-4) - 1 = 0.964028; / maxTP
    assert score.raw == pytest.approx((2 / (1 + math.exp(-4)) - 1) / MAX_TP)
    assert score.detected_windows == 1


def test_nab_missed_window_is_null_score():
    score = nab_score(np.zeros(20, dtype=int), WINDOW, probation=0)
    assert score.raw == -1.0
    assert score.normalized == 0.0


def test_nab_false_positive_before_any_window_costs_full_weight():
    # row 2 is before every window: -A_FP = -0.11; plus the TP at row 5 (+1.0) -> 0.89
    score = nab_score(_hits(20, [2, 5]), WINDOW, probation=0)
    assert score.raw == pytest.approx(1.0 - 0.11)
    assert score.false_positives == 1


def test_nab_false_positive_after_window_depends_on_distance():
    # row 10: position |9 - 10|/(5 - 1) = 0.25 -> S(0.25) = 2/(1 + e^1.25) - 1 = -0.554600; * 0.11 = -0.061006
    # row 12: position 3/4 = 0.75 -> S(0.75) = 2/(1 + e^3.75) - 1 = -0.954045; * 0.11 = -0.104945
    near = nab_score(_hits(20, [5, 10]), WINDOW, probation=0)
    far = nab_score(_hits(20, [5, 12]), WINDOW, probation=0)
    assert near.raw - 1.0 == pytest.approx(-0.061006, abs=1e-6)
    assert far.raw - 1.0 == pytest.approx(-0.104945, abs=1e-6)


def test_nab_probationary_rows_are_not_scored():
    # probation 6: the hit at row 5 is ignored, row 7 counts: -(9 - 7 + 1)/5 = -0.6 -> 0.905148 / maxTP = 0.917429;
    # the false alarm at row 2 is in probation too, so it costs nothing
    score = nab_score(_hits(20, [2, 5, 7]), WINDOW, probation=6)
    assert score.raw == pytest.approx((2 / (1 + math.exp(-3)) - 1) / MAX_TP)
    assert score.false_positives == 0
    # a window wholly inside probation is dropped from the null score (NAB still counts it as perfect)
    dropped = nab_score(np.zeros(20, dtype=int), [(1, 3)], probation=6)
    assert (dropped.windows, dropped.null, dropped.perfect) == (0, 0.0, 1.0)


def test_nab_corpus_score_normalises_the_sums():
    # series A: raw 1.0, null -1, perfect 1; series B: raw -1, null -1, perfect 1
    # corpus: 100 * (0 - (-2)) / (2 - (-2)) = 50
    a = nab_score(_hits(20, [5]), WINDOW, probation=0)
    b = nab_score(np.zeros(20, dtype=int), WINDOW, probation=0)
    assert combine([a, b]) == pytest.approx(50.0)


def test_nab_window_precision_and_recall():
    # two windows (5..9, 14..16); alerts at 2 (false), 6 (window 1) -> recall 1/2, precision 1/2
    score = nab_score(_hits(20, [2, 6]), [(5, 9), (14, 16)], probation=0)
    assert score.window_recall == 0.5
    assert score.window_precision == 0.5
    assert STANDARD_PROFILE.fp == 0.11


def test_probation_length_is_fifteen_percent_capped_at_750():
    assert probation_length(1000) == 150
    assert probation_length(1882) == 282  # floor(282.3)
    assert probation_length(10_000) == 750


def test_window_rows_walk_rows_in_file_order():
    # a clock that steps back (rows 3 -> 4) stays inside the window until a row passes its end
    stamps = np.array([0, 1, 2, 3, 2, 3, 4, 5], dtype="datetime64[s]")
    window = (np.datetime64(2, "s"), np.datetime64(3, "s"))
    assert window_rows(stamps, [window]) == [(2, 5)]
    assert window_rows(stamps, [(np.datetime64(10, "s"), np.datetime64(12, "s"))]) == []


def test_alert_onsets_keep_first_row_of_each_run():
    assert alert_onsets([0, 1, 1, 0, 1, 1, 1]).tolist() == [0, 1, 0, 0, 1, 0, 0]


def test_scaled_values_use_probation_rows_only():
    values = np.array([10.0, 20.0, 30.0, 100.0])
    assert scaled_values(values, probation=2).ravel().tolist() == [0.0, 1.0, 2.0, 9.0]


def _hits(n: int, rows: list[int]) -> np.ndarray:
    flags = np.zeros(n, dtype=int)
    flags[rows] = 1
    return flags
