"""Operator pages: each renders a template; the Dash apps inside load their own data."""

from django.shortcuts import render

from telemetry import selectors
from tenancy.access import operator_required


@operator_required
def fleet(request):
    """The first page: fleet health, utilization, power and data freshness, kept live by JS."""
    return render(request, "fleet.html", {"summary": selectors.fleet_summary()})


@operator_required
def racks(request):
    """The rack heatmap (Dash app `heatmap`)."""
    return render(request, "racks.html")
