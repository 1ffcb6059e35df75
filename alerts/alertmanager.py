"""Prometheus Alertmanager's webhook payload (version 4), validated and mapped onto Breakwater's labels.

Payload (Alertmanager docs, "webhook_config"): {version: "4", groupKey, truncatedAlerts, status, receiver,
groupLabels, commonLabels, commonAnnotations, externalURL, alerts: [{status, labels, annotations, startsAt,
endsAt, generatorURL, fingerprint}]}. Everything is checked before anything is written; the first problem is
raised as `PayloadError` naming its field path, e.g. ``alerts[2].labels.alertname: missing``.

Labels are kept as sent, plus the entity labels our routing, inhibition and pages use where the mapping is
obvious: `node` from node / Hostname (dcgm-exporter) / hostname / instance (without its port), `gpu` from the
GPU UUID (dcgm-exporter's `UUID`; its `gpu` label is the index, kept as `gpu_index`), `entity`, and a
`severity` normalised to critical / warning / info (the original kept as `source_severity`).
"""

from __future__ import annotations

from datetime import UTC, datetime

from alerts.lifecycle import Observation
from alerts.models import EntityKind

MAX_ALERTS = 5000
STATUSES = ("firing", "resolved")
NODE_LABELS = ("node", "Hostname", "hostname", "instance")
GPU_UUID_LABELS = ("UUID", "uuid", "gpu_uuid")
SEVERITY_MAP = {
    "critical": "critical", "page": "critical", "error": "critical", "high": "critical", "fatal": "critical",
    "emergency": "critical", "disaster": "critical",
    "warning": "warning", "warn": "warning", "medium": "warning", "average": "warning",
    "info": "info", "informational": "info", "low": "info", "none": "info", "notice": "info",
}
ZERO_TIME_YEAR = 1  # Go's zero time.Time ("0001-01-01T00:00:00Z") means "not set"


class PayloadError(ValueError):
    """A bad webhook payload: `path` is the field at fault, `message` what is wrong with it."""

    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}")
        self.path, self.message = path, message


def _strings(value, path: str, *, required: bool = False) -> dict[str, str]:
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise PayloadError(path, "missing" if value is None else "must be an object of strings")
    for k, v in value.items():
        if not isinstance(v, str):
            raise PayloadError(f"{path}.{k}", f"must be a string, got {type(v).__name__}")
    return value


def _time(value, path: str) -> datetime | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise PayloadError(path, "must be an RFC 3339 string")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise PayloadError(path, f"not an RFC 3339 time: {value[:40]!r}") from None
    if parsed.tzinfo is None:
        raise PayloadError(path, "must carry a UTC offset (e.g. 'Z')")
    if parsed.year == ZERO_TIME_YEAR:
        return None
    try:
        return parsed.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59:59-01:00 is past year 9999 once in UTC
        raise PayloadError(path, f"out of range: {value[:40]!r}") from None


def _check_envelope(payload) -> list:
    if not isinstance(payload, dict):
        raise PayloadError("(body)", "must be a JSON object")
    if payload.get("version") != "4":
        raise PayloadError("version", f"expected \"4\", got {payload.get('version')!r}")
    if "status" in payload and payload["status"] not in STATUSES:
        raise PayloadError("status", f"must be firing or resolved, got {payload['status']!r}")
    for key in ("receiver", "groupKey", "externalURL"):
        if key in payload and not isinstance(payload[key], str):
            raise PayloadError(key, "must be a string")
    for key in ("groupLabels", "commonLabels", "commonAnnotations"):
        _strings(payload.get(key), key)
    alerts = payload.get("alerts")
    if not isinstance(alerts, list):
        raise PayloadError("alerts", "missing" if alerts is None else "must be a list")
    if len(alerts) > MAX_ALERTS:
        raise PayloadError("alerts", f"{len(alerts)} alerts; at most {MAX_ALERTS} per request")
    return alerts


def _map_labels(labels: dict[str, str]) -> tuple[dict[str, str], str, str]:
    """(labels with our entity labels added, entity kind, entity key)."""
    out = dict(labels)
    uuid = next((labels[k] for k in GPU_UUID_LABELS if labels.get(k)), "")
    if uuid:
        if out.get("gpu") and out["gpu"] != uuid:
            out["gpu_index"] = out["gpu"]
        out["gpu"] = uuid
    elif out.get("gpu", "").isdigit():  # an index, not a GPU identity
        out["gpu_index"] = out.pop("gpu")
    node = next((labels[k] for k in NODE_LABELS if labels.get(k)), "")
    if node:
        out["node"] = _host(node)
    raw = labels.get("severity", "")
    out["severity"] = SEVERITY_MAP.get(raw.lower(), "warning")
    if raw and raw != out["severity"]:
        out["source_severity"] = raw
    kind, key = ((EntityKind.GPU, out["gpu"]) if out.get("gpu") else
                 (EntityKind.NODE, out["node"]) if out.get("node") else (EntityKind.EXTERNAL, ""))
    out.setdefault("entity", kind)
    return out, kind, key


def _host(instance: str) -> str:
    """'node-a:9400' -> 'node-a'; '[fe80::1]:9400' -> 'fe80::1'; a bare name or IPv6 address unchanged."""
    if instance.startswith("["):
        return instance[1:].split("]", 1)[0]
    host, sep, port = instance.rpartition(":")
    return host if sep and port.isdigit() and ":" not in host else instance


def _alert(raw, i: int, envelope: dict) -> tuple[str, Observation, datetime | None]:
    path = f"alerts[{i}]"
    if not isinstance(raw, dict):
        raise PayloadError(path, "must be an object")
    status = raw.get("status")
    if status not in STATUSES:
        raise PayloadError(f"{path}.status", "missing" if status is None else f"must be firing or resolved, "
                                                                             f"got {status!r}")
    labels = _strings(raw.get("labels"), f"{path}.labels", required=True)
    if not labels.get("alertname", "").strip():
        raise PayloadError(f"{path}.labels.alertname", "missing")
    annotations = {**_strings(envelope.get("commonAnnotations"), "commonAnnotations"),
                   **_strings(raw.get("annotations"), f"{path}.annotations")}
    starts_at = _time(raw.get("startsAt"), f"{path}.startsAt")
    ends_at = _time(raw.get("endsAt"), f"{path}.endsAt")
    for key in ("generatorURL", "fingerprint"):
        if key in raw and not isinstance(raw[key], str):
            raise PayloadError(f"{path}.{key}", "must be a string")
    if raw.get("generatorURL"):
        annotations["generator_url"] = raw["generatorURL"]
    if envelope.get("externalURL"):
        annotations["alertmanager_url"] = envelope["externalURL"]
    mapped, kind, key = _map_labels(labels)
    return status, Observation(mapped, annotations, kind, key, None, starts_at), ends_at


def parse_webhook(payload) -> tuple[list[Observation], list[tuple[dict, datetime | None]]]:
    """(observations of the firing alerts, [(labels, ends_at)] of the resolved ones); raises PayloadError."""
    alerts = _check_envelope(payload)
    firing, resolved = [], []
    for i, raw in enumerate(alerts):
        status, obs, ends_at = _alert(raw, i, payload)
        if status == "firing":
            firing.append(obs)
        else:
            resolved.append((obs.labels, ends_at))
    return firing, resolved
