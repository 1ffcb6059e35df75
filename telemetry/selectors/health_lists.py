"""The lists behind the fleet page's health tiles: every GPU, node or rack in one state, with why.

Each list is read from the same rules (`telemetry.health`) as the tile that links to it, so a tile's count and its
list's length are one number. Rows name their entity (uuid, hostname, rack); the page links them.
"""

from __future__ import annotations

from datetime import datetime

from telemetry import health
from telemetry.health import health_fields
from telemetry.models import Gpu, HealthState, Node, Port, Rack

KINDS = ("gpus", "nodes", "racks")


def gpus_in_state(state: str, now: datetime) -> tuple[list[dict], int]:
    states = {gid: h for gid, h in health.gpu_health(now=now).items() if h.state == state}
    gpus = Gpu.objects.filter(id__in=list(states)).select_related("node").order_by("node__hostname", "index")
    return [{"name": f"{g.node.hostname} GPU {g.index}", "uuid": g.uuid, "host": g.node.hostname,
             "since": states[g.id].since, **health_fields(states[g.id])} for g in gpus], len(states)


def nodes_in_state(state: str, now: datetime) -> tuple[list[dict], int]:
    states = {nid: h for nid, h in health.node_health(now=now).items() if h.state == state}
    nodes = Node.objects.filter(id__in=list(states)).order_by("hostname")
    return [{"name": n.hostname, "host": n.hostname, "since": states[n.id].since, **health_fields(states[n.id])}
            for n in nodes], len(states)


def racks_in_state(state: str, now: datetime) -> tuple[list[dict], int]:
    node_states = health.node_health(now=now)
    by_rack: dict[int, list[str]] = {}
    for node_id, rack_id in Node.objects.filter(rack__isnull=False).values_list("id", "rack_id"):
        by_rack.setdefault(rack_id, []).append(node_states[node_id].state)
    ids = [r for r, states in by_rack.items() if health.rack_state_from(states) == state]
    rows = []
    for rack in Rack.objects.filter(id__in=ids).select_related("row").order_by("row__name", "name"):
        states = by_rack[rack.id]
        bad = sum(s not in ("ok", "drained") for s in states)
        rows.append({"name": rack.name, "since": None, "health": state, "health_label": HealthState(state).label,
                     "health_colour": HealthState.colour(state),
                     "health_detail": f"{bad} of {len(states)} nodes not ok" if bad else ""})
    return rows, len(ids)


IN_STATE = {"gpus": gpus_in_state, "nodes": nodes_in_state, "racks": racks_in_state}


def ports_not_ok(now: datetime) -> list[dict]:
    """Every fabric port whose state is not OK, worst first."""
    bad = health.port_health(now=now, not_ok=True)
    ports = Port.objects.filter(id__in=list(bad)).select_related("node", "switch")
    return sorted(({"name": str(p), "port_id": p.id, "since": bad[p.id].since, **health_fields(bad[p.id])}
                   for p in ports), key=lambda r: (health.RANK[r["health"]], r["name"]))
