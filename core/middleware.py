"""Request hygiene ahead of every view: what no view should have to think about."""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpResponseBadRequest

from core.api import ErrorCode, error_response

JSON_PREFIXES = ("/api/", "/django_plotly_dash/")


def nul_problem(request) -> str | None:
    """Where a request carries a NUL byte in its path or query, or None.

    PostgreSQL refuses NUL in text, so a lookup that passed one through would fail in the database (a 500); and
    no name, id or search in this product contains one.
    """
    if "\x00" in request.path:
        return "the path contains a NUL byte"
    for key, values in request.GET.lists():
        if "\x00" in key or any("\x00" in v for v in values):
            return f"the query parameter {key[:40].replace(chr(0), '') or '(empty)'!r} contains a NUL byte"
    return None


class HybridMiddleware:
    """Base of our middleware: sync and async capable, so ingest keeps an all-async chain under daphne
    while the test client and management code call it synchronously. Subclasses define __call__ (and
    __acall__ for the async mode, which __call__ hands over to)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)


class RequestHygieneMiddleware(HybridMiddleware):
    """Refuses a request with a NUL byte in its path or query: 400 `malformed` (JSON under /api/)."""

    def __call__(self, request):
        if self.async_mode:
            return self.__acall__(request)
        return self._refusal(request) or self.get_response(request)

    async def __acall__(self, request):
        return self._refusal(request) or await self.get_response(request)

    @staticmethod
    def _refusal(request):
        why = nul_problem(request)
        if why is None:
            return None
        if request.path.startswith(JSON_PREFIXES):
            return error_response(400, ErrorCode.MALFORMED, why)
        return HttpResponseBadRequest(f"Bad request: {why}.", content_type="text/plain; charset=utf-8")
