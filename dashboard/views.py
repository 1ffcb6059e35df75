"""Operator pages: each renders a template; the Dash apps inside load their own data."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from telemetry import selectors


@login_required
def fleet(request):
    """The first page: fleet health, utilization, power and data freshness, kept live by JS."""
    return render(request, "fleet.html", {"summary": selectors.fleet_summary()})


@login_required
def racks(request):
    """The rack heatmap (Dash app `heatmap`)."""
    return render(request, "racks.html")
