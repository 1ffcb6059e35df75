"""A real, local OpenID Connect provider for the SSO tests: an http.server thread on a loopback port.

It speaks the authorization-code flow the way mozilla-django-oidc expects it:

- GET  /authorize  remembers the nonce and redirect URI and redirects back with a one-time code;
- POST /token      checks the client's id and secret, the code and the redirect URI, and answers an
                   access token and an ID token signed RS256 (its key in /jwks) or HS256 (the client secret);
- GET  /userinfo   answers the current claims for a valid access token;
- GET  /jwks       the public key set.

`claims` is what the provider says about the user at the next login: change it between logins to move
the user between groups.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

CLIENT_ID = "breakwater-test"
CLIENT_SECRET = "s3cret-for-the-local-provider-only-0123456789"
KID = "test-key-1"


class Provider:
    """The provider's state, shared with its request handler thread."""

    def __init__(self, algo: str = "RS256"):
        self.algo = algo
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.signing_key = None  # set to another key to sign with a key the JWKS does not hold
        self.claims: dict = {}
        self.codes: dict[str, dict] = {}
        self.access: dict[str, dict] = {}
        self.token_requests: list[dict] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Provider:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def settings(self) -> dict:
        """The OIDC_* settings a relying party needs for this provider."""
        return {"OIDC_RP_CLIENT_ID": CLIENT_ID, "OIDC_RP_CLIENT_SECRET": CLIENT_SECRET,
                "OIDC_OP_AUTHORIZATION_ENDPOINT": f"{self.url}/authorize",
                "OIDC_OP_TOKEN_ENDPOINT": f"{self.url}/token", "OIDC_OP_USER_ENDPOINT": f"{self.url}/userinfo",
                "OIDC_OP_JWKS_ENDPOINT": f"{self.url}/jwks", "OIDC_RP_SIGN_ALGO": self.algo}

    def jwks(self) -> dict:
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        return {"keys": [{**public, "kid": KID, "alg": "RS256", "use": "sig"}]}

    def id_token(self, nonce: str) -> str:
        now = int(time.time())
        payload = {"iss": self.url, "aud": CLIENT_ID, "sub": self.claims.get("sub", "user-1"), "iat": now,
                   "exp": now + 300, "nonce": nonce, "email": self.claims.get("email")}
        if self.algo == "HS256":
            return jwt.encode(payload, CLIENT_SECRET, algorithm="HS256")
        return jwt.encode(payload, self.signing_key or self.key, algorithm="RS256", headers={"kid": KID})


def _handler(provider: Provider):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # keep the test output quiet
            pass

        def _json(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            parts = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(parts.query).items()}
            if parts.path == "/authorize":
                code = secrets.token_urlsafe(16)
                provider.codes[code] = {"nonce": query.get("nonce"), "redirect_uri": query["redirect_uri"]}
                back = urlencode({"code": code, "state": query["state"]})
                self.send_response(302)
                self.send_header("Location", f"{query['redirect_uri']}?{back}")
                self.end_headers()
            elif parts.path == "/jwks":
                self._json(200, provider.jwks())
            elif parts.path == "/userinfo":
                token = self.headers.get("Authorization", "").removeprefix("Bearer ")
                if token not in provider.access:
                    self._json(401, {"error": "invalid_token"})
                else:
                    self._json(200, provider.access[token])
            else:
                self._json(404, {"error": "not_found"})

        def do_POST(self) -> None:  # noqa: N802
            if urlsplit(self.path).path != "/token":
                self._json(404, {"error": "not_found"})
                return
            form = {k: v[0] for k, v in parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode()).items()}
            provider.token_requests.append(form)
            grant = provider.codes.pop(form.get("code", ""), None)
            if (form.get("client_id"), form.get("client_secret")) != (CLIENT_ID, CLIENT_SECRET):
                self._json(401, {"error": "invalid_client"})
            elif grant is None or grant["redirect_uri"] != form.get("redirect_uri"):
                self._json(400, {"error": "invalid_grant"})
            else:
                access = secrets.token_urlsafe(16)
                provider.access[access] = dict(provider.claims)
                self._json(200, {"access_token": access, "token_type": "Bearer", "expires_in": 300,
                                 "id_token": provider.id_token(grant["nonce"])})

    return Handler
