"""Production settings: `manage.py check --deploy` is clean, secrets come from the environment or from files
(NAME_FILE), and nothing that looks like a secret is committed.

The settings are evaluated in subprocesses, with exactly the environment a deployment would give them.
"""

from __future__ import annotations

import ast
import os
import re
import secrets
import subprocess
import sys

import pytest

from tests.conftest import REPO

SECRET_NAME = re.compile(r"(SECRET|PASSWORD|TOKEN|PRIVATE_KEY|API_KEY)", re.I)
# What real credentials look like, the way this project mints them (bwt_/bwc_ + token_urlsafe(32), 43
# characters) and the way the providers we talk to do. Tests use short obvious fakes that do not match.
COMMITTED_SECRET = re.compile(
    r"-----BEGIN (?:RSA |EC |DSA |OPENSSH |ENCRYPTED )?PRIVATE KEY-----"
    r"|\bbw[tc]_[A-Za-z0-9_-]{40,}"
    r"|\bAKIA[0-9A-Z]{16}\b"
    r"|\bxox[abprs]-\d{6,}-[0-9A-Za-z-]{10,}"
    r"|\bgh[pousr]_[0-9A-Za-z]{36}\b"
)


def _production_env(**extra: str) -> dict:
    """The test runner's environment (service URLs) with production switched on and no secret inherited."""
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith(("SECRET_KEY", "SECURE_", "CSP_", "LOGIN_")) or k in ("DEBUG", "ALLOWED_HOSTS"))}
    env.update({"BREAKWATER_ENV": "production", "DJANGO_SETTINGS_MODULE": "dashboard.settings", **extra})
    return env


def _manage(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)


def _settings_in(env: dict, expression: str) -> subprocess.CompletedProcess:
    code = f"from django.conf import settings; print({expression})"
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def test_check_deploy_is_clean_with_production_settings():
    env = _production_env(SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="example.org")
    result = _manage("check", "--deploy", "--fail-level", "WARNING", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout


def test_check_deploy_fails_on_a_weakened_setting():
    """The check above could pass vacuously; turning HSTS off must make the same command fail."""
    env = _production_env(SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="example.org", SECURE_HSTS_SECONDS="0")
    result = _manage("check", "--deploy", "--fail-level", "WARNING", env=env)
    assert result.returncode != 0 and "security.W004" in result.stderr + result.stdout


def test_production_without_a_secret_key_refuses_to_start_and_says_which_variable():
    result = _settings_in(_production_env(ALLOWED_HOSTS="example.org"), "settings.SECRET_KEY")
    assert result.returncode != 0
    assert "ImproperlyConfigured: SECRET_KEY (or SECRET_KEY_FILE) must be set in production" in result.stderr


def test_secrets_are_read_from_the_files_their_FILE_variables_name(tmp_path):
    key = secrets.token_urlsafe(50)
    (tmp_path / "secret_key").write_text(key + "\n")  # as a secret mount writes it, newline and all
    (tmp_path / "database_url").write_text("postgresql://bw:s3cret%40pw@db.internal:5432/breakwater\n")
    env = _production_env(SECRET_KEY_FILE=str(tmp_path / "secret_key"),
                          DATABASE_URL_FILE=str(tmp_path / "database_url"), ALLOWED_HOSTS="example.org")
    env.pop("DATABASE_URL", None)
    result = _settings_in(env, "settings.SECRET_KEY, settings.DATABASES['default']['PASSWORD'], "
                               "settings.DATABASES['default']['HOST']")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == [key, "s3cret@pw", "db.internal"]


def test_a_FILE_variable_naming_an_unreadable_file_is_an_error_naming_it(tmp_path):
    missing = tmp_path / "absent"
    result = _settings_in(_production_env(SECRET_KEY_FILE=str(missing)), "settings.SECRET_KEY")
    assert result.returncode != 0 and f"SECRET_KEY_FILE='{missing}' cannot be read" in result.stderr


def test_production_cookies_and_headers_are_the_secure_ones():
    env = _production_env(SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="example.org",
                          CSRF_TRUSTED_ORIGINS="https://example.org")
    names = ["SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SESSION_COOKIE_HTTPONLY", "CSRF_COOKIE_HTTPONLY",
             "SECURE_SSL_REDIRECT", "SECURE_HSTS_SECONDS", "SECURE_CONTENT_TYPE_NOSNIFF", "X_FRAME_OPTIONS",
             "SESSION_COOKIE_SAMESITE", "CSRF_TRUSTED_ORIGINS", "CSP_REPORT_ONLY", "DEBUG"]
    result = _settings_in(env, "repr({" + ", ".join(f"'{n}': settings.{n}" for n in names) + "})")
    assert result.returncode == 0, result.stderr[-2000:]
    assert ast.literal_eval(result.stdout.strip()) == {
        "SESSION_COOKIE_SECURE": True, "CSRF_COOKIE_SECURE": True, "SESSION_COOKIE_HTTPONLY": True,
        "CSRF_COOKIE_HTTPONLY": True, "SECURE_SSL_REDIRECT": True, "SECURE_HSTS_SECONDS": 31536000,
        "SECURE_CONTENT_TYPE_NOSNIFF": True, "X_FRAME_OPTIONS": "DENY", "SESSION_COOKIE_SAMESITE": "Lax",
        "CSRF_TRUSTED_ORIGINS": ["https://example.org"], "CSP_REPORT_ONLY": False, "DEBUG": False,
    }


def _tracked_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True)
    return [p for p in listed.stdout.split("\0") if p]


def test_no_tracked_file_holds_something_that_looks_like_a_secret():
    found = []
    for path in _tracked_files():
        try:
            text = (REPO / path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary, or deleted in the working tree and not yet committed
        found += [f"{path}:{text.count(chr(10), 0, m.start()) + 1}: {m.group()[:24]}…"
                  for m in COMMITTED_SECRET.finditer(text)]
    assert found == []


def test_settings_assign_no_secret_a_literal():
    """In dashboard/settings.py, a secret-named setting is never a non-empty string literal, and no
    `_env("…SECRET…", default)` has a non-empty default: the value must come from the environment."""
    tree = ast.parse((REPO / "dashboard" / "settings.py").read_text())
    offenders = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value:
            offenders += [f"line {node.lineno}: {t.id}" for t in node.targets
                          if isinstance(t, ast.Name) and SECRET_NAME.search(t.id) and isinstance(node.value.value, str)]
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "_env" and len(node.args) == 2:
            name, default = node.args
            if (isinstance(name, ast.Constant) and SECRET_NAME.search(name.value)
                    and isinstance(default, ast.Constant) and default.value):
                offenders.append(f"line {node.lineno}: _env({name.value!r}, {default.value!r})")
    assert offenders == []


@pytest.mark.parametrize("assignment", ['EMAIL_HOST_PASSWORD = "hunter2"', 'K8S_TOKEN = _env("K8S_TOKEN", "abc")'])
def test_the_literal_check_catches_a_committed_secret(assignment, tmp_path, monkeypatch):
    """The check above, run on a settings file with one planted secret, finds it."""
    fake = tmp_path / "dashboard"
    fake.mkdir()
    fake.joinpath("settings.py").write_text((REPO / "dashboard" / "settings.py").read_text() + "\n" + assignment + "\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    with pytest.raises(AssertionError):
        test_settings_assign_no_secret_a_literal()


def test_the_secret_pattern_matches_real_shapes_and_not_the_tests_fakes():
    real = ["bwt_" + secrets.token_urlsafe(32), "bwc_" + secrets.token_urlsafe(32),
            "-----BEGIN OPENSSH " + "PRIVATE KEY-----", "AKIA" + "ABCDEFGHIJKLMNOP"]
    fakes = ["bwt_not-a-real-token", "xoxb-sl4ck-t0k3n", "Authorization: Bearer bwt_…"]
    assert [bool(COMMITTED_SECRET.search(s)) for s in real] == [True] * len(real)
    assert [bool(COMMITTED_SECRET.search(s)) for s in fakes] == [False] * len(fakes)
