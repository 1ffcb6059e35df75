"""Changing what mutes alerts: silences, maintenance windows and inhibition rules. Each action changes them, then
re-routes the alerts it touches (alerts.routing.do_route_alerts). What muting means, and its reads, are in
alerts.muting.
"""

from __future__ import annotations

from datetime import datetime

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from alerts.matching import check_regexes, matches
from alerts.models import Alert, InhibitRule, Silence, SilenceKind, validate_matchers
from alerts.muting import OPEN_STATES, open_alerts_matching
from alerts.routing import do_route_alerts
from core.audit import actor_name, do_audit

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
    do_route_alerts(alert_ids, now)
