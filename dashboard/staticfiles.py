"""Static files with version-stamped URLs that browsers may cache for good.

A 16k-GPU heatmap needs ~6 MB of JavaScript (plotly.js alone is 4.8 MB). Revalidating each file
on every page load costs a round trip per file through the ASGI server, a few hundred
milliseconds of the first render. So every URL we hand out carries a version:

- our own files (`{% static %}` + `?v={{ asset_version }}`): a hash of their contents;
- Dash's renderer and component bundles, which django-plotly-dash serves by redirecting to
  /static/dash/component/...: the redirect gets `?v=` + the installed versions of dash, plotly,
  dash-cytoscape and dpd-components;
- plotly.js: the cartesian bundle pinned in scripts/js-assets.txt (`PLOTLY_JS_URL`, its version in
  the name), for every page: dcc.Graph's request is redirected to it (dashboard.access) and the
  pages that draw with plotly.js directly load it.

A request with `v` is answered with a one-year immutable Cache-Control; a new release changes
the version and so the URL.
"""

from __future__ import annotations

import hashlib
from importlib.metadata import version
from pathlib import Path

from django.conf import settings
from django.contrib.staticfiles import finders
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core import checks
from django.core.exceptions import SuspiciousFileOperation
from django.http import Http404, HttpResponseNotFound

IMMUTABLE = "public, max-age=31536000, immutable"
_OWN_STATIC = Path(__file__).resolve().parent / "static" / "breakwater"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


DASH_ASSET_VERSION = _digest(" ".join(
    f"{name}=={version(name)}" for name in ("dash", "plotly", "dash-cytoscape", "dpd-components")))


def _plotly_js_asset() -> tuple[str, str]:
    """(static path, version) of the plotly.js bundle pinned in scripts/js-assets.txt."""
    for line in (_OWN_STATIC.parents[2] / "scripts" / "js-assets.txt").read_text().splitlines():
        fields = line.split()
        if fields and not fields[0].startswith("#") and fields[0].startswith("plotly.js"):
            return f"vendor/{fields[4]}", fields[1]
    raise RuntimeError("scripts/js-assets.txt names no plotly.js bundle")


PLOTLY_JS_PATH, PLOTLY_JS_VERSION = _plotly_js_asset()
# The version is in the file name too; `v` is what asks for the immutable Cache-Control below.
PLOTLY_JS_URL = f"/{settings.STATIC_URL.strip('/')}/{PLOTLY_JS_PATH}?v={PLOTLY_JS_VERSION}"


@checks.register(checks.Tags.staticfiles)
def plotly_js_fetched(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """Every chart needs the pinned bundle, which no Python package installs: say so before a page loads without."""
    if finders.find(PLOTLY_JS_PATH):
        return []
    return [checks.Error(f"static file {PLOTLY_JS_PATH} (plotly.js, scripts/js-assets.txt) is missing: "
                         "every chart would fail to load", hint="run scripts/fetch-js-assets (./dev runs it)",
                         id="breakwater.E001")]


def own_asset_version() -> str:
    """A hash of every file in dashboard/static/breakwater (names and contents)."""
    h = hashlib.sha256()
    for path in sorted(_OWN_STATIC.rglob("*")):
        if path.is_file():
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:12]


ASSET_VERSION = own_asset_version()


def asset_version(request) -> dict:
    """Template context processor: `asset_version` for our own static URLs."""
    return {"asset_version": ASSET_VERSION, "plotly_js_url": PLOTLY_JS_URL}


class CachingStaticFilesHandler(ASGIStaticFilesHandler):
    """Django's ASGI static handler, plus long caching for version-stamped requests."""

    def serve(self, request):
        try:
            response = super().serve(request)
        except (Http404, SuspiciousFileOperation, ValueError):
            # A missing file, a path that leaves the static folder (`..%2f`) or holds a NUL byte: a plain 404.
            # Not the site's 404 page: static requests skip the middleware its template needs (a 500 then), and
            # Django's handler lets the other two exceptions through unhandled.
            return HttpResponseNotFound(b"Not found.\n", content_type="text/plain; charset=utf-8")
        if request.GET.get("v") and response.status_code == 200:
            response["Cache-Control"] = IMMUTABLE
        return response
