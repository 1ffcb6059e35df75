"""Writes of the anomaly app: findings into anomaly events and current entity scores.

`do_record_findings` is the only way detectors' results reach the database:

1. For every finding, extend the open event of (kind, entity) or open a new one.
2. Close the open events of the kinds that ran this pass whose entity was not found again:
   the anomaly has ended (ended_at = the last time it was seen).
3. Upsert the entities' current anomaly score (the largest over the kinds that ran), clearing the
   score of entities no longer abnormal, so a heatmap shows "now", not "ever".
All in one transaction, so a reader never sees an event closed without its replacement.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime

from django.db import connection, transaction

from anomaly.findings import Finding
from anomaly.models import Anomaly, AnomalyKind, EntityScore

logger = logging.getLogger(__name__)


def do_record_findings(findings: Iterable[Finding], *, kinds: Iterable[str], at: datetime,
                       model_version=None) -> dict:
    """Store one pass of the detectors in `kinds`; returns counts of opened, extended, closed."""
    kinds = set(kinds)
    found: dict[tuple[str, str, str], Finding] = {}
    for f in findings:
        if f.kind not in kinds:
            raise ValueError(f"finding of kind {f.kind!r} outside the kinds that ran ({sorted(kinds)})")
        key = (f.kind, f.entity_kind, f.entity_id)
        if key not in found or f.score > found[key].score:
            found[key] = f
    with transaction.atomic():
        open_rows = {(a.kind, a.entity_kind, a.entity_id): a for a in
                     Anomaly.objects.select_for_update().filter(kind__in=kinds, ended_at=None)}
        opened, extended = _open_or_extend(found, open_rows, at, model_version)
        gone = [a.pk for key, a in open_rows.items() if key not in found]
        closed = Anomaly.objects.filter(pk__in=gone).update(ended_at=at) if gone else 0
        if AnomalyKind.FAILURE_RISK not in kinds:  # the risk pass keeps its own column (do_store_risks)
            _store_scores(found, kinds, at)
    logger.info("anomaly pass %s: %d opened, %d extended, %d closed", sorted(kinds), opened, extended, closed)
    return {"opened": opened, "extended": extended, "closed": closed}


def _open_or_extend(found, open_rows, at, model_version) -> tuple[int, int]:
    new, changed = [], []
    for key, f in found.items():
        contributions = [c.as_dict() for c in f.contributions]
        row = open_rows.get(key)
        if row is None:
            new.append(Anomaly(kind=f.kind, entity_kind=f.entity_kind, entity_id=f.entity_id, host=f.host,
                               started_at=at, last_seen=at, score=f.score, last_score=f.score, summary=f.text(),
                               contributions=contributions, model_version=model_version))
            continue
        row.last_seen, row.last_score = at, f.score
        if f.score >= row.score:  # keep the explanation of the worst moment
            row.score, row.summary, row.contributions = f.score, f.text(), contributions
        changed.append(row)
    Anomaly.objects.bulk_create(new, batch_size=2000)
    Anomaly.objects.bulk_update(changed, ["last_seen", "last_score", "score", "summary", "contributions"],
                                batch_size=2000)
    return len(new), len(changed)


def _store_scores(found: dict, kinds: set[str], at: datetime) -> None:
    """Current anomaly score per entity: the max over this pass's findings; others go to NULL."""
    best: dict[tuple[str, str], float] = {}
    for (_kind, ek, eid), f in found.items():
        if f.kind == AnomalyKind.FAILURE_RISK:
            continue
        best[(ek, eid)] = max(best.get((ek, eid), 0.0), f.score)
    table = EntityScore._meta.db_table
    with connection.cursor() as cur:
        cur.execute(f"UPDATE {table} SET anomaly_score = NULL, anomaly_at = %s WHERE anomaly_score IS NOT NULL",
                    [at])
        # The fleet row says when the detectors last ran, so "no anomalies" reads as healthy, not unscored.
        cur.execute(f"""INSERT INTO {table} (entity_kind, entity_id, anomaly_at) VALUES ('fleet', '*', %s)
                        ON CONFLICT (entity_kind, entity_id) DO UPDATE SET anomaly_at = excluded.anomaly_at""", [at])
        if best:
            eks, eids, scores = zip(*((ek, eid, s) for (ek, eid), s in best.items()), strict=True)
            cur.execute(
                f"""INSERT INTO {table} (entity_kind, entity_id, anomaly_score, anomaly_at)
                    SELECT * FROM unnest(%s::text[], %s::text[], %s::float8[], array_fill(%s::timestamptz,
                                         ARRAY[%s]))
                    ON CONFLICT (entity_kind, entity_id)
                    DO UPDATE SET anomaly_score = excluded.anomaly_score, anomaly_at = excluded.anomaly_at""",
                [list(eks), list(eids), list(scores), at, len(eks)])


def do_store_risks(risks: dict[str, float], *, at: datetime, version: int) -> int:
    """Current failure risk per GPU (UUID -> probability); GPUs not scored keep their last value."""
    if not risks:
        return 0
    table = EntityScore._meta.db_table
    with connection.cursor() as cur:
        cur.execute(
            f"""INSERT INTO {table} (entity_kind, entity_id, failure_risk, risk_at, risk_version)
                SELECT 'gpu', u, p, %s, %s FROM unnest(%s::text[], %s::float8[]) AS t(u, p)
                ON CONFLICT (entity_kind, entity_id)
                DO UPDATE SET failure_risk = excluded.failure_risk, risk_at = excluded.risk_at,
                              risk_version = excluded.risk_version""",
            [at, version, list(risks), list(risks.values())])
    return len(risks)

