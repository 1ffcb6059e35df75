"""nvidia-smi parsers against every real capture: counts, identities and values checked against the raw text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from telemetry.agent.nvsmi import NvsmiError, NvsmiResult, parse_nvsmi_text, parse_nvsmi_xml
from telemetry.fields import COUNTER, GPU_FIELDS, MIG_FIELDS, STATE
from tests.conftest import REPO, SHARED_DATA

NVSMI = SHARED_DATA / "nvidia-smi"
H200 = REPO / "tests" / "fixtures" / "device" / "nvidia-h200"
XML_CAPTURES = [*sorted(NVSMI.glob("telegraf/*.xml")), *sorted(NVSMI.glob("netdata/*.xml"))]
XML_CAPTURES.append(H200 / "nvidia-smi-q-x.xml")
TEXT_CAPTURES = sorted(p for p in NVSMI.glob("gpud/nvidia-smi-query.*") if ".invalid" not in p.name) + [
    H200 / "nvidia-smi-q.txt"
]
BROKEN_TEXT = NVSMI / "gpud" / "nvidia-smi-query.535.183.01.out.0.invalid"

GPU_KINDS = {f.name: f.kind for f in GPU_FIELDS}
MIG_NAMES = {f.name for f in MIG_FIELDS}


def _ids(paths: list[Path]) -> list[str]:
    return [f"{p.parent.name}/{p.name}" for p in paths]


def _xml(path: Path) -> NvsmiResult:
    return parse_nvsmi_xml(path.read_bytes(), host="node-1")


def _text(path: Path) -> NvsmiResult:
    return parse_nvsmi_text(path.read_text(), host="node-1")


def _xml_gpu_chunks(raw: str) -> list[str]:
    """Each <gpu> element's text without its MIG devices (they repeat fb_memory_usage)."""
    chunks = re.split(r"<gpu[\s>]", raw)[1:]
    return [re.sub(r"<mig_devices>.*?</mig_devices>", "", c, flags=re.S) for c in chunks]


def _text_gpu_chunks(raw: str) -> list[str]:
    return re.split(r"^GPU [0-9A-Fa-f]{8}:\S+$", raw, flags=re.M)[1:]


# --- every capture -----------------------------------------------------------------------------


def test_capture_lists_complete_all_found():
    # The parametrised tests below silently shrink if a capture goes missing; pin the counts.
    assert len(XML_CAPTURES) == 19, _ids(XML_CAPTURES)
    assert len(TEXT_CAPTURES) == 10, _ids(TEXT_CAPTURES)
    assert all(p.is_file() for p in [*XML_CAPTURES, *TEXT_CAPTURES, BROKEN_TEXT])


@pytest.mark.parametrize("path", XML_CAPTURES, ids=_ids(XML_CAPTURES))
def test_xml_capture_gpus_match_raw_text(path: Path):
    raw = path.read_text()
    result = _xml(path)
    assert len(result.gpus) == len(re.findall(r"<gpu[\s>]", raw))
    uuids = re.findall(r"<gpu[\s>].*?<uuid>\s*(GPU-[0-9a-fA-F-]+)\s*</uuid>", raw, flags=re.S)
    assert [g["uuid"] for g in result.gpus] == uuids
    assert [g["index"] for g in result.gpus] == list(range(len(uuids)))
    for gpu, chunk in zip(result.gpus, _xml_gpu_chunks(raw), strict=True):
        temp = re.search(r"<gpu_temp>\s*(-?\d+) C\s*</gpu_temp>", chunk)
        assert gpu["fields"].get("gpu_temp") == (int(temp.group(1)) if temp else None)
        used = re.search(r"<fb_memory_usage>.*?<used>\s*(\d+) MiB\s*</used>", chunk, flags=re.S)
        assert gpu["fields"].get("fb_used") == (int(used.group(1)) if used else None)
        replay = re.search(r"<replay_counter>\s*(\d+)\s*</replay_counter>", chunk)
        assert gpu["fields"].get("pcie_replay") == (int(replay.group(1)) if replay else None)
        util = re.search(r"<gpu_util>\s*(\d+) %\s*</gpu_util>", chunk)
        assert gpu["fields"].get("gpu_util") == (int(util.group(1)) if util else None)


@pytest.mark.parametrize("path", TEXT_CAPTURES, ids=_ids(TEXT_CAPTURES))
def test_text_capture_gpus_match_raw_text(path: Path):
    raw = path.read_text()
    result = _text(path)
    chunks = _text_gpu_chunks(raw)
    assert len(result.gpus) == len(chunks) == len(re.findall(r"^GPU 0000", raw, flags=re.M))
    assert [g["uuid"] for g in result.gpus] == re.findall(r"^\s+GPU UUID\s+: (\S+)$", raw, flags=re.M)
    driver = re.search(r"^Driver Version\s+: (\S+)$", raw, flags=re.M).group(1)
    assert result.driver == driver and all(g["driver"] == driver for g in result.gpus)
    for gpu, chunk in zip(result.gpus, chunks, strict=True):
        temp = re.search(r"GPU Current Temp\s+: (-?\d+) C$", chunk, flags=re.M)
        assert gpu["fields"].get("gpu_temp") == (int(temp.group(1)) if temp else None)
        used = re.search(r"FB Memory Usage\n(?:.*\n)*?\s+Used\s+: (\d+) MiB", chunk)
        assert gpu["fields"]["fb_used"] == int(used.group(1))
        replay = re.search(r"Replays Since Reset\s+: (\d+)$", chunk, flags=re.M)
        assert gpu["fields"]["pcie_replay"] == int(replay.group(1))
        power = re.search(r"Power Readings\s*\n(?:.*\n)*?\s+(?:Average )?Power Draw\s+: ([\d.]+) W", chunk)
        assert gpu["fields"]["power_w"] == pytest.approx(float(power.group(1)))
        if re.search(r"^\s+Idle\s+: Active$", chunk, flags=re.M):
            assert gpu["fields"]["throttle_reasons"] & 0x1


@pytest.mark.parametrize("path", XML_CAPTURES + TEXT_CAPTURES, ids=_ids(XML_CAPTURES + TEXT_CAPTURES))
def test_capture_fields_registry_names_and_int_counters(path: Path):
    result = _xml(path) if path.suffix == ".xml" else _text(path)
    for gpu in result.gpus:
        assert gpu["host"] == "node-1" and "time" not in gpu
        for name, value in gpu["fields"].items():
            assert name in GPU_KINDS, name
            assert isinstance(value, int | float) and not isinstance(value, bool)
            if GPU_KINDS[name] in (COUNTER, STATE):
                assert type(value) is int, (name, value)
        assert all(isinstance(v, int | float) for v in gpu["extra"].values())
    for mig in result.migs:
        assert set(mig["fields"]) <= MIG_NAMES
        assert type(mig["gi_id"]) is int


@pytest.mark.parametrize("path", XML_CAPTURES + TEXT_CAPTURES, ids=_ids(XML_CAPTURES + TEXT_CAPTURES))
def test_capture_unavailable_values_never_zero(path: Path):
    raw = path.read_text()
    result = _xml(path) if path.suffix == ".xml" else _text(path)
    chunks = _xml_gpu_chunks(raw) if path.suffix == ".xml" else _text_gpu_chunks(raw)
    probes = (
        ("gpu_temp", r"<gpu_temp>\s*N/A\s*</gpu_temp>|GPU Current Temp\s+: N/A"),
        ("memory_temp", r"<memory_temp>\s*N/A\s*</memory_temp>|Memory Current Temp\s+: N/A"),
        ("retired_sbe", r"<retired_count>N/A</retired_count>|Single Bit ECC\s+: N/A"),
        ("fb_reserved", r"<reserved>N/A</reserved>"),
        ("remapped_rows_correctable", r"<remapped_rows>N/A</remapped_rows>|Remapped Rows\s+: N/A"),
    )
    for gpu, chunk in zip(result.gpus, chunks, strict=True):
        for name, pattern in probes:
            if re.search(pattern, chunk):
                assert name not in gpu["fields"], (name, gpu["fields"].get(name))
    if re.search(r">\s*N/A\s*<|: N/A$", raw, flags=re.M):
        assert result.missing > 0


# --- specific values ---------------------------------------------------------------------------


def test_h200_xml_newest_schema_values():
    gpu = _xml(H200 / "nvidia-smi-q-x.xml").gpus[0]
    assert gpu["model"] == "NVIDIA H200" and gpu["serial"] == "1654024031241"
    assert gpu["pci_bus_id"] == "00000000:00:06.0" and gpu["driver"] == "580.159.04"
    f = gpu["fields"]
    # v13 has no <power_draw>: the average draw (NVML's power usage on Ampere+) is used.
    assert f["power_w"] == pytest.approx(129.03) and f["power_limit_w"] == pytest.approx(700.0)
    assert (f["sm_clock"], f["mem_clock"], f["fb_reserved"], f["memory_temp"]) == (1980, 3201, 616, 39)
    assert f["throttle_reasons"] == 0x1  # only gpu_idle is Active
    assert f["ecc_dbe_vol"] == 0 and f["row_remap_pending"] == 0
    assert "retired_sbe" not in f and "retired_pending" not in f  # N/A on HBM3e parts


def test_h200_text_and_xml_same_identity_and_fields():
    from_xml, from_text = _xml(H200 / "nvidia-smi-q-x.xml"), _text(H200 / "nvidia-smi-q.txt")
    ident = ("uuid", "index", "model", "serial", "pci_bus_id", "driver")
    assert [from_text.gpus[0][k] for k in ident] == [from_xml.gpus[0][k] for k in ident]
    assert from_text.gpus[0]["fields"].keys() == from_xml.gpus[0]["fields"].keys()
    assert from_text.missing == from_xml.missing


def test_h100_text_hw_power_brake_bitmask():
    gpu = _text(NVSMI / "gpud" / "nvidia-smi-query.535.161.08.out.0.valid").gpus[0]
    assert gpu["fields"]["throttle_reasons"] == 0x8 | 0x80  # HW Slowdown + nested HW Power Brake Slowdown
    assert gpu["fields"]["pcie_replay"] == 67


def test_a10_text_remapped_rows_pending():
    f = _text(NVSMI / "gpud" / "nvidia-smi-query.535.129.03.out.0.valid.a10").gpus[0]["fields"]
    assert (f["remapped_rows_uncorrectable"], f["row_remap_pending"], f["row_remap_failure"]) == (4, 1, 0)


def test_rtx4090_text_index_is_position_not_minor_number():
    raw = (NVSMI / "gpud" / "nvidia-smi-query.535.154.05.out.0.valid").read_text()
    result = parse_nvsmi_text(raw, host="node-1")
    assert re.findall(r"Minor Number\s+: (\d+)", raw)[:4] == ["3", "2", "1", "0"]
    assert [g["index"] for g in result.gpus] == list(range(8))
    assert "serial" not in result.gpus[0]  # "N/A" on GeForce: omitted, not stored as text


def test_p100_xml_single_bit_totals_used():
    f = _xml(NVSMI / "netdata" / "tesla-p100.xml").gpus[0]["fields"]
    assert (f["ecc_sbe_agg"], f["ecc_dbe_agg"], f["ecc_sbe_vol"]) == (3, 0, 0)
    assert (f["retired_sbe"], f["retired_dbe"], f["retired_pending"]) == (0, 0, 0)


def test_rtx_pro_6000_xml_instant_power_fallback_and_padding():
    gpu = _xml(NVSMI / "netdata" / "rtx-pro-6000-driver-580.xml").gpus[0]
    # power_draw and average_power_draw are " N/A ": the instant draw is the only reading.
    assert gpu["fields"] == {"gpu_temp": 37, "power_w": pytest.approx(66.84)}
    assert gpu["extra"]["nvsmi_fan_speed_pct"] == 40 and "driver" not in gpu


def test_mig_xml_capture_yields_mig_records():
    result = _xml(NVSMI / "netdata" / "a100-sxm4-mig.xml")
    uuid = result.gpus[0]["uuid"]
    assert [(m["gi_id"], m["ci_id"], m["profile"]) for m in result.migs] == [(1, 0, "3g.20gb"), (2, 0, "3g.20gb")]
    assert all(m["gpu_uuid"] == uuid and m["fields"] == {"fb_used": 19, "fb_free": 19948, "fb_reserved": 0}
               for m in result.migs)
    assert "gpu_util" not in result.gpus[0]["fields"]  # N/A while MIG is on


def test_mig_a100_80gb_xml_profiles_one_slice():
    result = _xml(NVSMI / "telegraf" / "a100-sxm4-v12.xml")
    assert [m["gi_id"] for m in result.migs] == [3, 4, 5, 6]
    assert {m["profile"] for m in result.migs} == {"1g.20gb"}


def test_mig_hopper_profile_omitted_not_guessed():
    xml = _synthetic("<product_name>NVIDIA H100 80GB HBM3</product_name>" + _MIG_DEVICE)
    mig = parse_nvsmi_xml(xml, host="n").migs[0]
    assert "profile" not in mig and mig["gi_id"] == 9 and mig["fields"]["fb_used"] == 5


def _synthetic(body: str) -> str:
    return f"<nvidia_smi_log><gpu id='00000000:01:00.0'><uuid>GPU-x</uuid>{body}</gpu></nvidia_smi_log>"


_MIG_DEVICE = (
    "<mig_devices><mig_device><gpu_instance_id>9</gpu_instance_id><compute_instance_id>0</compute_instance_id>"
    "<device_attributes><shared><multiprocessor_count>16</multiprocessor_count></shared></device_attributes>"
    "<fb_memory_usage><total>9856 MiB</total><used>5 MiB</used><free>N/A</free></fb_memory_usage>"
    "</mig_device></mig_devices>"
)


def test_synthetic_v13_ecc_parts_summed():
    parts = (
        "<sram_correctable>5</sram_correctable><sram_uncorrectable_parity>1</sram_uncorrectable_parity>"
        "<sram_uncorrectable_secded>2</sram_uncorrectable_secded><dram_correctable>6</dram_correctable>"
        "<dram_uncorrectable>4</dram_uncorrectable><sram_threshold_exceeded>No</sram_threshold_exceeded>"
    )
    xml = _synthetic(f"<ecc_errors><volatile>{parts}</volatile><aggregate>{parts.replace('>6<', '>N/A<')}"
                     "</aggregate></ecc_errors>")
    f = parse_nvsmi_xml(xml, host="n").gpus[0]["fields"]
    assert (f["ecc_sbe_vol"], f["ecc_dbe_vol"], f["ecc_sbe_agg"], f["ecc_dbe_agg"]) == (11, 7, 5, 7)


def test_synthetic_energy_joules_converted_to_mj():
    f = parse_nvsmi_xml(_synthetic("<total_energy_consumption>12.5 J</total_energy_consumption>"), host="n")
    assert f.gpus[0]["fields"]["energy_mj"] == 12500 and type(f.gpus[0]["fields"]["energy_mj"]) is int


UNAVAILABLE = ["N/A", "[N/A]", "[Not Supported]", "Unknown", "Requested functionality has been deprecated"]


@pytest.mark.parametrize("text", UNAVAILABLE)
def test_synthetic_unavailable_markers_omitted(text: str):
    result = parse_nvsmi_xml(_synthetic(f"<temperature><gpu_temp>{text}</gpu_temp></temperature>"), host="n")
    assert "gpu_temp" not in result.gpus[0]["fields"] and result.missing == 1


# --- broken input ------------------------------------------------------------------------------


def test_broken_gpud_text_raises_naming_line():
    with pytest.raises(NvsmiError, match=r"line 7: 'Attached GPUs : 8' but 1 .*truncated"):
        _text(BROKEN_TEXT)


@pytest.mark.parametrize("data", ["", "   \n", b""])
def test_empty_input_raises(data):
    with pytest.raises(NvsmiError, match="empty"):
        parse_nvsmi_xml(data, host="n")
    with pytest.raises(NvsmiError, match="empty"):
        parse_nvsmi_text(data, host="n")


def test_truncated_xml_raises_with_line_and_column():
    raw = (H200 / "nvidia-smi-q-x.xml").read_text()
    with pytest.raises(NvsmiError, match=r"malformed nvidia-smi XML at line \d+, column \d+"):
        parse_nvsmi_xml(raw[: len(raw) // 2], host="n")


def test_wrong_xml_root_raises():
    with pytest.raises(NvsmiError, match="<html>"):
        parse_nvsmi_xml("<html><body/></html>", host="n")


def test_xml_gpu_without_uuid_raises_naming_element():
    with pytest.raises(NvsmiError, match=r"nvidia_smi_log/gpu\[1\].*UUID"):
        parse_nvsmi_xml("<nvidia_smi_log><gpu><product_name>x</product_name></gpu></nvidia_smi_log>", host="n")


def test_text_not_nvsmi_raises_naming_line():
    with pytest.raises(NvsmiError, match=r"line 1: 'No devices were found'"):
        parse_nvsmi_text("No devices were found\n", host="n")


def test_text_given_xml_raises():
    with pytest.raises(NvsmiError, match="parse_nvsmi_xml"):
        parse_nvsmi_text((H200 / "nvidia-smi-q-x.xml").read_text(), host="n")


def test_text_gpu_without_uuid_raises_naming_line():
    text = "Attached GPUs : 1\nGPU 00000000:01:00.0\n    Product Name : X\n"
    with pytest.raises(NvsmiError, match=r"line 2: GPU section without a UUID"):
        parse_nvsmi_text(text, host="n")


def test_text_bad_indentation_raises_naming_line():
    text = (
        "Attached GPUs : 1\nGPU 00000000:01:00.0\n    GPU UUID : GPU-x\n    Temperature\n"
        "                  GPU Current Temp : 3 C\n"
    )
    with pytest.raises(NvsmiError, match=r"line 5: .*indented"):
        parse_nvsmi_text(text, host="n")
