"""The Fabric page: the InfiniBand leaf × spine matrix and the Clos graph (Dash app `fabric`)."""

from __future__ import annotations

from django.shortcuts import render

from tenancy.access import operator_required


@operator_required
def fabric(request):
    """The fabric's matrix, worst links and switch graph; the Dash app loads its own data."""
    return render(request, "fabric.html")
