"""Operator API for alerts, rules, silences, channels, remediation and audit (JSON, under /api/v1/).

Authentication (tenancy.auth): a session, or `Authorization: Bearer bwt_…` (an API token). Every endpoint is
operators' (and operator tokens'), except the alert list: a tenant's users and tokens read their own alerts
there (`Alert.objects.visible_to`). A session write also needs a CSRF token (header X-CSRFToken); a token
write a token that is not read-only. Errors are {"error": {"code", "message"}} with the HTTP status: 400 names
the field at fault ("field", and "fields" for all of them), 401 unauthenticated, 403 not allowed (collector
tokens: `collector_token`), 404, 405 (with Allow), 409 when the object's state refuses the change
(acknowledging a resolved alert, approving a decided action).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from alerts import delivery, lifecycle, rule_actions, selectors, silences
from alerts.forms import parse_duration, parse_matchers
from alerts.models import ActionState, AlertState, RemediationAction, Severity
from alerts.remediation import actions as remediation_actions
from alerts.remediation import impact
from alerts.remediation.actions import ActionError
from core.api import ApiError, ErrorCode, api_view, read_json
from tenancy.auth import acting_user

MAX_LIMIT = 1000
SILENCE_STATES = ("current", "active", "pending", "expired", "all")


def endpoint(*, tenant_reads: bool = False, **handlers: Callable) -> Callable:
    """A JSON view dispatching on the method (GET=..., POST=...), behind the API's one edge (core.api.api_view).

    Operators only, unless `tenant_reads`: then tenants' users and tokens may read (the handler scopes
    its rows with visible_to(request.who)).
    """

    def view(request: HttpRequest, **kwargs) -> JsonResponse:
        handler = handlers["GET" if request.method == "HEAD" else request.method]
        try:
            return handler(request, **kwargs)
        except (ValueError, ActionError) as exc:  # the actions' refusal: bad input, or a state that refuses it
            raise _refusal(exc) from exc

    return api_view(operator=not tenant_reads, tenant_reads=tenant_reads, methods=tuple(sorted(handlers)))(view)


def _refusal(exc: Exception) -> ApiError:
    # ActionError carries "invalid" (400) or "conflict" (409); a ValueError is the lifecycle's wrong state.
    if getattr(exc, "code", "conflict") == "invalid":
        return ApiError(400, ErrorCode.INVALID, str(exc))
    return ApiError(409, ErrorCode.CONFLICT, str(exc))


# --- Input -------------------------------------------------------------------------------------------

def _body(request: HttpRequest) -> dict:
    return read_json(request.body) if request.body.strip() else {}


def _time(value, name: str) -> datetime | None:
    """An ISO 8601 time (a time without a zone is UTC); ApiError naming the parameter if it is not one."""
    if value in (None, ""):
        return None
    try:
        moment = parse_datetime(value) if isinstance(value, str) else None
        # In UTC: PostgreSQL refuses offsets past ±15:59, which ISO 8601 (and Python) allow up to ±23:59.
        moment = moment and (moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC))
    except (ValueError, OverflowError):  # well-formed but no such time ("2026-02-30"), or past year 9999 in UTC
        moment = None
    if moment is None:
        raise ApiError(400, ErrorCode.INVALID, f"{name}: {value!r} is not an ISO 8601 time", field=name)
    return moment


def _choice(params, name: str, allowed, default: str = "") -> str:
    value = params.get(name, default) or default
    if value and value not in allowed:
        raise ApiError(400, ErrorCode.INVALID, f"{name}: {value!r} is not one of {', '.join(allowed)}", field=name)
    return value


def _limit(params) -> int:
    raw = params.get("limit", str(selectors.LIST_LIMIT))
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise ApiError(400, ErrorCode.INVALID, f"limit: must be a whole number from 1 to {MAX_LIMIT}", field="limit")
    return int(raw)


def _text(data: dict, name: str, *, required: bool = False) -> str:
    value = data.get(name, "")
    if not isinstance(value, str):
        raise ApiError(400, ErrorCode.INVALID, f"{name}: must be a string", field=name)
    if required and not value.strip():
        raise ApiError(400, ErrorCode.INVALID, f"{name}: is required", field=name)
    return value.strip()


def _found(row: dict | None, what: str) -> dict:
    if row is None:
        raise ApiError(404, ErrorCode.NOT_FOUND, f"no such {what}")
    return row


# --- Alerts ------------------------------------------------------------------------------------------

def _get_alerts(request):
    """?state= open (default) | firing | acknowledged | resolved | all, ?severity=, ?q=, ?since=, ?until=, ?limit=."""
    p = request.GET
    state = _choice(p, "state", ("open", "all", *AlertState.values), "open")
    f = selectors.HistoryFilters(q=p.get("q", "").strip(), state="" if state == "all" else state,
                                 severity=_choice(p, "severity", Severity.values),
                                 since=_time(p.get("since"), "since"), until=_time(p.get("until"), "until"))
    limit = _limit(p)
    rows = selectors.find_alerts(f, limit, who=request.who)
    return JsonResponse({"alerts": rows, "count": len(rows), "limited": len(rows) >= limit})


def _get_alert(request, alert_id: int):
    return JsonResponse(_found(selectors.alert_detail(alert_id), "alert"))


def _ack(request, alert_id: int):
    """POST acknowledges, DELETE withdraws the acknowledgement; {"note": "..."} optional either way."""
    note = _text(_body(request), "note")
    act = lifecycle.do_ack_alert if request.method == "POST" else lifecycle.do_unack_alert
    act(alert_id, acting_user(request), note)
    return JsonResponse(_found(selectors.alert_detail(alert_id), "alert"))


alert_list = endpoint(GET=_get_alerts, tenant_reads=True)
alert_detail = endpoint(GET=_get_alert)
alert_ack = endpoint(POST=_ack, DELETE=_ack)


# --- Rules -------------------------------------------------------------------------------------------

def _get_rules(request):
    return JsonResponse({"rules": selectors.rule_list()})


def _create_rule(request):
    rule = rule_actions.do_create_rule(_body(request), acting_user(request))
    resp = JsonResponse(selectors.rule_detail(rule.pk), status=201)
    resp["Location"] = f"/api/v1/rules/{rule.pk}"
    return resp


def _get_rule(request, rule_id: int):
    return JsonResponse(_found(selectors.rule_detail(rule_id), "rule"))


def _update_rule(request, rule_id: int):
    """PATCH changes the given fields; PUT replaces the rule (fields left out go back to their defaults)."""
    data = _body(request)
    if request.method == "PUT":
        missing = [f for f in ("name", "kind") if f not in data]
        if missing:
            raise ApiError(400, ErrorCode.INVALID, f"{missing[0]}: is required (PUT replaces the whole rule; "
                                                   "PATCH changes some fields)", field=missing[0])
        data = {**rule_actions.rule_defaults(), **data}
    rule_actions.do_update_rule(rule_id, data, acting_user(request))
    return JsonResponse(selectors.rule_detail(rule_id))


def _delete_rule(request, rule_id: int):
    rule_actions.do_delete_rule(rule_id, acting_user(request))
    return HttpResponse(status=204)


rule_list = endpoint(GET=_get_rules, POST=_create_rule)
rule_detail = endpoint(GET=_get_rule, PUT=_update_rule, PATCH=_update_rule, DELETE=_delete_rule)


# --- Silences ----------------------------------------------------------------------------------------

def _get_silences(request):
    """?state= current (active and pending; default) | active | pending | expired | all."""
    state = _choice(request.GET, "state", SILENCE_STATES, "current")
    return JsonResponse({"silences": selectors.silences(timezone.now(), state, _limit(request.GET))})


def _silence_matchers(value) -> list[dict]:
    # A list of {name, op, value}, or the text form "alertname=GpuHot, node=~gpu-0.*".
    if isinstance(value, str):
        try:
            return parse_matchers(value)
        except ValidationError as exc:
            raise ValidationError({"matchers": exc.messages}) from exc
    return value


def _create_silence(request):
    """{"matchers", "comment", "starts_at"?, "ends_at" or "duration" ("2h"), "kind"?: silence | maintenance}."""
    data, now = _body(request), timezone.now()
    starts = _time(data.get("starts_at"), "starts_at") or now
    ends = _time(data.get("ends_at"), "ends_at")
    if ends is None:
        duration = _text(data, "duration")
        if not duration:
            raise ApiError(400, ErrorCode.INVALID, "ends_at: give ends_at or a duration such as \"2h\"",
                           field="ends_at")
        try:
            ends = starts + parse_duration(duration)
        except ValidationError as exc:
            raise ValidationError({"duration": exc.messages}) from exc
    create = silences.do_create_silence
    silence = create(_silence_matchers(data.get("matchers")), starts, ends, _text(data, "comment"),
                     acting_user(request), kind=_text(data, "kind") or "silence", now=now)
    return JsonResponse(selectors.silence_detail(silence.pk, timezone.now()), status=201)


def _get_silence(request, silence_id: int):
    return JsonResponse(_found(selectors.silence_detail(silence_id, timezone.now()), "silence"))


def _expire_silence(request, silence_id: int):
    silences.do_expire_silence(silence_id, acting_user(request))
    return JsonResponse(selectors.silence_detail(silence_id, timezone.now()))


silence_list = endpoint(GET=_get_silences, POST=_create_silence)
silence_detail = endpoint(GET=_get_silence, DELETE=_expire_silence)


# --- Channels ----------------------------------------------------------------------------------------

def _get_channels(request):
    return JsonResponse({"channels": selectors.channel_list()})


def _test_channel(request, channel_id: int):
    """Queue a test notification; 202 with the notification to poll for its delivery."""
    n = delivery.do_send_test(channel_id, acting_user(request))
    return JsonResponse({"notification": selectors.notification_detail(n.pk),
                         "url": f"/alerts/notifications/{n.pk}/"}, status=202)


channel_list = endpoint(GET=_get_channels)
channel_test = endpoint(POST=_test_channel)


# --- Remediation -------------------------------------------------------------------------------------

def _get_actions(request):
    """?state= one of the action states; all when absent."""
    state = _choice(request.GET, "state", ActionState.values)
    return JsonResponse({"actions": selectors.actions((state,) if state else None, _limit(request.GET))})


def _action_row(action_id: int) -> dict:
    return selectors.action_row(RemediationAction.objects.select_related("decided_by").get(pk=action_id))


def _impact(request, action_id: int):
    """The confirmation's impact preview (jobs, tenants, GPUs, blast-radius budgets) and its confirm token."""

    return JsonResponse(impact.action_impact(RemediationAction.objects.get(pk=action_id)).as_dict())


def _approve(request, action_id: int):
    """Approve; with {"confirm": token} from the impact preview, only while that preview still holds (409)."""

    token = _body(request).get("confirm")
    current = impact.action_impact(RemediationAction.objects.get(pk=action_id)) if token is not None else None
    if token is not None and not impact.confirmed(current, str(token)):
        raise ApiError(409, ErrorCode.CONFLICT, "the impact changed since this confirm token was issued; read it again",
                       field="confirm")
    remediation_actions.do_approve_action(action_id, acting_user(request))
    return JsonResponse(_action_row(action_id))


def _reject(request, action_id: int):
    """{"reason": "..."} is required: it goes to the audit log."""
    reason = _text(_body(request), "reason", required=True)
    remediation_actions.do_reject_action(action_id, acting_user(request), reason)
    return JsonResponse(_action_row(action_id))


action_list = endpoint(GET=_get_actions)
action_approve = endpoint(POST=_approve)
action_impact = endpoint(GET=_impact)
action_reject = endpoint(POST=_reject)


# --- Audit -------------------------------------------------------------------------------------------

def _get_audit(request):
    """?actor= (contains), ?verb= (prefix), ?object_kind=, ?object_id=, ?since=, ?until=, ?limit=."""
    p = request.GET
    f = selectors.AuditFilters(actor=p.get("actor", ""), verb=p.get("verb", ""), object_kind=p.get("object_kind", ""),
                               object_id=p.get("object_id", ""), since=_time(p.get("since"), "since"),
                               until=_time(p.get("until"), "until"))
    return JsonResponse({"entries": selectors.audit_log(f, _limit(p))})


# Append-only: reading is the only thing this endpoint (or any other) does with the log.
audit_list = endpoint(GET=_get_audit)
