"""Read API for the one health model (operators and operator tokens: hardware state is cluster-wide)."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.utils import timezone

from core.api import ApiError, ErrorCode, api_view
from telemetry import health
from telemetry.models import Gpu, Node, Port

LIMIT = 1000


@api_view(operator=True)
def fleet_health(request: HttpRequest) -> JsonResponse:
    """GET /api/v1/health[?kind=gpus|nodes|ports&state=failed] — counts per state for GPUs, nodes and
    racks (the fleet page's tiles), and with `kind`, the entities in `state` (or not ok) with why."""
    now = timezone.now()
    kind, state = request.GET.get("kind", ""), request.GET.get("state", "")
    if kind and kind not in ("gpus", "nodes", "ports"):
        raise ApiError(400, ErrorCode.INVALID, f"kind must be gpus, nodes or ports, not {kind!r}", where="kind")
    if state and state not in health.ORDER:
        raise ApiError(400, ErrorCode.INVALID, f"state must be one of {', '.join(health.ORDER)}, not {state!r}",
                       where="state")
    counts = health.fleet_counts(now=now)
    body = {"generated_at": now.isoformat(),
            "counts": {k: {s: counts[k].get(s, 0) for s in health.ORDER} for k in ("gpus", "nodes", "racks")}}
    if kind:
        states = {"gpus": health.gpu_health, "nodes": health.node_health, "ports": health.port_health}[kind](now=now)
        chosen = {i: h for i, h in states.items() if (h.state == state if state else h.state != "ok")}
        names = _names(kind, list(chosen)[:LIMIT])
        body["items"] = sorted(({"id": i, **names.get(i, {}), **h.as_dict()} for i, h in list(chosen.items())[:LIMIT]),
                               key=lambda r: (health.RANK[r["state"]], r.get("name", "")))
        body["total"] = len(chosen)
    return JsonResponse(body)


def _names(kind: str, ids: list[int]) -> dict[int, dict]:
    if kind == "gpus":
        return {g.id: {"name": f"{g.node.hostname} GPU {g.index}", "uuid": g.uuid, "host": g.node.hostname,
                       "index": g.index} for g in Gpu.objects.filter(id__in=ids).select_related("node")}
    if kind == "nodes":
        return {i: {"name": h} for i, h in Node.objects.filter(id__in=ids).values_list("id", "hostname")}
    return {p.id: {"name": str(p)} for p in Port.objects.filter(id__in=ids)
            .select_related("node", "switch")}
