"""Hypothesis settings for the fuzzers: a short deterministic run in CI, the long run on demand.

CI runs a few hundred derandomized examples per parser (the same inputs on every run, so a red
build is reproducible). ``BW_FUZZ_EXAMPLES=N`` (set by bench/fuzz.py, `./dev bench fuzz`) runs N
random examples per parser instead. No example database: failures are reported with their
reproduction blob and minimal input, and turned into regression tests by hand.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.configuration import set_hypothesis_home_dir

# Hypothesis keeps caches (not examples: database=None below) in a home directory; var/ is ignored
# scratch space, so a fuzz run leaves nothing beside the sources.
set_hypothesis_home_dir(Path(__file__).resolve().parents[2] / "var" / "hypothesis")

LONG_EXAMPLES = int(os.environ.get("BW_FUZZ_EXAMPLES", "0") or 0)
# Generous: a parser that needs seconds for one input of at most a few hundred KiB has a
# super-linear path, while a loaded 2-core CI machine must not fail honest examples.
DEADLINE = timedelta(seconds=5)


def fuzz_settings(short_examples: int) -> settings:
    """`short_examples` derandomized examples in CI, or BW_FUZZ_EXAMPLES random ones."""
    return settings(
        max_examples=LONG_EXAMPLES or short_examples,
        derandomize=not LONG_EXAMPLES,
        database=None,
        deadline=DEADLINE,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
                               HealthCheck.filter_too_much],
    )


@pytest.fixture(scope="session", autouse=True)
def _sysfs_sandbox_cleanup():
    yield
    from tests.fuzz import targets

    for box in targets._sandbox:
        box.close()
    targets._sandbox.clear()
