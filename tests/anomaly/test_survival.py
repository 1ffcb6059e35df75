"""Survival analysis: Kaplan-Meier, log-rank and Cox against hand-computed answers, the Titan
record parser on real rows, and the cage effect in the real ORNL Titan data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from anomaly.survival import (
    CoxPH,
    KaplanMeier,
    Location,
    concordance_index,
    design_matrix,
    lifetimes_from_records,
    logrank_test,
    parse_records,
    read_records,
    survival_report,
)

TITAN = ("traces", "titan-gpu-failures", "gc_full.csv")
HEADER = "SN,location,insert,remove,duration,out,event"

# Six GPUs: failures at days 1, 2, 3, 5; censored at 2 (tied with a failure) and 4.
# By hand:  t  at risk  failed  S(t)
#           1     6       1     5/6
#           2     5       1     5/6 * 4/5 = 2/3   (the GPU censored at 2 is still at risk at 2)
#           3     3       1     2/3 * 2/3 = 4/9
#           4     2       0     4/9
#           5     1       1     0
KM_TIMES = [1, 2, 2, 3, 4, 5]
KM_EVENTS = [1, 1, 0, 1, 0, 1]


@pytest.fixture(scope="module")
def titan_records(shared_data):
    return read_records(shared_data.joinpath(*TITAN))


# --- Kaplan-Meier -------------------------------------------------------------------------------

def test_kaplan_meier_hand_example_matches_hand_computation():
    km = KaplanMeier().fit(KM_TIMES, KM_EVENTS)
    assert km.timeline_.tolist() == [1, 2, 3, 4, 5]
    assert km.at_risk_.tolist() == [6, 5, 3, 2, 1]
    assert km.n_events_.tolist() == [1, 1, 1, 0, 1]
    np.testing.assert_allclose(km.survival_, [5 / 6, 2 / 3, 4 / 9, 4 / 9, 0])
    # Greenwood: S^2 * sum d / (n (n - d)); at t=2: (2/3)^2 (1/30 + 1/20) = 1/27.
    np.testing.assert_allclose(km.variance_[:3], [(5 / 6) ** 2 / 30, 1 / 27, (4 / 9) ** 2 * (1 / 30 + 1 / 20 + 1 / 6)])
    assert km.median_ == 3  # first time S <= 0.5
    np.testing.assert_allclose(km.predict([0, 1, 1.5, 3.9, 10]), [1, 5 / 6, 5 / 6, 4 / 9, 0])


def test_kaplan_meier_log_log_band_matches_formula_and_brackets_estimate():
    km = KaplanMeier(alpha=0.05).fit(KM_TIMES, KM_EVENTS)
    s, green = 5 / 6, 1 / 30
    se = math.sqrt(green) / abs(math.log(s))
    assert km.ci_lower_[0] == pytest.approx(s ** math.exp(1.959964 * se), rel=1e-6)
    assert km.ci_upper_[0] == pytest.approx(s ** math.exp(-1.959964 * se), rel=1e-6)
    assert np.all(km.ci_lower_ <= km.survival_) and np.all(km.survival_ <= km.ci_upper_)
    assert km.ci_lower_[-1] == km.ci_upper_[-1] == 0  # S = 0 is known exactly


def test_kaplan_meier_without_failures_stays_at_one_with_no_median():
    km = KaplanMeier().fit([3, 5, 8], [0, 0, 0])
    assert km.survival_.tolist() == [1, 1, 1] and km.ci_lower_.tolist() == [1, 1, 1]
    assert km.median_ == math.inf


def test_kaplan_meier_unfitted_or_bad_input_raises():
    with pytest.raises(AttributeError, match="not fitted"):
        KaplanMeier().predict([1])
    with pytest.raises(ValueError, match="non-negative"):
        KaplanMeier().fit([1, -2], [1, 1])
    with pytest.raises(ValueError, match="events"):
        KaplanMeier().fit([1, 2], [1, 2])


def test_kaplan_meier_curve_downsamples_to_requested_points():
    rng = np.random.default_rng(3)
    km = KaplanMeier().fit(rng.exponential(100, 5000), rng.random(5000) < 0.6)
    curve = km.curve(max_points=200)
    assert len(curve["t"]) == len(curve["s"]) == len(curve["lower"]) == 200
    assert curve["s"][0] == 1 and np.all(np.diff(curve["s"]) <= 0)


# --- Log-rank and concordance -------------------------------------------------------------------

def test_logrank_two_groups_matches_scipy_with_ties():
    rng = np.random.default_rng(0)
    t = rng.exponential(10, 300).round()  # rounding makes many tied times
    e, g = rng.random(300) < 0.7, rng.integers(0, 2, 300)
    reference = stats.logrank(stats.CensoredData.right_censored(t[g == 0], ~e[g == 0]),
                              stats.CensoredData.right_censored(t[g == 1], ~e[g == 1]))
    ours = logrank_test(t, e, g)
    assert ours.df == 1
    assert ours.statistic == pytest.approx(reference.statistic**2, rel=1e-9)
    assert ours.p_value == pytest.approx(reference.pvalue, rel=1e-9)


def test_logrank_three_groups_detects_a_faster_group():
    rng = np.random.default_rng(1)
    g = np.repeat([0, 1, 2], 200)
    t = rng.exponential(np.array([10.0, 10.0, 4.0])[g])
    result = logrank_test(t, np.ones_like(t, bool), g)
    assert result.df == 2 and result.p_value < 1e-6
    assert result.observed[2] > result.expected[2]


def test_concordance_matches_pairwise_definition():
    rng = np.random.default_rng(2)
    t, r = rng.integers(1, 30, 150).astype(float), rng.integers(0, 5, 150).astype(float)
    e = rng.random(150) < 0.6
    concordant = pairs = 0.0
    for i in np.flatnonzero(e):
        later = t > t[i]
        pairs += later.sum()
        concordant += (r[later] < r[i]).sum() + 0.5 * (r[later] == r[i]).sum()
    assert concordance_index(t, r, e) == pytest.approx(concordant / pairs)


# --- Cox ---------------------------------------------------------------------------------------

def test_cox_one_binary_covariate_matches_closed_form():
    # Failures at 1 (x=1), 2 (x=0), 3 (x=1), 4 (x=0). With u = e^b the partial likelihood is
    # u/(2u+2) * 1/(u+2) * u/(u+1); d/db = 0 gives u^2 - u - 4 = 0, so u = (1 + sqrt 17) / 2.
    model = CoxPH().fit([[1], [0], [1], [0]], [1, 2, 3, 4], [1, 1, 1, 1])
    u = (1 + math.sqrt(17)) / 2
    assert model.coef_[0] == pytest.approx(math.log(u), abs=1e-8)
    assert model.log_likelihood_ == pytest.approx(2 * math.log(u) - math.log(2 * u + 2) - math.log(u + 2)
                                                  - math.log(u + 1), abs=1e-10)
    assert model.log_likelihood_null_ == pytest.approx(-math.log(4) - math.log(3) - math.log(2))


def test_cox_breslow_ties_match_closed_form():
    # Failures A (x=1) and B (x=0) tie at 1, C (x=0) fails at 2, D (x=1) is censored at 2.
    # Breslow: u / (2u+2)^2 * 1/(u+1); d/db: 1 - 3u/(u+1) = 0, so u = 1/2.
    model = CoxPH().fit([[1], [0], [0], [1]], [1, 1, 2, 2], [1, 1, 1, 0])
    assert model.coef_[0] == pytest.approx(-math.log(2), abs=1e-8)
    assert model.log_likelihood_ == pytest.approx(-math.log(2) - 2 * math.log(3) - math.log(1.5), abs=1e-10)


def test_cox_score_test_equals_logrank_for_binary_covariate_without_ties():
    rng = np.random.default_rng(4)
    g = rng.integers(0, 2, 400)
    t = rng.exponential(np.where(g == 1, 5.0, 8.0))  # continuous: no tied times
    e = rng.random(400) < 0.8
    model = CoxPH().fit(g[:, None], t, e)
    lr = logrank_test(t, e, g)
    assert model.score_test_[0] == pytest.approx(lr.statistic, rel=1e-9)
    # Group 1 fails more than expected under no effect, and its hazard ratio is above 1.
    assert lr.observed[1] > lr.expected[1] and model.hazard_ratios_[0] > 1


def test_cox_recovers_simulated_hazard_ratios():
    rng = np.random.default_rng(5)
    n = 4000
    X = np.column_stack([rng.integers(0, 2, n), rng.normal(size=n)])
    true = np.array([math.log(2.0), -0.5])
    life = rng.exponential(1 / (0.01 * np.exp(X @ true)))
    censor = rng.exponential(150, n)
    model = CoxPH().fit(X, np.minimum(life, censor), life <= censor)
    assert np.all(model.ci_lower_ < np.exp(true)) and np.all(np.exp(true) < model.ci_upper_)
    assert np.all(model.p_values_ < 1e-10)
    assert 0.6 < model.score(X, np.minimum(life, censor), life <= censor) < 0.8


def test_cox_rejects_collinear_covariates_and_unfitted_predict():
    with pytest.raises(ValueError, match="singular"):
        CoxPH().fit([[1, 1], [0, 0], [1, 1], [0, 0]], [1, 2, 3, 4], [1, 1, 1, 0])
    with pytest.raises(AttributeError, match="not fitted"):
        CoxPH().predict_risk([[1.0]])


# --- The Titan record parser --------------------------------------------------------------------

def _real_rows(shared_data, count: int) -> list[str]:
    with open(shared_data.joinpath(*TITAN), encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(count + 1)][1:]


def test_parser_reads_real_rows(shared_data):
    rows = _real_rows(shared_data, 50)
    records = parse_records("\n".join([HEADER, *rows]) + "\n")
    assert len(records) == 50
    first = records[0]
    sn, location, insert, remove, duration = rows[0].split(",")[:5]
    assert first.sn == sn and first.line == 2
    assert first.location == Location.parse(location)
    assert first.seconds == pytest.approx(int(duration), abs=3600)  # the file's duration ignores DST


@pytest.mark.parametrize(("field", "bad", "message"), [
    ("insert", "2017-13-09 21:36:19", "not a date"),
    ("remove", "yesterday", "not a date"),
    ("location", "c11-2c1s9n1", "unknown location format"),
    ("location", "rack-7", "unknown location format"),
    ("remove", "2010-01-01 00:00:00", "remove is before insert"),
    ("event", "XID79", "expected DBE, OTB or blank"),
    ("out", "maybe", "expected TRUE or FALSE"),
])
def test_parser_error_names_line_field_and_value(shared_data, tmp_path, field, bad, message):
    rows = _real_rows(shared_data, 3)
    values = dict(zip(HEADER.split(","), rows[2].split(","), strict=True))
    values[field] = bad
    rows[2] = ",".join(values.values())
    path = tmp_path / "gc_full.csv"
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    with pytest.raises(ValueError, match=message) as err:
        read_records(path)
    assert f"line 4: field {field!r} value {bad!r}" in str(err.value)


def test_parser_rejects_short_rows_and_missing_columns(shared_data):
    rows = _real_rows(shared_data, 2)
    with pytest.raises(ValueError, match="line 3: field 'row'.*expected 7 fields"):
        parse_records("\n".join([HEADER, rows[0], rows[1].rsplit(",", 2)[0]]) + "\n")
    with pytest.raises(ValueError, match="header lacks column"):
        parse_records("SN,location\n")


def test_lifetimes_sum_stays_and_count_failure_only_when_taken_out():
    text = "\n".join([
        HEADER,
        # GPU A: two stays (10 d at c1-0c2s0n0, then 30 d at c2-1c0s3n2), DBE, then removed.
        "A,c1-0c2s0n0,2014-01-01 00:00:00,2014-01-11 00:00:00,864000,FALSE,",
        "A,c2-1c0s3n2,2014-02-01 00:00:00,2014-03-03 00:00:00,2592000,TRUE,DBE",
        # GPU B: an OTB it survived (event-only row), still running at the end: censored.
        "B,c3-2c1s4n1,2016-06-01 00:00:00,2016-07-01 00:00:00,2592000,FALSE,",
        "B,c3-2c1s4n1,,2016-06-15 00:00:00,,,OTB",
    ]) + "\n"
    life, dropped = lifetimes_from_records(parse_records(text))
    assert dropped == 0
    assert life.sn.tolist() == ["A", "B"]
    np.testing.assert_allclose(life.days, [40, 30])
    assert life.failed.tolist() == [True, False]
    assert (life.col[0], life.row[0], life.cage[0], life.slot[0], life.node[0]) == (2, 1, 0, 3, 2)  # longest stay
    assert life.new_batch.tolist() == [False, True]


# --- The real Titan data ------------------------------------------------------------------------

def test_titan_higher_cages_fail_faster(titan_records):
    life, _ = lifetimes_from_records(titan_records)
    assert len(life) > 30_000 and life.failed.sum() > 5_000
    old = life.subset(~life.new_batch)
    cage = old.cage
    three_years = [KaplanMeier().fit(old.days[cage == c], old.failed[cage == c]).predict([3 * 365.25])[0]
                   for c in (0, 1, 2)]
    assert three_years[0] > three_years[1] > three_years[2]  # cooling air rises from cage 0 to cage 2
    assert logrank_test(old.days, old.failed, cage).p_value < 1e-10
    X = np.column_stack([cage == 1, cage == 2]).astype(float)
    model = CoxPH().fit(X, old.days, old.failed)
    assert 1 < model.ci_lower_[0] and model.ci_upper_[0] < model.ci_lower_[1]


def test_survival_report_on_titan_subset_is_small_and_complete(titan_records):
    life, _ = lifetimes_from_records(titan_records)
    part = life.subset(np.isin([sn[-1] for sn in life.sn], list("0123")))  # 40% of serials
    X, names, references = design_matrix(part)
    assert X.shape == (len(part), len(names)) and references["cage"] == 0 and "batch=new" in names
    report = survival_report(part, max_points=50)
    assert set(report["curves"]) == {"old", "new", "all"}
    assert set(report["curves"]["old"]["cage"]) == {0, 1, 2}
    assert len(report["curves"]["old"]["cage"][2]["t"]) == 50
    hazards = {h["name"]: h for h in report["hazards"]}
    assert hazards["cage=2"]["hr"] > hazards["cage=1"]["hr"] > 1
    assert 0.5 < report["cox"]["holdout"]["concordance"] <= 1
    assert report["n"] == len(part) and report["failures"] == int(part.failed.sum())
