"""What mutes an alert: silences, maintenance windows and inhibition rules (Alertmanager's semantics).

- An alert is *silenced* by an active silence (starts_at <= now < ends_at, not expired by hand) whose matchers
  all match its labels; a maintenance window is a silence that also blocks remediation on its targets.
- An alert is *inhibited* by an open (firing or acknowledged), itself unmuted alert that matches an enabled
  inhibit rule's source matchers while the alert matches its target matchers and both carry the same values of
  the rule's `equal` labels. An alert never inhibits itself, and (Alertmanager's two-sided rule) an alert that
  matches both sides is not inhibited by another that also matches both, so the pair cannot mute each other.

Muted alerts stay in their groups but are never sent (alerts.routing). Muting is recomputed by
alerts.routing.do_route_alerts; the actions that change silences and rules are in alerts.silences.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q, QuerySet

from alerts.matching import matches
from alerts.models import Alert, AlertState, InhibitRule, Silence

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
