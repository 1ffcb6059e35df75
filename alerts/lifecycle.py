"""The alert lifecycle: observations become alerts that fire, merge duplicates, resolve, and are acknowledged.

An observation is one entity for which a rule's condition holds now (or one alert an Alertmanager sent). Its
label set is its identity: `fingerprint(labels)`. Applying a rule's observations, under one advisory lock so
two evaluators never fire the same alert twice:

1. an observed fingerprint with no open alert fires a NEW alert row (a fingerprint that resolved earlier
   fires a new row too: the old one stays as history);
2. an observed fingerprint with an open alert is a re-sighting: `last_seen` and `value` follow every
   evaluation, but only a real change (annotations other than the summary and value, or the severity)
   counts an occurrence and records a `merged` event, so history is not one row per evaluation;
3. with `complete=True` (a rule's full result), the rule's open alerts not observed resolve;
4. in the same transaction the changed alerts are routed (`alerts.routing.do_route_alerts`), and after the
   commit the playbooks of the alerts that fired are run (`alerts.tasks.run_playbooks`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

import psycopg
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from alerts import live
from alerts.locks import lock_lifecycle
from alerts.matching import fingerprint
from alerts.models import (
    Alert,
    AlertEvent,
    AlertEventKind,
    AlertSource,
    AlertState,
    EntityKind,
    Rule,
    RulePending,
    Severity,
)
from alerts.routing import do_route_alerts
from core.audit import actor_name, do_audit
from core.queue import enqueue

logger = logging.getLogger(__name__)

# Annotations that change on every evaluation of a gauge; a change of only these is not a new sighting.
VOLATILE_ANNOTATIONS = frozenset({"summary", "value", "seconds"})
RULE_ACTOR = "system:rules"
SEVERITIES = frozenset(Severity.values)


@dataclass
class Observation:
    """One entity for which a rule's condition holds now, or one alert received from an Alertmanager."""

    labels: dict[str, str]
    annotations: dict = field(default_factory=dict)
    entity_kind: str = EntityKind.EXTERNAL
    entity_key: str = ""
    value: float | None = None
    starts_at: datetime | None = None  # when it began, if the source says (Alertmanager's startsAt)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.labels)


@dataclass
class Outcome:
    """What one application of observations changed, by alert id."""

    fired: list[int] = field(default_factory=list)
    merged: list[int] = field(default_factory=list)
    resolved: list[int] = field(default_factory=list)

    @property
    def changed(self) -> list[int]:
        return self.fired + self.merged + self.resolved


def do_apply_observations(rule: Rule | None, observations: list[Observation], now: datetime, *,
                          complete: bool = True) -> list[int]:
    """Fire, merge and (when `complete`) resolve the alerts of `rule`; returns the ids of the changed alerts."""
    return apply_observations(rule, observations, now, complete=complete).changed


@transaction.atomic(savepoint=False)
def apply_observations(rule: Rule | None, observations: list[Observation], now: datetime, *,
                       complete: bool = True, source: str = AlertSource.RULE,
                       actor: str = RULE_ACTOR) -> Outcome:
    """do_apply_observations with the changes told apart (fired / merged / resolved)."""
    lock_lifecycle()
    seen = {o.fingerprint: o for o in observations}
    open_alerts = _open_alerts(rule if complete else None, seen)
    out = Outcome()
    out.fired = _fire(rule, [o for fp, o in seen.items() if fp not in open_alerts], now, source, actor)
    out.merged = _merge([(a, seen[fp]) for fp, a in open_alerts.items() if fp in seen], now, actor)
    if complete:
        gone = [a for fp, a in open_alerts.items() if fp not in seen]
        out.resolved = _resolve(gone, now, actor, note="condition no longer holds")
    _route(out.changed, now)
    _run_playbooks_on_commit(out.fired)
    return out


class OpenAlert(NamedTuple):
    """What merging and resolving need of an open alert (no model instances: a storm has thousands)."""

    pk: int
    fingerprint: str
    annotations: dict
    severity: str
    value: float | None


def _open_alerts(rule: Rule | None, seen: dict[str, Observation]) -> dict[str, OpenAlert]:
    """Open alerts with an observed fingerprint, plus (for a complete result) every open alert of the rule."""
    which = Q(fingerprint__in=list(seen)) | (Q(rule=rule) if rule is not None else Q(pk__in=[]))
    rows = (Alert.objects.exclude(state=AlertState.RESOLVED).filter(which)
            .values_list("pk", "fingerprint", "annotations", "severity", "value"))
    return {row[1]: OpenAlert(*row) for row in rows}


def _severity(labels: dict) -> str:
    value = labels.get("severity", "")
    return value if value in SEVERITIES else Severity.WARNING


def _fire(rule: Rule | None, observations: list[Observation], now: datetime, source: str, actor: str) -> list[int]:
    if not observations:
        return []
    alerts = Alert.objects.bulk_create([
        Alert(fingerprint=o.fingerprint, rule=rule, source=source, name=o.labels.get("alertname", "")[:200],
              severity=_severity(o.labels), labels=o.labels, annotations=o.annotations,
              entity_kind=o.entity_kind, entity_key=o.entity_key[:200], value=o.value,
              starts_at=o.starts_at or now, last_seen=now)
        for o in observations
    ], batch_size=2000)
    AlertEvent.objects.bulk_create([
        AlertEvent(alert=a, time=now, kind=AlertEventKind.FIRED, actor=actor, value=a.value,
                   note=str(a.annotations.get("summary", ""))[:2000])
        for a in alerts
    ], batch_size=2000)
    return [a.pk for a in alerts]


def _stable(annotations: dict) -> dict:
    return {k: v for k, v in annotations.items() if k not in VOLATILE_ANNOTATIONS}


def _merge(pairs: list[tuple[OpenAlert, Observation]], now: datetime, actor: str) -> list[int]:
    """Re-sightings: last_seen for all; value and annotations where they moved; an occurrence and a `merged`
    event only where something really changed (a stable annotation or the severity), not a gauge's drift."""
    if not pairs:
        return []
    seen_only, rows, events, changed = [], [], [], []
    for alert, o in pairs:
        severity = _severity(o.labels)
        if alert.value == o.value and alert.annotations == o.annotations and alert.severity == severity:
            seen_only.append(alert.pk)
            continue
        real = alert.severity != severity or _stable(alert.annotations) != _stable(o.annotations)
        rows.append((alert.pk, o.value, _json(o.annotations), severity, int(real)))
        if real:
            changed.append(alert.pk)
            events.append(AlertEvent(alert_id=alert.pk, time=now, kind=AlertEventKind.MERGED, actor=actor,
                                     value=o.value, note=str(o.annotations.get("summary", ""))[:2000]))
    _update_merged(now, seen_only, rows)
    AlertEvent.objects.bulk_create(events, batch_size=2000)
    return changed


def _update_merged(now: datetime, seen_only: list[int], rows: list[tuple]) -> None:
    table = Alert._meta.db_table
    connection.ensure_connection()
    # A plain psycopg cursor binds on the server: Django's client-side quoting of thousand-element arrays
    # costs more than the UPDATE itself in an alert storm.
    with psycopg.Cursor(connection.connection) as cur:
        if seen_only:
            cur.execute(f"UPDATE {table} SET last_seen = GREATEST(last_seen, %s) WHERE id = ANY(%s)", [now, seen_only])
        if rows:
            ids, values, anns, sevs, incs = (list(c) for c in zip(*rows, strict=True))
            cur.execute(
                f"UPDATE {table} a SET last_seen = GREATEST(a.last_seen, %s), value = u.v, "
                "annotations = u.ann::jsonb, severity = u.sev, occurrences = a.occurrences + u.inc "
                "FROM unnest(%s::int[], %s::float8[], %s::text[], %s::text[], %s::int[]) AS u(id, v, ann, sev, inc) "
                "WHERE a.id = u.id",
                [now, ids, values, anns, sevs, incs],
            )


def _json(value: dict) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _resolve(alerts: list[Alert] | list[OpenAlert], now: datetime, actor: str, note: str = "",
             ends_at: datetime | None = None) -> list[int]:
    if not alerts:
        return []
    ids = [a.pk for a in alerts]
    Alert.objects.filter(pk__in=ids).update(state=AlertState.RESOLVED, ends_at=ends_at or now)
    AlertEvent.objects.bulk_create([
        AlertEvent(alert_id=a.pk, time=now, kind=AlertEventKind.RESOLVED, actor=actor, value=a.value,
                   note=note[:2000])
        for a in alerts
    ], batch_size=2000)
    return ids


def _route(alert_ids: list[int], now: datetime) -> None:
    """Silences, inhibition and groups for the changed alerts, in this transaction (alerts.routing)."""
    if not alert_ids:
        return
    do_route_alerts(alert_ids, now)
    live.publish_on_commit(live.ALERTS)


def _run_playbooks_on_commit(alert_ids: list[int]) -> None:
    if not alert_ids:
        return
    ids = list(alert_ids)

    def send() -> None:
        try:
            enqueue("alerts.tasks.run_playbooks", ids)
        except Exception:  # the broker is down: the alerts stand, only the playbook suggestion is lost
            logger.exception("could not enqueue playbooks for alerts %s", ids)

    transaction.on_commit(send)


@transaction.atomic
def do_resolve_orphans(now: datetime) -> list[int]:
    """Resolve the open alerts of deleted rules: nothing evaluates them any more."""
    lock_lifecycle()
    gone = list(Alert.objects.filter(source=AlertSource.RULE, rule__isnull=True).exclude(state=AlertState.RESOLVED))
    ids = _resolve(gone, now, RULE_ACTOR, note="its rule was deleted")
    _route(ids, now)
    return ids


# --- for_seconds: conditions that must hold a while before they fire -------------------------------

@transaction.atomic(savepoint=False)
def do_hold_pending(rule: Rule, observations: list[Observation], now: datetime) -> list[Observation]:
    """The observations that may fire now: held for `rule.for_seconds`, or already firing.

    A condition first seen is recorded as pending (since now); one no longer observed is forgotten, so it
    starts over when it returns (Prometheus' `for`).
    """
    if rule.for_seconds <= 0:
        return observations
    seen = {o.fingerprint: o for o in observations}
    RulePending.objects.filter(rule=rule).exclude(fingerprint__in=list(seen)).delete()
    since = dict(RulePending.objects.filter(rule=rule).values_list("fingerprint", "since"))
    new = [RulePending(rule=rule, fingerprint=fp, since=now, value=o.value) for fp, o in seen.items()
           if fp not in since]
    RulePending.objects.bulk_create(new, batch_size=2000, ignore_conflicts=True)
    firing = set(Alert.objects.filter(rule=rule, fingerprint__in=list(seen)).exclude(state=AlertState.RESOLVED)
                 .values_list("fingerprint", flat=True))
    due = now.timestamp() - rule.for_seconds
    return [o for fp, o in seen.items() if fp in firing or (fp in since and since[fp].timestamp() <= due)]


# --- Operator actions --------------------------------------------------------------------------------

def _locked_alert(alert_id: int) -> Alert:
    lock_lifecycle()
    return Alert.objects.select_for_update().get(pk=alert_id)


@transaction.atomic
def do_ack_alert(alert_id: int, user, note: str = "", *, now: datetime | None = None) -> Alert:
    """Acknowledge an open alert (providers are told through routing); acknowledging twice changes nothing."""
    now = now or timezone.now()
    alert = _locked_alert(alert_id)
    if alert.state == AlertState.RESOLVED:
        raise ValueError(f"alert {alert_id} is resolved; there is nothing to acknowledge")
    if alert.state == AlertState.ACKNOWLEDGED:
        return alert
    alert.state, alert.acked_at = AlertState.ACKNOWLEDGED, now
    alert.acked_by = user if getattr(user, "pk", None) else None
    alert.save(update_fields=["state", "acked_at", "acked_by"])
    _operator_event(alert, AlertEventKind.ACKNOWLEDGED, "alert.ack", user, note, now)
    return alert


@transaction.atomic
def do_unack_alert(alert_id: int, user, note: str = "", *, now: datetime | None = None) -> Alert:
    """Withdraw an acknowledgement: the alert fires (and may page) again."""
    now = now or timezone.now()
    alert = _locked_alert(alert_id)
    if alert.state != AlertState.ACKNOWLEDGED:
        raise ValueError(f"alert {alert_id} is {alert.state}, not acknowledged")
    alert.state, alert.acked_at, alert.acked_by = AlertState.FIRING, None, None
    alert.save(update_fields=["state", "acked_at", "acked_by"])
    _operator_event(alert, AlertEventKind.UNACKNOWLEDGED, "alert.unack", user, note, now)
    return alert


@transaction.atomic
def do_resolve_alert(alert_id: int, actor, note: str = "", *, now: datetime | None = None) -> Alert:
    """Resolve an alert by hand (meant for external alerts: a rule's alert fires again, as a new alert, while
    its condition still holds). Resolving a resolved alert changes nothing."""
    now = now or timezone.now()
    alert = _locked_alert(alert_id)
    if alert.state == AlertState.RESOLVED:
        return alert
    alert.state, alert.ends_at = AlertState.RESOLVED, now
    alert.save(update_fields=["state", "ends_at"])
    _operator_event(alert, AlertEventKind.RESOLVED, "alert.resolve", actor, note, now)
    return alert


def _operator_event(alert: Alert, kind: str, verb: str, actor, note: str, now: datetime) -> None:
    name = actor if isinstance(actor, str) else actor_name(actor)
    AlertEvent.objects.create(alert=alert, time=now, kind=kind, actor=name[:150], note=note, value=alert.value)
    do_audit(name, verb, "alert", alert.pk, reason=note, outcome=alert.state, at=now,
             detail={"name": alert.name, "fingerprint": alert.fingerprint})
    _route([alert.pk], now)


# --- Prometheus Alertmanager ------------------------------------------------------------------------

@transaction.atomic
def do_apply_alertmanager(firing: list[Observation], resolved: list[tuple[dict, datetime | None]],
                           now: datetime) -> list[int]:
    """Apply a parsed Alertmanager webhook (`alerts.alertmanager.parse_webhook`): firing alerts fire or merge,
    resolved ones (labels, ends_at) resolve."""
    out = apply_observations(None, firing, now, complete=False, source=AlertSource.ALERTMANAGER,
                             actor="system:alertmanager")
    fps = {fingerprint(labels): ends_at for labels, ends_at in resolved}
    gone = list(Alert.objects.filter(fingerprint__in=list(fps)).exclude(state=AlertState.RESOLVED))
    ids = []
    for alert in gone:  # each keeps the end time the Alertmanager reported
        ends_at = min(fps[alert.fingerprint] or now, now)
        ids += _resolve([alert], now, "system:alertmanager", note="resolved by Alertmanager", ends_at=ends_at)
    _route(ids, now)
    return out.changed + ids
