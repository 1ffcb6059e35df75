"""Every entity of a fleet against its own history, with the detector `anomaly_eval` measures.

`OwnHistory` holds one `RobustMultivariateDetector` model per entity (a GPU, a switch port, a rack),
fitted through `fit_many` with the detector's default settings: those are the settings the
evaluation vouches for, so none is overridden here. It adds only what a fleet needs around them:

1. Blocks. Entities are fitted BLOCK at a time: the detector's nearest-neighbour distances take
   entities × rows × rows floats, ~7 MB per 100 entities of 96 rows and a few such arrays at once,
   so a 64k-port fleet in one call would need gigabytes; a block of 256 peaks near 100 MB.
2. Alignment. `flag` takes the rows of a pass in whatever order and subset the pass has; entities
   the fit never saw, and entities whose regime (a GPU's job and busy/idle state) is not the one
   its model was fitted in, are not scored.
3. Direction. For features listed as `positive_only` (counter rates) a value below what the
   detector expected is replaced by that expectation before scoring: fewer errors than usual is
   never a problem, and must neither raise the score nor lead the explanation.
4. Decision: the newest row of an entity is flagged when its score exceeds the entity's own
   threshold (`thresholds_`, +inf where its history was too short to fit).

Pure: arrays in, arrays out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from anomaly.detectors.multivariate import RobustMultivariateDetector

BLOCK = 256


@dataclass(frozen=True)
class Flagged:
    """The rows `OwnHistory.flag` found beyond their entity's threshold, with the explanations."""

    rows: np.ndarray  # indices into the rows passed to `flag`
    scores: np.ndarray
    thresholds: np.ndarray
    features: np.ndarray  # (n, top) feature indices, most important first
    z: np.ndarray  # (n, top) signed σ; 0 for a positive-only feature that was below expectation
    expected: np.ndarray  # (n, features) what each value was compared with


class OwnHistory:
    """One RobustMultivariateDetector model per entity, fitted on that entity's own history rows."""

    def __init__(self, *, positive_only=(), top: int = 3, block: int = BLOCK):
        self.positive_only = positive_only
        self.top = top
        self.block = block

    def fit(self, ids, H, regimes=None) -> OwnHistory:
        """ids (E,) unique entity ids; H (E, rows, features), rows oldest first, NaN = missing (a row
        outside the entity's current regime should already be NaN); regimes (E,) the regime each
        entity's model stands for ("": none, never scored; regimes=None: the kind has no regimes).

        Entities with fewer usable rows than the detector's `min_rows` are not fitted at all: the
        detector would give them no threshold anyway, and on a new site (or a fleet that just
        changed jobs) that is nearly everyone, tens of seconds of CPU for nothing."""
        ids, H = np.asarray(ids), np.asarray(H)
        if H.ndim != 3 or len(ids) != H.shape[0]:
            raise ValueError(f"H must be (entities, rows, features) with one entity per id, got {H.shape}")
        if len(ids) > 1 and len(np.unique(ids)) < len(ids):
            raise ValueError("entity ids must be unique")
        usable = np.isfinite(H).any(axis=2).sum(axis=1) >= RobustMultivariateDetector().min_rows
        order = np.flatnonzero(usable)[np.argsort(ids[usable], kind="stable")]
        self.ids_, self.n_entities_ = ids[order], len(ids)
        self.regimes_ = None if regimes is None else np.asarray(regimes, dtype=object)[order]
        self.n_features_in_ = H.shape[2]
        self.positive_ = np.zeros(H.shape[2], dtype=bool)
        self.positive_[list(self.positive_only)] = True
        self.blocks_ = []
        for lo in range(0, len(order), self.block):
            part = np.asarray(H[order[lo:lo + self.block]], dtype=np.float64)
            self.blocks_.append((lo, RobustMultivariateDetector().fit_many(part)))
        self.thresholds_ = (np.concatenate([d.thresholds_ for _, d in self.blocks_]) if self.blocks_
                            else np.empty(0))
        return self

    def flag(self, ids, X, regimes=None) -> Flagged:
        """The rows of X (n, features), one per entity id, whose score exceeds their entity's
        threshold; `regimes` (n,) must equal the model's regime for a row to be scored."""
        X = np.asarray(X, dtype=np.float64)
        pos, known = self._positions(np.asarray(ids), regimes)
        at = np.full(len(self.ids_), -1)
        at[pos[known]] = np.flatnonzero(known)
        out: list[tuple] = []
        for lo, det in self.blocks_:
            mine = at[lo:lo + len(det.thresholds_)]
            live = (mine >= 0) & np.isfinite(det.thresholds_)
            if live.any():
                out.append(self._flag_block(det, X, mine, live))
        if not out:
            return Flagged(*_none(min(self.top, X.shape[1]), X.shape[1]))
        return Flagged(*(np.concatenate(parts) for parts in zip(*out, strict=True)))

    def _positions(self, ids: np.ndarray, regimes) -> tuple[np.ndarray, np.ndarray]:
        """Each row's entity position in the fit, and whether it has a model for the row's regime."""
        if not len(self.ids_):
            return np.zeros(len(ids), dtype=np.int64), np.zeros(len(ids), dtype=bool)
        pos = np.minimum(np.searchsorted(self.ids_, ids), len(self.ids_) - 1)
        known = self.ids_[pos] == ids
        if self.regimes_ is not None:
            now = np.asarray(regimes, dtype=object)
            known &= (self.regimes_[pos] == now) & (now != "")
        return pos, known

    def _flag_block(self, det: RobustMultivariateDetector, X: np.ndarray, mine: np.ndarray, live: np.ndarray):
        x = np.full((len(mine), X.shape[1]), np.nan)
        x[live] = X[mine[live]]
        _, _, expected = det.explain_many(x, self.top)
        lower = self.positive_ & (x < expected)
        x = np.where(lower, expected, x)
        scores = det.score_many(x[:, None, :])[:, 0]
        hit = live & (np.nan_to_num(scores, nan=-np.inf) > det.thresholds_)
        if not hit.any():
            return _none(min(self.top, X.shape[1]), X.shape[1])
        features, z, expected = det.explain_many(x, self.top)
        return mine[hit], scores[hit], det.thresholds_[hit], features[hit], z[hit], expected[hit]


def _none(top: int, n_features: int) -> tuple:
    """The fields of a Flagged with no rows."""
    return (np.empty(0, dtype=np.int64), np.empty(0), np.empty(0), np.empty((0, top), dtype=np.int64),
            np.empty((0, top)), np.empty((0, n_features)))
