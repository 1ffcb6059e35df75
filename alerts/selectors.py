"""Reads of the alerts app for the operator pages and the API: alerts and their history, rules, silences,
the routing tree, channels, remediation actions and the audit log.

Rows come back as plain dicts of JSON-ready values (times as ISO 8601 UTC strings), so the pages and
the API show the same thing; the pages add their display texts on top.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Prefetch, Q, QuerySet, TextField
from django.db.models.functions import Cast
from django.urls import NoReverseMatch, reverse

from alerts.models import (
    ActionState,
    Alert,
    AlertEvent,
    AlertState,
    Channel,
    DeliveryAttempt,
    InhibitRule,
    Notification,
    NotificationEvent,
    RemediationAction,
    Route,
    Rule,
    Severity,
    Silence,
)
from core.models import AuditEntry
from core.time import iso_utc
from telemetry.models import Port
from tenancy.scoping import is_operator as operator_scope

LIST_LIMIT = 200
OPEN_STATES = (AlertState.FIRING, AlertState.ACKNOWLEDGED)
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
RULE_FIELDS = ("name", "kind", "entity", "metric", "op", "threshold", "for_seconds", "window_seconds", "xid_codes",
               "xid_actions", "severity", "labels", "summary", "enabled")


def is_operator(user) -> bool:
    """Who may change alerting and remediation state: an operator (staff, superuser or operator role)."""
    return bool(user and user.is_authenticated and operator_scope(user))


def _iso(moment: datetime | None) -> str | None:
    return iso_utc(moment) if moment else None


# --- Entities ----------------------------------------------------------------------------------------

def entity_url(kind: str, key: str) -> str | None:
    """The drill-down page of an alert's entity, where there is one."""
    if not key:
        return None
    try:
        if kind in ("gpu", "node", "job"):
            return reverse(kind, args=[key])
        if kind == "port":
            port_id = _port_id(key)
            return reverse("port", args=[port_id]) if port_id else None
        if kind == "rack":
            return f"{reverse('search')}?q={key}"
    except NoReverseMatch:  # a key the URL pattern cannot carry (a "/" in a job key)
        return None
    return None


def _port_id(key: str) -> int | None:
    # Ports are named "switch:port" or "host:hca" in alert labels; a bare number is the row id.
    if key.isdigit():
        return int(key)
    owner, _, name = key.partition(":")
    if not name:
        return None
    return (Port.objects.filter(Q(switch__name=owner) | Q(node__hostname=owner), name=name)
            .values_list("pk", flat=True).first())


# --- Alerts --------------------------------------------------------------------------------------------

def alert_row(a: Alert) -> dict:
    """One alert as the list, the detail page and the API show it."""
    return {
        "id": a.pk, "name": a.name, "state": a.state, "severity": a.severity, "fingerprint": a.fingerprint,
        "source": a.source, "rule_id": a.rule_id, "labels": a.labels, "annotations": a.annotations,
        "entity_kind": a.entity_kind, "entity_key": a.entity_key, "entity_url": entity_url(a.entity_kind, a.entity_key),
        "value": a.value, "starts_at": _iso(a.starts_at), "last_seen": _iso(a.last_seen), "ends_at": _iso(a.ends_at),
        "occurrences": a.occurrences, "acked_by": a.acked_by.username if a.acked_by_id else None,
        "acked_at": _iso(a.acked_at), "silenced_by": a.silenced_by_id, "inhibited_by": a.inhibited_by_id,
        "muted": a.muted,
    }


def open_alerts(limit: int = LIST_LIMIT) -> list[dict]:
    """Firing and acknowledged alerts, most severe first, then newest."""
    qs = Alert.objects.filter(state__in=OPEN_STATES).select_related("acked_by").order_by("-starts_at")[:limit]
    return sorted((alert_row(a) for a in qs), key=lambda r: SEVERITY_ORDER.get(r["severity"], 9))


def scoped_alerts(who, resolved_since: datetime, *, limit: int = LIST_LIMIT, resolved_limit: int = 50) -> dict:
    """The alerts `who` sees (tenancy's scoping: a tenant's are labelled tenant=<slug>): "open" ones, most severe
    first, then newest, and those "resolved" since `resolved_since`, newest first."""
    scoped = Alert.objects.visible_to(who).select_related("acked_by")
    current = [alert_row(a) for a in scoped.filter(state__in=OPEN_STATES).order_by("-starts_at")[:limit]]
    recent = scoped.filter(state=AlertState.RESOLVED, ends_at__gte=resolved_since).order_by("-ends_at")
    return {"open": sorted(current, key=lambda r: SEVERITY_ORDER.get(r["severity"], 9)),
            "resolved": [alert_row(a) for a in recent[:resolved_limit]]}


def actions_on(targets: dict[str, set[str]], states, since: datetime) -> list[RemediationAction]:
    """Remediation actions in `states` created since `since` on any of `targets` ({"node": hostnames, "gpu":
    uuids, "job": job keys}), oldest first."""
    where = Q(pk__in=[])
    for kind, keys in targets.items():
        where |= Q(target_kind=kind, target_key__in=keys)
    return list(RemediationAction.objects.filter(where, state__in=states, created_at__gte=since).order_by("created_at"))


def open_alert_counts() -> dict:
    """Open alerts by severity, and how many are firing unacknowledged: the one count the alerts list,
    the fleet page and the API show, so they cannot disagree."""
    rows = Alert.objects.filter(state__in=OPEN_STATES).values_list("severity", "state").annotate(n=Count("pk"))
    by_severity = {s.value: 0 for s in Severity}
    firing = total = 0
    for severity, state, n in rows:
        by_severity[severity] = by_severity.get(severity, 0) + n
        total += n
        firing += n if state == AlertState.FIRING else 0
    return {"open": total, "firing": firing, "by_severity": by_severity}


@dataclass(frozen=True)
class HistoryFilters:
    """The history search: text in the name or labels, state ("open" for firing or acknowledged), severity and
    a time range (all optional)."""

    q: str = ""
    state: str = ""
    severity: str = ""
    since: datetime | None = None
    until: datetime | None = None


def _alert_query(f: HistoryFilters, who=None) -> QuerySet[Alert]:
    # `who` (a user or API token) narrows to the alerts it may see; None is the operator pages' whole view.
    qs = Alert.objects.all() if who is None else Alert.objects.visible_to(who)
    if f.q:
        qs = qs.annotate(labels_text=Cast("labels", TextField()))
        qs = qs.filter(Q(name__icontains=f.q) | Q(labels_text__icontains=f.q) | Q(entity_key__icontains=f.q))
    if f.state == "open":
        qs = qs.filter(state__in=OPEN_STATES)
    elif f.state:
        qs = qs.filter(state=f.state)
    if f.severity:
        qs = qs.filter(severity=f.severity)
    # Active at some point in the range: started before its end, not ended before its start.
    if f.until:
        qs = qs.filter(starts_at__lte=f.until)
    if f.since:
        qs = qs.filter(Q(ends_at=None) | Q(ends_at__gte=f.since))
    return qs


def find_alerts(f: HistoryFilters, limit: int = LIST_LIMIT, *, who=None) -> list[dict]:
    """Alerts matching the filters (state may be "open": firing or acknowledged), newest first; only those
    `who` may see when given (tenancy.scoping)."""
    qs = _alert_query(f, who).select_related("acked_by").order_by("-starts_at", "-id")
    return [alert_row(a) for a in qs[:limit]]


def search_history(f: HistoryFilters, limit: int = LIST_LIMIT) -> dict:
    """Alerts matching the filters, and their events and notifications within the time range, newest first."""
    alerts = list(_alert_query(f).select_related("acked_by")
                  .annotate(n_events=Count("events", distinct=True), n_notes=Count("notifications", distinct=True))
                  .order_by("-starts_at")[:limit])
    ids = [a.pk for a in alerts]
    events = AlertEvent.objects.filter(alert_id__in=ids).select_related("alert")
    notes = Notification.objects.filter(alerts__in=ids).distinct().select_related("channel")
    if f.since:
        events, notes = events.filter(time__gte=f.since), notes.filter(created_at__gte=f.since)
    if f.until:
        events, notes = events.filter(time__lte=f.until), notes.filter(created_at__lte=f.until)
    rows = [{**alert_row(a), "n_events": a.n_events, "n_notifications": a.n_notes} for a in alerts]
    return {"alerts": rows, "events": [event_row(e, with_alert=True) for e in events.order_by("-time", "-id")[:limit]],
            "notifications": [notification_row(n) for n in notes.order_by("-created_at", "-id")[:limit]],
            "limited": len(alerts) >= limit}


def event_row(e: AlertEvent, *, with_alert: bool = False) -> dict:
    """One AlertEvent of an alert's timeline."""
    row = {"id": e.pk, "time": _iso(e.time), "kind": e.kind, "kind_label": e.get_kind_display(), "actor": e.actor,
           "note": e.note, "value": e.value, "alert_id": e.alert_id}
    if with_alert:
        row["alert_name"] = e.alert.name
        row["entity_key"] = e.alert.entity_key
    return row


def attempt_row(d: DeliveryAttempt) -> dict:
    """One delivery attempt: what was sent (no secrets) and what came back."""
    return {"number": d.number, "started_at": _iso(d.started_at), "duration_ms": round(d.duration_ms, 1),
            "request": d.request, "status_code": d.status_code, "response": d.response, "error": d.error,
            "outcome": d.outcome}


def notification_row(n: Notification, *, attempts: bool = False) -> dict:
    """One outbox row; with its delivery attempts when asked."""
    row = {"id": n.pk, "channel_id": n.channel_id, "channel": n.channel.name, "channel_kind": n.channel.kind,
           "event": n.event, "status": n.status, "dedup_key": n.dedup_key, "attempts": n.attempts,
           "created_at": _iso(n.created_at), "delivered_at": _iso(n.delivered_at),
           "next_attempt_at": _iso(n.next_attempt_at), "error": n.error}
    if attempts:
        row["payload"] = n.payload
        row["attempt_log"] = [attempt_row(d) for d in n.attempt_log.all()]
    return row


def alert_detail(alert_id: int) -> dict | None:
    """An alert with its timeline, notifications (each with its delivery attempts), actions and muting."""
    a = Alert.objects.select_related("acked_by", "silenced_by", "inhibited_by", "rule").filter(pk=alert_id).first()
    if a is None:
        return None
    notes = (a.notifications.select_related("channel").order_by("created_at", "id")
             .prefetch_related(Prefetch("attempt_log", queryset=DeliveryAttempt.objects.order_by("number"))))
    return {**alert_row(a), "rule_name": a.rule.name if a.rule_id else None,
            "events": [event_row(e) for e in a.events.order_by("time", "id")],
            "notifications": [notification_row(n, attempts=True) for n in notes],
            "actions": [action_row(x) for x in a.actions.select_related("decided_by").order_by("-created_at")],
            "silence": silence_row(a.silenced_by) if a.silenced_by_id else None,
            "inhibitor": alert_row(a.inhibited_by) if a.inhibited_by_id else None}


def notification_detail(notification_id: int) -> dict | None:
    """One notification (a test message has no alert) with its payload, attempts and alerts."""
    n = Notification.objects.select_related("channel").filter(pk=notification_id).first()
    if n is None:
        return None
    alerts = [{"id": a.pk, "name": a.name, "state": a.state} for a in n.alerts.order_by("id")]
    return {**notification_row(n, attempts=True), "alerts": alerts}


# --- Rules ---------------------------------------------------------------------------------------------

def rule_row(r: Rule) -> dict:
    """A rule's fields, as the API reads and writes them."""
    return {"id": r.pk, **{f: getattr(r, f) for f in RULE_FIELDS}, "kind_label": r.get_kind_display(),
            "created_by": r.created_by.username if r.created_by_id else None,
            "created_at": _iso(r.created_at), "updated_at": _iso(r.updated_at)}


def rule_list() -> list[dict]:
    """Every rule by name, with how many alerts it has open."""
    rules = Rule.objects.select_related("created_by").annotate(
        n_open=Count("alerts", filter=Q(alerts__state__in=OPEN_STATES)))
    return [{**rule_row(r), "open_alerts": r.n_open} for r in rules.order_by("name")]


def rule_detail(rule_id: int) -> dict | None:
    """One rule, or None."""
    r = Rule.objects.select_related("created_by").filter(pk=rule_id).first()
    return rule_row(r) if r else None


# --- Silences, routing, inhibition ---------------------------------------------------------------------

def silence_row(s: Silence, now: datetime | None = None) -> dict:
    """A silence or maintenance window, with its state at `now` (pending, active or expired)."""
    row = {"id": s.pk, "kind": s.kind, "kind_label": s.get_kind_display(), "matchers": s.matchers,
           "starts_at": _iso(s.starts_at), "ends_at": _iso(s.ends_at), "author": s.author, "comment": s.comment,
           "created_at": _iso(s.created_at), "expired_at": _iso(s.expired_at)}
    if now is not None:
        row["state"] = silence_state(s, now)
    return row


def silence_state(s: Silence, now: datetime) -> str:
    """"expired" once ended (by time or by hand), "pending" before it starts, else "active"."""
    if s.expired_at is not None or s.ends_at <= now:
        return "expired"
    return "pending" if s.starts_at > now else "active"


def _silences_qs(state: str, now: datetime) -> QuerySet[Silence]:
    qs = Silence.objects.all()
    ended = Q(expired_at__isnull=False) | Q(ends_at__lte=now)
    if state == "expired":
        return qs.filter(ended).order_by("-ends_at")
    qs = qs.exclude(ended)
    if state == "active":
        return qs.filter(starts_at__lte=now)
    if state == "pending":
        return qs.filter(starts_at__gt=now)
    return qs


def silences(now: datetime, state: str = "current", limit: int = LIST_LIMIT) -> list[dict]:
    """Silences by state: "current" (active and pending), "active", "pending", "expired" or "all"."""
    qs = Silence.objects.order_by("-starts_at") if state == "all" else _silences_qs(state, now)
    rows = list(qs.annotate(n_muted=Count("silenced_alerts", filter=Q(silenced_alerts__state__in=OPEN_STATES)))
                [:limit])
    return [{**silence_row(s, now), "muted_alerts": s.n_muted} for s in rows]


def silence_detail(silence_id: int, now: datetime) -> dict | None:
    """One silence with the open alerts it mutes now."""
    s = Silence.objects.filter(pk=silence_id).first()
    if s is None:
        return None
    muted = [alert_row(a) for a in s.silenced_alerts.filter(state__in=OPEN_STATES).select_related("acked_by")]
    return {**silence_row(s, now), "alerts": muted}


def _route_node(route: Route, children: dict, channels: dict, escalation: dict) -> dict:
    return {"id": route.pk, "name": route.name, "matchers": route.matchers, "continue": route.continue_matching,
            "group_by": route.group_by, "group_wait_s": route.group_wait_s, "group_interval_s": route.group_interval_s,
            "repeat_interval_s": route.repeat_interval_s, "escalate_after_s": route.escalate_after_s,
            "channels": channels.get(route.pk, []), "escalation_channels": escalation.get(route.pk, []),
            "children": [_route_node(c, children, channels, escalation) for c in children.get(route.pk, [])]}


def routing_tree() -> list[dict]:
    """The routing tree(s), roots first, children in matching order, each with its channels."""
    routes = list(Route.objects.order_by("parent_id", "position", "id"))
    children: dict[int | None, list[Route]] = {}
    for r in routes:
        children.setdefault(r.parent_id, []).append(r)
    channels: dict[int, list[str]] = {}
    for rid, name in Route.channels.through.objects.values_list("route_id", "channel__name").order_by("channel__name"):
        channels.setdefault(rid, []).append(name)
    escalation: dict[int, list[str]] = {}
    for rid, name in (Route.escalation_channels.through.objects.values_list("route_id", "channel__name")
                      .order_by("channel__name")):
        escalation.setdefault(rid, []).append(name)
    return [_route_node(r, children, channels, escalation) for r in children.get(None, [])]


def inhibit_rules() -> list[dict]:
    """Every inhibition rule."""
    return [{"id": r.pk, "name": r.name, "source_matchers": r.source_matchers, "target_matchers": r.target_matchers,
             "equal": r.equal, "enabled": r.enabled} for r in InhibitRule.objects.order_by("name")]


# --- Channels ------------------------------------------------------------------------------------------

def channel_row(c: Channel, last_test: Notification | None = None) -> dict:
    """A channel without its secret or config values (they may hold tokens): kind, state, last success."""
    row = {"id": c.pk, "name": c.name, "kind": c.kind, "kind_label": c.get_kind_display(), "enabled": c.enabled,
           "disabled_reason": c.disabled_reason, "disabled_at": _iso(c.disabled_at), "last_ok_at": _iso(c.last_ok_at),
           "has_secret": bool(c.secret), "config_keys": sorted(c.config) if isinstance(c.config, dict) else []}
    row["last_test"] = notification_row(last_test) if last_test else None
    return row


def channel_list() -> list[dict]:
    """Every channel by name, each with its newest test notification."""
    chans = list(Channel.objects.order_by("name"))
    tests = (Notification.objects.filter(event=NotificationEvent.TEST, channel__in=chans).select_related("channel")
             .order_by("channel_id", "-created_at", "-id").distinct("channel_id"))
    latest = {n.channel_id: n for n in tests}
    return [channel_row(c, latest.get(c.pk)) for c in chans]


# --- Remediation ---------------------------------------------------------------------------------------

def action_row(x: RemediationAction) -> dict:
    """One remediation action with its decision, evidence and outcome."""
    return {"id": x.pk, "kind": x.kind, "kind_label": x.get_kind_display(), "mode": x.mode, "state": x.state,
            "state_label": x.get_state_display(), "target_kind": x.target_kind, "target_key": x.target_key,
            "target_url": entity_url(x.target_kind, x.target_key), "params": x.params, "reason": x.reason,
            "evidence": x.evidence, "alert_id": x.alert_id, "playbook_id": x.playbook_id,
            "requested_by": x.requested_by, "decided_by": x.decided_by.username if x.decided_by_id else None,
            "decided_at": _iso(x.decided_at), "backend": x.backend, "blocked_reason": x.blocked_reason,
            "result": x.result, "verified": x.verified, "created_at": _iso(x.created_at),
            "started_at": _iso(x.started_at), "finished_at": _iso(x.finished_at)}


REMEDIATION_SECTIONS = {
    "awaiting": (ActionState.AWAITING,),
    "suggested": (ActionState.SUGGESTED,),
    "shadowed": (ActionState.SHADOWED,),
    "recent": (ActionState.APPROVED, ActionState.RUNNING, ActionState.SUCCEEDED, ActionState.FAILED,
               ActionState.REJECTED, ActionState.BLOCKED),
}


def actions(states: tuple[str, ...] | None = None, limit: int = LIST_LIMIT) -> list[dict]:
    """Remediation actions in `states` (all when None), newest first."""
    qs = RemediationAction.objects.select_related("decided_by")
    if states:
        qs = qs.filter(state__in=states)
    return [action_row(x) for x in qs.order_by("-created_at", "-id")[:limit]]


def remediation_action(action_id: int) -> RemediationAction | None:
    """One action with who decided it and its alert, or None."""
    return RemediationAction.objects.select_related("decided_by", "alert").filter(pk=action_id).first()


def remediation_overview(limit: int = 50) -> dict:
    """The remediation page's sections: awaiting approval (oldest first), suggested, shadowed, recent."""
    out = {name: actions(states, limit) for name, states in REMEDIATION_SECTIONS.items()}
    out["awaiting"].reverse()  # the queue reads oldest first: that one has waited longest
    return out


# --- Audit ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AuditFilters:
    """The audit search: actor, verb (prefix), object kind and id, time range (all optional)."""

    actor: str = ""
    verb: str = ""
    object_kind: str = ""
    object_id: str = ""
    since: datetime | None = None
    until: datetime | None = None


def audit_row(e: AuditEntry) -> dict:
    """One audit entry."""
    return {"id": e.pk, "time": _iso(e.time), "actor": e.actor, "verb": e.verb, "object_kind": e.object_kind,
            "object_id": e.object_id, "reason": e.reason, "outcome": e.outcome, "detail": e.detail}


def audit_log(f: AuditFilters, limit: int = LIST_LIMIT) -> list[dict]:
    """Audit entries matching the filters, newest first."""
    qs = AuditEntry.objects.all()
    if f.actor:
        qs = qs.filter(actor__icontains=f.actor)
    if f.verb:
        qs = qs.filter(verb__istartswith=f.verb)
    if f.object_kind:
        qs = qs.filter(object_kind=f.object_kind)
    if f.object_id:
        qs = qs.filter(object_id=f.object_id)
    if f.since:
        qs = qs.filter(time__gte=f.since)
    if f.until:
        qs = qs.filter(time__lte=f.until)
    return [audit_row(e) for e in qs.order_by("-time", "-id")[:limit]]

