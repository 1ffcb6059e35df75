"""Fixtures shared by the dashboard tests: a signed-in session for websocket consumers."""

from __future__ import annotations

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings

from tests import personas


@pytest.fixture
def session_cookie(client, django_user_model) -> bytes:
    """The Cookie header value of a signed-in operator's session."""
    personas.signed_in(personas.operator("ws-operator"), client)
    name = settings.SESSION_COOKIE_NAME
    return f"{name}={client.cookies[name].value}".encode()


def ws_communicator(path: str, cookie: bytes | None = None) -> WebsocketCommunicator:
    """A websocket client for `path` through the real ASGI application, signed in with `cookie`."""
    from dashboard.asgi import application

    headers = [(b"origin", b"http://localhost"), (b"host", b"localhost")]
    if cookie:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, path, headers=headers)


def assert_dash_app_refuses_anonymous(client, app: str) -> None:
    """The app's layout and callback endpoints answer an anonymous XHR with 401 JSON."""
    layout = client.get(f"/django_plotly_dash/app/{app}/_dash-layout", HTTP_ACCEPT="application/json")
    assert layout.status_code == 401 and layout.json()["error"]["code"] == "not_authenticated"
    update = client.post(f"/django_plotly_dash/app/{app}/_dash-update-component", data="{}",
                         content_type="application/json")
    assert update.status_code == 401
