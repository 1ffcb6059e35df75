"""Fixtures for the Slurm tests: a session-wide local cluster that fails (never skips) when it cannot start."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.slurm.harness import SlurmCluster


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slurm: needs the local Slurm cluster (root, netns, MariaDB, slurm packages)")


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Munge + slurmdbd + slurmctld + 3 slurmd (4 fake H100 each) in a private network namespace."""
    cluster = SlurmCluster(nodes=3)
    try:
        cluster.start()
    except Exception as exc:  # noqa: BLE001 - whatever broke, the run must fail with the logs
        # A missing package or a broken daemon is a failure to report, not a reason to skip.
        message = str(exc)
        if "--- " not in message:  # HarnessError already carries the log tails; anything else does not
            message += "\n" + (cluster.log_tails() if cluster.log.exists() else "(no logs)")
        cluster.stop()
        pytest.fail(f"local Slurm did not start: {type(exc).__name__}: {message}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()
