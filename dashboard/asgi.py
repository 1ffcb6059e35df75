"""ASGI entry point: HTTP through Django, websockets through Channels."""

import os

from django.core.asgi import get_asgi_application
from django.core.handlers.asgi import ASGIHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
# Static files (a few stylesheets and scripts) are answered before Django's middleware, so the
# middleware chain stays fully async: one sync-only middleware would run every request,
# ingest included, through a single thread.
django_asgi_app = get_asgi_application()

from dashboard.staticfiles import CachingStaticFilesHandler  # noqa: E402  (needs Django set up first)

django_asgi_app = CachingStaticFilesHandler(django_asgi_app)

from django.conf import settings  # noqa: E402


class CollectorHandler(ASGIHandler):
    """Django for the collector endpoints, with settings.COLLECTOR_MIDDLEWARE as its whole chain.

    Same URLs, views and error handling as the site; only the middleware differs (why: settings.py).
    """

    def load_middleware(self, is_async=False):
        # BaseHandler builds its chain from settings.MIDDLEWARE; swapped for this handler alone, once,
        # while the module loads (one thread, before any request).
        site = settings.MIDDLEWARE
        settings.MIDDLEWARE = settings.COLLECTOR_MIDDLEWARE
        try:
            super().load_middleware(is_async)
        finally:
            settings.MIDDLEWARE = site


collector_app = CollectorHandler()


async def http_app(scope, receive, send):
    """Collector endpoints to their lean handler, everything else to the site's."""
    app = collector_app if scope["path"] in settings.COLLECTOR_PATHS else django_asgi_app
    await app(scope, receive, send)


from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from dashboard.routing import websocket_urlpatterns  # noqa: E402
from dashboard.security import AllowedHostGuard  # noqa: E402

# The guard checks the Host of every request and handshake (static files included) before anything else runs;
# the origin validator then refuses a websocket opened from another site's page.
application = AllowedHostGuard(ProtocolTypeRouter(
    {
        "http": http_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
))
