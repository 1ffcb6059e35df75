"""Alerting and remediation pages: alerts and their history, rules, silences, routing, channels, the remediation
queue and the audit log.

Every page is an operator's (`tenancy.access.operator_required`: the login page for anonymous visitors, 403
for tenants' users, whose alerts are in their portal); every change is a POST with CSRF that calls one action
and redirects back (post/redirect/get) with its outcome as a message.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime

from django.contrib import messages
from django.core.exceptions import (
    NON_FIELD_ERRORS,
    ObjectDoesNotExist,
    ValidationError,
)
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from alerts import delivery, forms, lifecycle, rule_actions, selectors, silences
from alerts.models import ActionState, AlertState, NotificationStatus, Severity
from alerts.remediation import actions as remediation_actions
from alerts.remediation import evidence
from alerts.remediation.actions import ActionError
from alerts.remediation.impact import APPROVABLE, action_impact, confirm_token, confirmed
from dashboard.pages.formatting import duration, when
from dashboard.pages.svgchart import line_chart
from telemetry import health
from telemetry.selectors import inventory
from tenancy.access import operator_required


def now() -> datetime:
    """The pages' clock (tests pin it)."""
    return timezone.now()


# What the actions raise when they refuse: bad input or a state that does not allow the change.
REFUSALS = (ValueError, ActionError)


def _attempt(request, call: Callable, done: str) -> bool:
    """Run one action; its refusal becomes an error message on the page, not a 500."""
    try:
        call()
    except ObjectDoesNotExist as exc:
        raise Http404(str(exc)) from exc
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return False
    except REFUSALS as exc:
        messages.error(request, str(exc))
        return False
    messages.success(request, done)
    return True


def _back(request, fallback: str) -> HttpResponseRedirect:
    return redirect(_next_url(request, fallback))


def _next_url(request, fallback: str) -> str:
    # The page the button was on, but only one of ours (not "//evil.example" nor "/\evil.example").
    target = request.POST.get("next") or request.GET.get("next") or ""
    ours = target.startswith("/") and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                                                        require_https=request.is_secure())
    return target if ours else fallback


def _add_errors(form, exc: ValidationError, rename: dict[str, str]) -> None:
    """An action's ValidationError on the form: each message on its field (renamed to the form's), else on top."""
    errors = exc.message_dict if hasattr(exc, "error_dict") else {None: exc.messages}
    for name, msgs in errors.items():
        field = rename.get(name, name)
        on_field = field in form.fields
        for msg in msgs:
            plain = on_field or name in (None, NON_FIELD_ERRORS)
            form.add_error(field if on_field else None, msg if plain else f"{name}: {msg}")


# --- Display shaping -----------------------------------------------------------------------------------

def _parse(iso: str | None) -> datetime | None:
    return datetime.fromisoformat(iso) if iso else None


def display_alert(row: dict, at: datetime) -> dict:
    """An alert row with its colours, age and times in words."""
    start, end = _parse(row["starts_at"]), _parse(row.get("ends_at"))
    return {**row, "severity_colour": Severity.colour(row["severity"]), "state_colour": AlertState.colour(row["state"]),
            "age": duration(max(0.0, ((end or at) - start).total_seconds())), "starts_text": when(row["starts_at"]),
            "ends_text": when(row.get("ends_at")), "labels_text": _pairs(row["labels"])}


def with_entity_health(rows: list[dict], at: datetime) -> list[dict]:
    """Each alert row with the current state of the hardware it is about (`telemetry.health`), so an
    alert and the GPU, node or port page it links to say the same thing now."""

    keys = {kind: {r["entity_key"] for r in rows if r.get("entity_kind") == kind and r.get("entity_key")}
            for kind in ("gpu", "node", "port")}
    gpu_ids = inventory.gpu_ids(keys["gpu"])
    node_ids = inventory.node_ids(keys["node"])
    port_ids = {k: int(k) for k in keys["port"] if k.isdigit()}
    found = {
        "gpu": (gpu_ids, health.gpu_health(gpu_ids.values(), now=at) if gpu_ids else {}),
        "node": (node_ids, health.node_health(node_ids.values(), now=at) if node_ids else {}),
        "port": (port_ids, health.port_health(port_ids.values(), now=at) if port_ids else {}),
    }
    for r in rows:
        ids, states = found.get(r.get("entity_kind"), ({}, {}))
        h = states.get(ids.get(r.get("entity_key")))
        r["entity_health"] = health.health_fields(h) if h else None
    return rows


def _pairs(labels: dict) -> list[str]:
    return [f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("alertname", "severity")]


def pretty(value) -> str:
    """JSON as an operator reads it: indented, keys in order, non-ASCII kept."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def display_notification(row: dict) -> dict:
    """A notification row with its status colour and (when present) its payload and attempts as text."""
    out = {**row, "status_colour": NotificationStatus.colour(row["status"]), "created_text": when(row["created_at"])}
    if "payload" in row:
        out["payload_text"] = pretty(row["payload"])
        out["attempt_log"] = [{**d, "request_text": pretty(d["request"])} for d in row["attempt_log"]]
    return out


def display_action(row: dict) -> dict:
    """A remediation action with its state colour, times in words and evidence/result as text."""
    return {**row, "state_colour": ActionState.colour(row["state"]), "created_text": when(row["created_at"]),
            "finished_text": when(row["finished_at"]), "evidence_text": pretty(row["evidence"]),
            "result_text": pretty(row["result"]), "approvable": _approvable(row)}


def _approvable(row: dict) -> bool:
    """Whether the action may still be approved (through its confirm page); a shadow record never runs."""
    return row["mode"] != "shadow" and row["state"] in APPROVABLE


def silence_text(labels: dict) -> str:
    """The matchers that silence exactly this label set (less severity), in the silence form's syntax."""
    def quote(v: str) -> str:
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return ", ".join(f"{k}={quote(str(v))}" for k, v in sorted(labels.items()) if k != "severity")


# --- Alerts ------------------------------------------------------------------------------------------

@operator_required
@require_safe
def alert_list(request):
    """Open alerts, and the history search over every alert, its events and notifications."""
    at = now()
    search = forms.HistoryForm(request.GET or None)
    history, status = None, 200
    if search.is_bound:
        if search.is_valid():
            d = search.cleaned_data
            history = selectors.search_history(selectors.HistoryFilters(
                q=d["q"].strip(), state=d["state"], severity=d["severity"], since=d["since"], until=d["until"]))
            history["alerts"] = [display_alert(r, at) for r in history["alerts"]]
            history["notifications"] = [display_notification(n) for n in history["notifications"]]
        else:
            status = 400
    rows = with_entity_health([display_alert(r, at) for r in selectors.open_alerts()], at)
    return render(request, "alerts/alerts.html", {
        "alerts": rows, "counts": selectors.open_alert_counts(), "search": search,
        "history": history, "operator": selectors.is_operator(request.user), "tab": "alerts"}, status=status)


@operator_required
@require_safe
def alert_detail(request, alert_id: int):
    """One alert: labels, annotations, timeline, notifications with every delivery attempt, actions."""
    row = selectors.alert_detail(alert_id)
    if row is None:
        raise Http404("No such alert.")
    alert = with_entity_health([display_alert(row, now())], now())[0]
    alert["notifications"] = [display_notification(n) for n in row["notifications"]]
    alert["actions"] = [display_action(x) for x in row["actions"]]
    alert["silence_text"] = silence_text(row["labels"])
    return render(request, "alerts/alert.html", {"alert": alert, "operator": selectors.is_operator(request.user),
                                                 "tab": "alerts"})


@operator_required
@require_POST
def alert_ack(request, alert_id: int):
    """Acknowledge an alert (or withdraw the acknowledgement with undo=1)."""
    note = request.POST.get("note", "").strip()[:500]
    if request.POST.get("undo"):
        unack = lifecycle.do_unack_alert
        _attempt(request, lambda: unack(alert_id, request.user, note), "Acknowledgement withdrawn.")
    else:
        ack = lifecycle.do_ack_alert
        _attempt(request, lambda: ack(alert_id, request.user, note), "Alert acknowledged.")
    return _back(request, reverse("alert", args=[alert_id]))


# --- Rules -------------------------------------------------------------------------------------------

def _rules_page(request, form: forms.RuleForm, editing: dict | None, status: int = 200):
    return render(request, "alerts/rules.html", {
        "rules": selectors.rule_list(), "form": form, "editing": editing, "tab": "rules",
        "operator": selectors.is_operator(request.user)}, status=status)


def _save_rule(request, form: forms.RuleForm, rule_id: int | None) -> bool:
    """Validate the form, then create or update through the rule actions; their errors land on the fields."""
    if not form.is_valid():
        _more_rule_errors(form, rule_id)
        return False
    try:
        if rule_id is None:
            rule = rule_actions.do_create_rule(form.cleaned_data, request.user)
        else:
            rule = rule_actions.do_update_rule(rule_id, form.cleaned_data, request.user)
    except ValidationError as exc:
        form.add_error(None, exc)
        return False
    messages.success(request, f"Rule {rule.name} {'created' if rule_id is None else 'saved'}.")
    return True


def _more_rule_errors(form: forms.RuleForm, rule_id: int | None) -> None:
    # The form's own errors stopped it; the model's checks of the other fields are shown in the same round.
    try:
        rule_actions.check_rule_fields(form.cleaned_data, rule_id, skip=tuple(form.errors))
    except ValidationError as exc:
        for name, msgs in exc.message_dict.items():
            if name in form.fields and name not in form.errors:
                form.add_error(name, msgs)


@operator_required
def rule_list(request):
    """Every rule, and the form to create one (POST, operators only)."""
    if request.method == "POST":
        form = forms.RuleForm(request.POST)
        if _save_rule(request, form, None):
            return redirect("alert-rules")
        return _rules_page(request, form, None, status=400)
    return _rules_page(request, forms.RuleForm(), None)


@operator_required
def rule_edit(request, rule_id: int):
    """Edit one rule (POST, operators only); the list stays beside the form."""
    rule = selectors.rule_detail(rule_id)
    if rule is None:
        raise Http404("No such rule.")
    if request.method == "POST":
        form = forms.RuleForm(request.POST)
        if _save_rule(request, form, rule_id):
            return redirect("alert-rules")
        return _rules_page(request, form, rule, status=400)
    return _rules_page(request, forms.RuleForm(initial=forms.RuleForm.initial_from(rule)), rule)


@operator_required
@require_POST
def rule_enabled(request, rule_id: int):
    """Switch a rule on (enabled=1) or off."""
    enabled = request.POST.get("enabled") == "1"
    _attempt(request, lambda: rule_actions.do_set_rule_enabled(rule_id, enabled, request.user),
             f"Rule {'enabled' if enabled else 'disabled'}.")
    return redirect("alert-rules")


@operator_required
@require_POST
def rule_delete(request, rule_id: int):
    """Delete a rule (its alerts resolve; their history stays)."""
    _attempt(request, lambda: rule_actions.do_delete_rule(rule_id, request.user), "Rule deleted.")
    return redirect("alert-rules")


# --- Silences, routing ---------------------------------------------------------------------------------

def _silences_page(request, form: forms.SilenceForm, at: datetime, status: int = 200):
    return render(request, "alerts/silences.html", {
        "current": selectors.silences(at, "current"), "expired": selectors.silences(at, "expired", limit=50),
        "form": form, "operator": selectors.is_operator(request.user), "tab": "silences"}, status=status)


@operator_required
def silence_list(request):
    """Active, pending and expired silences and maintenance windows; the create form (POST, operators only)."""
    at = now()
    if request.method != "POST":
        initial = {"matchers_text": request.GET.get("matchers", "")}
        return _silences_page(request, forms.SilenceForm(initial=initial, now=at), at)
    form = forms.SilenceForm(request.POST, now=at)
    if form.is_valid():
        do_create_silence = silences.do_create_silence
        d = form.cleaned_data
        try:
            silence = do_create_silence(d["matchers"], d["starts_at"], d["ends_at"], d["comment"], request.user,
                                        kind=d["kind"], now=at)
        except ValidationError as exc:
            _add_errors(form, exc, {"matchers": "matchers_text"})
        else:
            messages.success(request, f"Silence {silence.pk} created.")
            return redirect("silences")
    return _silences_page(request, form, at, status=400)


@operator_required
@require_POST
def silence_expire(request, silence_id: int):
    """End a silence now."""
    do_expire_silence = silences.do_expire_silence
    _attempt(request, lambda: do_expire_silence(silence_id, request.user), "Silence expired.")
    return redirect("silences")


@operator_required
@require_safe
def routing(request):
    """The routing tree and the inhibition rules (read-only; the admin edits them)."""
    return render(request, "alerts/routing.html", {"tree": selectors.routing_tree(),
                                                   "inhibit_rules": selectors.inhibit_rules(), "tab": "routing"})


# --- Channels and notifications ------------------------------------------------------------------------

@operator_required
@require_safe
def channel_list(request):
    """Channels with their state, last success and last test; it refreshes itself while a test is in flight."""
    rows = selectors.channel_list()
    for c in rows:
        c["last_test"] = display_notification(c["last_test"]) if c["last_test"] else None
    tested = request.GET.get("tested", "")
    tested = selectors.notification_detail(int(tested)) if tested.isdigit() else None
    waiting = any(c["last_test"] and c["last_test"]["status"] in ("pending", "sending") for c in rows)
    return render(request, "alerts/channels.html", {
        "channels": rows, "tested": display_notification(tested) if tested else None, "waiting": waiting,
        "tab": "channels", "operator": selectors.is_operator(request.user)})


@operator_required
@require_POST
def channel_test(request, channel_id: int):
    """Send a test notification through a channel; the page then shows how its delivery went."""
    do_send_test = delivery.do_send_test
    sent = []
    _attempt(request, lambda: sent.append(do_send_test(channel_id, request.user)), "Test notification queued.")
    return redirect(f"{reverse('channels')}?tested={sent[0].pk}" if sent else "channels")


@operator_required
@require_POST
def channel_enable(request, channel_id: int):
    """Switch a channel back on after a permanent delivery error was fixed."""
    do_enable_channel = delivery.do_enable_channel
    _attempt(request, lambda: do_enable_channel(channel_id, request.user), "Channel enabled.")
    return redirect("channels")


@operator_required
@require_safe
def notification_detail(request, notification_id: int):
    """One notification: its payload and every delivery attempt (request, response, status, duration)."""
    row = selectors.notification_detail(notification_id)
    if row is None:
        raise Http404("No such notification.")
    return render(request, "alerts/notification.html", {"n": display_notification(row), "tab": "channels",
                                                        "waiting": row["status"] in ("pending", "sending")})


# --- Remediation ---------------------------------------------------------------------------------------

@operator_required
@require_safe
def remediation(request):
    """The approvals queue, suggestions, shadow-mode records and recent executions with their verification."""
    sections = {k: [display_action(x) for x in v] for k, v in selectors.remediation_overview().items()}
    return render(request, "alerts/remediation.html", {
        **sections, "drain_form": forms.DrainForm(), "reject_form": forms.RejectForm(),
        "operator": selectors.is_operator(request.user)})


def _impact_page(request, action, impact, *, status: int = 200):
    """The confirmation: the impact preview and, while approving is allowed, the form that confirms it.
    `?partial=1` answers the fragment alone, which the remediation page's dialog shows (confirm.js)."""
    template = "alerts/_confirm.html" if request.GET.get("partial") else "alerts/confirm.html"

    return render(request, template, {"action": display_action(selectors.action_row(action)), "impact": impact,
                                      "token": confirm_token(impact),
                                      "next": _next_url(request, reverse("remediation"))}, status=status)


@operator_required
@require_http_methods(["GET", "HEAD", "POST"])
def action_approve(request, action_id: int):
    """Approve an action: GET shows the impact preview (jobs, tenants, GPUs, blast-radius budget); a POST
    acts only with the confirm token of that same preview, else it shows the preview again and changes
    nothing. A guard rail that blocks it (an exhausted budget) refuses it, recorded as blocked."""
    action = _get_action(action_id)
    impact = action_impact(action, now=now())
    if request.method != "POST":
        return _impact_page(request, action, impact)
    if not confirmed(impact, request.POST.get("confirm", "")):
        messages.warning(request, "Nothing was approved: read the impact below and confirm it"
                         + (" (it changed since it was shown)." if request.POST.get("confirm") else "."))
        return _impact_page(request, action, impact, status=409)
    do_approve_action = remediation_actions.do_approve_action
    try:
        action = do_approve_action(action_id, request.user, now=now())
    except REFUSALS as exc:
        messages.error(request, str(exc))
    else:
        if action.state == ActionState.BLOCKED:
            messages.error(request, f"Action {action_id} refused by a guard rail: {action.blocked_reason}")
        else:
            messages.success(request, f"Action {action_id} approved.")
    return redirect(_next_url(request, reverse("remediation")))


def _get_action(action_id: int):
    action = selectors.remediation_action(action_id)
    if action is None:
        raise Http404("No such remediation action.")
    return action


@operator_required
@require_safe
def action_detail(request, action_id: int):
    """One action: what it would do (the impact preview), its evidence as a timeline with the target's metric
    charts, and the raw evidence and result behind a toggle."""

    action, at = _get_action(action_id), now()
    impact = action_impact(action, now=at)
    entries = evidence.timeline(action, now=at)
    marks = [e.time for e in entries if e.source in ("fault", "action")]
    charts = [{**c, "svg": line_chart(c["lines"], c["start"], c["end"], marks=marks)}
              for c in evidence.charts(action, now=at)]
    return render(request, "alerts/action.html", {
        "action": display_action(selectors.action_row(action)), "impact": impact, "token": confirm_token(impact),
        "timeline": entries, "charts": charts, "next": reverse("action", args=[action_id]),
        "operator": selectors.is_operator(request.user)})


@operator_required
@require_POST
def action_reject(request, action_id: int):
    """Reject an action awaiting approval, with a reason."""
    do_reject_action = remediation_actions.do_reject_action
    form = forms.RejectForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Give a reason to reject an action.")
    else:
        reason = form.cleaned_data["reason"]
        _attempt(request, lambda: do_reject_action(action_id, request.user, reason), f"Action {action_id} rejected.")
    return redirect("remediation")


@operator_required
@require_POST
def action_drain(request):
    """Ask for a node to be drained by hand; it waits in the approvals queue (guard rails still apply)."""
    do_request_action = remediation_actions.do_request_action
    form = forms.DrainForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Give the node's hostname and a reason.")
        return redirect("remediation")
    d, made = form.cleaned_data, []
    _attempt(request, lambda: made.append(do_request_action(
        "drain", d["hostname"].strip(), mode="approval", reason=d["reason"], evidence={"requested": "by hand"},
        requested_by=request.user.username)), f"Drain of {d['hostname']} requested.")
    if made and made[0].state == ActionState.BLOCKED:
        messages.warning(request, f"Blocked by a guard rail: {made[0].blocked_reason}")
    return redirect("remediation")


# --- Audit ---------------------------------------------------------------------------------------------

@operator_required
@require_safe
def audit(request):
    """The append-only audit log, searchable; there is no way to change it here (or anywhere)."""
    search = forms.AuditForm(request.GET or None)
    entries, status = [], 200
    if search.is_bound and not search.is_valid():
        status = 400
    else:
        d = search.cleaned_data if search.is_bound else {}
        filters = selectors.AuditFilters(**{k: v for k, v in d.items() if v not in (None, "")})
        entries = [{**e, "time_text": when(e["time"]), "detail_text": pretty(e["detail"])}
                   for e in selectors.audit_log(filters)]
    return render(request, "alerts/audit.html", {"entries": entries, "search": search,
                                                 "limit": selectors.LIST_LIMIT}, status=status)
