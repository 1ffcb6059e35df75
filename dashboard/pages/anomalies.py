"""Anomalies and failure risk: the events the detectors and the failure model raised."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render


@login_required
def anomaly_list(request):
    """Open and recent anomaly and risk events, filterable by kind and entity."""
    return render(request, "anomalies.html", {})
