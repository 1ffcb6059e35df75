"""The lists behind the fleet page's health tiles: every GPU, node or rack in one state, with why.

Each list is read from the same rules (`telemetry.health`) as the tile that links to it, so a tile's
count and its list's length are one number.
"""

from __future__ import annotations

from django.http import Http404
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from telemetry import health
from telemetry.health import health_fields
from telemetry.models import Gpu, HealthState, Node, Rack
from tenancy.access import operator_required

KINDS = ("gpus", "nodes", "racks")
LIMIT = 500


def _gpu_rows(state: str, now) -> list[dict]:
    states = {gid: h for gid, h in health.gpu_health(now=now).items() if h.state == state}
    gpus = Gpu.objects.filter(id__in=list(states)).select_related("node").order_by("node__hostname", "index")
    return [{"name": f"{g.node.hostname} GPU {g.index}", "url": reverse("gpu", args=[g.uuid]),
             "host": g.node.hostname, "host_url": reverse("node", args=[g.node.hostname]),
             "since": states[g.id].since, **health_fields(states[g.id])} for g in gpus], len(states)


def _node_rows(state: str, now) -> list[dict]:
    states = {nid: h for nid, h in health.node_health(now=now).items() if h.state == state}
    nodes = Node.objects.filter(id__in=list(states)).order_by("hostname")
    return [{"name": n.hostname, "url": reverse("node", args=[n.hostname]), "since": states[n.id].since,
             **health_fields(states[n.id])} for n in nodes], len(states)


def _rack_rows(state: str, now) -> list[dict]:
    node_states = health.node_health(now=now)
    by_rack: dict[int, list[str]] = {}
    for node_id, rack_id in Node.objects.filter(rack__isnull=False).values_list("id", "rack_id"):
        by_rack.setdefault(rack_id, []).append(node_states[node_id].state)
    ids = [r for r, states in by_rack.items() if health.rack_state_from(states) == state]
    rows = []
    for rack in Rack.objects.filter(id__in=ids).select_related("row").order_by("row__name", "name"):
        states = by_rack[rack.id]
        bad = sum(s not in ("ok", "drained") for s in states)
        rows.append({"name": rack.name, "url": reverse("racks"), "since": None, "health": state,
                     "health_label": HealthState(state).label, "health_colour": HealthState.colour(state),
                     "health_detail": f"{bad} of {len(states)} nodes not ok" if bad else ""})
    return rows, len(ids)


@operator_required
def health_list(request, kind: str, state: str):
    """Every GPU, node or rack in `state`, worst reason first."""
    if kind not in KINDS or state not in health.ORDER:
        raise Http404(f"No list of {kind} in state {state}.")
    now = timezone.now()
    rows, total = {"gpus": _gpu_rows, "nodes": _node_rows, "racks": _rack_rows}[kind](state, now)
    return render(request, "health.html", {
        "kind": kind, "state": state, "label": HealthState(state).label, "rows": rows[:LIMIT], "total": total,
        "limit": LIMIT, "states": [(s, HealthState(s).label) for s in health.ORDER], "kinds": KINDS,
    })
