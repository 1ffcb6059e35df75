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

import importlib
import json
from collections.abc import Callable
from datetime import UTC, datetime

from django.core.exceptions import NON_FIELD_ERRORS, ObjectDoesNotExist, ValidationError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.csrf import csrf_exempt

from alerts import rule_actions, selectors
from alerts.forms import parse_duration, parse_matchers
from alerts.models import ActionState, AlertState, Severity
from tenancy.access import csrf_failure_reason, mark
from tenancy.auth import AccessDenied, acting_user, check_api_access, is_token_request

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
MAX_LIMIT = 1000
SILENCE_STATES = ("current", "active", "pending", "expired", "all")


class ApiError(Exception):
    """An error answered as {"error": {"code", "message", ...}} with an HTTP status."""

    def __init__(self, status: int, code: str, message: str, **extra):
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra

    def response(self, headers: dict | None = None) -> JsonResponse:
        resp = JsonResponse({"error": {"code": self.code, "message": self.message, **self.extra}}, status=self.status)
        for k, v in (headers or {}).items():
            resp[k] = v
        return resp


def invalid(exc: ValidationError) -> ApiError:
    """A ValidationError as a 400 that names its first field, and lists every field's messages."""
    fields = exc.message_dict if hasattr(exc, "error_dict") else {NON_FIELD_ERRORS: exc.messages}
    name, msgs = next(iter(fields.items()))
    message = msgs[0] if name == NON_FIELD_ERRORS else f"{name}: {msgs[0]}"
    return ApiError(400, "invalid", message, field=None if name == NON_FIELD_ERRORS else name, fields=fields)


def endpoint(*, tenant_reads: bool = False, **handlers: Callable) -> Callable:
    """A JSON view dispatching on the method (GET=..., POST=...), with the checks every endpoint shares.

    Operators only, unless `tenant_reads`: then tenants' users and tokens may read (the handler scopes
    its rows with visible_to(request.who)).
    """
    allow = ", ".join(sorted(handlers))

    @csrf_exempt  # enforced below for session writes, after the 401/403 checks, so errors stay JSON
    def view(request: HttpRequest, **kwargs) -> JsonResponse:
        handler = handlers.get("GET" if request.method == "HEAD" else request.method)
        try:
            _check_access(request, tenant_reads)  # first: who may not be here learns nothing of the methods
            if handler is None:
                raise ApiError(405, "method_not_allowed", f"{request.method} is not allowed here; use {allow}")
            return handler(request, **kwargs)
        except ApiError as exc:
            return exc.response({"Allow": allow} if exc.status == 405 else None)
        except ValidationError as exc:
            return invalid(exc).response()
        except ObjectDoesNotExist as exc:
            return ApiError(404, "not_found", str(exc) or "no such object").response()
        except _refusals() as exc:  # the actions' refusal: bad input, or a state that does not allow the change
            return _refusal(exc).response()

    return mark(view, "tenant" if tenant_reads else "operator")


def _refusals() -> tuple[type[Exception], ...]:
    try:
        from alerts.remediation.actions import ActionError
    except ImportError:
        return (ValueError,)
    return (ValueError, ActionError)


def _refusal(exc: Exception) -> ApiError:
    # ActionError carries "invalid" (400) or "conflict" (409); a ValueError is the lifecycle's wrong state.
    if getattr(exc, "code", "conflict") == "invalid":
        return ApiError(400, "invalid", str(exc))
    return ApiError(409, "conflict", str(exc))


def _check_access(request: HttpRequest, tenant_reads: bool) -> None:
    try:
        check_api_access(request, operator=not (tenant_reads and request.method in SAFE_METHODS))
    except AccessDenied as exc:
        raise ApiError(exc.status, exc.code, exc.message) from exc
    if request.method in SAFE_METHODS or is_token_request(request):
        return  # a token comes without cookies: only session writes can be forged across sites
    reason = csrf_failure_reason(request)
    if reason:
        raise ApiError(403, "csrf_failed", f"CSRF check failed: {reason}; send the csrftoken cookie's value as "
                                           "X-CSRFToken")


# --- Input -------------------------------------------------------------------------------------------

def _body(request: HttpRequest) -> dict:
    if not request.body.strip():
        return {}
    try:
        data = json.loads(request.body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "bad_json", f"the body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ApiError(400, "bad_json", "the body must be a JSON object")
    return data


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
        raise ApiError(400, "invalid", f"{name}: {value!r} is not an ISO 8601 time", field=name)
    return moment


def _choice(params, name: str, allowed, default: str = "") -> str:
    value = params.get(name, default) or default
    if value and value not in allowed:
        raise ApiError(400, "invalid", f"{name}: {value!r} is not one of {', '.join(allowed)}", field=name)
    return value


def _limit(params) -> int:
    raw = params.get("limit", str(selectors.LIST_LIMIT))
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise ApiError(400, "invalid", f"limit: must be a whole number from 1 to {MAX_LIMIT}", field="limit")
    return int(raw)


def _text(data: dict, name: str, *, required: bool = False) -> str:
    value = data.get(name, "")
    if not isinstance(value, str):
        raise ApiError(400, "invalid", f"{name}: must be a string", field=name)
    if required and not value.strip():
        raise ApiError(400, "invalid", f"{name}: is required", field=name)
    return value.strip()


def _action(name: str, module: str) -> Callable:
    return getattr(importlib.import_module(module), name)


def _found(row: dict | None, what: str) -> dict:
    if row is None:
        raise ApiError(404, "not_found", f"no such {what}")
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
    name = "do_ack_alert" if request.method == "POST" else "do_unack_alert"
    _action(name, "alerts.lifecycle")(alert_id, acting_user(request), note)
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
            raise ApiError(400, "invalid", f"{missing[0]}: is required (PUT replaces the whole rule; PATCH changes "
                                           "some fields)", field=missing[0])
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
            raise ApiError(400, "invalid", "ends_at: give ends_at or a duration such as \"2h\"", field="ends_at")
        try:
            ends = starts + parse_duration(duration)
        except ValidationError as exc:
            raise ValidationError({"duration": exc.messages}) from exc
    create = _action("do_create_silence", "alerts.silences")
    silence = create(_silence_matchers(data.get("matchers")), starts, ends, _text(data, "comment"),
                     acting_user(request), kind=_text(data, "kind") or "silence", now=now)
    return JsonResponse(selectors.silence_detail(silence.pk, timezone.now()), status=201)


def _get_silence(request, silence_id: int):
    return JsonResponse(_found(selectors.silence_detail(silence_id, timezone.now()), "silence"))


def _expire_silence(request, silence_id: int):
    _action("do_expire_silence", "alerts.silences")(silence_id, acting_user(request))
    return JsonResponse(selectors.silence_detail(silence_id, timezone.now()))


silence_list = endpoint(GET=_get_silences, POST=_create_silence)
silence_detail = endpoint(GET=_get_silence, DELETE=_expire_silence)


# --- Channels ----------------------------------------------------------------------------------------

def _get_channels(request):
    return JsonResponse({"channels": selectors.channel_list()})


def _test_channel(request, channel_id: int):
    """Queue a test notification; 202 with the notification to poll for its delivery."""
    try:
        send = _action("do_send_test", "alerts.delivery")
    except AttributeError:
        send = _action("do_send_test", "alerts.actions")
    n = send(channel_id, acting_user(request))
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
    from alerts.models import RemediationAction

    return selectors.action_row(RemediationAction.objects.select_related("decided_by").get(pk=action_id))


def _impact(request, action_id: int):
    """The confirmation's impact preview (jobs, tenants, GPUs, blast-radius budgets) and its confirm token."""
    from alerts.models import RemediationAction
    from alerts.remediation.impact import action_impact

    return JsonResponse(action_impact(RemediationAction.objects.get(pk=action_id)).as_dict())


def _approve(request, action_id: int):
    """Approve; with {"confirm": token} from the impact preview, only while that preview still holds (409)."""
    from alerts.models import RemediationAction
    from alerts.remediation.impact import action_impact, confirmed

    token = _body(request).get("confirm")
    if token is not None and not confirmed(action_impact(RemediationAction.objects.get(pk=action_id)), str(token)):
        raise ApiError(409, "conflict", "the impact changed since this confirm token was issued; read it again",
                       field="confirm")
    _action("do_approve_action", "alerts.remediation.actions")(action_id, acting_user(request))
    return JsonResponse(_action_row(action_id))


def _reject(request, action_id: int):
    """{"reason": "..."} is required: it goes to the audit log."""
    reason = _text(_body(request), "reason", required=True)
    _action("do_reject_action", "alerts.remediation.actions")(action_id, acting_user(request), reason)
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
