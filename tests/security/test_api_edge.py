"""Every JSON endpoint answers its errors through the one edge (core.api): one body, one set of codes.

The endpoints come from the URL configuration (every route under /api/), so a new one is checked the moment it is
routed. Each gets a request without credentials, a request with a method nobody allows, and (where it takes a body)
a body that is not JSON; every answer must be {"error": {"code": <an ErrorCode>, "message": <text>}} with the
status the code means, a 401 with its WWW-Authenticate challenge and a 405 with its Allow header.
"""

from __future__ import annotations

import pytest

from core.api import ErrorCode
from tests.security.test_no_500 import _values, world  # noqa: F401  (world: fixture)
from tests.tenancy.test_isolation import data, endpoints  # noqa: F401  (data: fixture)

JSON_ROUTES = ("api/",)
# Endpoints that take no body: a POST's body is not read, so it cannot be malformed.
NO_BODY = {"api-channel-test": "queues a test notification; the channel is in the path"}


def _api_endpoints():
    return [ep for ep in endpoints() if ep.route.startswith(JSON_ROUTES) and not ep.route.endswith(("yaml", "json"))]


def _shape(resp) -> str | None:
    """What is wrong with an error response's shape, or None."""
    if resp.get("Content-Type", "").split(";")[0] != "application/json":
        return f"Content-Type {resp.get('Content-Type')!r}"
    body = resp.json()
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("message"), str) or not err["message"]:
        return f"body {body!r} is not {{'error': {{'code', 'message'}}}}"
    if err.get("code") not in set(ErrorCode):
        return f"code {err.get('code')!r} is not an ErrorCode"
    if resp.status_code == 401 and not resp.get("WWW-Authenticate", "").startswith("Bearer"):
        return "401 without a WWW-Authenticate challenge"
    if resp.status_code == 405 and not resp.get("Allow"):
        return "405 without Allow"
    return None


@pytest.mark.django_db(transaction=True)  # the collector endpoints check tokens on threads of their own
def test_every_json_endpoint_answers_errors_in_one_shape(world):  # noqa: F811
    p = world["personas"]
    eps = _api_endpoints()
    assert len(eps) >= 20, [ep.route for ep in eps]
    problems, bodies = [], 0
    for ep in eps:
        url = ep.url(_values(ep, world["registry"]))
        token = p.tokens["collector_token" if ep.access == "collector" else "operator_token"]
        auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
        anon = p.clients["anonymous"]

        resp = anon.post(url, data="{}", content_type="application/json")
        if resp.status_code not in (401, 405) or _shape(resp):
            problems.append(f"{ep.route} without credentials: {resp.status_code} {_shape(resp) or ''}")

        resp = anon.generic("BREW", url, **auth)
        if resp.status_code != 405 or _shape(resp):
            problems.append(f"{ep.route} BREW: {resp.status_code} {_shape(resp) or ''}")
            continue
        allowed = {m.strip() for m in resp["Allow"].split(",")}

        for method in sorted(allowed & {"POST", "PUT", "PATCH"} if ep.name not in NO_BODY else ()):
            resp = anon.generic(method, url, "{not json", content_type="application/json", **auth)
            bodies += 1
            code = resp.json().get("error", {}).get("code") if _shape(resp) is None else None
            if resp.status_code != 400 or code != ErrorCode.MALFORMED:
                problems.append(f"{method} {ep.route} with a body that is not JSON: {resp.status_code} {code!r} "
                                f"{_shape(resp) or ''}")
    assert bodies >= 10
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("code", list(ErrorCode))
def test_error_codes_are_documented_in_the_openapi_document(code):
    from dashboard.openapi import document

    text = str(document())
    assert f"`{code}`" in text or f"'{code}'" in text, f"{code} is not in docs/openapi.yaml"
