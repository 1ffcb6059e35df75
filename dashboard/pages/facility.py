"""The facility pages: NVLink domains and power and cooling; their Dash apps load their own data."""

from __future__ import annotations

from django.shortcuts import render

from tenancy.access import operator_required


@operator_required
def nvlink(request):
    """GPUs grouped by NVLink domain, coloured by error rate or bandwidth (Dash app `nvlink`)."""
    return render(request, "nvlink.html")


@operator_required
def power(request):
    """Rack power against cap, row and hall totals, cooling loops and PUE (Dash app `power`)."""
    return render(request, "power.html")
