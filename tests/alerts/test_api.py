"""The operator API (/api/v1/...): access (401/403/405/CSRF), JSON errors naming the field, and every endpoint
against the real actions. The data are the page tests' (tests/alerts/test_pages.py)."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from alerts.models import ActionState, Alert, Notification, Rule, Silence
from core.models import AuditEntry
from tests import personas
from tests.alerts import test_pages

data = test_pages.data  # the page tests' fixture: the same alerts, rules, channels, actions and audit entries

API = "/api/v1"
RULE = {"name": "HbmHot", "kind": "threshold", "metric": "memory_temp", "op": ">", "threshold": 95,
        "for_seconds": 60, "severity": "warning", "labels": {"team": "ml"}}


@pytest.fixture
def op(client, django_user_model) -> Client:
    personas.signed_in(personas.operator("oper"), client)
    return client


@pytest.fixture
def viewer(client, django_user_model) -> Client:
    client.force_login(django_user_model.objects.create_user("viewer", password="pw-viewer-1"))
    return client


def send(client: Client, method: str, path: str, body=None):
    if method == "get":
        return client.get(f"{API}{path}")
    payload = body if isinstance(body, str) else "" if body is None else json.dumps(body)
    return getattr(client, method)(f"{API}{path}", data=payload, content_type="application/json")


def error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    err = response.json()["error"]
    assert err["code"] == code and err["message"]
    return err


def endpoints(d: dict) -> list[tuple[str, str]]:
    """(method, path) of every operator endpoint: reads first, then writes."""
    return [("get", "/alerts"), ("get", f"/alerts/{d['hot'].pk}"), ("get", "/rules"),
            ("get", f"/rules/{d['rule'].pk}"), ("get", "/silences"), ("get", f"/silences/{d['silence'].pk}"),
            ("get", "/channels"), ("get", "/remediation/actions"), ("get", "/audit"),
            ("post", f"/alerts/{d['hot'].pk}/ack"), ("delete", f"/alerts/{d['acked'].pk}/ack"), ("post", "/rules"),
            ("patch", f"/rules/{d['rule'].pk}"), ("put", f"/rules/{d['rule'].pk}"),
            ("delete", f"/rules/{d['rule'].pk}"), ("post", "/silences"), ("delete", f"/silences/{d['silence'].pk}"),
            ("post", f"/channels/{d['webhook'].pk}/test"), ("post", f"/remediation/actions/{d['awaiting'].pk}/approve"),
            ("post", f"/remediation/actions/{d['awaiting'].pk}/reject")]


# --- access ------------------------------------------------------------------------------------------

def test_every_endpoint_answers_401_json_when_not_signed_in(client, data):
    for method, path in endpoints(data):
        error(send(client, method, path, {}), 401, "not_authenticated")


def test_a_user_without_a_role_is_403_everywhere_and_changes_nothing(viewer, data):
    # Operators only (tenancy.access); the alert list also serves tenants, so a user with no role is told so.
    for method, path in endpoints(data):
        response = send(viewer, method, path, {"reason": "x"})
        error(response, 403, "no_role" if (method, path) == ("get", "/alerts") else "forbidden")
    assert Rule.objects.filter(pk=data["rule"].pk).exists() and Alert.objects.get(pk=data["hot"].pk).state == "firing"
    assert not Notification.objects.filter(event="test").exists()


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("post", "/audit", "GET"), ("put", "/audit", "GET"), ("delete", "/audit", "GET"), ("patch", "/audit", "GET"),
    ("delete", "/alerts", "GET"), ("get", "/channels/1/test", "POST"), ("post", "/rules/1", "DELETE, GET, PATCH, PUT"),
    ("put", "/silences/1", "DELETE, GET"), ("get", "/remediation/actions/1/approve", "POST"),
])
def test_wrong_methods_are_405_with_allow(op, db, method, path, allow):
    response = send(op, method, path, {})
    error(response, 405, "method_not_allowed")
    assert response["Allow"] == allow


def test_unknown_ids_are_404(op, db):
    for method, path in [("get", "/alerts/999"), ("post", "/alerts/999/ack"), ("get", "/rules/999"),
                         ("patch", "/rules/999"), ("delete", "/rules/999"), ("get", "/silences/999"),
                         ("delete", "/silences/999"), ("post", "/channels/999/test"),
                         ("post", "/remediation/actions/999/approve")]:
        error(send(op, method, path, {}), 404, "not_found")


def test_session_writes_need_the_csrf_token(django_user_model, data):
    client = Client(enforce_csrf_checks=True)
    personas.signed_in(personas.operator("oper"), client)
    error(send(client, "post", "/rules", RULE), 403, "csrf_failed")
    assert client.get(f"{API}/rules").status_code == 200  # reads need none
    client.get("/alerts/rules/")  # a page sets the csrftoken cookie
    token = client.cookies["csrftoken"].value
    response = client.post(f"{API}/rules", json.dumps(RULE), content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 201


# --- rules -------------------------------------------------------------------------------------------

def test_rule_crud_round_trip_is_audited(op, data):
    response = send(op, "post", "/rules", RULE)
    assert response.status_code == 201
    rule = response.json()
    assert response["Location"] == f"/api/v1/rules/{rule['id']}"
    assert (rule["threshold"], rule["labels"], rule["created_by"], rule["enabled"]) == (95.0, {"team": "ml"}, "oper",
                                                                                        True)
    assert [r["name"] for r in send(op, "get", "/rules").json()["rules"]] == ["GpuHot", "HbmHot"]
    patched = send(op, "patch", f"/rules/{rule['id']}", {"threshold": 97, "enabled": False}).json()
    assert (patched["threshold"], patched["enabled"], patched["metric"]) == (97.0, False, "memory_temp")
    put = send(op, "put", f"/rules/{rule['id']}", {"name": "HbmHot", "kind": "xid", "xid_codes": [48]}).json()
    assert (put["kind"], put["xid_codes"], put["threshold"], put["labels"], put["severity"]) == (
        "xid", [48], None, {}, "warning")  # PUT replaces: what it left out is back at the defaults
    assert send(op, "delete", f"/rules/{rule['id']}").status_code == 204
    error(send(op, "get", f"/rules/{rule['id']}"), 404, "not_found")
    verbs = list(AuditEntry.objects.filter(object_kind="rule", object_id=str(rule["id"])).order_by("id")
                 .values_list("verb", flat=True))
    assert verbs == ["rule.create", "rule.update", "rule.update", "rule.delete"]


@pytest.mark.parametrize(("body", "field", "message"), [
    ({"threshold": None}, "threshold", "a threshold rule needs a threshold"),
    ({"threshold": "hot"}, "threshold", "must be a float"),
    ({"kind": "magic"}, "kind", "is not a valid choice"),
    ({"name": ""}, "name", "cannot be blank"),
    ({"name": "GpuHot"}, "name", "already exists"),
    ({"for_seconds": -5}, "for_seconds", "greater than or equal to 0"),
    ({"labels": {"team": 7}}, "labels", "string values"),
    ({"kind": "xid", "xid_codes": ["48"]}, "xid_codes", "list of XID numbers"),
    ({"kind": "xid", "xid_codes": [], "xid_actions": []}, "xid_codes", "needs XID codes"),
    ({"colour": "red"}, "colour", "unknown field"),
])
def test_rule_create_with_bad_input_is_400_naming_the_field(op, data, body, field, message):
    err = error(send(op, "post", "/rules", {**RULE, **body}), 400, "invalid")
    assert err["field"] == field and message in err["message"] and err["message"].startswith(f"{field}: ")
    assert field in err["fields"]
    assert not Rule.objects.filter(name="HbmHot").exists()


def test_rule_write_with_a_body_that_is_not_a_json_object_is_400(op, data):
    error(send(op, "post", "/rules", "{not json"), 400, "malformed")
    error(send(op, "post", "/rules", "[1, 2]"), 400, "malformed")
    err = error(send(op, "put", f"/rules/{data['rule'].pk}", {"kind": "xid"}), 400, "invalid")
    assert err["field"] == "name"


# --- alerts ------------------------------------------------------------------------------------------

def test_alert_list_filters(op, data):
    def ids(query: str = "") -> set[int]:
        response = send(op, "get", f"/alerts{query}")
        assert response.status_code == 200
        return {a["id"] for a in response.json()["alerts"]}

    assert ids() == {data[k].pk for k in ("hot", "acked", "muted", "inhibited")}  # open by default
    assert ids("?state=all") == ids() | {data["old"].pk}
    assert ids("?state=resolved&q=slurm") == {data["old"].pk}
    assert ids("?severity=critical") == {data["hot"].pk}
    assert ids("?state=all&until=2026-11-29T07:00:00Z") == {data["old"].pk}
    assert len(send(op, "get", "/alerts?limit=1").json()["alerts"]) == 1
    for query, field in [("?state=sleeping", "state"), ("?since=yesterday", "since"), ("?limit=0", "limit"),
                         ("?severity=loud", "severity")]:
        assert error(send(op, "get", f"/alerts{query}"), 400, "invalid")["field"] == field


def test_alert_detail_has_events_notifications_with_attempts_and_actions(op, data):
    a = send(op, "get", f"/alerts/{data['hot'].pk}").json()
    assert a["name"] == "GpuHot" and a["labels"]["gpu"] == "GPU-aaa" and a["entity_url"] == "/gpus/GPU-aaa/"
    assert [e["kind"] for e in a["events"]] == ["fired"]
    attempt = a["notifications"][0]["attempt_log"][0]
    assert (attempt["status_code"], attempt["duration_ms"], attempt["response"]) == (200, 12.5, '{"ok": true}')
    assert [x["id"] for x in a["actions"]] == [data["awaiting"].pk]


def test_ack_and_unack_through_the_api(op, data):
    alert = data["hot"]
    acked = send(op, "post", f"/alerts/{alert.pk}/ack", {"note": "on it"}).json()
    assert acked["state"] == "acknowledged" and acked["acked_by"] == "oper"
    assert [e["note"] for e in acked["events"] if e["kind"] == "acknowledged"] == ["on it"]
    unacked = send(op, "delete", f"/alerts/{alert.pk}/ack")
    assert unacked.json().get("state") == "firing", unacked.content
    error(send(op, "post", f"/alerts/{data['old'].pk}/ack"), 409, "conflict")
    assert error(send(op, "post", f"/alerts/{alert.pk}/ack", {"note": 5}), 400, "invalid")["field"] == "note"


# --- silences, channels ------------------------------------------------------------------------------

def test_silence_create_from_text_or_list_and_expire(op, data):
    response = send(op, "post", "/silences", {"matchers": "alertname=GpuHot, gpu=~GPU-a.*", "duration": "1h",
                                              "comment": "fans"})
    assert response.status_code == 201
    s = response.json()
    assert s["matchers"][1] == {"name": "gpu", "op": "=~", "value": "GPU-a.*"} and s["state"] == "active"
    assert [a["id"] for a in s["alerts"]] == [data["hot"].pk]  # it mutes the matching open alert at once
    listed = send(op, "post", "/silences", {"matchers": [{"name": "node", "value": "gpu-0001"}], "kind": "maintenance",
                                            "ends_at": "2099-01-01T00:00:00Z", "comment": "rack move"}).json()
    assert listed["kind"] == "maintenance" and listed["matchers"] == [{"name": "node", "op": "=", "value": "gpu-0001"}]
    assert {x["id"] for x in send(op, "get", "/silences").json()["silences"]} >= {s["id"], listed["id"]}
    expired = send(op, "delete", f"/silences/{s['id']}").json()
    assert expired["state"] == "expired" and expired["expired_at"]
    assert s["id"] in {x["id"] for x in send(op, "get", "/silences?state=expired").json()["silences"]}


@pytest.mark.parametrize(("body", "field", "message"), [
    ({"matchers": "gpu=~GPU-(a"}, "matchers", "bad regex"),
    ({"matchers": "gpu GPU-a"}, "matchers", "matcher 1"),
    ({"matchers": []}, "matchers", "at least one matcher"),
    ({"matchers": "a=b", "comment": ""}, "comment", "say why"),
    ({"matchers": "a=b", "duration": ""}, "ends_at", "give ends_at or a duration"),
    ({"matchers": "a=b", "duration": "a while"}, "duration", "write a duration"),
    ({"matchers": "a=b", "ends_at": "tomorrow"}, "ends_at", "is not an ISO 8601 time"),
    ({"matchers": "a=b", "kind": "vacation"}, "kind", "must be one of"),
])
def test_silence_create_with_bad_input_is_400_naming_the_field(op, data, body, field, message):
    err = error(send(op, "post", "/silences", {"duration": "1h", "comment": "x", **body}), 400, "invalid")
    assert err["field"] == field and message in err["message"], err
    assert Silence.objects.count() == 2


def test_channels_list_hides_secrets_and_test_returns_the_notification(op, data):
    channels = send(op, "get", "/channels").json()["channels"]
    assert [c["name"] for c in channels] == ["ops-webhook", "pager"]
    assert "s3cret" not in json.dumps(channels) and channels[0]["has_secret"] is True
    assert channels[1]["enabled"] is False and channels[1]["disabled_reason"] == "HTTP 400: invalid routing key"
    response = send(op, "post", f"/channels/{data['webhook'].pk}/test")
    assert response.status_code == 202
    n = response.json()["notification"]
    assert n["event"] == "test" and n["status"] == "pending"
    assert response.json()["url"] == f"/alerts/notifications/{n['id']}/"
    assert send(op, "get", "/channels").json()["channels"][0]["last_test"]["id"] == n["id"]


# --- remediation, audit ------------------------------------------------------------------------------

def test_remediation_list_approve_and_reject(op, data):
    listed = send(op, "get", "/remediation/actions?state=awaiting").json()["actions"]
    assert [x["id"] for x in listed] == [data["awaiting"].pk]
    error(send(op, "get", "/remediation/actions?state=nap"), 400, "invalid")
    err = error(send(op, "post", f"/remediation/actions/{data['awaiting'].pk}/reject", {}), 400, "invalid")
    assert err["field"] == "reason"
    approved = send(op, "post", f"/remediation/actions/{data['awaiting'].pk}/approve").json()
    assert approved["state"] == ActionState.APPROVED and approved["decided_by"] == "oper"
    rejected = send(op, "post", f"/remediation/actions/{data['suggested'].pk}/reject", {"reason": "not needed"}).json()
    assert rejected["state"] == ActionState.REJECTED
    error(send(op, "post", f"/remediation/actions/{data['suggested'].pk}/approve"), 409, "conflict")
    assert AuditEntry.objects.filter(verb="action.reject", reason="not needed").exists()


def test_audit_list_filters_and_is_read_only(op, data):
    entries = send(op, "get", "/audit").json()["entries"]
    assert [e["actor"] for e in entries] == ["bob", "alice"]  # newest first
    assert [e["verb"] for e in send(op, "get", "/audit?verb=rule.").json()["entries"]] == ["rule.create"]
    assert [e["actor"] for e in send(op, "get", "/audit?since=2026-11-30T09:30:00Z").json()["entries"]] == ["bob"]
    assert error(send(op, "get", "/audit?until=later"), 400, "invalid")["field"] == "until"
    error(send(op, "delete", "/audit", {}), 405, "method_not_allowed")
    assert AuditEntry.objects.count() == 2
