"""Middleware for pages that embed Dash apps."""

from __future__ import annotations

from django.middleware.security import SecurityMiddleware
from django_plotly_dash.middleware import ContentCollector

from core.middleware import HybridMiddleware


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
