"""Drill-down pages: one GPU, one node, one fabric port, and the search box's results.

Each page renders its facts from the telemetry selectors; its plot is a Dash app
(`dashboard.dash_apps.inventory`) that reads the entity from the page URL, and `drilldown.js`
keeps the plot (and a GPU's fault events) live over `/ws/series/`.
"""

from __future__ import annotations

import math
from urllib.parse import urlencode

from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse

from dashboard.pages import anomalies  # a module import: anomalies imports this module too
from telemetry import selectors
from telemetry.models import GpuEventKind, HealthState
from tenancy.access import operator_required

# Okabe-Ito: told apart with every common colour-vision deficiency; the page writes the word too.
SEVERITY_COLOURS = {"info": "#0072b2", "warning": "#e69f00", "critical": "#d55e00"}
ACTION_LABELS = {
    "none": "No action needed", "restart_app": "Restart the application", "reset_gpu": "Reset the GPU",
    "drain_node": "Drain the node", "reboot_node": "Reboot the node", "rma": "Replace the GPU (RMA)",
}
SEARCH_GROUPS = (("node", "Nodes"), ("gpu", "GPUs"), ("job", "Jobs"), ("tenant", "Tenants"))
SEARCH_LIMIT = 50
SI_PREFIXES = ("", "k", "M", "G", "T", "P")
EVENTS_LIMIT = 50


# --- Formatting shared with drilldown.js (which renders pushed events the same way) -------------

def when(iso: str | None) -> str:
    """"2026-11-30 12:00:00 UTC" from a selector's ISO 8601 UTC string; "—" for None."""
    return "—" if not iso else f"{iso[:10]} {iso[11:19]} UTC"


def duration(seconds: float | None) -> str:
    """"45 s", "12 min", "3 h 5 min", "2 d 4 h"."""
    if seconds is None:
        return "—"
    minutes = int(seconds // 60)
    if minutes < 1:
        return f"{int(seconds)} s"
    if minutes < 120:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours < 48 else f"{hours // 24} d {hours % 24} h"


def value_text(value, unit: str) -> str:
    """A value with its unit as the tables show it; "—" where there is none yet."""
    if value is None:
        return "—"
    if unit == "bitmask":
        return f"0x{int(value):x}"
    if unit == "flag":
        return "yes" if value else "no"
    if unit in ("code", "state"):
        return str(int(value))
    v = float(value)
    if unit in ("B", "B/s") and abs(v) >= 1000:
        exp = min(int(math.log10(abs(v)) // 3), len(SI_PREFIXES) - 1)
        return f"{v / 1000 ** exp:.2f} {SI_PREFIXES[exp]}{unit}"
    if unit == "ratio":
        return f"{v:.3f}"
    if isinstance(value, int) or (v.is_integer() and abs(v) >= 1000):
        return f"{int(v):,} {unit}"
    return f"{v:,.{3 if abs(v) < 1 and v else 1}f} {unit}"


def event_rows(events: list[dict]) -> list[dict]:
    """`gpu_events` rows with their labels for display (the page and the live push share these)."""
    labels = dict(GpuEventKind.choices)
    return [
        {**e, "fault": f"XID {e['code']}" if e["kind"] == GpuEventKind.XID else labels.get(e["kind"], e["kind"]),
         "severity_colour": SEVERITY_COLOURS.get(e["severity"], SEVERITY_COLOURS["warning"]),
         "action_label": ACTION_LABELS.get(e["action"], e["action"]),
         "first_seen_text": when(e["first_seen"]), "last_seen_text": when(e["last_seen"])}
        for e in events
    ]


def _history_rows(history: list[dict]) -> list[dict]:
    return [{**h, "start_text": when(h["start"]), "end_text": "running" if h["open"] else when(h["end"]),
             "duration_text": duration(h["duration_s"])} for h in history]


def _job_url(key: str) -> str:
    return reverse("job", args=[key])


def _tenant_url(account: str) -> str:
    return f"{reverse('jobs')}?{urlencode({'account': account})}"


# --- Pages -------------------------------------------------------------------------------------

@operator_required
def gpu_detail(request, uuid: str):
    """One GPU: where it is, what it is, who holds it, every current value, a plot, faults, ledger."""
    gpu = selectors.gpu_detail(uuid)
    if gpu is None:
        raise Http404(f"No GPU with UUID {uuid}.")
    if gpu["uuid"] != uuid:  # "GPU-" left off: the plot reads the canonical UUID from the URL
        return redirect("gpu", uuid=gpu["uuid"])
    for row in gpu["latest"]:
        row["text"] = value_text(row["value"], row["unit"])
    for alloc in gpu["allocations"]:
        alloc["url"], alloc["tenant_url"] = _job_url(alloc["key"]), _tenant_url(alloc["tenant"] or "")
    return render(request, "gpu.html", {
        "gpu": gpu, "sample_time": when(gpu["sample_time"]), "health_label": HealthState(gpu["health"]).label,
        "events": event_rows(selectors.gpu_events(gpu_uuid=gpu["uuid"], limit=EVENTS_LIMIT)),
        "history": _history_rows(selectors.allocation_history(gpu_id=gpu["id"])),
        "anomalies": anomalies.gpu_section(gpu["uuid"]),
    })


@operator_required
def node_detail(request, hostname: str):
    """One node: location, its GPUs now, HCA ports, power, jobs, ledger and a plot across its GPUs."""
    node = selectors.node_detail(hostname)
    if node is None:
        raise Http404(f"No node named {hostname}.")
    for gpu in node["gpus"]:
        gpu["util_text"] = value_text(gpu["gpu_util"], "%")
        gpu["temp_text"] = value_text(gpu["gpu_temp"], "°C")
        gpu["power_text"] = value_text(gpu["power_w"], "W")
        gpu["health_label"] = HealthState(gpu["health"]).label
    return render(request, "node.html", {
        "node": node, "health_label": HealthState(node["health"]).label,
        "history": _history_rows(selectors.allocation_history(node_id=node["id"])),
        "anomalies": anomalies.node_section(node["hostname"]),
    })


@operator_required
def port_detail(request, port_id: int):
    """One fabric port: what and where it is, the port at the far end, current values and rates."""
    detail = selectors.port_detail(port_id)
    if detail is None:
        raise Http404(f"No port with id {port_id}.")
    rates = detail["rates"]["fields"]
    values = [
        {"name": name, "help": f["help"], "kind": f["kind"], "text": value_text(f["value"], f["unit"]),
         "rate": value_text(rates[name]["value"], rates[name]["unit"]) if name in rates else ""}
        for name, f in detail["latest"]["fields"].items()
    ]
    return render(request, "port.html", {
        "detail": detail, "port": detail["port"], "peer": detail["peer"], "values": values,
        "sample_time": when(detail["latest"]["time"]), "rate_bucket": when(detail["rates"]["bucket"]),
        "utilization": {k: value_text(v, "%") for k, v in detail["utilization"].items()},
        "anomalies": anomalies.port_section(port_id),
    })


@operator_required
def search(request):
    """Results grouped by kind; exactly one exact match goes straight to its page."""
    q = request.GET.get("q", "").strip()
    results = selectors.search(q, limit=SEARCH_LIMIT) if q else []
    for hit in results:
        hit["url"] = _hit_url(hit)
    exact = [hit for hit in results if hit["match"] == "exact"]
    if len(exact) == 1:
        return redirect(exact[0]["url"])
    groups = [{"kind": kind, "label": label, "hits": [h for h in results if h["kind"] == kind]}
              for kind, label in SEARCH_GROUPS]
    return render(request, "search.html", {
        "q": q, "results": results, "groups": [g for g in groups if g["hits"]], "limit": SEARCH_LIMIT,
    })


def _hit_url(hit: dict) -> str:
    if hit["kind"] == "tenant":
        return _tenant_url(hit["key"])
    if hit["kind"] == "job":
        return _job_url(hit["key"])
    return reverse(hit["kind"], args=[hit["key"]])
