"""Anomaly events in an operator's words: the one formatter every page, push and alert uses.

An event is stored as the detectors found it: an entity id (a GPU's UUID, a port's database id,
a rack's name, a job key), and per contribution the feature, its value and what it was compared
with (`expected`: the median of the peers, the gang, the GPU's own baseline, its cohort, or the
rack's cap), in the units the features are computed in. This module turns that into

    entity:  "GPU 7 of node-0227", "node-0227 mlx5_0/1 ↔ leaf-03 p12", "rack r01-01",
             "rank 5 of llm-pretrain (slurm:100)"
    reason:  "memory temperature 84.5 °C vs median of peers in node 71.0 °C (+6.2σ)"

naming a whole list's entities with one query per kind (`telemetry.selectors.names`). Values are
shown in the units an operator reads: per-minute counter rates as per second, byte rates as Gb/s,
activity ratios as %.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from anomaly import features as F
from anomaly.grouping import group_text
from anomaly.models import Anomaly, AnomalyKind
from core.time import iso_utc
from telemetry.fields import KINDS
from telemetry.selectors.names import gpu_name, gpu_names, job_names, port_names


@dataclass(frozen=True)
class Metric:
    """How one contribution's field is read: its name, the unit shown and the factor into it."""

    label: str
    unit: str
    scale: float = 1.0


# Feature units as computed (anomaly.features) -> (unit shown, factor).
_LEVELS = {"B/s": ("Gb/s", 8e-9), "MiB": ("GiB", 1 / 1024), "": ("%", 100.0), "share": ("% of the time", 100.0)}


def _feature_metric(kind: str, f: F.Feature) -> Metric:
    if f.how == "rate":  # deltas per minute of a counter: per second, in the counter's own noun
        noun = KINDS[kind].by_name[f.name].unit
        return Metric(f.label, f"{noun}/s", 1 / 60)
    if f.name == "xid_events":
        return Metric("XID events", "in the last hour")
    unit, scale = _LEVELS.get(f.unit, (f.unit, 1.0))
    return Metric(f.label, unit, scale)


METRICS: dict[str, Metric] = {
    **{f.name: _feature_metric("gpu", f) for f in F.GPU_FEATURES},
    **{f.name: _feature_metric("port", f) for f in F.PORT_FEATURES},
    "rack_power": Metric("rack power", "kW", 1e-3),
    "inlet_temp": Metric("inlet temperature", "°C"),
    "step_time_s": Metric("step time", "s"),
    "loss": Metric("loss", ""),
    "grad_norm": Metric("gradient norm", ""),
    "nan_count": Metric("NaN values", ""),
    "inf_count": Metric("Inf values", ""),
}


def number(x: float | None) -> str:
    """A value read at a glance: "82.1", "0.0123", "12,345", "—"."""
    if x is None or not isinstance(x, int | float) or not math.isfinite(x):
        return "—"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}" if abs(x) < 1 else f"{x:.4g}"


def format_value(field: str, value: float | None) -> str:
    """ "84.5 °C", "3.2 Gb/s", "0.05 errors/s"; a field this module does not know keeps its number."""
    metric = METRICS.get(field)
    if metric is None or value is None or not isinstance(value, int | float) or not math.isfinite(value):
        return number(value)
    text = number(value * metric.scale)
    if metric.unit.startswith("%"):  # "45%" and "12% of the time"; other units after a space ("84.5 °C")
        return f"{text}{metric.unit}"
    return f"{text} {metric.unit}".rstrip()


def _reference(basis: str) -> str:
    """What `expected` was for this basis: a peer group's median, else the basis itself."""
    if basis.startswith(("peers", "leaf uplinks", "ports on")):
        return f"median of {basis}"
    return basis or "expected"


def reason(c: dict) -> dict:
    """One contribution in words: metric, value and the peers' (or baseline's) value, with units."""
    field = c.get("field", "")
    metric = METRICS.get(field)
    label = metric.label if metric else (c.get("label") or field)
    value, dev = format_value(field, c.get("value")), c.get("deviation")
    basis = c.get("basis", "")
    text = f"{label} {value}"
    if c.get("expected") is not None:
        text += f" vs {_reference(basis)} {format_value(field, c.get('expected'))}"
    finite = isinstance(dev, int | float) and math.isfinite(dev)
    text += f" ({dev:+.1f}σ)" if finite else " (not finite)"
    return {"field": field, "metric": label, "unit": metric.unit if metric else "", "value_text": value,
            "expected_text": format_value(field, c.get("expected")) if c.get("expected") is not None else None,
            "basis": basis, "deviation": dev if finite else None, "text": text}


def _phrase(c: dict) -> str:
    """The stored summary's words for one contribution (`anomaly.findings.Contribution.phrase`)."""
    dev = c.get("deviation")
    if not isinstance(dev, int | float) or not math.isfinite(dev):
        return f"{c.get('label')} not finite"
    return f"{c.get('label')} {dev:+.1f}σ vs {c.get('basis')}"


def headline(summary: str, contributions: list) -> str:
    """The summary with each contribution's bare σ phrase replaced by its value, unit and peers'
    value; a detector's own sentence (rack power, failure risk, divergence) is kept as written."""
    cs = [c for c in contributions if isinstance(c, dict)]
    for n in range(min(len(cs), 3), 0, -1):
        stored = "; ".join(_phrase(c) for c in cs[:n])
        if summary.startswith(stored):
            return "; ".join(reason(c)["text"] for c in cs[:n]) + summary[len(stored):]
    return summary


def entity_url(entity_kind: str, entity_id: str) -> str | None:
    """The drill-down page of an anomaly's entity, where there is one."""
    if entity_kind == "gpu":
        return f"/gpus/{entity_id}/"
    if entity_kind == "port" and entity_id.isdigit():
        return f"/ports/{entity_id}/"
    if entity_kind in ("job", "rank"):
        return f"/jobs/{entity_id.split('#')[0]}/"
    if entity_kind == "rack":
        return f"/search/?q={entity_id}"
    return None


@dataclass(frozen=True)
class Names:
    """The names of a list's entities, looked up together."""

    gpus: dict[str, dict]
    ports: dict[int, dict]
    jobs: dict[str, str]

    @classmethod
    def of(cls, anomalies: Iterable[Anomaly]) -> Names:
        by_kind: dict[str, set[str]] = {}
        for a in anomalies:
            key = a.entity_id.split("#")[0] if a.entity_kind == "rank" else a.entity_id
            by_kind.setdefault("job" if a.entity_kind == "rank" else a.entity_kind, set()).add(key)
        ports = [int(i) for i in by_kind.get("port", ()) if i.isdigit()]
        return cls(gpu_names(by_kind.get("gpu", ())), port_names(ports), job_names(by_kind.get("job", ())))


def entity(a: Anomaly, names: Names) -> tuple[str, str, str]:
    """(what to call it, its host for grouping, a title with its stable id) for one event."""
    kind, eid = a.entity_kind, a.entity_id
    if kind == "gpu":
        gpu = names.gpus.get(eid)
        return (gpu["name"], gpu["host"], eid) if gpu else (gpu_name(None, a.host, eid), a.host, eid)
    if kind == "port":
        port = names.ports.get(int(eid)) if eid.isdigit() else None
        if port:
            return port["link"], port["host"], f"switch port {port['name']}"
        return (a.host.replace(":", " ") or "port (no longer in the inventory)"), "", "switch port"
    if kind == "rack":
        return f"rack {eid}", "", ""
    if kind == "rank" and "#" in eid:
        key, rank = eid.rsplit("#", 1)
        return f"rank {rank} of {names.jobs.get(key, key)}", a.host, eid
    if kind == "job":
        return names.jobs.get(eid, eid), a.host, eid
    return eid, a.host, ""


def row(a: Anomaly, names: Names) -> dict:
    """One event for display and for the JSON the live pages and alerts read."""
    text, host, title = entity(a, names)
    text += group_text(a.members or [])  # an event per cause: its worst entity, "(+36 more ports)"
    reasons = [reason(c) for c in a.contributions if isinstance(c, dict)]
    return {"id": a.pk, "kind": a.kind, "kind_label": AnomalyKind(a.kind).label, "entity_kind": a.entity_kind,
            "entity_id": a.entity_id, "entity_text": text, "entity_title": title, "label": text, "host": host,
            "member_count": a.member_count,
            "url": entity_url(a.entity_kind, a.entity_id), "score": round(a.score, 3),
            "last_score": round(a.last_score, 3), "summary": headline(a.summary, a.contributions),
            "reasons": reasons, "contributions": a.contributions, "started_at": iso_utc(a.started_at),
            "last_seen": iso_utc(a.last_seen), "ended_at": iso_utc(a.ended_at) if a.ended_at else None,
            "colour": AnomalyKind.colour(a.kind)}


def rows(anomalies: Iterable[Anomaly]) -> list[dict]:
    """Events for display, their entities named with one query per kind."""
    anomalies = list(anomalies)
    names = Names.of(anomalies)
    return [row(a, names) for a in anomalies]
