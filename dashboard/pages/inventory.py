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
from django.views.decorators.http import require_safe

from alerts.search import SEARCH_LIMIT, find_anything
from dashboard.pages import anomalies
from dashboard.pages.formatting import duration, when
from telemetry import selectors
from telemetry.models import GpuEventKind, HealthState, JobState
from telemetry.selectors.search import MAX_QUERY, clean_query
from tenancy.access import operator_required, tenant_member_required
from tenancy.scoping import is_operator

# Okabe-Ito: told apart with every common colour-vision deficiency; the page writes the word too.
SEVERITY_COLOURS = {"info": "#0072b2", "warning": "#e69f00", "critical": "#d55e00"}
ACTION_LABELS = {
    "none": "No action needed", "restart_app": "Restart the application", "reset_gpu": "Reset the GPU",
    "drain_node": "Drain the node", "reboot_node": "Reboot the node", "rma": "Replace the GPU (RMA)",
}
SI_PREFIXES = ("", "k", "M", "G", "T", "P")
EVENTS_LIMIT = 50
SEARCH_KINDS = {"tenant": "Tenants", "job": "Jobs", "node": "Nodes", "gpu": "GPUs", "alert": "Alerts", "rack": "Racks",
                "switch": "Switches", "port": "Fabric ports"}
# Kinds with a drill-down of their own: one exact hit among them opens it straight away.
OWN_PAGE = frozenset({"node", "gpu", "job", "port", "alert", "tenant"})


# --- Formatting shared with drilldown.js (which renders pushed events the same way; times in formatting) ---

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
        "gpu": gpu, "sample_time": when(gpu["sample_time"]),
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
    return render(request, "node.html", {
        "node": node,
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


@tenant_member_required
@require_safe
def search(request):
    """Find anything (alerts.search): results grouped by kind; one exact hit with a page of its own opens it.

    An operator searches the whole fleet; a tenant's user its own tenants' jobs, the GPUs and nodes they
    hold, its alerts, and reaches them on its portal. A query too long or holding control characters is
    a 400 that says why; a blank one shows how to search.
    """
    raw = request.GET.get("q", "")
    q = raw.strip()
    problem = search_problem(q)
    operator = is_operator(request.user)
    groups = [] if problem else find_anything(q, request.user, SEARCH_LIMIT)
    for group in groups:
        group["label"] = SEARCH_KINDS[group["kind"]]
        for hit in group["hits"]:
            hit.update(url=_hit_url(hit, operator), **_state_badge(hit))
    exact = [h for g in groups for h in g["hits"] if h["match"] == "exact"]
    if operator and len(exact) == 1 and exact[0]["kind"] in OWN_PAGE:
        return redirect(exact[0]["url"])
    return render(request, "search.html", {
        "q": q[:MAX_QUERY], "problem": problem, "groups": groups, "limit": SEARCH_LIMIT, "operator": operator,
        "total": sum(len(g["hits"]) for g in groups), "more": any(g["more"] for g in groups),
    }, status=400 if problem else 200)


def search_problem(q: str) -> str:
    """Why a query cannot be searched, or ""."""
    if len(q) > MAX_QUERY:
        return f"That query is {len(q):,} characters long; search takes up to {MAX_QUERY}."
    if clean_query(q) != q:
        return "That query holds control characters; type the name, id or text you are looking for."
    return ""


def _hit_url(hit: dict, operator: bool) -> str:
    """The hit's page: the drill-downs for operators, the tenant's portal for a tenant's user."""
    kind, key = hit["kind"], hit["key"]
    if kind == "tenant":
        return reverse("portal", args=[key])
    if not operator:
        slug = hit.get("tenant")
        page = {"job": "portal-jobs", "gpu": "portal-health", "node": "portal-health"}.get(kind, "portal")
        return reverse(page, args=[slug]) if slug else reverse("portal-home")
    if kind == "rack":
        return reverse("racks")
    if kind == "switch":  # no page of its own: its ports, each with theirs
        return f"{reverse('search')}?{urlencode({'q': f'{key}/'})}"
    if kind == "job":
        return _job_url(key)
    return reverse(kind, args=[int(key) if kind in ("port", "alert") else key])


def _state_badge(hit: dict) -> dict:
    """The hit's state as the pages write it, with its colour."""
    state = hit.get("state") or ""
    if hit["kind"] == "job":
        return {"state_label": JobState(state).label, "state_colour": JobState.colour(state)}
    if hit["kind"] == "alert":
        label = f"{hit['severity']} · {state}" if state != "resolved" else state
        colour = SEVERITY_COLOURS.get(hit["severity"], "#6c7a89") if state != "resolved" else "#6c7a89"
        return {"state_label": label.capitalize(), "state_colour": colour}
    if hit["kind"] == "tenant":
        return {"state_label": state.capitalize(), "state_colour": "#2e9d5b" if state == "running" else "#6c7a89"}
    # Hardware: the health model's state, marked as every page marks it (`data-health`).
    return {"state_label": HealthState(state).label, "state_colour": HealthState.colour(state), "health": state}
