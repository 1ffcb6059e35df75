"""The Fabric page: the InfiniBand leaf × spine matrix and the Clos graph (Dash app `fabric`), and the ports
that are not OK by the one health model, with the open anomalies on fabric ports beside them."""

from __future__ import annotations

from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from anomaly.models import Anomaly
from telemetry import health
from telemetry.models import Port
from tenancy.access import operator_required

PORTS_LISTED = 50


def ports_not_ok(now) -> dict:
    """Every fabric port whose state is not OK, worst first (the first PORTS_LISTED), and the count."""
    bad = {pid: h for pid, h in health.port_health(now=now).items() if h.state != "ok"}
    ports = Port.objects.filter(id__in=list(bad)).select_related("node", "switch")
    rows = sorted(({"name": str(p), "url": reverse("port", args=[p.id]),
                    "since": bad[p.id].since, **health.health_fields(bad[p.id])} for p in ports),
                  key=lambda r: (health.RANK[r["health"]], r["name"]))
    return {"rows": rows[:PORTS_LISTED], "total": len(rows), "limit": PORTS_LISTED}


@operator_required
def fabric(request):
    """The fabric's matrix, worst links and switch graph (the Dash app loads its own data), and the list of
    ports not OK with the count of open anomalies on fabric ports (the Anomalies page lists them)."""
    return render(request, "fabric.html", {
        "ports": ports_not_ok(timezone.now()),
        "port_anomalies": Anomaly.objects.filter(ended_at=None, entity_kind="port").count(),
    })
