"""The Alertmanager webhook receiver: v4 payloads become alerts (fire, merge, resolve), labels map onto our
entity labels, collector-token auth, and every bad field is a 400 naming it with nothing written."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime

import pytest

from alerts.models import Alert, AlertEvent, AlertSource, AlertState
from telemetry.actions import do_create_collector_token

pytestmark = pytest.mark.django_db
URL = "/api/v1/alerts/alertmanager"
STARTS = "2025-06-01T11:58:03.123456789Z"  # in the past: an end time ahead of the clock is capped


@pytest.fixture
def token():
    return do_create_collector_token("alertmanager")


@pytest.fixture
def post(client, token):
    def _post(body, *, auth: str | None = "token"):
        data = body if isinstance(body, (str, bytes)) else json.dumps(body)
        extra = {"HTTP_AUTHORIZATION": f"Bearer {token}" if auth == "token" else auth} if auth else {}
        return client.post(URL, data=data, content_type="application/json", **extra)

    return _post


def _alert(status: str = "firing", **labels) -> dict:
    """One alert as dcgm-exporter's metrics label it after Prometheus (gpu is the index, UUID the identity)."""
    base = {"alertname": "GpuXid", "severity": "page", "Hostname": "node-a", "UUID": "GPU-1", "gpu": "0",
            "instance": "10.0.0.5:9400", "job": "dcgm"}
    return {"status": status, "labels": {**base, **labels}, "annotations": {"description": "XID 79"},
            "startsAt": STARTS, "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2025-06-01T11:59:00Z",
            "generatorURL": "http://prometheus:9090/graph?g0.expr=DCGM_FI_DEV_XID_ERRORS", "fingerprint": "abc123"}


def _payload(*alerts: dict, status: str = "firing") -> dict:
    return {"version": "4", "groupKey": '{}:{alertname="GpuXid"}', "truncatedAlerts": 0, "status": status,
            "receiver": "breakwater", "groupLabels": {"alertname": "GpuXid"}, "commonLabels": {"job": "dcgm"},
            "commonAnnotations": {"runbook": "https://wiki/xid"}, "externalURL": "http://alertmanager:9093",
            "alerts": list(alerts)}


def test_firing_alerts_become_alertmanager_alerts_with_entity_labels(post):
    resp = post(_payload(_alert(), _alert(alertname="NodeHot", UUID="", gpu="", Hostname="")))
    assert resp.status_code == 200, resp.content
    assert resp.json()["received"] == 2 and len(resp.json()["changed"]) == 2
    gpu_alert = Alert.objects.get(name="GpuXid")
    assert gpu_alert.source == AlertSource.ALERTMANAGER and gpu_alert.rule is None
    assert gpu_alert.labels["gpu"] == "GPU-1" and gpu_alert.labels["gpu_index"] == "0"
    assert (gpu_alert.labels["node"], gpu_alert.labels["entity"]) == ("node-a", "gpu")
    assert (gpu_alert.labels["severity"], gpu_alert.labels["source_severity"], gpu_alert.severity) == (
        "critical", "page", "critical")
    assert (gpu_alert.entity_kind, gpu_alert.entity_key) == ("gpu", "GPU-1")
    assert gpu_alert.starts_at == datetime(2025, 6, 1, 11, 58, 3, 123456, tzinfo=UTC)
    assert gpu_alert.annotations["runbook"] == "https://wiki/xid" and gpu_alert.annotations["description"] == "XID 79"
    assert gpu_alert.annotations["generator_url"].startswith("http://prometheus:9090/")
    node_alert = Alert.objects.get(name="NodeHot")  # no Hostname: the instance, without its port
    assert (node_alert.labels["node"], node_alert.entity_kind, node_alert.entity_key) == ("10.0.0.5", "node",
                                                                                          "10.0.0.5")


def test_resent_alert_merges_and_resolved_alert_resolves(post):
    post(_payload(_alert()))
    post(_payload(_alert()))  # Alertmanager re-sends a firing group on its repeat interval
    alert = Alert.objects.get()
    assert alert.state == AlertState.FIRING
    resp = post(_payload(_alert("resolved"), status="resolved"))
    assert resp.json()["changed"] == [alert.pk]
    alert.refresh_from_db()
    assert alert.state == AlertState.RESOLVED
    assert alert.ends_at == datetime(2025, 6, 1, 11, 59, tzinfo=UTC)
    assert list(AlertEvent.objects.filter(alert=alert).values_list("kind", "actor")) == [
        ("fired", "system:alertmanager"), ("resolved", "system:alertmanager")]
    post(_payload(_alert()))  # firing again later: a new alert
    assert Alert.objects.filter(state=AlertState.FIRING).exclude(pk=alert.pk).count() == 1


def test_missing_token_is_401_and_bad_token_403(post):
    resp = post(_payload(_alert()), auth=None)
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "not_authenticated"
    assert resp["WWW-Authenticate"].startswith("Bearer")
    resp = post(_payload(_alert()), auth="Bearer not-a-token")
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "bad_token"
    assert not Alert.objects.exists()


def test_get_is_405(client):
    assert client.get(URL).status_code == 405


def _set(path: list, value):
    """A mutator of a good payload: set (or, with value=DELETE, remove) the item at `path`."""
    def mutate(doc: dict) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        if value is DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = value
    return mutate


DELETE = object()
BAD_FIELDS = [
    (_set(["version"], DELETE), "version"),
    (_set(["version"], "3"), "version"),
    (_set(["status"], "pending"), "status"),
    (_set(["alerts"], DELETE), "alerts"),
    (_set(["alerts"], {"a": 1}), "alerts"),
    (_set(["commonLabels", "job"], 5), "commonLabels.job"),
    (_set(["commonAnnotations"], ["x"]), "commonAnnotations"),
    (_set(["externalURL"], 7), "externalURL"),
    (_set(["alerts", 2], "firing"), "alerts[2]"),
    (_set(["alerts", 2, "status"], DELETE), "alerts[2].status"),
    (_set(["alerts", 2, "status"], "pending"), "alerts[2].status"),
    (_set(["alerts", 2, "labels"], DELETE), "alerts[2].labels"),
    (_set(["alerts", 2, "labels", "alertname"], DELETE), "alerts[2].labels.alertname"),
    (_set(["alerts", 2, "labels", "alertname"], " "), "alerts[2].labels.alertname"),
    (_set(["alerts", 2, "labels", "gpu"], 0), "alerts[2].labels.gpu"),
    (_set(["alerts", 2, "annotations"], "text"), "alerts[2].annotations"),
    (_set(["alerts", 2, "annotations", "summary"], None), "alerts[2].annotations.summary"),
    (_set(["alerts", 2, "startsAt"], "yesterday"), "alerts[2].startsAt"),
    (_set(["alerts", 2, "startsAt"], 1700000000), "alerts[2].startsAt"),
    (_set(["alerts", 2, "endsAt"], "2026-11-30T12:00:00"), "alerts[2].endsAt"),
    (_set(["alerts", 2, "endsAt"], "9999-12-31T23:59:59-01:00"), "alerts[2].endsAt"),  # past year 9999 in UTC
    (_set(["alerts", 2, "generatorURL"], 1), "alerts[2].generatorURL"),
    (_set(["alerts", 2, "fingerprint"], []), "alerts[2].fingerprint"),
]


@pytest.mark.parametrize(("mutate", "where"), BAD_FIELDS, ids=[w for _, w in BAD_FIELDS])
def test_bad_field_is_400_naming_it_and_nothing_is_written(post, mutate, where):
    body = _payload(_alert(), _alert(UUID="GPU-2"), _alert(UUID="GPU-3"))
    doc = copy.deepcopy(body)
    mutate(doc)
    resp = post(doc)
    assert resp.status_code == 400, resp.content
    error = resp.json()["error"]
    assert error["code"] == "bad_payload" and error["where"] == where
    assert error["message"].startswith(f"{where}: ")
    assert not Alert.objects.exists()


def test_bad_json_and_non_object_body_are_400(post):
    resp = post("{not json")
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "malformed"
    resp = post([1, 2])
    assert resp.status_code == 400 and resp.json()["error"]["message"] == "(body): must be a JSON object"
    assert not Alert.objects.exists()
