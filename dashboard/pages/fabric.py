"""The Fabric page: the InfiniBand leaf × spine matrix and the Clos graph (Dash app `fabric`)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render


@login_required
def fabric(request):
    """The fabric's matrix, worst links and switch graph; the Dash app loads its own data."""
    return render(request, "fabric.html")
