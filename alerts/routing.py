"""Routing: alerts to groups through the route tree, and due groups to notifications (Alertmanager's semantics).

do_route_alerts(alert_ids, now), in the transaction that changed the alerts:
1. recompute each open alert's mute (alerts.silences) and record silenced / inhibited / unmuted on a change;
   then the alerts whose inhibition may depend on them (those they inhibit, those they could inhibit) likewise;
2. walk the route tree: depth-first, the first matching child wins unless it has `continue_matching`, a route
   whose children all miss takes the alert itself; an empty group_by, or no channels, is inherited from the
   parent (Alertmanager's inheritance); the root route catches every alert;
3. put the alert into AlertGroup(route, key of its group_by values, '...' = all labels) and set the group due:
   a new (or emptied) group after group_wait, an existing one at max(last notification + group_interval, now);
4. after commit, queue the flush task for when the group is due.

do_flush_due_groups(now) claims due groups (FOR UPDATE SKIP LOCKED, so two workers never send the same group)
and for each decides one event from its unmuted alerts against `notified_state` (what providers were last told):
trigger (something fires unacknowledged), acknowledge (all open ones acknowledged), resolve (all resolved);
unchanged groups resend only after repeat_interval. Muted alerts are never sent and are forgotten from
`notified_state`, so they notify again when unmuted. Resolved alerts leave the group once dealt with.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Min
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from alerts.locks import lock_lifecycle
from alerts.matching import matches
from alerts.models import (
    Alert,
    AlertEvent,
    AlertEventKind,
    AlertGroup,
    AlertState,
    Channel,
    InhibitRule,
    Notification,
    NotificationEvent,
    NotificationStatus,
    Route,
)
from alerts.muting import OPEN_STATES, active_silences, compute_mute, inhibition_targets
from core.queue import enqueue

logger = logging.getLogger(__name__)

ACTOR = "system:routing"
FLUSH_BATCH = 200
GROUP_KEY_MAX = 500
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


# --- Route tree -----------------------------------------------------------------------------------------

@dataclass
class RouteTree:
    """All routes, loaded once per call: children in sibling order, and the inherited settings."""

    routes: dict[int, Route] = field(default_factory=dict)
    children: dict[int | None, list[Route]] = field(default_factory=dict)

    @classmethod
    def load(cls) -> RouteTree:
        tree = cls()
        for route in Route.objects.order_by("position", "id"):
            tree.routes[route.pk] = route
            tree.children.setdefault(route.parent_id, []).append(route)
        return tree

    @property
    def root(self) -> Route | None:
        roots = self.children.get(None, [])
        return roots[0] if roots else None

    def match(self, labels: dict) -> list[Route]:
        """The routes that take an alert with `labels` (empty without a root route)."""
        return self._match(self.root, labels, is_root=True) if self.root else []

    def _match(self, route: Route, labels: dict, is_root: bool = False) -> list[Route]:
        if not is_root and not matches(labels, route.matchers):
            return []
        found: list[Route] = []
        for child in self.children.get(route.pk, []):
            hit = self._match(child, labels)
            found += hit
            if hit and not child.continue_matching:
                break
        return found or [route]

    def group_by(self, route: Route) -> list[str]:
        """The route's group_by, or the nearest ancestor's when empty."""
        node: Route | None = route
        while node is not None:
            if node.group_by:
                return list(node.group_by)
            node = self.routes.get(node.parent_id)
        return []


def effective_channels(route: Route) -> list[Channel]:
    """Enabled channels of the route, or of the nearest ancestor that has any (Alertmanager's receiver)."""
    node: Route | None = route
    while node is not None:
        channels = list(node.channels.all())
        if channels:
            return [c for c in channels if c.enabled]
        node = node.parent
    return []


def group_labels(labels: dict, group_by: list[str]) -> dict:
    """The label values that name an alert's group; '...' groups by every label."""
    if "..." in group_by:
        return dict(sorted(labels.items()))
    return {name: labels[name] for name in sorted(group_by) if name in labels}


def group_key(labels: dict) -> str:
    """`{a="x",b="y"}` of the group labels (hashed when too long for the column)."""
    text = "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
    if len(text) > GROUP_KEY_MAX:
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    return text


def dedup_key(group: AlertGroup) -> str:
    """Stable per (route, group key): one provider incident per group, whatever the redeliveries."""
    return hashlib.sha256(f"{group.route_id}:{group.key}".encode()).hexdigest()


# --- Routing --------------------------------------------------------------------------------------------

def do_route_alerts(alert_ids: list[int], now: datetime | None = None) -> None:
    """Mute, group and schedule the given alerts (see the module docstring). Safe inside a caller's transaction."""
    now = now or timezone.now()
    with transaction.atomic():
        # One writer of alert state at a time (the lifecycle's lock; re-entrant when the lifecycle calls us).
        lock_lifecycle()
        alerts = list(Alert.objects.filter(pk__in=alert_ids).order_by("id"))
        if not alerts:
            return
        changed = _update_all_mutes(alerts, now)
        tree = RouteTree.load()
        due = [t for a in alerts + changed for t in _place(tree, a, now)]
        _schedule_flush(due, now)


def _update_all_mutes(alerts: list[Alert], now: datetime) -> list[Alert]:
    """Mutes of `alerts`, then of the alerts whose inhibition depends on them; returns the dependents changed."""
    silences = list(active_silences(now))
    rules = list(InhibitRule.objects.filter(enabled=True).order_by("id"))
    # Possible inhibition sources first, so a target in the same batch sees its source's new mute.
    for alert in sorted(alerts, key=lambda a: (not any(matches(a.labels, r.source_matchers) for r in rules), a.pk)):
        _update_mute(alert, silences, rules, now)
    own = {a.pk for a in alerts}
    dependents = set(Alert.objects.filter(inhibited_by__in=own, state__in=OPEN_STATES).values_list("id", flat=True))
    for alert in alerts:
        if alert.is_open and not alert.muted:
            dependents |= inhibition_targets(alert, rules)
    changed = []
    for alert in Alert.objects.filter(pk__in=dependents - own).order_by("id"):
        if _update_mute(alert, silences, rules, now):
            changed.append(alert)
    return changed


def _update_mute(alert: Alert, silences: list, rules: list, now: datetime) -> bool:
    """Recompute one open alert's mute; record the change. A resolved alert keeps the mute it resolved under."""
    if not alert.is_open:
        return False
    mute = compute_mute(alert, silences, rules)
    silence_id, source_id = mute.ids
    if (silence_id, source_id) == (alert.silenced_by_id, alert.inhibited_by_id):
        return False
    if silence_id and silence_id != alert.silenced_by_id:
        note = f"by silence {silence_id} ({mute.silence.kind}): {mute.silence.comment}"
        _event(alert, AlertEventKind.SILENCED, now, note)
    if source_id and source_id != alert.inhibited_by_id:
        _event(alert, AlertEventKind.INHIBITED, now, f"by alert {source_id} ({mute.source.name})")
    if not silence_id and not source_id:
        _event(alert, AlertEventKind.UNMUTED, now, "")
    Alert.objects.filter(pk=alert.pk).update(silenced_by_id=silence_id, inhibited_by_id=source_id)
    alert.silenced_by_id, alert.inhibited_by_id = silence_id, source_id
    return True


def _event(alert: Alert, kind: str, now: datetime, note: str) -> None:
    AlertEvent.objects.create(alert=alert, time=now, kind=kind, actor=ACTOR, note=note[:2000], value=alert.value)


def _place(tree: RouteTree, alert: Alert, now: datetime) -> list[datetime]:
    """Put the alert into the group of every route that takes it; returns when those groups are due."""
    due = []
    for route in tree.match(alert.labels):
        labels = group_labels(alert.labels, tree.group_by(route))
        when = _join_group(route, labels, alert, now)
        if when is not None:
            due.append(when)
    return due


def _join_group(route: Route, labels: dict, alert: Alert, now: datetime) -> datetime | None:
    """Add the alert to its group (locked, so a flush in progress finishes first) and set when it is due."""
    group, created = AlertGroup.objects.select_for_update().get_or_create(
        route=route, key=group_key(labels), defaults={"labels": labels, "created_at": now})
    member = not created and group.alerts.filter(pk=alert.pk).exists()
    if not member and not alert.is_open:
        return None  # resolved before it was ever grouped: nobody was told, nobody needs telling
    fresh = created or (not member and not group.alerts.exists())
    if not member:
        group.alerts.add(alert)
    if fresh:
        # A new incident in this group (Alertmanager makes a new aggregation group): wait, then tell everything.
        group.notified_state, group.escalated_at, group.last_notified_at = {}, None, None
    group.next_flush_at = _next_flush(group, route, fresh, now)
    group.save(update_fields=["next_flush_at", "notified_state", "escalated_at", "last_notified_at"])
    return group.next_flush_at


def _next_flush(group: AlertGroup, route: Route, fresh: bool, now: datetime) -> datetime:
    if fresh:
        return now + timedelta(seconds=route.group_wait_s)
    if group.last_notified_at is None:
        return group.next_flush_at or now  # still inside group_wait: keep its end
    due = max(group.last_notified_at + timedelta(seconds=route.group_interval_s), now)
    return min(due, group.next_flush_at) if group.next_flush_at else due


def _schedule_flush(due: list[datetime], now: datetime) -> None:
    """After commit, one flush task per distinct due second (group_wait 0 sends at once, not at the next beat)."""
    for countdown in sorted({max(0, math.ceil((t - now).total_seconds())) for t in due}):
        transaction.on_commit(lambda c=countdown: enqueue("alerts.tasks.flush_groups", countdown=c), robust=True)


# --- Flushing -------------------------------------------------------------------------------------------

def do_flush_due_groups(now: datetime | None = None) -> int:
    """Send what due groups have to say (see the module docstring); returns the number of notifications made.

    1. silences that started or ended by the clock are swept first (do_sweep_silences, below);
    2. due groups are claimed in batches, each batch in its own transaction, FOR UPDATE SKIP LOCKED;
    3. a group whose alerts another transaction is changing is left due: that change re-schedules it.
    """
    now = now or timezone.now()
    do_sweep_silences(now)
    sent, seen = 0, set()
    while True:
        with transaction.atomic():
            groups = _claim_due(now, seen)
            for group in groups:
                sent += _flush_group(group, now)
        if len(groups) < FLUSH_BATCH:
            return sent


def _claim_due(now: datetime, seen: set[int]) -> list[AlertGroup]:
    qs = (AlertGroup.objects.select_for_update(skip_locked=True, of=("self",)).select_related("route")
          .filter(next_flush_at__lte=now).exclude(pk__in=seen).order_by("next_flush_at", "id"))
    groups = list(qs[:FLUSH_BATCH])
    seen.update(g.pk for g in groups)
    return groups


def _lock_group_alerts(group: AlertGroup) -> list[Alert] | None:
    """The group's alerts, locked without waiting; None when one is locked by a transaction changing it.

    Never waiting is what keeps the flush out of deadlocks: the lifecycle locks alerts, then groups.
    """
    ids = list(group.alerts.values_list("id", flat=True))
    locked = list(Alert.objects.select_for_update(skip_locked=True, no_key=True).filter(pk__in=ids).order_by("id"))
    return locked if len(locked) == len(ids) else None


def _flush_group(group: AlertGroup, now: datetime) -> int:
    alerts = _lock_group_alerts(group)
    if alerts is None:
        return 0
    route = group.route
    visible = _visible(alerts, group.notified_state)
    event = _decide_event(group, route, visible, now)
    count = _send(group, route, visible, event, now) if event else 0
    escalate_at = _escalation_due_at(group, route, visible)
    if escalate_at is not None and escalate_at <= now:
        count += _escalate(group, route, visible, now)
        escalate_at = None
    _settle(group, route, alerts, visible, escalate_at, sent=event is not None, now=now)
    return count


def _visible(alerts: list[Alert], notified: dict) -> list[Alert]:
    """Unmuted alerts providers should hear about: the open ones, and resolved ones they were told were open.

    One alert per fingerprint: an open one hides a resolved predecessor (a flap inside one interval).
    """
    by_fp: dict[str, Alert] = {}
    for alert in sorted(alerts, key=lambda a: (a.is_open, a.pk)):
        if alert.muted:
            continue
        if alert.is_open or notified.get(alert.fingerprint) in OPEN_STATES:
            by_fp[alert.fingerprint] = alert
    return list(by_fp.values())


def _decide_event(group: AlertGroup, route: Route, visible: list[Alert], now: datetime) -> str | None:
    """trigger / acknowledge / resolve when something changed since the last notification (or a repeat is due)."""
    if not visible:
        return None
    notified = group.notified_state or {}
    firing = any(a.state == AlertState.FIRING for a in visible)
    if not notified and not firing:
        return None  # providers never heard of these alerts: nothing to acknowledge or resolve
    changed = any(notified.get(a.fingerprint) != a.state for a in visible)
    repeat_due = firing and group.last_notified_at is not None and (
        now >= group.last_notified_at + timedelta(seconds=route.repeat_interval_s))
    if not (changed or repeat_due):
        return None
    if firing:
        return NotificationEvent.TRIGGER
    if any(a.state == AlertState.ACKNOWLEDGED for a in visible):
        return NotificationEvent.ACKNOWLEDGE
    return NotificationEvent.RESOLVE


def _send(group: AlertGroup, route: Route, visible: list[Alert], event: str, now: datetime) -> int:
    channels = effective_channels(route)
    made = _notify(group, route, channels, visible, event, now)
    if made:
        names = ", ".join(c.name for c in channels)
        for alert in visible:
            _event(alert, AlertEventKind.NOTIFIED, now, f"{event} to {names} (route {route.name})")
    return made


def _notify(group: AlertGroup, route: Route, channels: list[Channel], alerts: list[Alert], event: str,
            now: datetime) -> int:
    """One pending outbox row per channel, its delivery queued after commit."""
    if not channels:
        return 0
    payload = build_payload(group, route, alerts, event)
    key = dedup_key(group)

    for channel in channels:
        note = Notification.objects.create(channel=channel, group=group, event=event, dedup_key=key,
                                           payload=payload, status=NotificationStatus.PENDING, created_at=now,
                                           next_attempt_at=now)
        note.alerts.set(alerts)
        transaction.on_commit(lambda nid=note.pk: enqueue("alerts.tasks.deliver", nid), robust=True)
    return len(channels)


def _escalation_due_at(group: AlertGroup, route: Route, visible: list[Alert]) -> datetime | None:
    """When the group escalates: escalate_after_s after the earliest first notification of an alert still
    firing unacknowledged (its start, where its route has no channels); None when it need not or already did."""
    if group.escalated_at is not None or route.escalate_after_s is None:
        return None
    unacked = [a for a in visible if a.state == AlertState.FIRING]
    if not unacked or not route.escalation_channels.filter(enabled=True).exists():
        return None
    first = dict(AlertEvent.objects.filter(alert__in=unacked, kind=AlertEventKind.NOTIFIED)
                 .values("alert_id").annotate(t=Min("time")).values_list("alert_id", "t"))
    start = min(first.get(a.pk, a.starts_at) for a in unacked)
    return start + timedelta(seconds=route.escalate_after_s)


def _escalate(group: AlertGroup, route: Route, visible: list[Alert], now: datetime) -> int:
    """Nobody acknowledged in time: tell the escalation channels, once per incident of the group."""
    unacked = [a for a in visible if a.state == AlertState.FIRING]
    channels = list(route.escalation_channels.filter(enabled=True))
    made = _notify(group, route, channels, unacked, NotificationEvent.ESCALATE, now)
    names = ", ".join(c.name for c in channels)
    for alert in unacked:
        _event(alert, AlertEventKind.ESCALATED, now,
               f"unacknowledged {route.escalate_after_s} s after notification; escalated to {names}")
    group.escalated_at = now
    return made


def _settle(group: AlertGroup, route: Route, alerts: list[Alert], visible: list[Alert],
            escalate_at: datetime | None, *, sent: bool, now: datetime) -> None:
    """Record what providers now know, drop resolved alerts, and set when the group is next due."""
    resolved = [a for a in alerts if not a.is_open]
    if resolved:
        group.alerts.remove(*resolved)
    if sent:
        group.last_notified_at = now
    group.notified_state = {a.fingerprint: a.state for a in visible if a.is_open}
    if len(resolved) == len(alerts):
        group.notified_state, group.escalated_at, group.next_flush_at = {}, None, None
    else:
        group.next_flush_at = _next_due(group, route, visible, escalate_at)
    group.save(update_fields=["last_notified_at", "notified_state", "escalated_at", "next_flush_at"])


def _next_due(group: AlertGroup, route: Route, visible: list[Alert], escalate_at: datetime | None):
    """The repeat of a still-firing group, or its escalation, whichever is first; None when neither is pending."""
    due = []
    if group.last_notified_at and any(a.state == AlertState.FIRING for a in visible):
        due.append(group.last_notified_at + timedelta(seconds=route.repeat_interval_s))
    if escalate_at is not None and group.escalated_at is None:
        due.append(escalate_at)
    return min(due, default=None)


# --- Payload --------------------------------------------------------------------------------------------

def build_payload(group: AlertGroup, route: Route, alerts: list[Alert], event: str) -> dict:
    """What transports render (the contract's schema): the group, its common labels and each alert."""
    alerts = sorted(alerts, key=lambda a: (not a.is_open, SEVERITY_ORDER.get(a.severity, 9), a.starts_at, a.pk))
    status = "firing" if any(a.is_open for a in alerts) else "resolved"
    return {
        "status": status, "event": event, "route": route.name, "group_key": group.key,
        "group_labels": dict(group.labels), "common_labels": common_labels(alerts),
        "title": _title(group, alerts, event), "summary": _summary(alerts),
        "url": alert_url(alerts[0].pk), "alerts": [_alert_payload(a) for a in alerts],
    }


def common_labels(alerts: list[Alert]) -> dict:
    """Labels with the same value on every alert."""
    if not alerts:
        return {}
    common = dict(alerts[0].labels)
    for alert in alerts[1:]:
        common = {k: v for k, v in common.items() if alert.labels.get(k) == v}
    return dict(sorted(common.items()))


def _title(group: AlertGroup, alerts: list[Alert], event: str) -> str:
    """Alertmanager's: `[FIRING:2] GpuOverheating node=gpu-01`."""
    open_count = sum(a.is_open for a in alerts)
    word = {"trigger": "FIRING", "acknowledge": "ACKNOWLEDGED", "escalate": "ESCALATED"}.get(str(event))
    tag = f"{word}:{open_count}" if word else "RESOLVED"
    names = sorted({a.name for a in alerts})
    name = names[0] if len(names) == 1 else f"{len(names)} alert names"
    rest = " ".join(f"{k}={v}" for k, v in group.labels.items() if k != "alertname")
    return f"[{tag}] {name} {rest}".strip()


def _summary(alerts: list[Alert]) -> str:
    first = alerts[0]
    text = first.annotations.get("summary") or first.annotations.get("description") or str(first)
    return text if len(alerts) == 1 else f"{text} (and {len(alerts) - 1} more)"


def alert_url(alert_id: int) -> str:
    """Absolute link to the alert's page in this console."""
    try:
        path = reverse("alert", args=[alert_id])
    except NoReverseMatch:
        path = f"/alerts/{alert_id}/"
    return f"{settings.BREAKWATER_BASE_URL}{path}"


def _alert_payload(alert: Alert) -> dict:
    return {
        "id": alert.pk, "fingerprint": alert.fingerprint, "name": alert.name, "state": alert.state,
        "severity": alert.severity, "labels": alert.labels, "annotations": alert.annotations, "value": alert.value,
        "starts_at": alert.starts_at.isoformat(), "ends_at": alert.ends_at.isoformat() if alert.ends_at else None,
        "url": alert_url(alert.pk),
    }


def do_sweep_silences(now: datetime) -> int:
    """Re-route open alerts whose silence ended on its own or that a silence which has just started covers.

    Silences start and end by the clock, with no event to hook; the flush task runs this every few seconds.
    It takes the lifecycle's lock without waiting: while an evaluation (or another sweep) holds it, the flush
    goes on and the next one sweeps. Returns the number of alerts re-routed.
    """
    with transaction.atomic():
        if not lock_lifecycle(wait=False):
            return 0
        active = list(active_silences(now))
        open_alerts = Alert.objects.filter(state__in=OPEN_STATES)
        ended = open_alerts.filter(silenced_by__isnull=False).exclude(silenced_by__in=active)
        ids = set(ended.values_list("id", flat=True))
        if active:
            ids.update(a.pk for a in open_alerts.filter(silenced_by__isnull=True).only("id", "labels")
                       if any(matches(a.labels, s.matchers) for s in active))
        if ids:
            do_route_alerts(sorted(ids), now)
    return len(ids)
