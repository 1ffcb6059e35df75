"""The Fabric page: the InfiniBand leaf × spine matrix and the Clos graph (Dash app `fabric`), and the ports
that are not OK by the one health model, with the open anomalies on fabric ports beside them."""

from __future__ import annotations

from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from anomaly.selectors import open_anomaly_count
from telemetry.selectors import health_lists
from tenancy.access import operator_required

PORTS_LISTED = 50


def ports_not_ok(now) -> dict:
    """Every fabric port whose state is not OK, worst first (the first PORTS_LISTED), and the count."""
    rows = health_lists.ports_not_ok(now)
    return {"rows": [{**r, "url": reverse("port", args=[r["port_id"]])} for r in rows[:PORTS_LISTED]],
            "total": len(rows), "limit": PORTS_LISTED}


@operator_required
def fabric(request):
    """The fabric's matrix, worst links and switch graph (the Dash app loads its own data), and the list of
    ports not OK with the count of open anomalies on fabric ports (the Anomalies page lists them)."""
    return render(request, "fabric.html", {
        "ports": ports_not_ok(timezone.now()),
        "port_anomalies": open_anomaly_count("port"),
    })
