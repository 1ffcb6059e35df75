"""Operator pages."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from telemetry import selectors


@login_required
def fleet(request):
    """The first page: fleet health, utilization, power and data freshness, kept live by JS."""
    return render(request, "fleet.html", {"summary": selectors.fleet_summary()})
