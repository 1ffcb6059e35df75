"""Each transport's request against its provider's documented fields, through the real local receiver
(and a real local SMTP server for email)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.test import override_settings

from alerts import transports
from alerts.models import Channel, ChannelKind, Notification
from alerts.receiver import Behaviour
from alerts.transports import TransportError
from tests.alerts.smtp_server import SmtpServer
from tests.conftest import FIXED_NOW
from tests.procs import free_port

REPO = Path(__file__).resolve().parents[2]
ROUTING_KEY = "R0UT1NGK3Y0123456789abcdefABCDEF"  # PagerDuty integration keys are 32 characters
GENIE_KEY = "0b9c2e7a-6d0f-4b8e-9a35-3c4f5e6a7b8c"
DEDUP = "7d1a" * 16  # routing's dedup keys are sha256 hex
BASE = "http://console.example:8000"


def sample_alert(i: int = 0, *, state: str = "firing", severity: str = "critical", summary: str = "") -> dict:
    """One alert in alerts.routing's payload schema (a hot GPU on a node of rack r12)."""
    labels = {"alertname": "GpuOverTemp", "severity": severity, "gpu": f"GPU-3f2a9c1e-{i:04d}",
              "node": f"node-a{i % 32:03d}", "rack": "r12", "tenant": "acme"}
    return {"id": 1000 + i, "fingerprint": f"{i:064x}", "name": "GpuOverTemp", "state": state,
            "severity": severity, "labels": labels,
            "annotations": {"summary": summary or f"GPU temperature 9{i % 10} C above 90 C"},
            "value": 90.0 + i % 10, "starts_at": (FIXED_NOW - timedelta(minutes=5 + i)).isoformat(),
            "ends_at": FIXED_NOW.isoformat() if state == "resolved" else None,
            "url": f"{BASE}/alerts/{1000 + i}"}


def sample_payload(n: int = 1, *, status: str = "firing", event: str = "trigger", title: str = "",
                   summary: str = "", **alert_kw) -> dict:
    """A notification payload in the routing schema with n alerts."""
    alerts = [sample_alert(i, **alert_kw) for i in range(n)]
    return {"status": status, "event": event, "route": "gpu-oncall", "group_key": "rack=r12",
            "group_labels": {"rack": "r12"}, "common_labels": {"alertname": "GpuOverTemp", "rack": "r12"},
            "title": title or f"GpuOverTemp on rack r12 ({n} GPUs)",
            "summary": summary or f"{n} GPU(s) above 90 C on rack r12", "url": f"{BASE}/alerts/?group=rack%3Dr12",
            "alerts": alerts}


_seq = iter(range(1, 10_000))


def make_notification(kind: str, config: dict, *, secret: str = "", event: str = "trigger",
                      payload: dict | None = None, dedup_key: str = DEDUP, created_at: datetime = FIXED_NOW,
                      **fields) -> Notification:
    """A channel of `kind` and one pending notification to it (`fields`: more Notification fields)."""
    channel = Channel.objects.create(name=f"{kind}-{next(_seq)}", kind=kind, config=config, secret=secret)
    return Notification.objects.create(channel=channel, event=event, dedup_key=dedup_key,
                                       payload=payload if payload is not None else sample_payload(event=event),
                                       created_at=created_at, **fields)


def send(notification: Notification):
    return transports.get(notification.channel.kind).notify(notification)


# --- registry -------------------------------------------------------------------------------------

def test_registry_has_a_transport_for_every_channel_kind():
    assert transports.kinds() == sorted(ChannelKind.values)
    for kind in ChannelKind.values:
        assert transports.get(kind).kind == kind
    with pytest.raises(TransportError) as err:
        transports.get("fax")
    assert err.value.permanent


# --- Slack ----------------------------------------------------------------------------------------

def assert_slack_message(message: dict) -> None:
    """Block Kit limits (api.slack.com/reference/block-kit/blocks)."""
    assert isinstance(message["text"], str) and 0 < len(message["text"]) <= 40000
    blocks = message["blocks"]
    assert 0 < len(blocks) <= 50
    for block in blocks:
        assert block["type"] in {"header", "section", "context", "actions", "divider"}
        if block["type"] == "header":
            assert block["text"]["type"] == "plain_text" and 0 < len(block["text"]["text"]) <= 150
        if block["type"] == "section":
            assert block["text"]["type"] == "mrkdwn" and 0 < len(block["text"]["text"]) <= 3000
        if block["type"] == "context":
            assert 0 < len(block["elements"]) <= 10
            assert all(e["type"] in {"mrkdwn", "plain_text", "image"} for e in block["elements"])
        if block["type"] == "actions":
            for element in block["elements"]:
                assert element["type"] == "button"
                assert element["text"]["type"] == "plain_text" and len(element["text"]["text"]) <= 75
                assert element["url"].startswith("http") and len(element["url"]) <= 3000
                assert len(element["action_id"]) <= 255


@pytest.mark.django_db
def test_slack_message_has_fallback_header_alerts_and_link_within_limits(receiver):
    long_summary = "fan failure; " * 40
    payload = sample_payload(120, summary="many GPUs overheating", title="GpuOverTemp " + "x" * 300)
    payload["alerts"][0]["name"] = "Gpu<Hot>&Co"
    payload["alerts"][1]["annotations"]["summary"] = long_summary
    n = make_notification("slack", {"url": receiver.url("/slack/services/T0/B0/XYZ")}, payload=payload)

    result = send(n)

    assert result.ok and result.status_code == 200 and result.response == "ok"
    message = receiver.requests[0].json()
    assert_slack_message(message)
    assert [b["type"] for b in message["blocks"]] == ["header", "section", "context", "actions"]
    assert message["text"].startswith("[FIRING:120] GpuOverTemp")
    section = message["blocks"][1]["text"]["text"]
    assert "Gpu&lt;Hot&gt;&amp;Co" in section and "<Hot>" not in section
    assert re.search(r"…and \d+ more$", section)
    assert message["blocks"][3]["elements"][0]["url"] == payload["url"]
    assert receiver.requests[0].headers["content-type"] == "application/json"


@pytest.mark.django_db
def test_slack_resolve_message_says_resolved(receiver):
    payload = sample_payload(2, status="resolved", event="resolve", state="resolved")
    n = make_notification("slack", {"url": receiver.url("/slack")}, event="resolve", payload=payload)
    assert send(n).ok
    message = receiver.requests[0].json()
    assert message["blocks"][0]["text"]["text"].startswith("[RESOLVED]")
    assert ":white_check_mark:" in message["blocks"][1]["text"]["text"]


@pytest.mark.parametrize(("status", "body", "outcome"), [
    (404, "no_service", "permanent"), (403, "invalid_token", "permanent"), (410, "channel_is_archived", "permanent"),
    (400, "invalid_payload", "permanent"), (429, "rate_limited", "retry"), (500, "rollup_error", "retry"),
    (503, "", "retry"), (302, "", "permanent"),
])
@pytest.mark.django_db
def test_slack_answers_are_classified_permanent_or_retry(receiver, status, body, outcome):
    receiver.script.append(Behaviour(status=status, body=body))
    result = send(make_notification("slack", {"url": receiver.url("/slack")}))
    assert (result.outcome, result.status_code) == (outcome, status)
    assert f"Slack answered HTTP {status}" in result.error
    assert body in result.error


@pytest.mark.django_db
def test_slack_webhook_url_is_not_in_the_stored_request(receiver):
    n = make_notification("slack", {"url": receiver.url("/services/T0AAA/B0BBB/s3cr3tT0k3n")})
    record = transports.get("slack").prepare(n).record
    assert "s3cr3tT0k3n" not in json.dumps(record)
    assert record["url"].startswith(f"http://127.0.0.1:{receiver.port}/services/")


@pytest.mark.django_db
def test_unreachable_host_is_retried():
    port = free_port()  # a port nobody listens on
    result = send(make_notification("slack", {"url": f"http://127.0.0.1:{port}/slack"}))
    assert result.outcome == "retry" and "cannot reach Slack" in result.error


@pytest.mark.django_db
def test_missing_url_is_a_permanent_configuration_error(receiver):
    result = send(make_notification("teams", {}))
    assert result.outcome == "permanent" and "url" in result.error
    assert receiver.requests == []


# --- Microsoft Teams ------------------------------------------------------------------------------

def assert_teams_message(message: dict) -> None:
    """Teams webhook message with one Adaptive Card attachment (adaptivecards.io schema 1.4)."""
    assert message["type"] == "message"
    (attachment,) = message["attachments"]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    assert attachment["contentUrl"] is None
    card = attachment["content"]
    assert card["$schema"] == "http://adaptivecards.io/schemas/adaptive-card.json"
    assert card["type"] == "AdaptiveCard" and card["version"] == "1.4"
    for element in card["body"]:
        assert element["type"] in {"TextBlock", "FactSet"}
        if element["type"] == "TextBlock":
            assert isinstance(element["text"], str) and element["text"]
        else:
            assert element["facts"]
            assert all(set(f) == {"title", "value"} and all(isinstance(v, str) for v in f.values())
                       for f in element["facts"])
    for action in card.get("actions", []):
        assert action["type"] == "Action.OpenUrl" and action["url"].startswith("http") and action["title"]
    assert len(json.dumps(message).encode()) < 28 * 1024  # Teams' message size limit


@pytest.mark.django_db
def test_teams_message_is_an_adaptive_card_with_facts_and_link(receiver):
    payload = sample_payload(200, summary="s" * 5000)
    n = make_notification("teams", {"url": receiver.url("/teams/workflows/abc")}, payload=payload)
    assert send(n).ok
    message = receiver.requests[0].json()
    assert_teams_message(message)
    card = message["attachments"][0]["content"]
    assert card["body"][0]["text"].startswith("[FIRING:200]")
    assert card["body"][0]["color"] == "attention"
    facts = next(e for e in card["body"] if e["type"] == "FactSet")["facts"]
    assert facts[0]["title"] == "GpuOverTemp GPU-3f2a9c1e-0000"
    assert card["body"][-1]["text"] == f"…and {200 - len(facts)} more"
    assert card["actions"][0]["url"] == payload["url"]


@pytest.mark.django_db
def test_teams_rate_limit_reported_inside_a_200_is_retried(receiver):
    receiver.script.append(Behaviour(status=200, body="Microsoft Teams endpoint returned HTTP error 429"))
    result = send(make_notification("teams", {"url": receiver.url("/teams")}))
    assert result.outcome == "retry"


# --- PagerDuty ------------------------------------------------------------------------------------

PD_SEVERITIES = {"critical", "error", "warning", "info"}


def assert_pagerduty_trigger(event: dict) -> None:
    """Events API v2 trigger (developer.pagerduty.com/docs/events-api-v2/trigger-events)."""
    assert set(event) <= {"routing_key", "event_action", "dedup_key", "payload", "images", "links", "client",
                          "client_url"}
    assert isinstance(event["routing_key"], str) and len(event["routing_key"]) == 32
    assert event["event_action"] == "trigger"
    assert isinstance(event["dedup_key"], str) and 0 < len(event["dedup_key"]) <= 255
    p = event["payload"]
    assert {"summary", "source", "severity"} <= set(p)
    assert set(p) <= {"summary", "source", "severity", "timestamp", "component", "group", "class", "custom_details"}
    assert isinstance(p["summary"], str) and 0 < len(p["summary"]) <= 1024
    assert isinstance(p["source"], str) and p["source"]
    assert p["severity"] in PD_SEVERITIES
    if "timestamp" in p:
        assert datetime.fromisoformat(p["timestamp"]).tzinfo is not None
    assert all(isinstance(p[k], str) for k in ("component", "group", "class") if k in p)
    assert isinstance(p.get("custom_details", {}), dict)
    for link in event.get("links", []):
        assert set(link) == {"href", "text"} and link["href"].startswith("http")
    assert isinstance(event.get("client", ""), str) and isinstance(event.get("client_url", ""), str)


@pytest.mark.django_db
def test_pagerduty_trigger_matches_events_api_v2(receiver):
    payload = sample_payload(3, title="T" * 2000)
    n = make_notification("pagerduty", {"url": receiver.url("/pagerduty")}, secret=ROUTING_KEY, payload=payload)

    result = send(n)

    assert result.ok and result.status_code == 202
    event = receiver.requests[0].json()
    assert_pagerduty_trigger(event)
    assert event["routing_key"] == ROUTING_KEY and event["dedup_key"] == DEDUP
    p = event["payload"]
    assert len(p["summary"]) == 1024 and p["summary"].endswith("…")
    assert (p["severity"], p["source"], p["group"], p["class"]) == ("critical", "r12", "r12", "GpuOverTemp")
    assert p["timestamp"] == payload["alerts"][-1]["starts_at"]  # the earliest start
    assert p["custom_details"]["firing"] == 3
    assert event["links"][0] == {"href": payload["url"], "text": "Open in Breakwater"}
    assert event["client"] == "Breakwater"
    assert receiver.incidents == {DEDUP: "trigger"}


@pytest.mark.parametrize("event", ["acknowledge", "resolve"])
@pytest.mark.django_db
def test_pagerduty_acknowledge_and_resolve_carry_only_the_dedup_key(receiver, event):
    n = make_notification("pagerduty", {"url": receiver.url("/pagerduty")}, secret=ROUTING_KEY, event=event)
    assert send(n).ok
    assert receiver.requests[0].json() == {"routing_key": ROUTING_KEY, "event_action": event, "dedup_key": DEDUP}
    assert receiver.incidents == {DEDUP: event}


@pytest.mark.parametrize(("severities", "expected"), [
    (["warning", "critical", "info"], "critical"), (["info", "warning"], "warning"), (["info"], "info"),
])
@pytest.mark.django_db
def test_pagerduty_severity_is_the_highest_among_open_alerts(receiver, severities, expected):
    payload = sample_payload(0)
    payload["alerts"] = [sample_alert(i, severity=s) for i, s in enumerate(severities)]
    n = make_notification("pagerduty", {"url": receiver.url("/pagerduty")}, secret=ROUTING_KEY, payload=payload)
    assert send(n).ok
    assert receiver.requests[0].json()["payload"]["severity"] == expected


@pytest.mark.django_db
def test_pagerduty_default_url_is_the_events_api():
    n = make_notification("pagerduty", {}, secret=ROUTING_KEY)
    assert transports.get("pagerduty").prepare(n).request.url == "https://events.pagerduty.com/v2/enqueue"


@pytest.mark.django_db
def test_pagerduty_wrong_routing_key_length_fails_without_sending(receiver):
    n = make_notification("pagerduty", {"url": receiver.url("/pagerduty")}, secret="short")
    result = send(n)
    assert result.outcome == "permanent" and "32 characters" in result.error
    assert receiver.requests == []


@pytest.mark.django_db
def test_pagerduty_routing_key_is_not_in_the_stored_request(receiver):
    n = make_notification("pagerduty", {"url": receiver.url("/pagerduty")}, secret=ROUTING_KEY)
    record = transports.get("pagerduty").prepare(n).record
    assert ROUTING_KEY not in json.dumps(record)
    assert record["body"]["routing_key"] == "[redacted]"


@pytest.mark.django_db
def test_pagerduty_invalid_event_answer_is_permanent_and_named(receiver):
    body = json.dumps({"status": "invalid event", "message": "Event object is invalid",
                       "errors": ["'payload.severity' is invalid"]})
    receiver.script.append(Behaviour(status=400, body=body))
    result = send(make_notification("pagerduty", {"url": receiver.url("/pagerduty")}, secret=ROUTING_KEY))
    assert result.outcome == "permanent"
    assert result.error == ("PagerDuty answered HTTP 400: Event object is invalid - invalid event - "
                            "'payload.severity' is invalid")


# --- Opsgenie -------------------------------------------------------------------------------------

def assert_opsgenie_create(body: dict) -> None:
    """Create Alert request (docs.opsgenie.com/docs/alert-api#create-alert)."""
    assert set(body) <= {"message", "alias", "description", "responders", "visibleTo", "actions", "tags", "details",
                         "entity", "source", "priority", "user", "note"}
    assert isinstance(body["message"], str) and 0 < len(body["message"]) <= 130
    assert isinstance(body["alias"], str) and len(body["alias"]) <= 512
    assert isinstance(body["description"], str) and len(body["description"]) <= 15000
    assert isinstance(body["tags"], list) and len(body["tags"]) <= 20
    assert all(isinstance(t, str) and len(t) <= 50 for t in body["tags"])
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in body["details"].items())
    assert sum(len(k) + len(v) for k, v in body["details"].items()) <= 8000
    assert len(body["entity"]) <= 512 and len(body["source"]) <= 100
    assert body["priority"] in {"P1", "P2", "P3", "P4", "P5"}


@pytest.mark.django_db
def test_opsgenie_create_matches_the_alert_api(receiver):
    payload = sample_payload(400, title="M" * 300)
    payload["group_labels"] = {f"label{i}": "v" * 100 for i in range(200)}
    n = make_notification("opsgenie", {"url": receiver.url("/opsgenie")}, secret=GENIE_KEY, payload=payload)

    result = send(n)

    assert result.ok and result.status_code == 202
    req = receiver.requests[0]
    assert req.path == "/opsgenie/v2/alerts"
    assert req.headers["authorization"] == f"GenieKey {GENIE_KEY}"
    body = req.json()
    assert_opsgenie_create(body)
    assert body["alias"] == DEDUP and body["priority"] == "P1" and len(body["message"]) == 130
    assert body["entity"] == "r12" and body["source"] == "Breakwater"
    assert len(body["description"]) == 15000
    assert "breakwater" in body["tags"] and "alertname:GpuOverTemp" in body["tags"]
    assert body["details"]["url"] == payload["url"]


@pytest.mark.parametrize(("event", "verb"), [("acknowledge", "acknowledge"), ("resolve", "close")])
@pytest.mark.django_db
def test_opsgenie_acknowledge_and_close_address_the_alert_by_alias(receiver, event, verb):
    n = make_notification("opsgenie", {"url": receiver.url("/opsgenie")}, secret=GENIE_KEY, event=event)
    assert send(n).ok
    req = receiver.requests[0]
    assert req.path == f"/opsgenie/v2/alerts/{DEDUP}/{verb}?identifierType=alias"
    body = req.json()
    assert set(body) == {"source", "user", "note"} and len(body["user"]) <= 100 and len(body["note"]) <= 25000


@pytest.mark.parametrize(("severity", "priority"), [("critical", "P1"), ("warning", "P3"), ("info", "P5")])
@pytest.mark.django_db
def test_opsgenie_priority_follows_severity(receiver, severity, priority):
    payload = sample_payload(2, severity=severity)
    n = make_notification("opsgenie", {"url": receiver.url("/opsgenie")}, secret=GENIE_KEY, payload=payload)
    assert send(n).ok
    assert receiver.requests[0].json()["priority"] == priority


@pytest.mark.parametrize(("status", "outcome"), [(401, "permanent"), (403, "permanent"), (422, "permanent"),
                                                 (429, "retry"), (503, "retry")])
@pytest.mark.django_db
def test_opsgenie_refusals_are_classified(receiver, status, outcome):
    receiver.script.append(Behaviour(status=status, body='{"message": "Key format is not valid!", "took": 0.0}'))
    result = send(make_notification("opsgenie", {"url": receiver.url("/opsgenie")}, secret=GENIE_KEY))
    assert result.outcome == outcome
    assert "Key format is not valid!" in result.error


@pytest.mark.django_db
def test_opsgenie_key_is_not_in_the_stored_request():
    n = make_notification("opsgenie", {"url": "https://api.eu.opsgenie.com"}, secret=GENIE_KEY)
    outbound = transports.get("opsgenie").prepare(n)
    assert outbound.request.url == "https://api.eu.opsgenie.com/v2/alerts"
    assert GENIE_KEY not in json.dumps(outbound.record)
    assert outbound.record["headers"]["Authorization"] == "[redacted]"


# --- Signed webhook -------------------------------------------------------------------------------

@pytest.mark.django_db
def test_webhook_is_signed_and_verifies_with_the_receiver(receiver):
    n = make_notification("webhook", {"url": receiver.url("/hook")}, secret=receiver.secret)

    assert send(n).ok

    req = receiver.requests[0]
    assert req.signature_ok is True
    assert req.headers["x-breakwater-delivery"] == str(n.id)
    assert req.headers["x-breakwater-signature"].startswith("v1=")
    assert abs(int(req.headers["x-breakwater-timestamp"]) - req.at) < 5
    body = req.json()
    assert (body["delivery_id"], body["event"], body["dedup_key"]) == (n.id, "trigger", DEDUP)
    assert body["alerts"] == n.payload["alerts"] and body["title"] == n.payload["title"]


@pytest.mark.django_db
def test_webhook_signed_with_another_secret_does_not_verify(receiver):
    assert send(make_notification("webhook", {"url": receiver.url("/hook")}, secret="not-the-receivers")).ok
    assert receiver.requests[0].signature_ok is False


@pytest.mark.django_db
def test_webhook_without_secret_is_a_configuration_error(receiver):
    result = send(make_notification("webhook", {"url": receiver.url("/hook")}))
    assert result.outcome == "permanent" and "signing secret" in result.error
    assert receiver.requests == []


def _docs_verify():
    """The verification snippet operators copy from docs/alerting-channels.md, as a function."""
    text = (REPO / "docs" / "alerting-channels.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {}
    exec(compile(snippet, "alerting-channels.md", "exec"), namespace)  # noqa: S102 - our own docs
    return namespace["verify_breakwater_signature"]


@pytest.mark.django_db
def test_webhook_verification_snippet_in_the_docs_accepts_a_delivery_and_rejects_tampering(receiver):
    verify = _docs_verify()
    assert send(make_notification("webhook", {"url": receiver.url("/hook")}, secret="docs-secret")).ok
    req = receiver.requests[0]
    headers = {k.title(): v for k, v in req.headers.items()}

    assert verify("docs-secret", headers, req.body)
    assert not verify("docs-secret", headers, req.body.replace(b"GpuOverTemp", b"GpuUnderTemp"))
    assert not verify("other-secret", headers, req.body)
    stale = {**headers, "X-Breakwater-Timestamp": str(int(headers["X-Breakwater-Timestamp"]) - 3600)}
    assert not verify("docs-secret", stale, req.body)


# --- Email ----------------------------------------------------------------------------------------

def smtp_settings(server: SmtpServer):
    return override_settings(EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend", EMAIL_HOST=server.host,
                             EMAIL_PORT=server.port, EMAIL_USE_TLS=False, EMAIL_HOST_USER="",
                             EMAIL_HOST_PASSWORD="", DEFAULT_FROM_EMAIL="breakwater@example.com")


@pytest.mark.django_db
def test_email_sends_subject_text_and_html_to_every_recipient():
    payload = sample_payload(2)
    payload["alerts"][0]["annotations"]["summary"] = "<b>injected</b>"
    n = make_notification("email", {"to": ["oncall@example.com", "gpu-team@example.com"]}, payload=payload)
    with SmtpServer() as server, smtp_settings(server):
        result = send(n)

    assert result.ok and result.status_code == 250
    (received,) = server.messages
    assert received.mail_from == "breakwater@example.com"
    assert received.rcpt_to == ["oncall@example.com", "gpu-team@example.com"]
    message = received.message
    assert message["Subject"] == "[FIRING:2] GpuOverTemp on rack r12 (2 GPUs)"
    assert message["X-Breakwater-Delivery"] == str(n.id)
    text = message.get_body(("plain",)).get_content()
    html = message.get_body(("html",)).get_content()
    assert "GpuOverTemp GPU-3f2a9c1e-0001 (firing)" in text and payload["url"] in text
    assert "&lt;b&gt;injected&lt;/b&gt;" in html and "<b>injected</b>" not in html
    assert f'href="{payload["url"]}"' in html


@pytest.mark.django_db
def test_email_refused_recipient_is_permanent():
    n = make_notification("email", {"to": ["gone@example.com"]})
    with SmtpServer(refuse_rcpt={"gone@example.com": (550, "5.1.1 mailbox unavailable")}) as server, \
            smtp_settings(server):
        result = send(n)
    assert result.outcome == "permanent" and result.status_code == 550
    assert "mailbox unavailable" in result.error
    assert server.messages == []


@pytest.mark.django_db
def test_email_temporary_refusal_is_retried():
    n = make_notification("email", {"to": ["oncall@example.com"]})
    with SmtpServer(data_reply=(451, "4.3.0 try again later")) as server, smtp_settings(server):
        result = send(n)
    assert result.outcome == "retry" and result.status_code == 451


@pytest.mark.django_db
def test_email_unreachable_server_is_retried():
    port = free_port()
    n = make_notification("email", {"to": ["oncall@example.com"]})
    with override_settings(EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend", EMAIL_HOST="127.0.0.1",
                           EMAIL_PORT=port):
        result = send(n)
    assert result.outcome == "retry" and "cannot send email" in result.error


@pytest.mark.parametrize("config", [{}, {"to": []}, {"to": ["not-an-address"]}, {"to": [1]}])
@pytest.mark.django_db
def test_email_without_valid_recipients_is_a_configuration_error(config):
    result = send(make_notification("email", config))
    assert result.outcome == "permanent" and "to" in result.error
