"""Breakwater settings. This is the only module that reads the environment.

Every variable is optional for development (`./dev` exports the URLs of the services it
started); production sets BREAKWATER_ENV=production, which makes SECRET_KEY mandatory.
"""

from __future__ import annotations

import ipaddress
import os
import re
from datetime import timedelta
from pathlib import Path
from urllib.parse import unquote, urlsplit

import redis
from django.core.exceptions import ImproperlyConfigured
from kombu import Queue

from core.queue import paging_queue

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("BREAKWATER_VAR", BASE_DIR / "var"))


def _env(name: str, default: str | None = None) -> str | None:
    """A variable's value, or the contents of the file named by NAME_FILE (for secrets)."""
    file_var = os.environ.get(f"{name}_FILE")
    if file_var:
        try:
            return Path(file_var).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={file_var!r} cannot be read: {exc}") from exc
    return os.environ.get(name, default)


def _env_int(name: str, default: int) -> int:
    raw = _env(name)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from exc


def _env_bool(name: str, default: bool) -> bool:
    raw = _env(name)
    if raw in (None, ""):
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name} must be true or false, got {raw!r}")


def _database_from_url(url: str) -> dict:
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ImproperlyConfigured(f"DATABASE_URL must be a postgresql:// URL, got scheme {parts.scheme!r}")
    if not parts.path.strip("/"):
        raise ImproperlyConfigured("DATABASE_URL names no database")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        # Persistent connections: ingest and the rollup task run many short transactions.
        "CONN_MAX_AGE": _env_int("DB_CONN_MAX_AGE", 300),
        "CONN_HEALTH_CHECKS": True,
        # A suffix lets several test runs share one server without clobbering each other.
        "TEST": {"NAME": "test_" + unquote(parts.path.lstrip("/")) + (_env("TEST_DB_SUFFIX") or "")},
    }


PRODUCTION = _env("BREAKWATER_ENV", "development") == "production"
# Off unless asked for (`./dev up --debug` sets BREAKWATER_DEBUG=1), in development too: Django's debug pages
# show settings, SQL and tracebacks to whoever triggers them. Not the bare name DEBUG, which a shell may have
# exported for something else entirely.
DEBUG = _env_bool("BREAKWATER_DEBUG", False)
if DEBUG and PRODUCTION:
    raise ImproperlyConfigured("BREAKWATER_DEBUG must not be on with BREAKWATER_ENV=production")

SECRET_KEY = _env("SECRET_KEY")
if not SECRET_KEY:
    if PRODUCTION:
        raise ImproperlyConfigured("SECRET_KEY (or SECRET_KEY_FILE) must be set in production")
    # Development only: a key generated once per checkout by ./dev, never committed.
    key_file = VAR_DIR / "secret_key"
    SECRET_KEY = key_file.read_text().strip() if key_file.exists() else "dev-insecure-key-not-for-production"

# `./dev up` serves http://127.0.0.1:PORT/. Any other Host gets a plain 400 before Django runs, on every path
# and on websockets, DEBUG or not (dashboard.security.AllowedHostGuard).
ALLOWED_HOSTS = [h for h in (_env("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]") or "").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in (_env("CSRF_TRUSTED_ORIGINS", "") or "").split(",") if o]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_plotly_dash.apps.DjangoPlotlyDashConfig",
    "core",
    "telemetry",
    "anomaly",
    "alerts",
    "tenancy",
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Before the session and the views: a NUL byte in a path or query is refused here, once for every route.
    "core.middleware.RequestHygieneMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # django-plotly-dash's own content middleware is sync-only; this one does the same job in
    # both modes, so ingest keeps an async middleware chain.
    "dashboard.middleware.DashContentMiddleware",
]

ROOT_URLCONF = "dashboard.urls"
ASGI_APPLICATION = "dashboard.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "dashboard.staticfiles.asset_version",
            ],
        },
    },
]

# Parsed, not kept: a DATABASE_URL setting would carry the password under a name Django does not mask
# (DATABASES' PASSWORD is masked by its key).
DATABASES = {"default": _database_from_url(_env("DATABASE_URL", "postgresql://breakwater@127.0.0.1:55432/breakwater"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Kept as a URL (every Redis client of the project is made from it, like the broker and the channel layer's
# hosts below); a password in it is masked in error reports and logs by dashboard.redaction.
REDIS_URL = _env("REDIS_URL", "redis://127.0.0.1:56379/0")
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # channels_redis waits for messages with a 5 s blocking read (BZPOPMIN); redis-py 8's default
        # 5 s socket timeout fires first and kills every idle websocket with 1011. Give the read room.
        # retry_on_error: after a Redis restart the layer's pooled connections are dead; without a retry the
        # first command fails and the page waits out a 5 s timeout before it is live again (1.2 s with it).
        "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 15,
                              "retry_on_error": [redis.ConnectionError]}],
                   "prefix": _env("BREAKWATER_CHANNEL_PREFIX", "bw")},
    }
}

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None  # tasks record their own outcome in the database
CELERY_TASK_ACKS_LATE = True  # a task killed mid-run is redelivered; every task is idempotent
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TIMEZONE = "UTC"
# Keep Django's LOGGING (its password-masking formatter) in workers: Celery would replace the root handlers.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# The queue tasks are sent to and workers consume. The test suite sets its own, so a test's tasks
# never reach the worker of a `./dev up` running beside it on the same Redis (and vice versa).
CELERY_TASK_DEFAULT_QUEUE = _env("CELERY_QUEUE", "celery")
# Paging has a queue of its own, which `./dev up` (and deploy/systemd's breakwater-alerts.service) gives a
# worker of its own: a new fault's evaluate → flush → deliver must not wait behind a scoring pass or a
# rollup. With both queues in CELERY_TASK_QUEUES a worker started without -Q consumes both, so a site with
# one worker still pages. Measured at 16,384 GPUs with the simulator's load on 2 cores (bench/fault_to_page):
# with one queue the p95 from fault to page was 6.6-7.2 s, the worker's two slots near saturation.
PAGING_TASKS = ("alerts.tasks.evaluate", "alerts.tasks.flush_groups", "alerts.tasks.deliver")


def celery_queues(default: str) -> tuple[str, tuple, dict]:
    """(paging queue, CELERY_TASK_QUEUES, CELERY_TASK_ROUTES) for the default queue `default`; the test suite
    calls it again when it gives this process a queue of its own. Each queue is bound by its own name: a
    Queue without a routing key takes the default one."""
    paging = paging_queue(default)
    return (paging, (Queue(default, routing_key=default), Queue(paging, routing_key=paging)),
            {name: {"queue": paging} for name in PAGING_TASKS})


CELERY_ALERTS_QUEUE, CELERY_TASK_QUEUES, CELERY_TASK_ROUTES = celery_queues(CELERY_TASK_DEFAULT_QUEUE)
CELERY_BEAT_SCHEDULE = {
    "rollup": {"task": "telemetry.tasks.run_rollups", "schedule": timedelta(seconds=30)},
    "retention": {"task": "telemetry.tasks.apply_retention", "schedule": timedelta(hours=1)},
    "scrape": {"task": "telemetry.tasks.scrape_targets", "schedule": timedelta(seconds=15)},
    # A GPU that stops reporting turns "no data" with time, not with a commit: look every 2 s.
    "health-changes": {"task": "telemetry.tasks.publish_health_changes", "schedule": timedelta(seconds=2)},
    # Detectors and failure risk every minute; every model retrained daily (anomaly app).
    "anomaly-score": {"task": "anomaly.tasks.score", "schedule": timedelta(minutes=1)},
    "anomaly-train": {"task": "anomaly.tasks.train_models", "schedule": timedelta(days=1)},
    # A new site gets its first models as soon as it has the history for them, not a day later.
    "anomaly-train-missing": {"task": "anomaly.tasks.train_models", "schedule": timedelta(minutes=10),
                              "kwargs": {"missing_only": True}},
    # Alerts are evaluated on ingest; this backstop resolves alerts whose entity went quiet and ends
    # for-durations when no batch arrives. Groups flush on their own schedule; the sweep redelivers.
    "alerts-evaluate": {
        "task": "alerts.tasks.evaluate", "schedule": timedelta(seconds=10), "kwargs": {"backstop": True},
    },
    "alerts-flush": {"task": "alerts.tasks.flush_groups", "schedule": timedelta(seconds=5)},
    "alerts-sweep": {"task": "alerts.tasks.sweep_outbox", "schedule": timedelta(seconds=15)},
    # Usage metering: complete hours from the ledger and the rollups, plus the last few hours again (tenancy).
    "tenancy-meter": {"task": "tenancy.tasks.meter", "schedule": timedelta(minutes=5)},
}
# Scoring catches up at most this many missed minutes per kind after an outage; older ones are logged and skipped.
SCORING_MAX_CATCHUP_MINUTES = _env_int("SCORING_MAX_CATCHUP_MINUTES", 15)

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "fleet"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
# vendor/: browser bundles no Python package ships, fetched by ./dev (scripts/fetch-js-assets) into var/vendor.
STATICFILES_DIRS = [BASE_DIR / "dashboard" / "static", ("vendor", VAR_DIR / "vendor")]
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    # Dash's renderer, components and plotly.js are collected and served as our own static files:
    # the pages must work on a cluster network with no route to a CDN.
    "django_plotly_dash.finders.DashAssetFinder",
    "django_plotly_dash.finders.DashComponentFinder",
]
PLOTLY_COMPONENTS = ["dash_cytoscape", "dpd_components"]
PLOTLY_DASH = {
    "serve_locally": True,
    # Every Dash endpoint (layout, callbacks, component suites) needs a signed-in user.
    "view_decorator": "dashboard.access.dash_login_required",
    # Initial arguments are not used; keep them out of the session either way.
    "cache_arguments": True,
}
# Dash apps are embedded directly in pages, but Django's own admin still forbids framing.
X_FRAME_OPTIONS = "SAMEORIGIN"

# --- Breakwater ---------------------------------------------------------------------------
# Largest ingest body accepted before decompression and after; larger gets 413.
INGEST_MAX_BODY_BYTES = _env_int("INGEST_MAX_BODY_BYTES", 64 * 1024 * 1024)
# Samples further in the future than this are rejected one by one (clock skew guard).
INGEST_MAX_FUTURE_SKEW = timedelta(seconds=_env_int("INGEST_MAX_FUTURE_SECONDS", 300))
# Retention per resolution, enforced with drop_chunks by the hourly retention task.
RETENTION = {
    "raw": timedelta(days=_env_int("RETENTION_RAW_DAYS", 7)),
    "1m": timedelta(days=_env_int("RETENTION_1M_DAYS", 90)),
    "1h": timedelta(days=_env_int("RETENTION_1H_DAYS", 730)),
}
# An entity is "no data" once its newest sample is older than two of its source's collection
# intervals plus STALE_GRACE (the push delay); STALE_AFTER caps that wait for slow sources and is
# what a source gets before its second sample shows its interval (`telemetry.health`).
STALE_AFTER = timedelta(seconds=_env_int("STALE_AFTER_SECONDS", 180))
STALE_GRACE = timedelta(seconds=_env_int("STALE_GRACE_SECONDS", 3))
# dcgm-exporter endpoints pulled by the beat scraper are ScrapeTarget rows
# (`manage.py scrape_targets add URL`, or the admin); each fetch gives up after this long.
SCRAPE_TIMEOUT_SECONDS = _env_int("SCRAPE_TIMEOUT_SECONDS", 5)
# Slurm jobs and the GPU allocation ledger, polled through the Slurm CLI every 30 s when enabled.
# SLURM_COMMAND_PREFIX runs the commands elsewhere, e.g. "ssh slurm-head".
SLURM_SYNC = _env_bool("SLURM_SYNC", False)
SLURM_COMMAND_PREFIX = _env("SLURM_COMMAND_PREFIX", "") or ""
if SLURM_SYNC:
    CELERY_BEAT_SCHEDULE["slurm"] = {"task": "telemetry.tasks.sync_slurm", "schedule": timedelta(seconds=30)}

# --- Alerts, notifications and remediation (alerts app) -------------------------------------------
# Absolute base of links in notifications (a page in Slack must point at this console).
BREAKWATER_BASE_URL = (_env("BREAKWATER_BASE_URL", "http://localhost:8000") or "").rstrip("/")
# Delivery: at most this many attempts per notification, backoff doubling from ALERT_RETRY_BASE_SECONDS;
# a worker that claimed a row and died is presumed dead after ALERT_CLAIM_TIMEOUT_SECONDS and the row
# is delivered again (with the same provider dedup key, so no second incident opens).
ALERT_DELIVERY_MAX_ATTEMPTS = _env_int("ALERT_DELIVERY_MAX_ATTEMPTS", 6)
ALERT_RETRY_BASE_SECONDS = _env_int("ALERT_RETRY_BASE_SECONDS", 5)
ALERT_CLAIM_TIMEOUT = timedelta(seconds=_env_int("ALERT_CLAIM_TIMEOUT_SECONDS", 60))
ALERT_HTTP_TIMEOUT_SECONDS = _env_int("ALERT_HTTP_TIMEOUT_SECONDS", 10)
# Email channels send through this SMTP server.
EMAIL_HOST = _env("EMAIL_HOST", "localhost") or "localhost"
EMAIL_PORT = _env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = _env("EMAIL_HOST_USER", "") or ""
EMAIL_HOST_PASSWORD = _env("EMAIL_HOST_PASSWORD", "") or ""
EMAIL_USE_TLS = _env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = _env("DEFAULT_FROM_EMAIL", "breakwater@localhost") or "breakwater@localhost"
# Where drain/resume/requeue go: "slurm" (scontrol, through SLURM_COMMAND_PREFIX), "kubernetes" (cordon,
# eviction, pod deletion through K8S_API_URL) or "simulator" (the simulated cluster of `./dev up`).
REMEDIATION_BACKEND = _env("REMEDIATION_BACKEND", "simulator") or "simulator"
if REMEDIATION_BACKEND not in ("slurm", "kubernetes", "simulator"):
    raise ImproperlyConfigured(f"REMEDIATION_BACKEND={REMEDIATION_BACKEND!r}: use slurm, kubernetes or simulator")
K8S_API_URL = _env("K8S_API_URL", "") or ""
K8S_TOKEN = _env("K8S_TOKEN", "") or ""
# Agent commands (power cap, GPU reset) not fetched by the node agent within this long expire.
AGENT_COMMAND_TTL = timedelta(seconds=_env_int("AGENT_COMMAND_TTL_SECONDS", 600))

# --- Usage metering (tenancy app) -------------------------------------------------------------------
# A GPU minute whose GR-engine activity averages under this share is idle-held (allocated, not working).
_idle_pct = _env_int("IDLE_HELD_THRESHOLD_PCT", 5)
if not 0 <= _idle_pct <= 100:
    raise ImproperlyConfigured(f"IDLE_HELD_THRESHOLD_PCT must be 0..100, got {_idle_pct}")
IDLE_HELD_THRESHOLD = _idle_pct / 100
# A node's draw besides its GPUs (CPUs, memory, NICs, fans) where no PSU reports the node's power.
NODE_OVERHEAD_W = _env_int("NODE_OVERHEAD_W", 1500)
# Facility over IT power where no cooling loop or facility meter reports it.
try:
    PUE = float(_env("PUE", "1.3") or "1.3")
except ValueError as exc:
    raise ImproperlyConfigured(f"PUE must be a number, got {_env('PUE')!r}") from exc
if not 1.0 <= PUE <= 5.0:
    raise ImproperlyConfigured(f"PUE must be between 1 and 5, got {PUE}")
# Each pass re-meters this many hours before its watermark: ledger rows that arrive late still count.
METERING_LATE_HOURS = _env_int("METERING_LATE_HOURS", 3)
# A first pass (or one after a long outage) meters at most this far back.
METERING_BACKFILL_DAYS = _env_int("METERING_BACKFILL_DAYS", 35)

# --- Single sign-on (OIDC, optional; tenancy.oidc) -----------------------------------------------
# Off unless OIDC_RP_CLIENT_ID is set; then the provider's endpoints and the client secret are required.
# OIDC_GROUP_ROLES maps the provider's group claims to roles, e.g.
# "bw-ops=operator,acme-admins=tenant_admin@acme,acme-devs=member@acme"; the roles are synced at every login.
OIDC_ROLES = ("operator", "tenant_admin", "member", "viewer")
OIDC_SIGN_ALGOS = ("HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "ES256", "ES384", "ES512")


def _oidc_required(name: str) -> str:
    value = (_env(name) or "").strip()
    if not value:
        raise ImproperlyConfigured(f"{name} must be set when OIDC_RP_CLIENT_ID is (single sign-on)")
    if name.endswith("_ENDPOINT") and urlsplit(value).scheme not in ("http", "https"):
        raise ImproperlyConfigured(f"{name} must be an http(s) URL, got {value!r}")
    return value


def _oidc_group_roles(raw: str) -> dict[str, tuple[str, str | None]]:
    """"group=role[@tenant-slug],..." -> {group: (role, slug or None)}; operator takes no slug, the rest need one."""
    roles: dict[str, tuple[str, str | None]] = {}
    for entry in filter(None, (e.strip() for e in raw.split(","))):
        group, eq, grant = (p.strip() for p in entry.partition("="))
        role, at, slug = (p.strip() for p in grant.partition("@"))
        if not group or not eq or role not in OIDC_ROLES:
            raise ImproperlyConfigured(f"OIDC_GROUP_ROLES: {entry!r} is not group=role[@tenant] with a role of "
                                       f"{', '.join(OIDC_ROLES)}")
        if (role == "operator") == bool(at):
            need = "takes no @tenant" if role == "operator" else "needs @tenant-slug"
            raise ImproperlyConfigured(f"OIDC_GROUP_ROLES: {entry!r}: {role} {need}")
        if at and not slug.replace("-", "").replace("_", "").isalnum():
            raise ImproperlyConfigured(f"OIDC_GROUP_ROLES: {entry!r}: {slug!r} is not a tenant slug")
        if group in roles:
            raise ImproperlyConfigured(f"OIDC_GROUP_ROLES: group {group!r} is mapped twice")
        roles[group] = (role, slug or None)
    return roles


AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend"]
OIDC_RP_CLIENT_ID = (_env("OIDC_RP_CLIENT_ID") or "").strip()
OIDC_ENABLED = bool(OIDC_RP_CLIENT_ID)
if OIDC_ENABLED:
    OIDC_RP_CLIENT_SECRET = _oidc_required("OIDC_RP_CLIENT_SECRET")
    OIDC_OP_AUTHORIZATION_ENDPOINT = _oidc_required("OIDC_OP_AUTHORIZATION_ENDPOINT")
    OIDC_OP_TOKEN_ENDPOINT = _oidc_required("OIDC_OP_TOKEN_ENDPOINT")
    OIDC_OP_USER_ENDPOINT = _oidc_required("OIDC_OP_USER_ENDPOINT")
    OIDC_RP_SIGN_ALGO = (_env("OIDC_RP_SIGN_ALGO") or "RS256").strip()
    if OIDC_RP_SIGN_ALGO not in OIDC_SIGN_ALGOS:
        raise ImproperlyConfigured(f"OIDC_RP_SIGN_ALGO must be one of {', '.join(OIDC_SIGN_ALGOS)}, "
                                   f"got {OIDC_RP_SIGN_ALGO!r}")
    if not OIDC_RP_SIGN_ALGO.startswith("HS"):  # asymmetric: the provider's public keys come from its JWKS
        OIDC_OP_JWKS_ENDPOINT = _oidc_required("OIDC_OP_JWKS_ENDPOINT")
    OIDC_RP_SCOPES = _env("OIDC_RP_SCOPES", "openid email profile groups") or "openid email profile groups"
    OIDC_GROUPS_CLAIM = (_env("OIDC_GROUPS_CLAIM") or "groups").strip()
    OIDC_GROUP_ROLES = _oidc_group_roles(_env("OIDC_GROUP_ROLES") or "")
    OIDC_TIMEOUT = _env_int("OIDC_TIMEOUT_SECONDS", 10)
    OIDC_USERNAME_ALGO = "tenancy.oidc.username_from_claims"
    AUTHENTICATION_BACKENDS.append("tenancy.oidc.GroupRolesOIDCBackend")

# Error reports (the debug page, mail to admins) and log lines show no URL's password: dashboard.redaction.
DEFAULT_EXCEPTION_REPORTER = "dashboard.redaction.UrlPasswordReporter"
DEFAULT_EXCEPTION_REPORTER_FILTER = "dashboard.redaction.UrlPasswordFilter"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"class": "dashboard.redaction.RedactingFormatter",
                             "format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": _env("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

if PRODUCTION:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = _env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = _env_int("SECURE_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    # The session cookie is never read by script; the CSRF cookie neither (our pages post forms with the
    # token field, and Dash's renderer reads its own _csrf_token cookie, not Django's).
    SESSION_COOKIE_HTTPONLY = True
    CSRF_COOKIE_HTTPONLY = True
    # Lax (the default, said out loud): links from chat notifications into the console still carry the
    # session; cross-site POSTs do not.
    SESSION_COOKIE_SAMESITE = "Lax"
    CSRF_COOKIE_SAMESITE = "Lax"
    SECURE_CONTENT_TYPE_NOSNIFF = True
    SECURE_REFERRER_POLICY = "same-origin"
    SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
    # No page is framed (Dash apps are embedded directly, not in iframes); the CSP says frame-ancestors 'none'.
    X_FRAME_OPTIONS = "DENY"
# --- Ingest admission control and ingest rate limits (issue 8: overload) ---
# Batches parsed and written at once per web process (telemetry.api.admission). The write is bound by the
# database (COPY, last-value upsert), so past a few concurrent batches a process gains no throughput, only latency
# and memory (each running batch is held parsed); 4 is the concurrency bench/ingest measures with, and it stays
# below the worker-thread pool every process has (min(32, CPUs + 4)), so an admitted batch never queues for a thread.
INGEST_MAX_INFLIGHT = _env_int("INGEST_MAX_INFLIGHT", 4)
# Batches that may wait for a slot, FIFO; beyond them the answer is an immediate 429 + Retry-After. 16 (four per
# slot) absorbs the burst of a fleet whose agents tick on the same wall-clock second, while the wait stays at a few
# batch times, far below the agent's 10 s request timeout, so nobody waits for an answer it will not read.
INGEST_MAX_WAITING = _env_int("INGEST_MAX_WAITING", 16)
# Per collector token, shared by every web process through Redis: sustained requests/s and the burst above it.
# 0 turns the limit off. One token may serve a whole fleet: 2,048 nodes pushing every 10 s are ~200 requests/s,
# and their spools drain together after an outage, so 1,000/s with a burst of 2,000 is only ever reached by a
# runaway collector, never by agents or the simulator working normally.
INGEST_RATE_PER_TOKEN = _env_int("INGEST_RATE_PER_TOKEN", 1000)
INGEST_RATE_BURST = _env_int("INGEST_RATE_BURST", 2000)
for _name, _least in (("INGEST_MAX_INFLIGHT", 1), ("INGEST_MAX_WAITING", 0), ("INGEST_RATE_PER_TOKEN", 0),
                      ("INGEST_RATE_BURST", 1)):
    if globals()[_name] < _least:
        raise ImproperlyConfigured(f"{_name} must be at least {_least}, got {globals()[_name]}")
# The middleware of the collector endpoints (ingest, training steps, job snapshots), which dashboard.asgi serves
# through a Django handler of their own. In an async request Django's stock middleware runs each of its hooks
# through sync_to_async on a thread started for that request: the site's chain makes ~13 such handoffs per
# request, about a third of what a small ingest batch cost the web process (a one-GPU batch: 13-16 ms of CPU
# before, 7-8 ms after, with the cheaper token lookup and ingest log). Collectors authenticate by bearer token
# and use no session, user, CSRF token or messages, so their chain keeps only the security headers and the
# HTTPS redirect, run inline.
COLLECTOR_MIDDLEWARE = ["dashboard.middleware.InlineSecurityMiddleware", "core.middleware.RequestHygieneMiddleware"]
COLLECTOR_PATHS = frozenset({"/api/v1/ingest", "/api/v1/ingest/prometheus", "/api/v1/training", "/api/v1/jobs"})
# --- end ingest admission ---

# --- Web security: CSP, login rate limit and lockout (issue 8: security) ---
# dashboard.security; docs/security.md. The policy is enforced unless CSP_REPORT_ONLY (a trial of a change).
CSP_REPORT_ONLY = _env_bool("CSP_REPORT_ONLY", False)
CSP_REPORT_URI = (_env("CSP_REPORT_URI", "") or "").strip()
# LOGIN_FAILURE_LIMIT failed sign-ins for one username within LOGIN_FAILURE_WINDOW lock it for LOGIN_LOCKOUT.
LOGIN_FAILURE_LIMIT = _env_int("LOGIN_FAILURE_LIMIT", 5)
LOGIN_FAILURE_WINDOW = timedelta(minutes=_env_int("LOGIN_FAILURE_WINDOW_MINUTES", 15))
LOGIN_LOCKOUT = timedelta(minutes=_env_int("LOGIN_LOCKOUT_MINUTES", 15))
# At most LOGIN_RATE_LIMIT sign-in POSTs per client IP per LOGIN_RATE_WINDOW (console and admin); then 429.
LOGIN_RATE_LIMIT = _env_int("LOGIN_RATE_LIMIT", 20)
LOGIN_RATE_WINDOW = timedelta(seconds=_env_int("LOGIN_RATE_WINDOW_SECONDS", 60))
for _name, _value in (("LOGIN_FAILURE_LIMIT", LOGIN_FAILURE_LIMIT), ("LOGIN_RATE_LIMIT", LOGIN_RATE_LIMIT),
                      ("LOGIN_FAILURE_WINDOW_MINUTES", LOGIN_FAILURE_WINDOW.total_seconds()),
                      ("LOGIN_LOCKOUT_MINUTES", LOGIN_LOCKOUT.total_seconds()),
                      ("LOGIN_RATE_WINDOW_SECONDS", LOGIN_RATE_WINDOW.total_seconds())):
    if _value < 1:
        raise ImproperlyConfigured(f"{_name} must be at least 1, got {_value:g}")
# Reverse proxies in front of the web processes whose X-Forwarded-For is trusted for the client address.
# Production already trusts the proxy's X-Forwarded-Proto, so it assumes one; 0 means REMOTE_ADDR.
CLIENT_IP_PROXY_COUNT = _env_int("CLIENT_IP_PROXY_COUNT", 1 if PRODUCTION else 0)
# Right after SecurityMiddleware: its HTTPS redirect comes first; then the policy header, which sees every
# later HTML response; then the rate limit, which answers before sessions, CSRF or a view run.
_after_security = MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1
MIDDLEWARE[_after_security:_after_security] = [
    "dashboard.security.ContentSecurityPolicyMiddleware",
    "dashboard.security.LoginRateLimitMiddleware",
]
# --- end web security ---

# --- Outbound URL guard for webhooks and channels (issue 8: SSRF) ---
# Channel URLs may not reach loopback, private, link-local (cloud metadata) or other non-public addresses
# (alerts.urlguard) unless named here, comma-separated: a host ("hooks.corp.example", "127.0.0.1": any
# port), a host:port ("127.0.0.1:58025", "[::1]:8080") or a network ("10.20.0.0/16"). Empty: public only.


def _outbound_allowlist(raw: str) -> tuple[str, ...]:
    entries = tuple(e.strip().lower() for e in raw.split(",") if e.strip())
    for entry in entries:
        host, port = entry, ""
        if entry.startswith("["):  # [v6] or [v6]:port
            host, _, port = entry[1:].partition("]")
            port = port.removeprefix(":") if port.startswith(":") or not port else "?"
        elif entry.count(":") == 1:
            host, _, port = entry.partition(":")
        try:
            if "/" in entry:
                ipaddress.ip_network(entry, strict=False)
            elif ":" in host or entry.startswith("["):
                ipaddress.ip_address(host)
            elif not re.fullmatch(r"[a-z0-9_.-]+", host):
                raise ValueError("not a host name")
            if port and not (port.isdigit() and 0 < int(port) < 65536):
                raise ValueError(f"bad port {port!r}")
        except ValueError as exc:
            raise ImproperlyConfigured(f"OUTBOUND_URL_ALLOWLIST entry {entry!r}: write a host, host:port or "
                                       f"a network (a.b.c.d/nn): {exc}") from None
    return entries


OUTBOUND_URL_ALLOWLIST = _outbound_allowlist(_env("OUTBOUND_URL_ALLOWLIST", "") or "")
# --- end outbound URL guard ---

# request.body refuses bodies above this; ingest bodies may be that large (413 beyond it).
DATA_UPLOAD_MAX_MEMORY_SIZE = INGEST_MAX_BODY_BYTES
