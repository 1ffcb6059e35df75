"""bench/_common.Span: the machine CPU a timed section used, which bench/ingest turns into the best ratio a path
can reach on the machine's cores (its CPU per round divided by the cores bounds its wall time)."""

import importlib.util
import os
import time
from pathlib import Path

import pytest

from tests.reliability import soak_lib

_spec = importlib.util.spec_from_file_location("bench_common", Path(__file__).parents[2] / "bench" / "_common.py")
bench_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_common)

pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads Linux's /proc/stat")


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_busy_section_is_counted_and_never_more_than_the_cores_allow():
    with bench_common.Span() as span:
        _spin(0.3)
    ticks = 2 / os.sysconf("SC_CLK_TCK")  # /proc/stat counts whole ticks, at each end
    assert span.wall >= 0.3
    # This process alone kept one core busy for the whole section.
    assert span.cpu >= 0.3 - ticks
    assert span.cpu <= span.wall * len(os.sched_getaffinity(0)) + ticks + 0.05


def test_a_sleeping_section_costs_this_process_no_cpu():
    before = sum(os.times()[:2])
    with bench_common.Span() as span:
        time.sleep(0.3)
    mine = sum(os.times()[:2]) - before
    assert span.wall >= 0.3
    assert mine < 0.05


def test_idle_io_wait_and_steal_are_not_work():
    # Checked on a made-up /proc/stat line: on the live machine the other test worker, PostgreSQL and the
    # servers of other tests may keep both cores busy through any sleep, so no bound on the real figure holds.
    hz = os.sysconf("SC_CLK_TCK")
    line = "cpu  100 20 30 5000 700 4 6 900 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"
    cpu = soak_lib.machine_cpu(line)
    assert cpu["busy"] == (100 + 20 + 30 + 4 + 6) / hz
    assert (cpu["idle"], cpu["iowait"], cpu["steal"]) == (5000 / hz, 700 / hz, 900 / hz)

