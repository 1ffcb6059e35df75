"""Fixtures for the anomaly tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fresh_scoring_memo():
    """The scoring pass memoises its baseline and the registry its active models per process;
    each test has its own database, so neither may leak from the test before."""
    from anomaly.registry import load_active
    from anomaly.scoring import clear_caches

    clear_caches()
    load_active.cache_clear()
    yield
