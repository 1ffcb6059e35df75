"""The NVML collector through a fake pynvml shaped from a real H200's answers."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from telemetry.agent.nvml import XidWatcher, collect
from telemetry.fields import GPU_FIELDS, MIG_FIELDS
from tests.agent.fake_nvml import FIXTURE, FakeGpu, h200_from_capture, make_nvml

REGISTRY = {f.name: f for f in GPU_FIELDS}


def test_real_h200_readings_map_to_registry_units():
    captured = json.loads(FIXTURE.read_text())["gpus"][0]
    reading = collect(make_nvml([h200_from_capture()]), host="h200-vm")
    (gpu,) = reading.gpus
    assert gpu["uuid"] == captured["uuid"] and gpu["model"] == "NVIDIA H200" and gpu["serial"] == captured["serial"]
    f = gpu["fields"]
    assert f["power_w"] == pytest.approx(captured["power_mw"] / 1000)
    assert f["power_limit_w"] == 700.0
    assert f["energy_mj"] == captured["energy_mj"]
    assert f["fb_used"] == pytest.approx(captured["mem"]["used"] / 2**20)
    assert f["gpu_temp"] == captured["gpu_temp"] and f["sm_clock"] == captured["sm_clock"]
    assert f["throttle_reasons"] == captured["throttle"]  # 0x1: GPU idle, as the real board said
    # The real single-GPU VM answered NotSupported for NVLink: missing, not zero.
    assert not any(k.startswith("nvlink") for k in f)
    assert set(f) <= set(REGISTRY)
    assert all(isinstance(f[k], int) for k in f if REGISTRY[k].is_int)


def test_hgx_nvlink_errors_are_summed_over_links():
    links = [{2: 1, 3: 0, 0: 5}, {2: 2, 1: 1}] + [{}] * 16
    reading = collect(make_nvml([FakeGpu(uuid="GPU-a", nvlinks=links)]), host="hgx-1")
    f = reading.gpus[0]["fields"]
    assert f["nvlink_crc_flit_errors"] == 3 and f["nvlink_replay_errors"] == 5 and f["nvlink_recovery_errors"] == 1


def test_not_supported_is_missing_and_counted():
    gpu = FakeGpu(uuid="GPU-consumer", memory_temp=None, energy_mj=None, remapped=None)
    reading = collect(make_nvml([gpu]), host="ws-1")
    f = reading.gpus[0]["fields"]
    assert "memory_temp" not in f and "energy_mj" not in f and "remapped_rows_correctable" not in f
    assert reading.not_supported >= 2 and reading.problems == []


def test_one_failing_call_is_a_problem_and_the_rest_is_read():
    gpu = FakeGpu(uuid="GPU-x", broken={"nvmlDeviceGetPowerUsage"})
    reading = collect(make_nvml([gpu]), host="n1")
    assert "power_w" not in reading.gpus[0]["fields"] and reading.gpus[0]["fields"]["gpu_temp"] == 40
    assert reading.problems == ["GPU 0: nvmlDeviceGetPowerUsage: Unknown Error"]


def test_mig_instances_become_mig_records():
    gpu = FakeGpu(uuid="GPU-mig", mig=[(1, 0, 2 * 2**30), (2, 0, 0)])
    reading = collect(make_nvml([gpu]), host="a100-1")
    assert [(m["gi_id"], m["ci_id"], m["fields"]["fb_used"]) for m in reading.migs] == [(1, 0, 2048.0), (2, 0, 0.0)]
    assert all(set(m["fields"]) <= {f.name for f in MIG_FIELDS} for m in reading.migs)


def test_ecc_and_row_remap_failure():
    gpu = FakeGpu(uuid="GPU-bad", ecc={(1, 0): 2, (0, 1): 40}, remapped=(3, 1, 0, 1))
    f = collect(make_nvml([gpu]), host="n2").gpus[0]["fields"]
    assert f["ecc_dbe_vol"] == 2 and f["ecc_sbe_agg"] == 40
    assert f["remapped_rows_uncorrectable"] == 1 and f["row_remap_failure"] == 1


def test_xid_events_come_from_the_event_set():
    nvml = make_nvml([FakeGpu(uuid="GPU-0"), FakeGpu(uuid="GPU-1")])
    watcher = XidWatcher(nvml)
    assert watcher.poll() == []
    nvml.events.extend([SimpleNamespace(device=nvml.nvmlDeviceGetHandleByIndex(1), eventData=79, eventType=8)])
    assert watcher.poll() == [{"gpu_uuid": "GPU-1", "xid": 79}]
