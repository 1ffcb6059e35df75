"""Every parser, fed mutated real captures and grammar-built inputs: a result or its documented error.

The contract of each parser and what counts as a crash are in tests/fuzz/targets.py. The number of
examples below keeps the whole directory within a minute on a 2-core CI machine; bench/fuzz.py
runs the same targets with 100,000 examples each.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz import targets
from tests.fuzz.conftest import fuzz_settings


@fuzz_settings(500)
@given(st.deferred(lambda: targets.TARGETS["exposition"].strategy()))
def test_exposition_gives_batch_or_located_error(case):
    targets.check_exposition(case)


@fuzz_settings(600)
@given(st.deferred(lambda: targets.TARGETS["ingest-json"].strategy()))
def test_json_and_ndjson_ingest_give_batch_or_located_error(case):
    targets.check_ingest(case)


@fuzz_settings(400)
@given(st.deferred(lambda: targets.TARGETS["ingest-arrow"].strategy()))
def test_arrow_ingest_gives_batch_or_located_error(case):
    targets.check_arrow(case)


@fuzz_settings(250)
@given(st.deferred(lambda: targets.TARGETS["nvidia-smi"].strategy()))
def test_nvidia_smi_gives_records_or_nvsmi_error(case):
    targets.check_nvsmi(case)


@fuzz_settings(250)
@given(st.deferred(lambda: targets.TARGETS["infiniband"].strategy()))
def test_infiniband_sysfs_and_perfquery_never_crash(case):
    targets.check_infiniband(case)


@fuzz_settings(300)
@given(st.deferred(lambda: targets.TARGETS["redfish"].strategy()))
def test_redfish_walk_reports_problems_never_raises(tree):
    targets.check_redfish(tree)


@fuzz_settings(600)
@given(st.deferred(lambda: targets.TARGETS["slurm"].strategy()))
def test_slurm_parsers_give_result_or_slurm_parse_error(case):
    targets.check_slurm(case)


@fuzz_settings(300)
@given(st.deferred(lambda: targets.TARGETS["topology"].strategy()))
def test_topology_gives_plan_or_topology_error(case):
    targets.check_topology(case)
