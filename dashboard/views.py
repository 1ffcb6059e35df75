"""Operator pages."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render


@login_required
def fleet(request):
    from telemetry import selectors

    return render(request, "fleet.html", {"summary": selectors.fleet_summary()})
