"""Secure by default: DEBUG only when asked for, no password in a page, an error report or a log line, and a
foreign Host answered with a plain 400 on every path, for everyone, DEBUG or not.

The servers here are daphne processes started with the environment `./dev up` gives them (its own option
parser, sourced from ./dev), on the test database and on a Redis of their own that requires a password, so
every secret-bearing URL (database, Redis, broker, channel layer) really carries one.
"""

from __future__ import annotations

import base64
import http.client
import io
import logging
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from urllib.parse import quote

import pytest
from django.conf import settings
from django.test import Client, override_settings
from django.views.debug import get_exception_reporter_class, get_exception_reporter_filter

from dashboard.redaction import MASK, RedactingFormatter, UrlPasswordFilter, mask_url_passwords
from dashboard.security import BAD_HOST_BODY
from tests import procs
from tests.conftest import REPO, AsgiServer, _wait_for_backends_to_exit

FOREIGN_HOSTS = ["evil.example", "evil.example:8000", "127.0.0.1.evil.example"]


def dev_up_env(*options: str, base: dict | None = None) -> dict:
    """The environment `./dev up OPTIONS` runs its processes with: ./dev sourced, its `up` option parser run."""
    base = {k: v for k, v in (base or os.environ).items()
            if k not in ("BREAKWATER_DEBUG", "DEBUG", "DJANGO_SETTINGS_MODULE")}
    result = subprocess.run(["bash", "-c", 'source ./dev help >/dev/null && up_options "$@" && env -0', "_", *options],
                            cwd=REPO, env=base, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return dict(line.split("=", 1) for line in result.stdout.split("\0") if "=" in line)


@pytest.fixture(scope="module")
def redis_password():
    return "rpw-" + secrets.token_hex(12)


@pytest.fixture(scope="module")
def locked_redis(tmp_path_factory, redis_password):
    """A Redis of these tests' own that refuses clients without the password: its URL carries it."""
    port = procs.free_port()
    server = procs.Child("redis", ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--requirepass",
                                   redis_password, "--save", "", "--appendonly", "no",
                                   "--dir", str(tmp_path_factory.mktemp("redis"))], port=port).start()
    url = f"redis://:{redis_password}@127.0.0.1:{port}/0"
    try:
        server.wait_port(timeout=10)
        yield url
    finally:
        server.stop()


def _secrets(redis_password: str) -> list[str]:
    """Every password the servers were given; the database's is the real one of this checkout."""
    return [s for s in (redis_password, settings.DATABASES["default"]["PASSWORD"]) if s]


def _test_database_url() -> str:
    db = settings.DATABASES["default"]
    return f"postgresql://{quote(db['USER'])}:{quote(db['PASSWORD'])}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def _server(options, locked_redis, django_db_setup, django_db_blocker):
    env = {**dev_up_env(*options), "DATABASE_URL": _test_database_url(), "REDIS_URL": locked_redis,
           "DB_CONN_MAX_AGE": "0", "LOG_LEVEL": "INFO"}
    server = AsgiServer(env)  # daphne as `./dev up` runs it; what it logs is in its log file (log_text())
    server.start()
    yield server
    server.stop()
    _wait_for_backends_to_exit(settings.DATABASES["default"]["NAME"], django_db_blocker)


@pytest.fixture(scope="module")
def default_server(locked_redis, django_db_setup, django_db_blocker):
    """`./dev up`: no option."""
    yield from _server((), locked_redis, django_db_setup, django_db_blocker)


@pytest.fixture(scope="module")
def debug_server(locked_redis, django_db_setup, django_db_blocker):
    """`./dev up --debug`."""
    yield from _server(("--debug",), locked_redis, django_db_setup, django_db_blocker)


@pytest.fixture
def operator_cookie(transactional_db, django_user_model) -> str:
    client = Client()
    client.force_login(django_user_model.objects.create_user("sec-operator", password="pw-sec-operator-1",
                                                             is_staff=True))
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def _request(server, path: str, host: str, cookie: str | None = None, method: str = "GET",
             body: bytes | None = None) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    headers = {"Host": host, **({"Cookie": cookie} if cookie else {}),
               **({"Content-Type": "application/json"} if body is not None else {})}
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read()
    finally:
        conn.close()


def _ws_handshake(server, path: str, host: str, origin: str, cookie: str | None = None) -> int:
    """The HTTP status daphne answers a websocket handshake with (101 when the application accepts it)."""
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}", "Upgrade: websocket", "Connection: Upgrade",
             f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}", "Sec-WebSocket-Version: 13",
             f"Origin: {origin}", *([f"Cookie: {cookie}"] if cookie else [])]
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        return int(s.recv(4096).split(b" ", 2)[1])


# --- DEBUG is off unless asked for --------------------------------------------------------------------------

def _debug_in(env: dict) -> str:
    result = subprocess.run([sys.executable, "-c", "from django.conf import settings; print(settings.DEBUG)"],
                            cwd=REPO, env={**env, "DJANGO_SETTINGS_MODULE": "dashboard.settings"},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def test_dev_up_runs_with_debug_off_and_only_its_debug_option_turns_it_on():
    default, debug = dev_up_env(), dev_up_env("--debug")
    assert "BREAKWATER_DEBUG" not in default and debug["BREAKWATER_DEBUG"] == "1"
    assert (_debug_in(default), _debug_in(debug)) == ("False", "True")
    # A shell's unrelated DEBUG=1 is not a request for Django's debug mode.
    assert _debug_in({**default, "DEBUG": "1"}) == "False"
    refused = subprocess.run(["bash", "-c", "source ./dev help >/dev/null && up_options --bogus"], cwd=REPO,
                             capture_output=True, text=True, timeout=30)
    assert refused.returncode != 0 and "unknown option for up: --bogus" in refused.stderr


def test_debug_is_refused_in_production():
    env = {**dev_up_env("--debug"), "BREAKWATER_ENV": "production", "SECRET_KEY": secrets.token_urlsafe(50)}
    result = subprocess.run([sys.executable, "-c", "from django.conf import settings; settings.DEBUG"], cwd=REPO,
                            env={**env, "DJANGO_SETTINGS_MODULE": "dashboard.settings"}, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0 and "BREAKWATER_DEBUG must not be on with BREAKWATER_ENV=production" in result.stderr


@pytest.mark.slow
def test_default_server_shows_no_debug_page_and_still_serves_its_pages_and_static_files(
        default_server, debug_server, operator_cookie):
    host = f"127.0.0.1:{default_server.port}"
    status, _, body = _request(default_server, "/no-such-page/", host)
    assert status == 404 and b"DEBUG = True" not in body and b"dashboard.urls" not in body
    # The probe can tell: the --debug server answers the same request with Django's technical page.
    status, _, body = _request(debug_server, "/no-such-page/", f"127.0.0.1:{debug_server.port}")
    assert status == 404 and b"DEBUG = True" in body
    for path, cookie in (("/login/", None), ("/", operator_cookie)):
        status, _, page = _request(default_server, path, host, cookie)
        assert status == 200, (path, status)
        assets = sorted(set(re.findall(rb'(?:src|href)="(/static/[^"]+)"', page)))
        assert assets, f"{path} links no static file"
        broken = [(a, s) for a in assets if (s := _request(default_server, a.decode(), host)[0]) != 200]
        assert broken == []


# --- A foreign Host: a plain 400, whoever asks, wherever, DEBUG or not ---------------------------------------

FOREIGN_HOST_REQUESTS = [("GET", "/"), ("GET", "/login/"), ("GET", "/alerts/"), ("GET", "/no-such-page/"),
                         ("GET", "/static/breakwater/breakwater.css"), ("GET", "/admin/"),
                         ("GET", "/api/v1/openapi.json"), ("POST", "/api/v1/ingest"), ("POST", "/login/")]


@pytest.mark.slow
@pytest.mark.parametrize("which", ["default_server", "debug_server"])
def test_a_foreign_host_gets_a_plain_400_with_no_secret_for_anyone(which, request, operator_cookie, redis_password):
    server = request.getfixturevalue(which)
    answers = {}
    for persona, cookie in (("anonymous", None), ("operator", operator_cookie)):
        for method, path in FOREIGN_HOST_REQUESTS:
            for host in FOREIGN_HOSTS:
                body = b"{}" if method == "POST" else None
                answers[persona, method, path, host] = _request(server, path, host, cookie, method, body)
    assert {key: (status, ctype) for key, (status, ctype, _) in answers.items()
            if (status, ctype) != (400, "text/plain; charset=utf-8")} == {}
    bodies = {body for _, _, body in answers.values()}
    assert bodies == {BAD_HOST_BODY}
    for secret in [*_secrets(redis_password), "DATABASE_URL", "Traceback", "REDIS_URL", "settings"]:
        assert secret.encode() not in BAD_HOST_BODY
    # The guard is not a blanket refusal: the same requests for the server's own host get through.
    own = f"127.0.0.1:{server.port}"
    assert [p for _, p in FOREIGN_HOST_REQUESTS[:7] if _request(server, p, own, operator_cookie)[0] == 400] == []


@pytest.mark.slow
def test_websocket_handshakes_need_an_allowed_host_and_origin(default_server, operator_cookie):
    own = f"127.0.0.1:{default_server.port}"
    assert _ws_handshake(default_server, "/ws/fleet/", own, f"http://{own}", operator_cookie) == 101
    for host, origin in (("evil.example", "http://evil.example"), ("evil.example", f"http://{own}"),
                         (own, "http://evil.example")):
        assert _ws_handshake(default_server, "/ws/fleet/", host, origin, operator_cookie) == 403, (host, origin)


@pytest.mark.slow
def test_server_logs_hold_no_password(debug_server, operator_cookie, redis_password):
    _request(debug_server, "/alerts/", "evil.example", operator_cookie)
    _request(debug_server, "/login/", f"127.0.0.1:{debug_server.port}", method="POST", body=b"{}")
    deadline = time.monotonic() + 5
    while "Host 'evil.example' is not in ALLOWED_HOSTS" not in debug_server.log_text():
        assert time.monotonic() < deadline, debug_server.log_text()[-2000:]
        time.sleep(0.1)
    log = debug_server.log_text()
    assert [s for s in _secrets(redis_password) if s in log] == []


# --- Error reports and log lines ------------------------------------------------------------------------------

LEAKY = {
    "CELERY_BROKER_URL": "redis://:broker-pw-1@redis.internal:6379/0",
    "CELERY_RESULT_BACKEND": "redis://bw:result-pw-2@redis.internal:6379/1",
    "REDIS_URL": "rediss://default:redis-pw-3@redis.internal:6380/0",
    "CHANNEL_LAYERS": {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                   "CONFIG": {"hosts": [{"address": "redis://:layer-pw-4@redis.internal:6379/2"}]}}},
    "CACHES": {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                           "LOCATION": ["redis://:cache-pw-5@redis.internal:6379/3", "redis://replica:6379/3"]}},
    "SENTRY_DSN": "https://public:dsn-pw-6@sentry.example/1",
}
LEAKY_PASSWORDS = ["broker-pw-1", "result-pw-2", "redis-pw-3", "layer-pw-4", "cache-pw-5", "dsn-pw-6"]


def test_url_passwords_are_masked_and_other_urls_left_alone():
    assert mask_url_passwords("postgresql://bw:p%40ss@db:5432/bw") == f"postgresql://bw:{MASK}@db:5432/bw"
    assert mask_url_passwords("amqp://u:p@ss/w@mq//") == f"amqp://u:{MASK}@mq//"  # unencoded @ and / in it
    assert mask_url_passwords("see 'redis://:x@h/0', then") == f"see 'redis://:{MASK}@h/0', then"
    assert mask_url_passwords(("a", ["redis://:x@h", {"k": "redis://:y@h"}], 3)) == (
        "a", [f"redis://:{MASK}@h", {"k": f"redis://:{MASK}@h"}], 3)
    for clean in ("redis://127.0.0.1:56379/0", "https://token@host/x", "http://host:8000/a", "a:b@c"):
        assert mask_url_passwords(clean) == clean


@override_settings(**LEAKY)
def test_error_report_settings_hold_no_password(rf):
    request = rf.get("/")
    report_filter = get_exception_reporter_filter(request)
    assert isinstance(report_filter, UrlPasswordFilter)
    safe = repr(report_filter.get_safe_settings())
    assert [p for p in [*LEAKY_PASSWORDS, *_secrets("")] if p in safe] == []
    # Masked where they stand, not dropped: the rest of each URL still says where it points.
    for masked in (f"redis://:{MASK}@redis.internal:6379/0", f"redis://bw:{MASK}@redis.internal:6379/1",
                   f"rediss://default:{MASK}@redis.internal:6380/0", f"redis://:{MASK}@redis.internal:6379/2",
                   f"redis://:{MASK}@redis.internal:6379/3", "redis://replica:6379/3"):
        assert masked in safe
    assert not hasattr(settings, "DATABASE_URL")  # parsed into DATABASES, whose PASSWORD Django masks by name


@override_settings(**LEAKY)
def test_an_exception_report_holds_no_password_from_message_locals_or_settings(rf):
    request = rf.get("/")
    try:
        broker = settings.CELERY_BROKER_URL
        layer = settings.CHANNEL_LAYERS["default"]["CONFIG"]
        raise ConnectionError(f"cannot reach {broker} nor {layer}")
    except ConnectionError:
        reporter = get_exception_reporter_class(request)(request, *sys.exc_info())
        text, html = reporter.get_traceback_text(), reporter.get_traceback_html()
    for report in (text, html):
        assert "cannot reach redis://:" in report and MASK in report
        assert [p for p in [*LEAKY_PASSWORDS, *_secrets("")] if p in report] == []


@pytest.fixture
def project_log():
    """What the project's configured console handler writes (settings.LOGGING), captured."""
    handlers = [h for h in logging.getLogger().handlers if isinstance(h.formatter, RedactingFormatter)]
    assert len(handlers) == 1, "settings.LOGGING's console handler is not installed"
    stream = io.StringIO()
    old = handlers[0].setStream(stream)
    yield stream
    handlers[0].setStream(old)


@pytest.mark.urls("tests.security.error_urls")
@pytest.mark.parametrize("debug", [False, True])
def test_a_failing_request_shows_and_logs_no_password(debug, settings, project_log):
    # Through the `settings` fixture only: with @override_settings around it too, the fixture's teardown
    # restored the settings it found (the overridden ones), and every later test in the process saw LEAKY.
    for name, value in LEAKY.items():
        setattr(settings, name, value)
    settings.DEBUG = debug
    response = Client(raise_request_exception=False).get("/broker-down/")
    assert response.status_code == 500
    page = response.content.decode()
    assert [p for p in [*LEAKY_PASSWORDS, *_secrets("")] if p in page] == []
    if debug:  # the technical page, with the failing frame's locals and the settings: all masked
        assert "cannot reach the broker at redis://:" in page and MASK in page
    log = project_log.getvalue()
    assert "Internal Server Error: /broker-down/" in log and f"redis://:{MASK}@redis.internal" in log
    assert [p for p in LEAKY_PASSWORDS if p in log] == []


@pytest.mark.slow
@pytest.mark.parametrize(("command", "ready"), [("worker", "ready."), ("beat", "beat: Starting")])
def test_celery_startup_banner_masks_the_broker_password(command, ready, locked_redis, redis_password, tmp_path,
                                                         django_db_setup):
    env = {**dev_up_env(), "DATABASE_URL": _test_database_url(), "REDIS_URL": locked_redis,
           "CELERY_QUEUE": "bw-sec-" + secrets.token_hex(4)}
    argv = (procs.worker_argv(env["CELERY_QUEUE"], "secure-defaults@%h", concurrency=1, loglevel="INFO")
            if command == "worker" else procs.beat_argv(tmp_path / "beat-schedule", loglevel="INFO"))
    child = procs.Child(f"celery-{command}", argv, env).start()
    try:
        child.wait_log(ready, timeout=90)
    finally:
        child.stop(timeout=30)
    output = child.log_text()
    port = locked_redis.rsplit(":", 1)[1].split("/")[0]
    assert f"redis://:**@127.0.0.1:{port}" in output  # the banner names the broker, password masked
    assert [s for s in _secrets(redis_password) if s in output] == []


def test_dev_messages_print_no_url_or_password():
    """./dev's own messages (say, die) never expand a variable that holds a service URL or a password."""
    script = (REPO / "dev").read_text()
    messages = re.findall(r'\b(?:say|die) "([^"]*)"', script)
    assert len(messages) > 20
    leaks = [m for m in messages if re.search(r"\$\{?(DATABASE_URL|REDIS_URL|pw|pw_file)\b", m)]
    assert leaks == []
