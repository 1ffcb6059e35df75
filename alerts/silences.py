"""What mutes an alert: silences, maintenance windows and inhibition rules (Alertmanager's semantics).

- An alert is *silenced* by an active silence (starts_at <= now < ends_at, not expired by hand) whose matchers
  all match its labels; a maintenance window is a silence that also blocks remediation on its targets.
- An alert is *inhibited* by an open (firing or acknowledged), itself unmuted alert that matches an enabled
  inhibit rule's source matchers while the alert matches its target matchers and both carry the same values of
  the rule's `equal` labels. An alert never inhibits itself, and (Alertmanager's two-sided rule) an alert that
  matches both sides is not inhibited by another that also matches both, so the pair cannot mute each other.

Muted alerts stay in their groups but are never sent (alerts.routing). Muting is recomputed by
alerts.routing.do_route_alerts; the actions here change silences and rules, then re-route what they touch.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from alerts.lifecycle import LIFECYCLE_LOCK
from alerts.matching import check_regexes, matches
from alerts.models import Alert, AlertState, InhibitRule, Silence, SilenceKind, validate_matchers
from core.audit import actor_name, do_audit

OPEN_STATES = (AlertState.FIRING, AlertState.ACKNOWLEDGED)


# --- Reads ---------------------------------------------------------------------------------------------

def active_silences(now: datetime) -> QuerySet[Silence]:
    """Silences in force at `now`, oldest first (the first match is the one an alert records)."""
    return (Silence.objects.filter(starts_at__lte=now, ends_at__gt=now)
            .filter(Q(expired_at__isnull=True) | Q(expired_at__gt=now)).order_by("starts_at", "id"))


@dataclass(frozen=True)
class Mute:
    """Why an alert is muted now: the silence and the inhibiting alert (either may be None)."""

    silence: Silence | None
    source: Alert | None

    @property
    def ids(self) -> tuple[int | None, int | None]:
        return (self.silence.pk if self.silence else None, self.source.pk if self.source else None)


def compute_mute(alert: Alert, silences: list[Silence], rules: list[InhibitRule]) -> Mute:
    """The silence and the inhibiting source that mute `alert` now, given the active silences and enabled rules."""
    silence = next((s for s in silences if matches(alert.labels, s.matchers)), None)
    return Mute(silence, inhibiting_source(alert, rules))


def inhibiting_source(alert: Alert, rules: list[InhibitRule]) -> Alert | None:
    """The first open, unmuted alert that inhibits `alert` under one of `rules`, or None."""
    for rule in rules:
        if not matches(alert.labels, rule.target_matchers):
            continue
        two_sided = matches(alert.labels, rule.source_matchers)
        for cand in _source_candidates(alert, rule):
            if not matches(cand.labels, rule.source_matchers) or not _equal(cand.labels, alert.labels, rule.equal):
                continue
            if two_sided and matches(cand.labels, rule.target_matchers):
                continue
            return cand
    return None


def _source_candidates(alert: Alert, rule: InhibitRule) -> QuerySet[Alert]:
    """Open unmuted alerts other than `alert`, narrowed in SQL by the rule's equality matchers and equal labels."""
    must = {m["name"]: m["value"] for m in rule.source_matchers if m.get("op", "=") == "=" and m["value"]}
    must.update({name: alert.labels[name] for name in rule.equal if alert.labels.get(name)})
    qs = Alert.objects.filter(state__in=OPEN_STATES, silenced_by__isnull=True, inhibited_by__isnull=True)
    if must:
        qs = qs.filter(labels__contains=must)
    return qs.exclude(pk=alert.pk).order_by("id")


def _equal(a: dict, b: dict, names: list[str]) -> bool:
    # A label missing on both sides counts as equal (both are the empty string), as in Alertmanager.
    return all(str(a.get(n, "")) == str(b.get(n, "")) for n in names)


def inhibition_targets(source: Alert, rules: list[InhibitRule]) -> set[int]:
    """Open alerts that `source` could inhibit now (it matches a rule's source side), by id."""
    found: set[int] = set()
    for rule in rules:
        if not matches(source.labels, rule.source_matchers):
            continue
        must = {n: source.labels[n] for n in rule.equal if source.labels.get(n)}
        qs = Alert.objects.filter(state__in=OPEN_STATES).exclude(pk=source.pk)
        if must:
            qs = qs.filter(labels__contains=must)
        found.update(a.pk for a in qs.only("id", "labels")
                     if matches(a.labels, rule.target_matchers) and _equal(a.labels, source.labels, rule.equal))
    return found


def open_alerts_matching(matchers: list[dict]) -> list[int]:
    """Ids of open alerts whose labels match all `matchers` (equality matchers narrow the scan in SQL)."""
    must = {m["name"]: m["value"] for m in matchers if m.get("op", "=") == "=" and m["value"]}
    qs = Alert.objects.filter(state__in=OPEN_STATES)
    if must:
        qs = qs.filter(labels__contains=must)
    return [a.pk for a in qs.only("id", "labels").order_by("id") if matches(a.labels, matchers)]


# --- Silences ------------------------------------------------------------------------------------------

def _normalized(matchers: object, field: str = "matchers") -> list[dict]:
    """Matchers validated (shape, operator, regex) and with an explicit op each."""
    validate_matchers(matchers, field)
    error = check_regexes(matchers)
    if error:
        raise ValidationError({field: error})
    return [{"name": m["name"], "op": m.get("op", "="), "value": m["value"]} for m in matchers]


def _validate_silence(matchers: list[dict], starts_at: datetime, ends_at: datetime, author: str, comment: str,
                      kind: str, now: datetime) -> None:
    if not matchers:
        raise ValidationError({"matchers": "a silence needs at least one matcher (it would mute everything)"})
    # Alertmanager's rule: matchers that all match the empty string would mute every alert.
    if all(matches({}, [m]) for m in matchers):
        raise ValidationError({"matchers": "at least one matcher must not match an empty label"})
    if ends_at <= starts_at:
        raise ValidationError({"ends_at": "must be after starts_at"})
    if ends_at <= now:
        raise ValidationError({"ends_at": "is in the past"})
    if kind not in SilenceKind.values:
        raise ValidationError({"kind": f"must be one of {', '.join(SilenceKind.values)}"})
    if not author.strip():
        raise ValidationError({"author": "a silence needs an author"})
    if not comment.strip():
        raise ValidationError({"comment": "say why the alerts are silenced"})


def do_create_silence(matchers: list[dict], starts_at: datetime, ends_at: datetime, comment: str = "", user=None, *,
                      author: str = "", kind: str = SilenceKind.SILENCE, now: datetime | None = None) -> Silence:
    """Create a silence (or maintenance window), audit it, and mute the open alerts it matches now.

    `author` defaults to the user's name. A start in the past begins now (Alertmanager's rule); a silence that
    starts later mutes when it starts (the flush sweep, alerts.routing, picks it up).
    """
    now = now or timezone.now()
    matchers = _normalized(matchers)
    author = author or (actor_name(user) if user else "")
    _validate_silence(matchers, starts_at, ends_at, author, comment or "", kind, now)
    starts_at = max(starts_at, now)
    with transaction.atomic():
        silence = Silence.objects.create(kind=kind, matchers=matchers, starts_at=starts_at, ends_at=ends_at,
                                         author=author[:150], comment=comment,
                                         created_by=user if getattr(user, "pk", None) else None)
        do_audit(actor_name(user) if user else author, "silence.create", "silence", silence.pk, reason=comment,
                 at=now, detail={"kind": kind, "matchers": matchers, "starts_at": starts_at.isoformat(),
                                 "ends_at": ends_at.isoformat()})
        if starts_at <= now:
            _reroute(open_alerts_matching(matchers), now)
    return silence


def do_expire_silence(silence_id: int, user=None, now: datetime | None = None) -> Silence:
    """End a silence now; the alerts it muted are re-routed (and notify again if they still fire).

    Expiring a silence that already ended changes nothing.
    """
    now = now or timezone.now()
    with transaction.atomic():
        silence = Silence.objects.select_for_update().get(pk=silence_id)
        if silence.ends_at <= now or (silence.expired_at and silence.expired_at <= now):
            return silence
        silence.expired_at = now
        silence.save(update_fields=["expired_at"])
        do_audit(actor_name(user), "silence.expire", "silence", silence.pk, at=now,
                 detail={"kind": silence.kind, "matchers": silence.matchers})
        muted = Alert.objects.filter(silenced_by=silence, state__in=OPEN_STATES).order_by("id")
        _reroute(list(muted.values_list("id", flat=True)), now)
    return silence


def do_sweep_silences(now: datetime) -> int:
    """Re-route open alerts whose silence ended on its own or that a silence which has just started covers.

    Silences start and end by the clock, with no event to hook; the flush task runs this every few seconds.
    It takes the lifecycle's lock without waiting: while an evaluation (or another sweep) holds it, the flush
    goes on and the next one sweeps. Returns the number of alerts re-routed.
    """
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", list(LIFECYCLE_LOCK))
            if not cur.fetchone()[0]:
                return 0
        active = list(active_silences(now))
        open_alerts = Alert.objects.filter(state__in=OPEN_STATES)
        ended = open_alerts.filter(silenced_by__isnull=False).exclude(silenced_by__in=active)
        ids = set(ended.values_list("id", flat=True))
        if active:
            ids.update(a.pk for a in open_alerts.filter(silenced_by__isnull=True).only("id", "labels")
                       if any(matches(a.labels, s.matchers) for s in active))
        _reroute(sorted(ids), now)
    return len(ids)


# --- Inhibition rules ----------------------------------------------------------------------------------

def do_upsert_inhibit_rule(name: str, *, source_matchers: list[dict], target_matchers: list[dict],
                           equal: list[str], enabled: bool = True, user=None,
                           now: datetime | None = None) -> InhibitRule:
    """Create or update the inhibit rule `name`, audit it, and re-route the alerts it may mute or release."""
    now = now or timezone.now()
    rule = InhibitRule(name=name, source_matchers=_normalized(source_matchers, "source_matchers"),
                       target_matchers=_normalized(target_matchers, "target_matchers"), equal=equal,
                       enabled=enabled)
    rule.clean()
    if not rule.source_matchers:
        raise ValidationError({"source_matchers": "an inhibit rule needs at least one source matcher"})
    fields = {f: getattr(rule, f) for f in ("source_matchers", "target_matchers", "equal", "enabled")}
    with transaction.atomic():
        rule, created = InhibitRule.objects.update_or_create(name=name, defaults=fields)
        do_audit(actor_name(user), "inhibit_rule.create" if created else "inhibit_rule.update", "inhibit_rule",
                 rule.pk, at=now, detail={"name": name, **fields})
        inhibited = Alert.objects.filter(state__in=OPEN_STATES, inhibited_by__isnull=False)
        ids = set(open_alerts_matching(rule.target_matchers)) | set(inhibited.values_list("id", flat=True))
        _reroute(sorted(ids), now)
    return rule


def _reroute(alert_ids: list[int], now: datetime) -> None:
    if not alert_ids:
        return
    from alerts.routing import do_route_alerts  # late: routing imports this module

    do_route_alerts(alert_ids, now)
