"""Middleware for pages that embed Dash apps."""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.middleware.security import SecurityMiddleware
from django_plotly_dash.middleware import ContentCollector


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


class DashContentMiddleware(HybridMiddleware):
    """Does what django-plotly-dash's BaseMiddleware does, in sync and async mode.

    `{% plotly_direct %}` collects the Dash renderer's scripts and styles while the template
    renders; `{% plotly_header %}` / `{% plotly_footer %}` leave placeholders that are filled in
    here. Only HTML responses are rewritten: ingest, JSON and streamed responses pass untouched.
    """

    def __call__(self, request):
        if self.async_mode:
            return self.__acall__(request)
        request.dpd_content_handler = ContentCollector()
        return self._adjust(request, self.get_response(request))

    async def __acall__(self, request):
        request.dpd_content_handler = ContentCollector()
        return self._adjust(request, await self.get_response(request))

    @staticmethod
    def _adjust(request, response):
        if response.streaming or not response.get("Content-Type", "").startswith("text/html"):
            return response
        return request.dpd_content_handler.adjust_response(response)


class InlineSecurityMiddleware(SecurityMiddleware):
    """Django's SecurityMiddleware with its hooks run in the event loop instead of on the sync thread.

    Its two hooks only read headers and settings (HTTPS redirect, HSTS, nosniff, referrer and opener
    policies): nothing blocks, so the thread handoff Django's MiddlewareMixin makes for each costs more than
    the hook itself (settings.COLLECTOR_MIDDLEWARE).
    """

    async def __acall__(self, request):
        response = self.process_request(request)
        if response is None:
            response = await self.get_response(request)
        return self.process_response(request, response)
