"""What one scoring pass found, before it is stored: plain dataclasses shared by every detector.

Detectors are pure (arrays in, arrays out); the loaders in `anomaly.features` and `anomaly.jobs`
turn their scores into `Finding`s, and `anomaly.actions.do_record_findings` stores them as
`Anomaly` events (opening, extending and closing them) and as current `EntityScore`s.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Contribution:
    """One field's part in a finding: its value, what was expected, and the deviation in σ."""

    field: str
    label: str  # what an operator reads: "memory temperature"
    value: float | None
    expected: float | None
    deviation: float  # robust z (σ units, MAD-scaled); sign says above (+) or below (-)
    basis: str  # what it was compared with: "peers in node", "own baseline", "cohort", "gang median"

    def as_dict(self) -> dict:
        return {"field": self.field, "label": self.label, "value": _round(self.value),
                "expected": _round(self.expected), "deviation": _round(self.deviation, 2), "basis": self.basis}

    def phrase(self) -> str:
        if self.deviation != self.deviation:  # NaN: a non-finite value, e.g. loss = NaN
            return f"{self.label} not finite"
        return f"{self.label} {self.deviation:+.1f}σ vs {self.basis}"


def _round(x: float | None, digits: int = 4) -> float | None:
    """JSON-safe: NaN and ±inf (which PostgreSQL's jsonb refuses) become None."""
    if x is None or x != x or x in (float("inf"), float("-inf")):
        return None
    return round(float(x), digits)


@dataclass(frozen=True)
class Finding:
    """One entity found abnormal by one detector in one pass (kind is an `AnomalyKind` value)."""

    kind: str
    entity_kind: str  # gpu, port, rack, job, rank
    entity_id: str
    score: float  # 0..1; for failure_risk the calibrated probability
    contributions: tuple[Contribution, ...] = ()
    host: str = ""
    summary: str = ""  # defaults to the top contributions' phrases
    extra: dict = field(default_factory=dict)

    def text(self) -> str:
        if self.summary:
            return self.summary[:300]
        return "; ".join(c.phrase() for c in self.contributions[:3])[:300] or f"{self.kind} score {self.score:.2f}"
