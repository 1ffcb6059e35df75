"""Findings to events: one event per root cause, not one per detector and entity.

A fleet of 16k GPUs raises the same problem on many entities at once: a congested leaf switch backs up
every port on it and the HCA and spine ports cabled to it; a hot GPU is flagged by its node's peers, by
its own history and, as its rank slows, by the straggler detector. An operator wants one line for each.
So every finding is a *member* of an event, and the event stands for a cause:

1. **Entity first.** A finding on an entity that is already a member of an open event joins that event
   (deduplication across detectors; a rank counts as its GPU).
2. **Else its cause key.** A GPU's or rank's finding: its host (`host:<node>`), since the GPUs of one
   node share its board, power, cooling and job. A port's: the leaf switch it is on or cabled to
   (`leaf:<switch>`), since a leaf's congestion and its cables' errors show on both ends. A rack's:
   the rack. A job's: the job. Failure-risk forecasts are a stream of their own (`risk|`), grouped the
   same way, so a forecast never hides in, or extends, a detector's event.
3. **Ranked by evidence.** An event tells an operator what is wrong, so a finding that names no metric at
   least `EVIDENCE_SIGMA` from what it was compared with (the threshold every peer and own-history
   finding is recorded at) opens or joins no event; the cohort model's outliers can lack one (its forest
   flags a combination of small deviations). Its score still reaches the entity's current score.
4. **Persistent conditions are not re-opened.** An event stays open until its cause has been quiet for
   `HOLD`: a counter that rises every few minutes (a marginal cable's symbol errors, a weak GPU's ECC
   errors) is one event, not one per minute it rose. It then closes as of its last finding.

Each member keeps its own first and last minute, score and leading signals, so what was flagged,
when, and by which detector is still there for the evaluation and the drill-down pages. The event's
`kind`, entity, score and explanation are those of its worst moment; `member_count` says how many
entities it covers ("37 ports").
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from anomaly.findings import Finding
from anomaly.models import AnomalyKind
from telemetry.models import Port

# How long a cause must stay quiet before its event closes. The longest window any minute detector
# reads is the last hour (XID events in the last hour): a condition that recurs within it is the same
# condition, and one that has been quiet that long has ended.
HOLD = timedelta(hours=1)
SIGNALS_KEPT = 3
# The fleet detectors' threshold (anomaly.scoring.Z_THRESHOLD, which imports this module's writer).
EVIDENCE_SIGMA = 6.0
# Detectors whose contributions are deviations in σ from a reference; the others (rack power against its
# cap, stragglers, divergence, failure risk) state their own case.
SIGMA_KINDS = frozenset({AnomalyKind.PEER_NODE, AnomalyKind.PEER_JOB, AnomalyKind.PEER_LEAF, AnomalyKind.BASELINE,
                         AnomalyKind.COHORT})
SUMMARY_KEPT = 200  # a member's own words, for the alerts and the detail page; the event keeps 300
NOUNS = {"gpu": "GPU", "port": "port", "rank": "rank", "rack": "rack", "job": "job"}


def evident(f: Finding) -> bool:
    """Whether a finding names a metric far enough off to open or join an event (see the module)."""
    if f.kind not in SIGMA_KINDS:
        return True
    return any(abs(c.deviation) >= EVIDENCE_SIGMA for c in f.contributions if c.deviation == c.deviation)


def stream(kind: str) -> str:
    """Failure-risk forecasts are grouped apart from what the detectors see now."""
    return "risk" if kind == AnomalyKind.FAILURE_RISK else "fleet"


def entity_keys(kind: str, entity_kind: str, entity_id: str, gpu: str = "") -> list[tuple[str, str, str]]:
    """The (stream, entity kind, id) a finding is deduplicated by: itself, and a rank's GPU."""
    s = stream(kind)
    keys = [(s, entity_kind, entity_id)]
    if gpu:
        keys.append((s, "gpu", gpu))
    return keys


def cause_key(f: Finding, port_leaves: dict[str, str]) -> str:
    """`<stream>|<cause>` for a finding no open event already holds (see the module docstring)."""
    if f.entity_kind in ("gpu", "rank") and f.host:
        cause = f"host:{f.host}"
    elif f.entity_kind == "port":
        cause = port_leaves.get(f.entity_id) or f"port:{f.entity_id}"
    else:
        cause = f"{f.entity_kind}:{f.entity_id}"
    return f"{stream(f.kind)}|{cause}"


def port_leaves(port_ids: Iterable[str]) -> dict[str, str]:
    """Port id -> `leaf:<switch>`: the leaf it is on, else the leaf its cable ends on (an HCA port, a
    spine port), else its own switch or node. One query for the ports among a pass's findings."""
    ids = [int(i) for i in set(port_ids) if i.isdigit()]
    out = {}
    rows = Port.objects.filter(id__in=ids).values_list(
        "id", "switch__name", "switch__role", "link_as_a__b__switch__name", "link_as_a__b__switch__role",
        "link_as_b__a__switch__name", "link_as_b__a__switch__role", "node__hostname")
    for pk, name, role, a_name, a_role, b_name, b_role, host in rows:
        peer, peer_role = (a_name, a_role) if a_name else (b_name, b_role)
        if role == "leaf":
            out[str(pk)] = f"leaf:{name}"
        elif peer_role == "leaf":
            out[str(pk)] = f"leaf:{peer}"
        else:
            out[str(pk)] = f"switch:{name}" if name else f"host:{host}"
    return out


def member(f: Finding, at: datetime) -> dict:
    """A new member for one finding."""
    m = {"kind": f.kind, "entity_kind": f.entity_kind, "entity_id": f.entity_id, "host": f.host,
         "first_seen": at.isoformat(), "last_seen": at.isoformat(), "score": round(f.score, 4),
         "last_score": round(f.score, 4), "summary": f.text()[:SUMMARY_KEPT],
         "signals": [[c.field, _finite(c.deviation)] for c in f.contributions[:SIGNALS_KEPT]]}
    if f.extra.get("gpu_uuid"):
        m["gpu"] = f.extra["gpu_uuid"]
    return m


def merge(members: list[dict], f: Finding, at: datetime) -> None:
    """Add `f` to an event's members: a new member, or the same detector's on the same entity extended.
    A member's signals are those of its first finding (what it was flagged for when it was flagged);
    its summary follows its strongest."""
    for m in members:
        if (m["kind"], m["entity_kind"], m["entity_id"]) == (f.kind, f.entity_kind, f.entity_id):
            m["last_seen"], m["last_score"] = at.isoformat(), round(f.score, 4)
            if f.score >= m["score"]:
                m["score"], m["summary"] = round(f.score, 4), f.text()[:SUMMARY_KEPT]
            return
    members.append(member(f, at))


def entities(members: list[dict]) -> int:
    """Distinct entities among the members (a rank and its GPU are two: a job's view and a board's)."""
    return len({(m["entity_kind"], m["entity_id"]) for m in members})


def group_text(members: list[dict]) -> str:
    """ "(+36 more ports on its leaf)" for an event of several entities; "" for one."""
    n = entities(members)
    if n <= 1:
        return ""
    kinds = {m["entity_kind"] for m in members}
    noun = NOUNS.get(next(iter(kinds)), "entity") if len(kinds) == 1 else "entity"
    plural = "entities" if noun == "entity" else f"{noun}s"
    return f" (+{n - 1} more {noun if n == 2 else plural})"


def _finite(x: float) -> float | None:
    return round(float(x), 2) if x == x and x not in (float("inf"), float("-inf")) else None
