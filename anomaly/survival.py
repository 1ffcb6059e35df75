"""Survival analysis of GPU lifetimes: the Titan record parser, Kaplan-Meier, log-rank and Cox.

Pure numpy/scipy: arrays in, arrays out; loading files for the registry and storing versions
live in the `fit_survival` command.

The data is ORNL Titan's GPU inventory (olcf/TitanGPULife `gc_full.csv`, Ostrouchov et al.,
SC'20): one row per contiguous (serial number, location) stay, plus rows that only carry a
DBE/OTB event. A GPU's lifetime follows the paper's definition:

1. its life is the sum of its stays (days), and its location is where it stayed longest;
2. it failed when it had a DBE or OTB event and was taken out before the machine's last
   inventory (`out`); otherwise it is right-censored (replaced proactively, or still running
   when Titan was switched off);
3. its batch is "new" when first inserted after 2016-01-01 (the replacement parts), else "old".
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
from scipy import stats

COLUMNS = ("SN", "location", "insert", "remove", "duration", "out", "event")
FAILURE_EVENTS = frozenset({"DBE", "OTB"})
EVENTS = FAILURE_EVENTS | {""}
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
# c{column}-{row}c{cage}s{slot}n{node}: Titan has cabinet columns 0-24, rows 0-7, 3 cages of
# 8 slots (blades), 4 nodes per blade.
LOCATION_RE = re.compile(r"^c(\d{1,2})-([0-7])c([0-2])s([0-7])n([0-3])$")
# The inventory wrote Oak Ridge wall-clock times; lifetimes are taken in UTC so DST changes cancel.
TITAN_TZ = ZoneInfo("America/New_York")
NEW_BATCH_AFTER = datetime(2016, 1, 1, tzinfo=TITAN_TZ)
_NEW_BATCH_AFTER_UTC = np.datetime64(NEW_BATCH_AFTER.astimezone(UTC).replace(tzinfo=None), "s")
SECONDS_PER_DAY = 86400.0


# --- Parsing ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Location:
    """A GPU slot in Titan: cabinet column and row, cage, slot (blade) and node."""

    col: int
    row: int
    cage: int
    slot: int
    node: int

    @classmethod
    def parse(cls, text: str) -> Location | None:
        m = LOCATION_RE.match(text)
        return cls(*(int(g) for g in m.groups())) if m else None


@dataclass(frozen=True)
class Record:
    """One row of gc_full.csv: a stay of a GPU at a location, or an event-only row (no insert)."""

    line: int
    sn: str
    location: Location
    insert: datetime | None
    remove: datetime
    out: bool
    event: str

    @property
    def seconds(self) -> float:
        return (self.remove - self.insert).total_seconds() if self.insert else 0.0


def _bad(line: int, field: str, value: str, why: str) -> ValueError:
    return ValueError(f"line {line}: field {field!r} value {value!r}: {why}")


def _date(line: int, field: str, value: str) -> datetime:
    try:
        local = datetime.strptime(value, DATE_FORMAT)  # noqa: DTZ007  (zone added below)
    except ValueError:
        raise _bad(line, field, value, f"not a date in the form {DATE_FORMAT}") from None
    return local.replace(tzinfo=TITAN_TZ).astimezone(UTC)


def _record(line: int, row: dict) -> Record:
    sn, loc_text = row["SN"].strip(), row["location"].strip()
    if not sn:
        raise _bad(line, "SN", row["SN"], "empty serial number")
    location = Location.parse(loc_text)
    if location is None:
        raise _bad(line, "location", loc_text, "unknown location format, expected like c11-2c1s4n1")
    event = row["event"].strip()
    if event not in EVENTS:
        raise _bad(line, "event", event, "expected DBE, OTB or blank")
    remove = _date(line, "remove", row["remove"].strip())
    insert_text = row["insert"].strip()
    if not insert_text:
        # The file's event-only rows: a DBE/OTB seen at a stay that another row describes.
        if not event:
            raise _bad(line, "insert", insert_text, "blank insert is only allowed on a DBE/OTB event row")
        return Record(line, sn, location, None, remove, False, event)
    insert = _date(line, "insert", insert_text)
    if remove < insert:
        raise _bad(line, "remove", row["remove"], f"remove is before insert {insert_text}")
    out = row["out"].strip().upper()
    if out not in ("TRUE", "FALSE"):
        raise _bad(line, "out", row["out"], "expected TRUE or FALSE on a stay row")
    return Record(line, sn, location, insert, remove, out == "TRUE", event)


def parse_records(text: str | Iterable[str]) -> list[Record]:
    """Parse gc_full.csv content; a bad row raises ValueError naming its line, field and value."""
    lines = io.StringIO(text) if isinstance(text, str) else text
    reader = csv.DictReader(lines)
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise ValueError(f"line 1: header lacks column(s) {', '.join(missing)}; expected {','.join(COLUMNS)}")
    records = []
    for row in reader:
        if None in row or any(v is None for v in row.values()):
            raise _bad(reader.line_num, "row", ",".join(str(v) for v in row.values()),
                       f"expected {len(COLUMNS)} fields")
        records.append(_record(reader.line_num, row))
    return records


def read_records(path: str | Path) -> list[Record]:
    with open(path, newline="", encoding="utf-8") as f:
        return parse_records(f)


# --- One lifetime per GPU -----------------------------------------------------------------------

@dataclass(frozen=True)
class Lifetimes:
    """One row per GPU (serial number): days lived, failed or censored, where and when installed."""

    sn: np.ndarray
    days: np.ndarray
    failed: np.ndarray  # bool
    col: np.ndarray
    row: np.ndarray
    cage: np.ndarray
    slot: np.ndarray
    node: np.ndarray
    first_insert: np.ndarray  # datetime64[s]
    new_batch: np.ndarray  # bool

    def __len__(self) -> int:
        return len(self.sn)

    def subset(self, mask: np.ndarray) -> Lifetimes:
        return Lifetimes(**{name: getattr(self, name)[mask] for name in self.__dataclass_fields__})


def _gpu_lifetime(stays: list[Record], events: set[str]) -> tuple | None:
    seconds: dict[Location, float] = {}
    for r in stays:
        seconds[r.location] = seconds.get(r.location, 0.0) + r.seconds
    total = sum(seconds.values())
    if total <= 0:
        return None
    where = max(seconds, key=seconds.get)
    failed = bool(events & FAILURE_EVENTS) and any(r.out for r in stays)
    first = min(r.insert for r in stays)
    return total / SECONDS_PER_DAY, failed, where, first


def lifetimes_from_records(records: Sequence[Record]) -> tuple[Lifetimes, int]:
    """Aggregate stays per serial number (see the module docstring); also the count of GPUs
    dropped because they have no stay of positive length."""
    stays: dict[str, list[Record]] = {}
    events: dict[str, set[str]] = {}
    for r in records:
        if r.insert is not None:
            stays.setdefault(r.sn, []).append(r)
        if r.event:
            events.setdefault(r.sn, set()).add(r.event)
    rows, dropped = [], len({r.sn for r in records} - stays.keys())
    for sn, gpu_stays in stays.items():
        life = _gpu_lifetime(gpu_stays, events.get(sn, set()))
        if life is None:
            dropped += 1
            continue
        days, failed, loc, first = life
        rows.append((sn, days, failed, loc.col, loc.row, loc.cage, loc.slot, loc.node, first))
    if not rows:
        raise ValueError("no GPU has a stay of positive length: nothing to analyse")
    cols = list(zip(*rows, strict=True))
    first_insert = np.array([d.replace(tzinfo=None) for d in cols[8]], dtype="datetime64[s]")  # UTC
    return Lifetimes(
        sn=np.array(cols[0]), days=np.array(cols[1], dtype=float), failed=np.array(cols[2], dtype=bool),
        col=np.array(cols[3]), row=np.array(cols[4]), cage=np.array(cols[5]), slot=np.array(cols[6]),
        node=np.array(cols[7]), first_insert=first_insert, new_batch=first_insert > _NEW_BATCH_AFTER_UTC), dropped


# --- Shared validation ------------------------------------------------------------------------

def _check_survival_data(durations, events) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(durations, dtype=float)
    e = np.asarray(events)
    if t.ndim != 1 or e.shape != t.shape:
        raise ValueError(f"durations and events must be 1-D of the same length, got {t.shape} and {e.shape}")
    if len(t) == 0:
        raise ValueError("no observations")
    if not np.all(np.isfinite(t)) or np.any(t < 0):
        raise ValueError("durations must be finite and non-negative")
    if not np.isin(e, (0, 1, True, False)).all():
        raise ValueError("events must be 0/1 or boolean (1 = failed, 0 = censored)")
    return t, e.astype(bool)


def _check_is_fitted(estimator, attribute: str) -> None:
    if not hasattr(estimator, attribute):
        raise AttributeError(f"this {type(estimator).__name__} is not fitted yet; call fit() first")


# --- Kaplan-Meier -------------------------------------------------------------------------------

class KaplanMeier:
    """The Kaplan-Meier survival estimate with a Greenwood confidence band.

    The band is Greenwood's variance on the log(-log S) scale (R survival's `conf.type =
    "log-log"`), so it stays inside [0, 1]. After `fit`: `timeline_` (distinct observed times,
    ascending), `at_risk_`, `n_events_`, `n_censored_`, `survival_` (S just after each time),
    `variance_` (Greenwood's Var S), `ci_lower_`/`ci_upper_`, `median_` (inf if S never
    reaches 0.5).
    """

    def __init__(self, *, alpha: float = 0.05):
        self.alpha = alpha

    def fit(self, durations, events) -> KaplanMeier:
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha!r}")
        t, e = _check_survival_data(durations, events)
        times, inverse = np.unique(t, return_inverse=True)
        d = np.bincount(inverse, weights=e, minlength=len(times))
        c = np.bincount(inverse, weights=~e, minlength=len(times))
        n = len(t) - np.concatenate(([0.0], np.cumsum(d + c)[:-1]))
        s = np.cumprod(1.0 - d / n)
        with np.errstate(divide="ignore", invalid="ignore"):
            green = np.cumsum(np.where(d > 0, d / (n * (n - d)), 0.0))
        self.timeline_, self.at_risk_, self.n_events_, self.n_censored_ = times, n, d, c
        self.survival_ = s
        with np.errstate(invalid="ignore"):
            # Once S is 0 it is known exactly; Greenwood's term there is inf * 0.
            self.variance_ = np.where(s > 0, s**2 * green, 0.0)
        self.ci_lower_, self.ci_upper_ = self._band(s, green)
        below = np.flatnonzero(s <= 0.5)
        self.median_ = float(times[below[0]]) if len(below) else float("inf")
        return self

    def _band(self, s: np.ndarray, green: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        z = stats.norm.ppf(1 - self.alpha / 2)
        with np.errstate(divide="ignore", invalid="ignore"):
            se = np.sqrt(green) / np.abs(np.log(s))
            lower, upper = s ** np.exp(z * se), s ** np.exp(-z * se)
        # S = 1 (no failure yet) and S = 0 (all failed) are known exactly.
        lower = np.where(s >= 1, 1.0, np.where(s <= 0, 0.0, lower))
        upper = np.where(s >= 1, 1.0, np.where(s <= 0, 0.0, upper))
        return lower, upper

    def predict(self, times) -> np.ndarray:
        """S(t) at each of `times` (1 before the first observed time)."""
        _check_is_fitted(self, "survival_")
        idx = np.searchsorted(self.timeline_, np.asarray(times, dtype=float), side="right") - 1
        return np.where(idx >= 0, self.survival_[np.maximum(idx, 0)], 1.0)

    def curve(self, max_points: int = 300) -> dict:
        """The step curve and band on at most `max_points` evenly spaced times, for plotting."""
        _check_is_fitted(self, "survival_")
        grid = np.linspace(0.0, self.timeline_[-1], max_points)
        idx = np.searchsorted(self.timeline_, grid, side="right") - 1
        pick = lambda a: np.where(idx >= 0, a[np.maximum(idx, 0)], 1.0)  # noqa: E731
        return {"t": grid.round(2).tolist(), "s": pick(self.survival_).round(5).tolist(),
                "lower": pick(self.ci_lower_).round(5).tolist(), "upper": pick(self.ci_upper_).round(5).tolist()}


# --- Log-rank -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class LogRank:
    """A k-sample log-rank test: chi-square statistic, degrees of freedom, p-value, O and E per group."""

    statistic: float
    df: int
    p_value: float
    groups: list
    observed: list
    expected: list


def logrank_test(durations, events, groups) -> LogRank:
    """Do the groups' survival curves differ? (Mantel-Haenszel, hypergeometric variance.)"""
    t, e = _check_survival_data(durations, events)
    g = np.asarray(groups)
    labels, gi = np.unique(g, return_inverse=True)
    if len(labels) < 2:
        raise ValueError("the log-rank test needs at least two groups")
    times, ti = np.unique(t, return_inverse=True)
    k = len(labels)
    at = np.zeros((len(times), k))
    dead = np.zeros((len(times), k))
    np.add.at(at, (ti, gi), 1.0)
    np.add.at(dead, (ti, gi), e.astype(float))
    n_g = at[::-1].cumsum(axis=0)[::-1]  # at risk: observed at this time or later
    keep = dead.sum(axis=1) > 0
    n_g, dead = n_g[keep], dead[keep]
    n, d = n_g.sum(axis=1), dead.sum(axis=1)
    share = n_g / n[:, None]
    expected = (share * d[:, None]).sum(axis=0)
    o_minus_e = dead.sum(axis=0) - expected
    with np.errstate(invalid="ignore", divide="ignore"):
        factor = np.where(n > 1, d * (n - d) / (n - 1), 0.0)
    v = (np.einsum("t,tg->g", factor, share)[:, None] * np.eye(k)
         - np.einsum("t,tg,th->gh", factor, share, share))
    stat = float(o_minus_e[:-1] @ np.linalg.solve(v[:-1, :-1], o_minus_e[:-1]))
    return LogRank(stat, k - 1, float(stats.chi2.sf(stat, k - 1)), labels.tolist(),
                   dead.sum(axis=0).tolist(), expected.tolist())


# --- Cox proportional hazards -------------------------------------------------------------------

class _RiskSets:
    """The sorted-time bookkeeping the Breslow partial likelihood needs, built once per fit."""

    def __init__(self, X: np.ndarray, t: np.ndarray, e: np.ndarray):
        order = np.argsort(t, kind="stable")
        self.X, self.t, self.e = X[order], t[order], e[order]
        times, self.starts, self.inverse = np.unique(self.t, return_index=True, return_inverse=True)
        self.d = np.bincount(self.inverse, weights=self.e, minlength=len(times))
        self.x_events = self.X[self.e].sum(axis=0)

    def evaluate(self, beta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """Log partial likelihood, its gradient and the information (minus the Hessian) at beta.

        1. w_i = exp(eta_i - c); the shift c cancels and keeps exp() finite.
        2. Risk-set sums at each distinct time are reverse cumulative sums of per-time sums.
        3. The information's first term, sum_k d_k S2_k / S0_k, is sum_i w_i A_i x_i x_i' with
           A_i = sum_{k: t_k <= T_i} d_k / S0_k: one n-by-p product instead of a p-by-p matrix
           per distinct time.
        """
        eta = self.X @ beta
        c = eta.max()
        w = np.exp(eta - c)
        s0 = np.add.reduceat(w, self.starts)[::-1].cumsum()[::-1]
        s1 = np.add.reduceat(w[:, None] * self.X, self.starts, axis=0)[::-1].cumsum(axis=0)[::-1]
        ev = self.d > 0
        d, s0e, m = self.d[ev], s0[ev], s1[ev] / s0[ev, None]
        loglik = float(eta[self.e].sum() - (d * (np.log(s0e) + c)).sum())
        grad = self.x_events - d @ m
        a = np.cumsum(np.where(ev, self.d / s0, 0.0))[self.inverse]
        info = (self.X.T * (w * a)) @ self.X - (m.T * d) @ m
        return loglik, grad, info


def _solve(info: np.ndarray, grad: np.ndarray) -> np.ndarray:
    try:
        return np.linalg.solve(info, grad)
    except np.linalg.LinAlgError:
        raise ValueError("the Cox information matrix is singular: covariates are collinear or constant") from None


class CoxPH:
    """Cox proportional-hazards regression, Breslow ties, fitted by Newton-Raphson with step halving.

    `ridge` adds an L2 penalty 0.5 * ridge * |beta|^2 (0 = the plain partial likelihood).
    After `fit`: `coef_` (log hazard ratios), `se_`, `hazard_ratios_`, `ci_lower_`/`ci_upper_`
    (hazard ratio, 1 - alpha), `z_`, `p_values_` (Wald), `log_likelihood_`,
    `log_likelihood_null_`, `score_test_` (chi-square and p at beta = 0; with one binary
    covariate and no tied times this is the log-rank test), `n_iter_`, `n_features_in_`,
    `n_events_`. `predict_risk` is the log relative hazard: higher fails sooner.
    """

    def __init__(self, *, alpha: float = 0.05, ridge: float = 0.0, max_iter: int = 50, tol: float = 1e-9):
        self.alpha = alpha
        self.ridge = ridge
        self.max_iter = max_iter
        self.tol = tol

    def _validate_params(self) -> None:
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha!r}")
        if self.ridge < 0 or self.max_iter < 1 or self.tol <= 0:
            raise ValueError("ridge must be >= 0, max_iter >= 1 and tol > 0")

    def _objective(self, sets: _RiskSets, beta: np.ndarray):
        loglik, grad, info = sets.evaluate(beta)
        p = len(beta)
        return (loglik - 0.5 * self.ridge * beta @ beta, grad - self.ridge * beta,
                info + self.ridge * np.eye(p), loglik)

    def fit(self, X, durations, events) -> CoxPH:
        self._validate_params()
        t, e = _check_survival_data(durations, events)
        X = np.asarray(X, dtype=float)
        if X.ndim != 2 or len(X) != len(t):
            raise ValueError(f"X must be 2-D with one row per duration, got {X.shape} for {len(t)} durations")
        if not e.any():
            raise ValueError("no failures: the Cox model needs at least one event")
        sets = _RiskSets(X, t, e)
        beta = np.zeros(X.shape[1])
        obj, grad, info, loglik = self._objective(sets, beta)
        self.log_likelihood_null_ = loglik
        step = _solve(info, grad)
        score = float(grad @ step)
        self.score_test_ = (score, float(stats.chi2.sf(score, X.shape[1])))
        self.n_iter_ = 0
        while self.n_iter_ < self.max_iter:
            self.n_iter_ += 1
            beta, obj, grad, info, loglik, change = self._newton_step(sets, beta, obj, step)
            if change < self.tol * (abs(obj) + self.tol):
                break
            step = _solve(info, grad)
        self._store(beta, info, loglik, X.shape[1], int(e.sum()))
        return self

    def _newton_step(self, sets: _RiskSets, beta, obj, step):
        """Take the Newton step, halving it until the objective does not go down."""
        for _ in range(30):
            new_beta = beta + step
            new_obj, grad, info, loglik = self._objective(sets, new_beta)
            if np.isfinite(new_obj) and new_obj >= obj - 1e-12:
                return new_beta, new_obj, grad, info, loglik, new_obj - obj
            step = step / 2
        return beta, obj, *self._objective(sets, beta)[1:], 0.0

    def _store(self, beta, info, loglik, p, n_events) -> None:
        cov = np.linalg.inv(info)
        z_crit = stats.norm.ppf(1 - self.alpha / 2)
        self.coef_ = beta
        self.var_ = cov
        self.se_ = np.sqrt(np.diag(cov))
        self.z_ = beta / self.se_
        self.p_values_ = 2 * stats.norm.sf(np.abs(self.z_))
        # A level without failures drifts towards -inf: its interval may overflow to an honest inf.
        with np.errstate(over="ignore"):
            self.hazard_ratios_ = np.exp(beta)
            self.ci_lower_ = np.exp(beta - z_crit * self.se_)
            self.ci_upper_ = np.exp(beta + z_crit * self.se_)
        self.log_likelihood_ = loglik
        self.n_features_in_ = p
        self.n_events_ = n_events

    def predict_risk(self, X) -> np.ndarray:
        """Log relative hazard x'beta: higher means an earlier expected failure."""
        _check_is_fitted(self, "coef_")
        X = np.asarray(X, dtype=float)
        if X.ndim != 2 or X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[-1]} features, the model was fitted on {self.n_features_in_}")
        return X @ self.coef_

    def score(self, X, durations, events) -> float:
        """Harrell's concordance of the predicted risk with the observed lifetimes."""
        return concordance_index(durations, self.predict_risk(X), events)


def concordance_index(durations, risk, events) -> float:
    """Harrell's C: of the pairs where the shorter life ended in failure, the share where that GPU
    had the higher risk (ties in risk count half). 0.5 is chance, 1 perfect."""
    t, e = _check_survival_data(durations, events)
    r = np.asarray(risk, dtype=float)
    if r.shape != t.shape:
        raise ValueError(f"risk has shape {r.shape}, durations {t.shape}")
    ranks = np.unique(r, return_inverse=True)[1]
    tree = _Fenwick(int(ranks.max()) + 1)
    order = np.argsort(-t, kind="stable")
    concordant = tied = pairs = 0.0
    start = 0
    while start < len(order):
        stop = start
        while stop < len(order) and t[order[stop]] == t[order[start]]:
            stop += 1
        group = order[start:stop]
        # Every GPU already in the tree lived strictly longer than this group.
        for i in group[e[group]]:
            below, at = tree.prefix(ranks[i]), tree.prefix(ranks[i] + 1) - tree.prefix(ranks[i])
            concordant += below
            tied += at
            pairs += tree.total
        for i in group:
            tree.add(ranks[i])
        start = stop
    if pairs == 0:
        raise ValueError("no comparable pairs: the concordance is undefined")
    return (concordant + 0.5 * tied) / pairs


class _Fenwick:
    """Counts of inserted ranks with O(log n) prefix sums."""

    def __init__(self, size: int):
        self.tree = [0] * (size + 1)
        self.total = 0

    def add(self, rank: int) -> None:
        self.total += 1
        i = rank + 1
        while i < len(self.tree):
            self.tree[i] += 1
            i += i & -i

    def prefix(self, rank: int) -> int:
        """How many inserted ranks are below `rank`."""
        s, i = 0, rank
        while i > 0:
            s += self.tree[i]
            i -= i & -i
        return s


# --- The fleet report: everything the reliability page shows -----------------------------------

LOCATION_FIELDS = ("cage", "slot", "node", "row", "col")
SCOPES = {"old": "old batch", "new": "new batch", "all": "all GPUs"}


def design_matrix(life: Lifetimes) -> tuple[np.ndarray, list[str], dict[str, int]]:
    """Treatment-coded dummies for each location field (its lowest level is the reference) and
    batch=new; also the reference level of each field."""
    columns, names, references = [], [], {}
    for field in LOCATION_FIELDS:
        values = getattr(life, field)
        levels = np.unique(values)
        references[field] = int(levels[0])
        for level in levels[1:]:
            columns.append(values == level)
            names.append(f"{field}={level}")
    columns.append(life.new_batch)
    names.append("batch=new")
    return np.column_stack(columns).astype(float), names, references


def _scope_mask(life: Lifetimes, scope: str) -> np.ndarray:
    return {"old": ~life.new_batch, "new": life.new_batch, "all": np.ones(len(life), bool)}[scope]


def _km_summary(days, failed, max_points: int) -> dict:
    km = KaplanMeier().fit(days, failed)
    return {**km.curve(max_points), "n": len(days), "failures": int(failed.sum()),
            "median_days": km.median_ if np.isfinite(km.median_) else None,
            "survival_3y": float(km.predict([3 * 365.25])[0])}


def _scope_curves(life: Lifetimes, max_points: int) -> tuple[dict, dict]:
    curves = {"overall": _km_summary(life.days, life.failed, max_points)}
    tests = {}
    for field in ("cage", "slot", "node"):
        values = getattr(life, field)
        curves[field] = {int(v): _km_summary(life.days[values == v], life.failed[values == v], max_points)
                         for v in np.unique(values)}
        if life.failed.any() and len(curves[field]) > 1:
            lr = logrank_test(life.days, life.failed, values)
            tests[field] = {"statistic": lr.statistic, "df": lr.df, "p_value": lr.p_value}
    return curves, tests


def _hazard_table(model: CoxPH, names: list[str], references: dict[str, int]) -> list[dict]:
    rows = []
    for j, name in enumerate(names):
        field, level = name.split("=")
        rows.append({"name": name, "covariate": field, "level": level,
                     "reference": "old" if field == "batch" else str(references[field]),
                     "hr": float(model.hazard_ratios_[j]), "lower": float(model.ci_lower_[j]),
                     "upper": float(model.ci_upper_[j]), "p": float(model.p_values_[j]),
                     "coef": float(model.coef_[j]), "se": float(model.se_[j])})
    return rows


def holdout_split(life: Lifetimes, fraction: float) -> np.ndarray:
    """True for the `fraction` of GPUs installed last (by first insert): the holdout."""
    if not 0 < fraction < 1:
        raise ValueError(f"holdout fraction must be in (0, 1), got {fraction!r}")
    cutoff = np.sort(life.first_insert)[int(len(life) * (1 - fraction))]
    return life.first_insert >= cutoff


def _holdout_concordance(X, life: Lifetimes, holdout: np.ndarray, ridge: float) -> dict:
    """Fit on the earlier-installed GPUs, score Harrell's C on the later-installed ones."""
    train = ~holdout
    varying = X[train].std(axis=0) > 0  # a level never seen in training cannot be estimated
    model = CoxPH(ridge=ridge).fit(X[train][:, varying], life.days[train], life.failed[train])
    c = model.score(X[holdout][:, varying], life.days[holdout], life.failed[holdout])
    return {"concordance": c, "n": int(holdout.sum()), "failures": int(life.failed[holdout].sum()),
            "installed_from": str(life.first_insert[holdout].min())}


def survival_report(life: Lifetimes, *, holdout_fraction: float = 0.2, max_points: int = 250,
                    ridge: float = 0.0, progress=None) -> dict:
    """KM curves and log-rank tests per scope, the Cox hazard table and its holdout concordance.

    A plain dict of lists and numbers, small enough to load with the page and safe to unpickle
    whatever this module later becomes. `progress(message)` is called between steps.
    """
    say = progress or (lambda message: None)
    report = {"schema": 1, "n": len(life), "failures": int(life.failed.sum()),
              "max_days": float(life.days.max()), "curves": {}, "logrank": {}, "scopes": dict(SCOPES),
              "first_insert": str(life.first_insert.min()), "last_insert": str(life.first_insert.max())}
    for scope in SCOPES:
        part = life.subset(_scope_mask(life, scope))
        report[f"n_{scope}"], report[f"failures_{scope}"] = len(part), int(part.failed.sum())
        if len(part):
            report["curves"][scope], report["logrank"][scope] = _scope_curves(part, max_points)
        say(f"Kaplan-Meier by cage, slot and node: {SCOPES[scope]} ({len(part)} GPUs, "
            f"{int(part.failed.sum())} failures)")
    X, names, references = design_matrix(life)
    holdout = _holdout_concordance(X, life, holdout_split(life, holdout_fraction), ridge)
    say(f"Cox on earlier installs, scored on the last {holdout['n']} installed: C = {holdout['concordance']:.3f}")
    model = CoxPH(ridge=ridge).fit(X, life.days, life.failed)
    say(f"Cox on all {len(life)} GPUs: {len(names)} covariates, {model.n_iter_} Newton steps")
    lr = 2 * (model.log_likelihood_ - model.log_likelihood_null_)
    report["cox"] = {"features": names, "references": references, "n_iter": model.n_iter_,
                     "log_likelihood": model.log_likelihood_, "log_likelihood_null": model.log_likelihood_null_,
                     "lr_statistic": lr, "lr_p_value": float(stats.chi2.sf(lr, len(names))),
                     "concordance_train": model.score(X, life.days, life.failed),
                     "holdout": holdout}
    report["hazards"] = _hazard_table(model, names, references)
    return report
