"""Writes of alert rules from the operator pages and the API: create, update, enable/disable, delete.

Each runs in one transaction with its audit entry. Input is a dict of rule fields (the form's cleaned data
or the API's JSON); every problem is a ValidationError keyed by the field at fault, so both the form and
the API can name it.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import CharField

from alerts.lifecycle import do_resolve_alert
from alerts.models import AlertState, Rule
from alerts.selectors import RULE_FIELDS
from core.audit import actor_name, do_audit


def rule_defaults() -> dict:
    """Every editable field at its model default (what a PUT leaves out)."""
    return {f: Rule._meta.get_field(f).get_default() for f in RULE_FIELDS}


def _snapshot(rule: Rule) -> dict:
    return {f: getattr(rule, f) for f in RULE_FIELDS}


def _apply(rule: Rule, data: dict) -> None:
    """Set the given fields on `rule`; unknown names are an error, null text is the empty string."""
    unknown = sorted(set(data) - set(RULE_FIELDS))
    if unknown:
        raise ValidationError({name: f"unknown field; a rule has {', '.join(RULE_FIELDS)}" for name in unknown})
    for name, value in data.items():
        field = Rule._meta.get_field(name)
        if value is None and isinstance(field, CharField) and field.blank:
            value = ""
        setattr(rule, name, value)


def _check_lists(rule: Rule) -> None:
    # The model stores these as JSON; full_clean does not look inside them.
    codes = rule.xid_codes
    if not isinstance(codes, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in codes):
        raise ValidationError({"xid_codes": "must be a list of XID numbers, e.g. [48, 79]"})
    classes = rule.xid_actions
    if not isinstance(classes, list) or not all(isinstance(c, str) and c for c in classes):
        raise ValidationError({"xid_actions": "must be a list of catalogue action classes, e.g. ['drain_node']"})


def validate_rule(rule: Rule) -> None:
    """Field types, choices, uniqueness, the per-kind rules of Rule.clean() and the list fields."""
    rule.full_clean()
    _check_lists(rule)


def check_rule_fields(data: dict, rule_id: int | None = None, *, skip: tuple[str, ...] = ()) -> None:
    """Validate `data` as a rule (the one with `rule_id` when editing) without saving; fields in `skip` are
    left out. A form calls it to show the model's errors beside its own in one go."""
    rule = Rule.objects.filter(pk=rule_id).first() if rule_id else None
    rule = rule or Rule()
    _apply(rule, {k: v for k, v in data.items() if k not in skip})
    rule.full_clean(exclude=list(skip))
    _check_lists(rule)


def _save(rule: Rule) -> None:
    try:
        with transaction.atomic():  # a savepoint: a lost race on the name must not poison the outer transaction
            rule.save()
    except IntegrityError as exc:  # another rule took the name between the check and the insert
        raise ValidationError({"name": "a rule with this name already exists"}) from exc


def do_create_rule(data: dict, user) -> Rule:
    """Create a rule from `data` (field -> value) on behalf of `user`; ValidationError names the bad field."""
    rule = Rule(created_by=user if getattr(user, "is_authenticated", False) else None)
    _apply(rule, data)
    validate_rule(rule)
    with transaction.atomic():
        _save(rule)
        do_audit(actor_name(user), "rule.create", "rule", rule.pk, detail={"rule": _snapshot(rule)})
    return rule


def do_update_rule(rule_id: int, data: dict, user) -> Rule:
    """Change the given fields of a rule (Rule.DoesNotExist if there is none); audit records old and new."""
    with transaction.atomic():
        rule = Rule.objects.select_for_update().get(pk=rule_id)
        before = _snapshot(rule)
        _apply(rule, data)
        validate_rule(rule)
        _save(rule)
        after = _snapshot(rule)
        changes = {f: [before[f], after[f]] for f in RULE_FIELDS if before[f] != after[f]}
        do_audit(actor_name(user), "rule.update", "rule", rule.pk, detail={"changes": changes})
        if before["enabled"] and not rule.enabled:
            _resolve_open_alerts(rule, user, "rule disabled")
    return rule


def do_set_rule_enabled(rule_id: int, enabled: bool, user) -> Rule:
    """Switch a rule on or off; switching it off resolves its open alerts (nothing evaluates them any more)."""
    with transaction.atomic():
        rule = Rule.objects.select_for_update().get(pk=rule_id)
        changed = rule.enabled != enabled
        rule.enabled = enabled
        rule.save(update_fields=["enabled", "updated_at"])
        do_audit(actor_name(user), "rule.enable" if enabled else "rule.disable", "rule", rule.pk,
                 outcome="changed" if changed else "unchanged")
        if changed and not enabled:
            _resolve_open_alerts(rule, user, "rule disabled")
    return rule


def do_delete_rule(rule_id: int, user) -> None:
    """Delete a rule; its open alerts are resolved first and its alert history stays (rule set to null)."""
    with transaction.atomic():
        rule = Rule.objects.select_for_update().get(pk=rule_id)
        _resolve_open_alerts(rule, user, "rule deleted")
        do_audit(actor_name(user), "rule.delete", "rule", rule.pk, detail={"rule": _snapshot(rule)})
        rule.delete()


def _resolve_open_alerts(rule: Rule, user, note: str) -> None:
    # The evaluator only looks at enabled rules: without this, a disabled rule's alerts would fire for ever.
    for alert_id in rule.alerts.exclude(state=AlertState.RESOLVED).values_list("pk", flat=True):
        do_resolve_alert(alert_id, actor_name(user), note)
