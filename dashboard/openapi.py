"""The API's OpenAPI document (docs/openapi.yaml), served at /api/v1/openapi.yaml and /api/v1/openapi.json.

The YAML file in docs/ is the one source: the views read it once per process, and the JSON form is the same
document converted, so the two never disagree. It describes the API and holds no cluster data, so anybody
may read it (like the login page).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import yaml
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from core.api import method_not_allowed, public

DOCUMENT = Path(__file__).resolve().parent.parent / "docs" / "openapi.yaml"


@cache
def _text() -> str:
    return DOCUMENT.read_text(encoding="utf-8")


@cache
def document() -> dict:
    """The parsed OpenAPI document."""
    return yaml.safe_load(_text())


@cache
def _json() -> bytes:
    return json.dumps(document(), ensure_ascii=False, indent=1).encode()


def _method_not_allowed(request: HttpRequest) -> JsonResponse:
    return method_not_allowed(request, ("GET", "HEAD")).response()


@public
@csrf_exempt  # a POST gets the API's 405, not the CSRF page: nothing here changes state
def openapi_yaml(request: HttpRequest) -> HttpResponse:
    """GET /api/v1/openapi.yaml — the document as written."""
    if request.method not in ("GET", "HEAD"):
        return _method_not_allowed(request)
    return HttpResponse(_text(), content_type="application/yaml; charset=utf-8")


@public
@csrf_exempt  # a POST gets the API's 405, not the CSRF page: nothing here changes state
def openapi_json(request: HttpRequest) -> HttpResponse:
    """GET /api/v1/openapi.json — the same document as JSON."""
    if request.method not in ("GET", "HEAD"):
        return _method_not_allowed(request)
    return HttpResponse(_json(), content_type="application/json")
