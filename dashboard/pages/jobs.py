"""The Jobs pages: the job list and one job's page; the Dash apps inside load their own data."""

from __future__ import annotations

from django.shortcuts import render

from dashboard.pages.anomalies import job_section
from telemetry.selectors.jobs import get_job
from tenancy.access import operator_required


@operator_required
def job_list(request):
    """Every job, filterable, newest first (Dash app `jobs`)."""
    return render(request, "jobs.html")


@operator_required
def job_detail(request, key: str):
    """One job's gang on the topology, its stragglers and step times (Dash app `job`).

    An unknown key is a 404 page that says so, inside the console's frame, not a bare error.
    """
    job = get_job(key) if ":" in key else None
    if job is None:
        return render(request, "job.html", {"key": key, "job": None}, status=404)
    return render(request, "job.html", {"key": key, "job": job, "anomalies": job_section(key)})
