"""Fleet reliability: survival analysis of GPU lifetimes (owned by the survival work)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render


@login_required
def reliability(request):
    """Kaplan-Meier curves and the hazard model of GPU lifetimes by location and age."""
    return render(request, "reliability.html", {})
