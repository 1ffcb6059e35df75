"""The lists behind the fleet page's health tiles: every GPU, node or rack in one state, with why.

Each list is read from the same rules (`telemetry.health`) as the tile that links to it, so a tile's
count and its list's length are one number (telemetry.selectors.health_lists).
"""

from __future__ import annotations

from django.http import Http404
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from telemetry import health
from telemetry.models import HealthState
from telemetry.selectors.health_lists import IN_STATE, KINDS
from tenancy.access import operator_required

LIMIT = 500


def _link(kind: str, row: dict) -> dict:
    if kind == "gpus":
        return {**row, "url": reverse("gpu", args=[row["uuid"]]), "host_url": reverse("node", args=[row["host"]])}
    if kind == "nodes":
        return {**row, "url": reverse("node", args=[row["host"]])}
    return {**row, "url": reverse("racks")}


@operator_required
def health_list(request, kind: str, state: str):
    """Every GPU, node or rack in `state`, worst reason first."""
    if kind not in KINDS or state not in health.ORDER:
        raise Http404(f"No list of {kind} in state {state}.")
    rows, total = IN_STATE[kind](state, timezone.now())
    return render(request, "health.html", {
        "kind": kind, "state": state, "label": HealthState(state).label,
        "rows": [_link(kind, r) for r in rows[:LIMIT]], "total": total,
        "limit": LIMIT, "states": [(s, HealthState(s).label) for s in health.ORDER], "kinds": KINDS,
    })
