"""docs/openapi.yaml: a valid OpenAPI 3.1 document that lists every /api/v1/ route, served as YAML and JSON.

The route check walks the URL configuration itself (includes followed), so a new /api/v1/ endpoint without a
schema entry fails here by name, and so does a schema path that no route serves any more.
"""

from __future__ import annotations

import json
import re

import schemathesis
import yaml
from django.urls import URLPattern, URLResolver, get_resolver
from schemathesis.core.result import Err

from dashboard.openapi import document

API_PREFIX = "api/v1/"
CONVERTER = re.compile(r"<(?:\w+:)?(\w+)>")
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def _routes(patterns, prefix: str = ""):
    for p in patterns:
        route = prefix + str(p.pattern)
        if isinstance(p, URLResolver):
            yield from _routes(p.url_patterns, route)
        elif isinstance(p, URLPattern):
            yield route, p


def api_routes(urlconf: str | None = None) -> dict[str, URLPattern]:
    """Every /api/v1/ route of the URL configuration as an OpenAPI path ("/alerts/{alert_id}")."""
    out = {}
    for route, pattern in _routes(get_resolver(urlconf).url_patterns):
        if route.startswith(API_PREFIX):
            out["/" + CONVERTER.sub(r"{\1}", route.removeprefix(API_PREFIX))] = pattern
    return out


def test_openapi_document_loads_and_every_operation_is_valid():
    doc = document()
    assert doc["openapi"].startswith("3.1")
    schema = schemathesis.openapi.from_dict(doc)
    schema.validate()  # against the OpenAPI 3.1 meta-schema; raises naming the offending part
    operations = list(schema.get_all_operations())
    errors = [str(r.err()) for r in operations if isinstance(r, Err)]
    assert not errors, errors
    declared = sum(len(METHODS & set(item)) for item in doc["paths"].values())
    assert len(operations) == declared >= 30


def test_every_project_api_route_is_in_the_document():
    # The project's own URL configuration: what is routed today must be documented.
    missing = sorted(set(api_routes()) - set(document()["paths"]))
    assert not missing, f"/api/v1/ routes with no entry in docs/openapi.yaml: {missing}"


def test_every_document_path_is_routed():
    routed = api_routes()
    stale = sorted(set(document()["paths"]) - set(routed))
    assert not stale, f"docs/openapi.yaml documents paths no route serves: {stale}"
    # Path parameters are integers wherever the route converts them with <int:…>.
    for path, pattern in routed.items():
        params = {p["name"]: p for p in _parameters(path)}
        for converter, name in re.findall(r"<(\w+):(\w+)>", str(pattern.pattern)):
            assert params[name]["schema"]["type"] == ("integer" if converter == "int" else "string"), (path, name)


def _parameters(path: str) -> list[dict]:
    components = document()["components"]["parameters"]
    item = document()["paths"][path]
    raw = list(item.get("parameters", []))
    for method in METHODS & set(item):
        raw += item[method].get("parameters", [])
    return [components[p["$ref"].rsplit("/", 1)[1]] if "$ref" in p else p for p in raw]


def test_document_is_served_as_yaml_and_json(client):
    as_yaml = client.get("/api/v1/openapi.yaml")
    as_json = client.get("/api/v1/openapi.json")
    assert as_yaml.status_code == as_json.status_code == 200
    assert as_yaml["Content-Type"].startswith("application/yaml")
    assert as_json["Content-Type"] == "application/json"
    assert yaml.safe_load(as_yaml.content) == json.loads(as_json.content) == document()
    refused = client.post("/api/v1/openapi.json")
    assert refused.status_code == 405 and refused["Allow"] == "GET, HEAD"
    assert refused.json()["error"]["code"] == "method_not_allowed"
