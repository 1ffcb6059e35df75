"""Login lockout and the per-IP login rate limit (dashboard.security), through the Django test client against
the real Redis: N failures lock a username for a while, whether or not it exists; a success starts the count
again; the admin's login shares the lock; too many sign-in POSTs from one address get 429 and Retry-After."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient, RequestFactory

from core.models import AuditEntry
from core.redis_client import fast_client
from dashboard import security
from tests import personas

pytestmark = pytest.mark.django_db
PASSWORD = personas.PASSWORD
BAD_CREDENTIALS = "Please enter a correct username and password"
LOCKED = "Too many failed sign-ins for this account"


@pytest.fixture(autouse=True)
def _fresh_counters(settings):
    """Counts live in Redis and outlive a test's database transaction. A cheap hasher: these tests sign
    in dozens of times, and the windows they shorten must not be eaten by PBKDF2."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    security.clear_login_counters()
    yield
    security.clear_login_counters()


@pytest.fixture
def alice(django_user_model):
    return personas.operator("alice")


def _login(client, username: str, password: str, *, path: str = "/login/", ip: str = "127.0.0.1"):
    return client.post(path, {"username": username, "password": password}, REMOTE_ADDR=ip)


def _error(response) -> str:
    """The form's error text, times and durations blanked (two messages a minute apart compare equal)."""
    assert response.status_code == 200, response.status_code
    errors = response.context["form"].non_field_errors()
    assert len(errors) == 1, errors
    return re.sub(r"\d+", "#", errors[0])


def test_fifth_failure_locks_the_account_and_the_right_password_is_then_refused(client, alice, settings, caplog):
    settings.LOGIN_FAILURE_LIMIT = 5
    for _ in range(4):
        assert BAD_CREDENTIALS in _error(_login(client, "alice", "guess"))
    with caplog.at_level(logging.WARNING, logger="dashboard.security"):
        fifth = _error(_login(client, "alice", "guess", ip="198.51.100.7"))
    assert LOCKED in fifth and "try again then" in fifth and "UTC" in fifth
    assert any("'alice' locked until" in r.getMessage() for r in caplog.records)
    entry = AuditEntry.objects.get(verb="login.lock")
    assert (entry.object_kind, entry.object_id, entry.outcome) == ("user", "alice", "locked")
    assert entry.detail["ip"] == "198.51.100.7"

    refused = _login(client, "alice", PASSWORD)
    assert LOCKED in _error(refused) and "_auth_user_id" not in client.session


def test_the_lock_lifts_when_the_lockout_ends(client, alice, settings):
    settings.LOGIN_FAILURE_LIMIT = 2
    settings.LOGIN_LOCKOUT = timedelta(seconds=2)
    _login(client, "alice", "guess")
    assert LOCKED in _error(_login(client, "alice", "guess"))
    assert LOCKED in _error(_login(client, "alice", PASSWORD))
    time.sleep(2.1)
    signed_in = _login(client, "alice", PASSWORD)
    assert signed_in.status_code == 302 and client.session["_auth_user_id"] == str(alice.pk)


def test_a_success_starts_the_failure_count_again(client, alice, settings):
    settings.LOGIN_FAILURE_LIMIT = 3
    for _ in range(2):
        _login(client, "alice", "guess")
    assert _login(client, "alice", PASSWORD).status_code == 302
    client.logout()
    for _ in range(2):  # two more: with the old count these would have locked the account
        assert BAD_CREDENTIALS in _error(_login(client, "alice", "guess"))
    assert LOCKED in _error(_login(client, "alice", "guess"))


def test_failures_older_than_the_window_are_forgotten(client, alice, settings):
    settings.LOGIN_FAILURE_LIMIT = 2
    settings.LOGIN_FAILURE_WINDOW = timedelta(seconds=2)
    _login(client, "alice", "guess")
    time.sleep(2.1)
    assert BAD_CREDENTIALS in _error(_login(client, "alice", "guess"))


def test_an_unknown_username_gets_exactly_the_answers_a_real_one_gets(client, alice, settings):
    settings.LOGIN_FAILURE_LIMIT = 3
    real = [_error(_login(client, "alice", "guess")) for _ in range(4)]
    unknown = [_error(_login(client, "nobody-by-this-name", "guess")) for _ in range(4)]
    assert real == unknown
    assert [LOCKED in e for e in real] == [False, False, True, True]


def test_case_variants_of_a_username_share_one_count(client, alice, settings):
    settings.LOGIN_FAILURE_LIMIT = 2
    _login(client, "alice", "guess")
    assert LOCKED in _error(_login(client, "ALICE", "guess"))
    assert LOCKED in _error(_login(client, "alice", PASSWORD))


def test_the_admin_login_counts_and_honours_the_same_lock(client, alice, settings):
    settings.LOGIN_FAILURE_LIMIT = 2
    _login(client, "alice", "guess", path="/admin/login/")
    admin = _login(client, "alice", "guess", path="/admin/login/")
    assert admin.status_code == 200 and LOCKED in admin.content.decode()
    assert LOCKED in _error(_login(client, "alice", PASSWORD))  # the console's form sees the admin's lock


def test_another_web_process_sees_the_lock(client, alice, settings):
    """Counts are in Redis, not in process memory: a second Python process with the same settings
    (as a second daphne would be) finds the lock this one set."""
    settings.LOGIN_FAILURE_LIMIT = 1
    _login(client, "alice", "guess")
    code = ("import django; django.setup(); from dashboard.security import locked_until; "
            "lock = locked_until('alice'); print('locked' if lock else 'open')")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "dashboard.settings"}
    other = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert other.stdout.strip() == "locked", other.stderr[-2000:]


def test_sign_in_posts_beyond_the_rate_limit_get_429_with_retry_after(client, settings):
    settings.LOGIN_RATE_LIMIT = 3
    settings.LOGIN_RATE_WINDOW = timedelta(seconds=60)
    for n in range(3):  # a different username each time: the limit is per address, not per account
        assert _login(client, f"user{n}", "guess", ip="203.0.113.9").status_code == 200
    refused = _login(client, "user9", "guess", ip="203.0.113.9", path="/admin/login/")
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert "Try again in" in refused.content.decode()
    assert _login(client, "user0", "guess", ip="203.0.113.10").status_code == 200  # another address
    assert client.get("/login/", REMOTE_ADDR="203.0.113.9").status_code == 200  # only POSTs are counted


def test_the_rate_window_ends_and_posts_are_answered_again(client, settings):
    settings.LOGIN_RATE_LIMIT = 1
    settings.LOGIN_RATE_WINDOW = timedelta(seconds=2)
    assert _login(client, "bob", "guess").status_code == 200
    assert _login(client, "bob", "guess").status_code == 429
    time.sleep(2.1)
    assert _login(client, "bob", "guess").status_code == 200


def test_the_rate_limit_answers_429_on_the_async_path_too(settings):
    """daphne runs the middleware chain async (ingest needs it); the limit works there as well."""
    settings.LOGIN_RATE_LIMIT = 1
    post = async_to_sync(AsyncClient().post)
    assert post("/login/", {"username": "carol", "password": "guess"}).status_code == 200
    refused = post("/login/", {"username": "carol", "password": "guess"})
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1


def test_client_ip_trusts_only_the_configured_number_of_proxies(settings):
    factory = RequestFactory()
    request = factory.post("/login/", REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="1.2.3.4, 198.51.100.7")
    settings.CLIENT_IP_PROXY_COUNT = 0
    assert security.client_ip(request) == "10.0.0.2"  # no proxy: a client-sent header is ignored
    settings.CLIENT_IP_PROXY_COUNT = 1
    assert security.client_ip(request) == "198.51.100.7"  # what our proxy saw, not what the client wrote
    settings.CLIENT_IP_PROXY_COUNT = 3
    assert security.client_ip(request) == "10.0.0.2"  # fewer hops than proxies: the header is not ours


def test_sign_in_still_works_when_redis_is_down(client, alice, monkeypatch, caplog):
    """Fail open, and say so: an unreachable Redis must not lock every operator out during an incident."""
    monkeypatch.setattr(security, "shared_client", lambda: fast_client("redis://127.0.0.1:1/0"))  # nobody there
    try:
        with caplog.at_level(logging.ERROR, logger="dashboard.security"):
            assert BAD_CREDENTIALS in _error(_login(client, "alice", "guess"))
            assert _login(client, "alice", PASSWORD).status_code == 302
    finally:
        monkeypatch.undo()  # before the fixture's cleanup, which needs the real Redis
    assert any("Redis unavailable" in r.getMessage() for r in caplog.records)
