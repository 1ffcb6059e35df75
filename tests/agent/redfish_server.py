"""A real local HTTP server that plays a BMC's Redfish service from files on disk.

Layouts served (see shared/data/README.md, "Redfish fake-server layout"):
- ``<tree>/redfish/v1/.../index.json`` is the body for that URL (LambdaLabs trees);
- ``<tree>/.../index.json`` where the tree root *is* ``/redfish/v1`` (DMTF mockups);
- ``<tree>/hashedresponses/<md5(path+query)>.json`` for requests with a query (LambdaLabs ``$expand``);
- ``routes``: an explicit ``{url path: file path | bytes | dict}`` map, for flat captures such as
  telegraf's (routes win over the tree).

Paths are matched without a trailing slash, since BMCs link both ``/redfish/v1/Chassis`` and
``/redfish/v1/Chassis/``. Basic auth is enforced when ``username`` is given.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

Body = Path | bytes | dict


@dataclass
class RedfishServer:
    """A running fake BMC; ``url`` is its base URL, ``requests`` the paths it was asked for."""

    tree: Path | None
    routes: dict[str, Body] = field(default_factory=dict)
    username: str | None = None
    password: str | None = None
    requests: list[str] = field(default_factory=list)
    url: str = ""
    _httpd: ThreadingHTTPServer | None = None

    def body(self, raw_path: str) -> bytes | None:
        """The response body for a request path (with query), or None for 404."""
        parts = urlsplit(raw_path)
        path = parts.path.rstrip("/") or "/"
        if path in self.routes:
            return _as_bytes(self.routes[path])
        if self.tree is None:
            return None
        if parts.query:
            hashed = self.tree / "hashedresponses" / f"{hashlib.md5(raw_path.encode()).hexdigest()}.json"
            return hashed.read_bytes() if hashed.is_file() else None
        for candidate in self._candidates(path):
            if candidate.is_file():
                return candidate.read_bytes()
        return None

    def _candidates(self, path: str) -> Iterator[Path]:
        rel = path.lstrip("/")
        yield self.tree / rel / "index.json"
        if rel == "redfish/v1" or rel.startswith("redfish/v1/"):  # DMTF mockups: tree root is /redfish/v1
            yield self.tree / rel.removeprefix("redfish/v1").lstrip("/") / "index.json"

    def authorized(self, header: str | None) -> bool:
        if self.username is None:
            return True
        expected = base64.b64encode(f"{self.username}:{self.password or ''}".encode()).decode()
        return header == f"Basic {expected}"

    def start(self) -> RedfishServer:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        host, port = self._httpd.server_address[:2]
        self.url = f"http://{host}:{port}"
        # A short poll keeps shutdown() at teardown quick.
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()


def _as_bytes(body: Body) -> bytes:
    if isinstance(body, Path):
        return body.read_bytes()
    if isinstance(body, dict):
        return json.dumps(body).encode()
    return body


def _handler(server: RedfishServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            server.requests.append(self.path)
            if not server.authorized(self.headers.get("Authorization")):
                self._reply(401, b'{"error": "unauthorized"}', {"WWW-Authenticate": 'Basic realm="bmc"'})
                return
            body = server.body(self.path)
            if body is None:
                self._reply(404, b'{"error": "not found"}')
            else:
                self._reply(200, body)

        def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep test output quiet
            pass

    return Handler


@pytest.fixture
def redfish_server() -> Iterator[Callable[..., RedfishServer]]:
    """Factory fixture: ``redfish_server(tree, routes=..., username=..., password=...)``; all stop at teardown."""
    started: list[RedfishServer] = []

    def make(tree: Path | None = None, **kwargs: Any) -> RedfishServer:
        server = RedfishServer(tree, **kwargs).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()
