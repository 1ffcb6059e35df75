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
