"""Tests for the DCGM mapper on the real captures: whole-GPU vs MIG rows, sentinels, extras.

Expected values are read from the capture lines (or given by the capture's source docs), and the
per-capture checks rebuild the series independently with prometheus_client.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from telemetry.fields import (
    DCGM_INT32_BLANK,
    DCGM_INT64_BLANK,
    DCGM_TO_GPU_FIELD,
    GPU_FIELDS,
    MIG_FIELDS,
)
from telemetry.ingest.dcgm import DcgmRecords, dcgm_records
from telemetry.ingest.prometheus import parse_exposition
from tests.conftest import SHARED_DATA

CAPTURES = sorted(p.relative_to(SHARED_DATA).as_posix() for p in SHARED_DATA.glob("dcgm/**/*.prom"))
MIG_CAPTURE = "dcgm/nvidia-cloud-native-docs/a100-mig-1g.5gb-dcgm-exporter.prom"
L4_CAPTURE = "dcgm/cncf-k8s-ai-conformance/v1.35_kops.prom"
SENTINEL = "9223372036854775794"  # NVML "not supported", as seen in the dcgm-exporter README
INT_COLUMNS = {f.name for f in GPU_FIELDS if f.is_int}


def read(shared_data: Path, rel: str) -> str:
    return (shared_data / rel).read_text(encoding="utf-8")


def capture_line(text: str, metric: str, instance: bool = False) -> str:
    """The capture's line for ``metric``, for the whole GPU or for the GPU instance."""
    for line in text.splitlines():
        if line.startswith(metric + "{") and ("GPU_I_ID=" in line) == instance:
            return line
    raise AssertionError(f"{metric} (instance={instance}) not in capture")


def value_of(line: str) -> float:
    return float(line.rsplit(" ", 1)[1])


def label_of(line: str, name: str) -> str:
    return line.split(f'{name}="', 1)[1].split('"', 1)[0]


def with_value(line: str, token: str) -> str:
    return f"{line.rsplit(' ', 1)[0]} {token}"


def records_of(text: str) -> DcgmRecords:
    return dcgm_records(parse_exposition(text))


# --- the MIG capture -------------------------------------------------------------------------


def test_mig_capture_one_gpu_one_instance(shared_data: Path) -> None:
    text = read(shared_data, MIG_CAPTURE)
    out = records_of(text)
    assert len(out.gpus) == 1 and len(out.migs) == 1
    gpu, mig = out.gpus[0], out.migs[0]
    instance_line = capture_line(text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", instance=True)
    assert mig["gi_id"] == int(label_of(instance_line, "GPU_I_ID")) == 13
    assert mig["profile"] == label_of(instance_line, "GPU_I_PROFILE") == "1g.5gb"
    assert mig["gpu_uuid"] == gpu["uuid"] == label_of(instance_line, "UUID")
    assert mig["host"] == gpu["host"] == label_of(instance_line, "Hostname")
    assert mig["gpu_index"] == gpu["index"] == 0
    assert mig["ci_id"] is None and mig["time"] is None and gpu["time"] is None
    assert out.blanks == 0 and out.ignored == 0


def test_mig_capture_gpu_and_instance_values_apart(shared_data: Path) -> None:
    text = read(shared_data, MIG_CAPTURE)
    out = records_of(text)
    gpu, mig = out.gpus[0]["fields"], out.migs[0]["fields"]
    # Values published in NVIDIA's dcgm-exporter docs for this capture.
    assert gpu["gr_engine_active"] == 0.995630
    assert mig["gr_engine_active"] == 0.995687
    for metric, column in [
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gr_engine_active"),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor_active"),
        ("DCGM_FI_PROF_DRAM_ACTIVE", "dram_active"),
    ]:
        assert gpu[column] == value_of(capture_line(text, metric))
        assert mig[column] == value_of(capture_line(text, metric, instance=True))
        assert gpu[column] != mig[column]


def test_mig_instance_fields_limited_to_mig_fields(shared_data: Path) -> None:
    out = records_of(read(shared_data, MIG_CAPTURE))
    mig = out.migs[0]
    assert set(mig["fields"]) <= {f.name for f in MIG_FIELDS}
    assert {"xid", "gr_engine_active", "tensor_active", "dram_active"} <= set(mig["fields"])
    # The whole-GPU-only fields stay on the GPU row.
    assert "energy_mj" in out.gpus[0]["fields"] and "energy_mj" not in mig["fields"]


def test_mig_series_non_mig_field_lands_in_extra(shared_data: Path) -> None:
    text = read(shared_data, MIG_CAPTURE)
    instance = capture_line(text, "DCGM_FI_DEV_XID_ERRORS", instance=True)
    temp = instance.replace("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_GPU_TEMP", 1)
    (mig,) = records_of(with_value(temp, "55") + "\n").migs
    assert mig["fields"] == {} and mig["extra"] == {"DCGM_FI_DEV_GPU_TEMP": 55.0}


def test_mig_compute_instance_label_read(shared_data: Path) -> None:
    instance = capture_line(read(shared_data, MIG_CAPTURE), "DCGM_FI_DEV_XID_ERRORS", True)
    line = instance.replace("{", '{GPU_I_CI_ID="2",', 1)
    assert records_of(line + "\n").migs[0]["ci_id"] == 2


def test_energy_counter_kept_in_mj_as_int(shared_data: Path) -> None:
    text = read(shared_data, MIG_CAPTURE)
    energy = records_of(text).gpus[0]["fields"]["energy_mj"]
    raw = capture_line(text, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION").rsplit(" ", 1)[1]
    assert type(energy) is int
    assert energy == int(raw) == 319159391


def test_int_columns_int_and_gauges_float(shared_data: Path) -> None:
    for gpu in records_of(read(shared_data, L4_CAPTURE)).gpus:
        for column, value in gpu["fields"].items():
            assert type(value) is (int if column in INT_COLUMNS else float), column


# --- sentinels, NaN, extras ------------------------------------------------------------------


def test_memory_temp_sentinel_dropped_and_counted(shared_data: Path) -> None:
    text = read(shared_data, MIG_CAPTURE)
    real = capture_line(text, "DCGM_FI_DEV_MEMORY_TEMP")
    out = records_of(text.replace(real, with_value(real, SENTINEL)))
    fields = out.gpus[0]["fields"]
    assert out.blanks == 1
    assert "memory_temp" not in fields and "DCGM_FI_DEV_MEMORY_TEMP" not in out.gpus[0]["extra"]
    # The rest of the row is untouched.
    assert fields["gpu_temp"] == value_of(capture_line(text, "DCGM_FI_DEV_GPU_TEMP"))
    assert records_of(text).gpus[0]["fields"]["memory_temp"] == value_of(real)


@pytest.mark.parametrize("offset", range(16))
def test_int_sentinel_ranges_dropped(shared_data: Path, offset: int) -> None:
    real = capture_line(read(shared_data, MIG_CAPTURE), "DCGM_FI_DEV_FB_USED")
    int64_blank = with_value(real, str(DCGM_INT64_BLANK + offset))
    int32_blank = with_value(real, str(DCGM_INT32_BLANK + offset))
    out = records_of(f"{int64_blank}\n{int32_blank}\n")
    assert out.blanks == 2 and out.gpus[0]["fields"] == {}


def test_value_below_sentinels_kept(shared_data: Path) -> None:
    real = capture_line(read(shared_data, MIG_CAPTURE), "DCGM_FI_DEV_FB_USED")
    out = records_of(with_value(real, str(DCGM_INT32_BLANK - 1)))
    assert out.blanks == 0 and out.gpus[0]["fields"]["fb_used"] == float(DCGM_INT32_BLANK - 1)


@pytest.mark.parametrize("token", ["NaN", "+Inf", "-Inf"])
def test_nan_and_inf_kept_as_float(shared_data: Path, token: str) -> None:
    text = read(shared_data, MIG_CAPTURE)
    real = capture_line(text, "DCGM_FI_DEV_GPU_TEMP")
    energy = capture_line(text, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    out = records_of(f"{with_value(real, token)}\n{with_value(energy, token)}\n")
    fields = out.gpus[0]["fields"]
    assert out.blanks == 0
    for column in ("gpu_temp", "energy_mj"):
        assert type(fields[column]) is float
        assert math.isnan(fields[column]) if token == "NaN" else fields[column] == float(token)


def test_unknown_field_lands_in_extra(shared_data: Path) -> None:
    text = read(shared_data, MIG_CAPTURE)
    metric = "DCGM_FI_DEV_VGPU_LICENSE_STATUS"
    assert metric not in DCGM_TO_GPU_FIELD
    gpu = records_of(text).gpus[0]
    assert gpu["extra"] == {metric: value_of(capture_line(text, metric))}


def test_preferred_power_limit_source_wins(shared_data: Path) -> None:
    real = capture_line(read(shared_data, MIG_CAPTURE), "DCGM_FI_DEV_POWER_USAGE")
    mgmt = with_value(real.replace("POWER_USAGE", "POWER_MGMT_LIMIT", 1), "300")
    enforced = with_value(real.replace("POWER_USAGE", "ENFORCED_POWER_LIMIT", 1), "250")
    for lines in ([mgmt, enforced], [enforced, mgmt]):
        gpu = records_of("\n".join(lines)).gpus[0]
        assert gpu["fields"]["power_limit_w"] == 250.0
        assert gpu["extra"] == {"DCGM_FI_DEV_POWER_MGMT_LIMIT": 300.0}


# --- identity, host, timestamps, ignored ------------------------------------------------------


def test_gpu_identity_from_labels(shared_data: Path) -> None:
    text = read(shared_data, L4_CAPTURE)
    line = capture_line(text, "DCGM_FI_DEV_GPU_TEMP")
    (gpu,) = records_of(text).gpus  # the capture repeats one scrape: still one GPU
    assert gpu["model"] == label_of(line, "modelName") == "NVIDIA L4"
    assert gpu["pci_bus_id"] == label_of(line, "pci_bus_id")
    assert gpu["driver"] == label_of(line, "DCGM_FI_DRIVER_VERSION")
    assert gpu["uuid"] == label_of(line, "UUID") and gpu["index"] == int(label_of(line, "gpu"))


def test_non_dcgm_and_uuidless_samples_ignored(shared_data: Path) -> None:
    text = read(shared_data, MIG_CAPTURE)
    real = capture_line(text, "DCGM_FI_DEV_GPU_TEMP")
    no_uuid = real.replace(f'UUID="{label_of(real, "UUID")}",', "", 1)
    foreign = real.replace("DCGM_FI_DEV_GPU_TEMP", "node_hwmon_temp_celsius", 1)
    out = records_of(f"{text}\ngo_goroutines 12\n{no_uuid}\n{foreign}\n")
    assert out.ignored == 3
    assert len(out.gpus) == 1 and "node_hwmon_temp_celsius" not in out.gpus[0]["extra"]


def test_missing_hostname_gives_none_host(shared_data: Path) -> None:
    real = capture_line(read(shared_data, MIG_CAPTURE), "DCGM_FI_DEV_GPU_TEMP")
    line = real.replace(f',Hostname="{label_of(real, "Hostname")}"', "", 1)
    assert "Hostname" not in line
    assert records_of(line).gpus[0]["host"] is None


def test_distinct_timestamps_distinct_records(shared_data: Path) -> None:
    real = capture_line(read(shared_data, MIG_CAPTURE), "DCGM_FI_DEV_GPU_TEMP")
    first, second = 1764460800000, 1764460815250
    out = records_of(f"{real} {first}\n{real} {second}\n{real} {first}\n")
    assert [g["time"] for g in out.gpus] == [
        datetime(2025, 11, 30, 0, 0, 0, tzinfo=UTC),
        datetime(2025, 11, 30, 0, 0, 15, 250000, tzinfo=UTC),
    ]
    assert all(g["time"].tzinfo is UTC for g in out.gpus)


# --- every capture, rebuilt independently ---------------------------------------------------


def independent_series(text: str) -> dict[tuple, float]:
    """(host, uuid, gi_id, metric) -> last value, via prometheus_client."""
    written = {line.split("{", 1)[0] for line in text.splitlines() if line[:1].isalpha()}
    series = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            # prometheus_client appends "_total" to counter samples; map back to the written name.
            metric = s.name if s.name in written else s.name.removesuffix("_total")
            key = (s.labels.get("Hostname"), s.labels["UUID"], s.labels.get("GPU_I_ID"), metric)
            series[key] = s.value
    return series


@pytest.mark.parametrize("capture", CAPTURES)
def test_capture_every_series_stored_once(shared_data: Path, capture: str) -> None:
    text = read(shared_data, capture)
    out = records_of(text)
    expected = independent_series(text)
    rows = {(g["host"], g["uuid"], None): g for g in out.gpus}
    rows |= {(m["host"], m["gpu_uuid"], str(m["gi_id"])): m for m in out.migs}
    assert len(rows) == len(out.gpus) + len(out.migs)
    assert set(rows) == {key[:3] for key in expected}
    stored = 0
    for (host, uuid, gi, metric), value in expected.items():
        row = rows[(host, uuid, gi)]
        column = DCGM_TO_GPU_FIELD.get(metric)
        found = row["fields"][column] if column in row["fields"] else row["extra"][metric]
        assert found == value, (metric, gi)
        stored += 1
    assert stored == sum(len(r["fields"]) + len(r["extra"]) for r in rows.values())
    assert out.blanks == 0 and out.ignored == 0
