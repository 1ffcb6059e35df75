"""STUB: being built."""

from django.http import HttpResponse


def _stub(request, *args, **kwargs):
    return HttpResponse("not built yet", status=501)


fabric = _stub
