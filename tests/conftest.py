"""Fixtures shared by every test module."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Real captures live beside the checkout (../shared/data), never inside it.
SHARED_DATA = Path(os.environ.get("BREAKWATER_SHARED_DATA", REPO.parent / "shared" / "data"))

# Tests fix time with a constant, not now().
FIXED_NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Root of the real public captures; the suite fails loudly if they are missing."""
    if not SHARED_DATA.is_dir():
        pytest.fail(f"real captures not found at {SHARED_DATA}; set BREAKWATER_SHARED_DATA")
    return SHARED_DATA


@pytest.fixture(scope="session", autouse=True)
def _no_persistent_worker_connections():
    """API work runs in worker threads with their own connections; closing them after each
    request lets the test database be flushed and dropped."""
    from django.conf import settings

    if settings.configured:  # pure parser tests may run with -p no:django
        from django.db import connections

        connections.settings["default"]["CONN_MAX_AGE"] = 0
    yield


@pytest.fixture(autouse=True)
def _fresh_entity_cache():
    """Ingest caches inventory ids per process; each test starts with an empty database."""
    from django.conf import settings

    if not settings.configured:
        yield
        return
    from telemetry.ingest import entities

    entities.clear_cache()
    yield
    entities.clear_cache()
