"""An action's evidence as an operator reads it: one timeline, and the target's metrics around the fault.

The timeline merges, oldest first, what happened to the target and to the action:
- the alert that asked for it (fired, acknowledged, resolved, notified…, from its events);
- GPU fault events on the target's GPUs, each XID with its catalogue meaning;
- anomalies on the target's GPUs or host;
- the action itself: proposed, approved or blocked, rejected, started, succeeded or failed, verified (from the
  audit log, which records each of them before and after it happens).
The charts read the same series as the GPU and node pages (`telemetry.series.series`), over a window from an
hour before the first sign of trouble to the action's end (or now).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from alerts.models import AlertEvent, RemediationAction
from alerts.remediation.guards import resolve_target
from anomaly.models import Anomaly
from core.models import AuditEntry
from telemetry.models import Gpu, GpuEvent, GpuEventKind
from telemetry.selectors.fleet import gpu_events
from telemetry.series import series
from telemetry.xid import describe

LOOKBACK = timedelta(hours=6)  # faults this long before the action still explain it
CHART_BEFORE = timedelta(hours=1)
CHART_AFTER = timedelta(minutes=15)
CHART_FIELDS = ("gpu_temp", "gpu_util", "power_w")
MAX_CHART_GPUS = 8


@dataclass(frozen=True)
class Entry:
    """One line of the timeline: when, what kind of thing (alert, fault, anomaly, action), and what."""

    time: datetime
    source: str
    title: str
    detail: str = ""
    tone: str = "info"  # info, warn, bad, good: the dot's colour


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def gpus_of(action: RemediationAction) -> list[Gpu]:
    """The GPUs the action's target holds: the GPU, or every GPU of the node; none for a job."""
    target = resolve_target(action.kind, action.target_key)
    if target.gpu is not None:
        return [target.gpu]
    return list(target.node.gpus.order_by("index")) if target.node else []


def _anchor(action: RemediationAction) -> datetime:
    return min(action.alert.starts_at, action.created_at) if action.alert_id else action.created_at


def timeline(action: RemediationAction, *, now: datetime | None = None) -> list[Entry]:
    """Everything in the module docstring's list, oldest first."""
    now = now or timezone.now()
    start, end = _anchor(action) - LOOKBACK, action.finished_at or now
    gpus = gpus_of(action)
    entries = [*_alert_entries(action), *_fault_entries(gpus, start, end),
               *_anomaly_entries(action, gpus, start, end), *_action_entries(action)]
    return sorted(entries, key=lambda e: e.time)


def _alert_entries(action: RemediationAction) -> list[Entry]:
    if not action.alert_id:
        return []
    alert = action.alert
    return [Entry(e.time, "alert", f"Alert {alert.name} {e.get_kind_display().lower()}",
                  " — ".join(x for x in (f"by {e.actor}" if e.actor else "", e.note) if x),
                  "bad" if e.kind == "fired" else "good" if e.kind == "resolved" else "info")
            for e in AlertEvent.objects.filter(alert=alert).order_by("time", "id")]


def _fault_entries(gpus: list[Gpu], start: datetime, end: datetime) -> list[Entry]:
    """Faults of the GPUs that were open at some point of [start, end], with the catalogue's meaning."""
    out = []
    for gpu in gpus:
        for ev in gpu_events(gpu_uuid=gpu.uuid, limit=50):
            first, last = datetime.fromisoformat(ev["first_seen"]), datetime.fromisoformat(ev["last_seen"])
            if last < start or first > end:
                continue
            kind = dict(GpuEventKind.choices)[ev["kind"]]
            what = f"XID {ev['code']} ({describe(ev['code']).name})" if ev["kind"] == GpuEventKind.XID else kind
            seen = f"seen {ev['count']}× until {_iso(last)} UTC" if ev["count"] > 1 else ""
            cleared = f"cleared {ev['cleared_at'][:19].replace('T', ' ')} UTC" if ev["cleared_at"] else ""
            parts = (ev["meaning"], f"recommended: {ev['action'].replace('_', ' ')}", seen, cleared)
            detail = ". ".join(x.rstrip(".") for x in parts if x) + "."
            out.append(Entry(first, "fault", f"{what} on GPU {gpu.index} of {ev['host']}", detail,
                             "bad" if ev["severity"] == "critical" else "warn"))
    return out


def _anomaly_entries(action: RemediationAction, gpus: list[Gpu], start: datetime, end: datetime) -> list[Entry]:
    target = resolve_target(action.kind, action.target_key)
    where = Q(entity_kind="gpu", entity_id__in=[g.uuid for g in gpus])
    if target.node is not None:
        where |= Q(host=target.node.hostname)
    if target.kind == "job":
        where = Q(entity_kind__in=("job", "rank"), entity_id__startswith=target.key)
    rows = Anomaly.objects.filter(where, started_at__gte=start, started_at__lte=end).order_by("started_at")[:50]
    return [Entry(a.started_at, "anomaly", f"Anomaly: {a.summary or a.get_kind_display()}",
                  f"{a.entity_kind} {a.entity_id}, score {a.score:.2f}", "warn") for a in rows]


def _action_entries(action: RemediationAction) -> list[Entry]:
    audit = list(AuditEntry.objects.filter(object_kind="action", object_id=str(action.pk)).order_by("time", "id"))
    out = [_audit_entry(action, e) for e in audit]
    if not any(e.verb == "action.request" for e in audit):
        out.append(Entry(action.created_at, "action", f"{action.get_kind_display()} of {action.target_key} proposed",
                         f"by {action.requested_by}: {action.reason}"))
    return out


def _audit_entry(action: RemediationAction, e: AuditEntry) -> Entry:
    what = f"{action.get_kind_display()} of {action.target_key}"
    why = f": {e.reason}" if e.reason else ""
    if e.verb == "action.request":
        return Entry(e.time, "action", f"{what} proposed ({e.outcome})", f"by {e.actor}{why}",
                     "warn" if e.outcome == "blocked" else "info")
    if e.verb == "action.approve":
        if e.outcome == "blocked":
            return Entry(e.time, "action", f"Approval by {e.actor} refused by a guard rail", e.reason, "bad")
        return Entry(e.time, "action", f"Approved by {e.actor}", "", "good")
    if e.verb == "action.reject":
        return Entry(e.time, "action", f"Rejected by {e.actor}", e.reason)
    if e.verb == "action.execute":
        backend = e.detail.get("backend") if isinstance(e.detail, dict) else None
        via = f" via {backend}" if backend else ""
        tone = {"failed": "bad", "succeeded": "good", "blocked": "bad"}.get(e.outcome, "info")
        return Entry(e.time, "action", f"Run {e.outcome}{via}", e.reason, tone)
    if e.verb == "action.verify":
        return Entry(e.time, "action", f"Verification: {e.outcome}", "",
                     "good" if e.outcome == "verified" else "bad" if e.outcome == "not verified" else "info")
    return Entry(e.time, "action", f"{e.verb} by {e.actor}", e.reason)


def chart_window(action: RemediationAction, now: datetime | None = None) -> tuple[datetime, datetime]:
    """From an hour before the first sign of trouble (the alert, else the earliest fault) to the end, or now."""
    now = now or timezone.now()
    gpus = gpus_of(action)
    first = _anchor(action)
    if gpus:
        fault = (GpuEvent.objects.filter(gpu__in=gpus, last_seen__gte=first - LOOKBACK, first_seen__lte=first)
                 .order_by("first_seen").values_list("first_seen", flat=True).first())
        first = min(first, fault) if fault else first
    end = min(now, (action.finished_at or now) + CHART_AFTER)
    return first - CHART_BEFORE, max(end, first + timedelta(minutes=1))


def charts(action: RemediationAction, *, now: datetime | None = None) -> list[dict]:
    """Per field, one series per relevant GPU: those with a fault in the window, else all of the target's.

    Each chart: {field, unit, start, end, lines: [{label, url, points: [(time, value or None)]}]}; a GPU
    with no data in the window has no line.
    """
    gpus = gpus_of(action)
    start, end = chart_window(action, now)
    faulty = set(GpuEvent.objects.filter(gpu__in=gpus, last_seen__gte=start, first_seen__lte=end)
                 .values_list("gpu_id", flat=True))
    chosen = [g for g in gpus if g.pk in faulty] or gpus
    out = []
    for name in CHART_FIELDS:
        lines, unit = [], ""
        for gpu in chosen[:MAX_CHART_GPUS]:
            s = series("gpu", gpu.pk, name, start, end, max_points=300)
            unit = s.unit
            if any(v is not None for _, v in s.points):
                lines.append({"label": f"GPU {gpu.index}", "uuid": gpu.uuid, "points": s.points})
        out.append({"field": name, "unit": unit, "start": start, "end": end, "lines": lines})
    return out
