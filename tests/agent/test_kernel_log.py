"""The kernel-log parser against the real gpud captures and hand-made edge cases. No database."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from telemetry.agent.kernel_log import normalise_pci_bus_id, parse_fabric_manager_log, parse_kernel_log
from telemetry.xid import CATALOGUE, describe

REPO = Path(__file__).resolve().parents[2]
CAPTURE_NAMES = (
    "dmesg-with-xid-119.log", "dmesg.0.log", "dmesg.decode.iso.log.0", "dmesg.decode.iso.log.1",
    "dmesg.peermem.log.0", "fabric-manager.0.log", "fabricmanager.log", "kmsg.1.log", "kmsg.2.peermem.log",
)
# Independent of the parser's regexes on purpose: the simplest pattern a person would grep with.
SIMPLE_XID = re.compile(r"NVRM: Xid \(PCI:[0-9a-f:.]+\): \d+,")


@pytest.fixture(scope="module")
def captures(shared_data: Path) -> Path:
    return shared_data / "traces" / "gpud-kernel-logs"


def _read(captures: Path, name: str) -> str:
    return (captures / name).read_text(encoding="utf-8", errors="replace")


def xid_events(text: str) -> list[dict]:
    return [e for e in parse_kernel_log(text).events if e["kind"] == "xid"]


@pytest.mark.parametrize("name", CAPTURE_NAMES)
def test_capture_parses_with_xid_count_matching_simple_regex(captures: Path, name: str) -> None:
    text = _read(captures, name)
    result = parse_kernel_log(text)
    assert result.lines == text.count("\n") + (not text.endswith("\n"))
    assert len([e for e in result.events if e["kind"] == "xid"]) == len(SIMPLE_XID.findall(text))
    assert result.unparsed == []


def test_capture_directory_has_no_unexpected_files(captures: Path) -> None:
    # A new capture dropped into the folder should be added to CAPTURE_NAMES so it is parsed above.
    assert sorted(p.name for p in captures.iterdir() if p.is_file()) == sorted(CAPTURE_NAMES)


def test_xid_119_capture_yields_code_119_on_9b(captures: Path) -> None:
    events = xid_events(_read(captures, "dmesg-with-xid-119.log"))
    assert [e["xid"] for e in events] == [119] * 5
    first = events[0]
    assert first["pci_bus_id"] == "00000000:9B:00.0"
    assert (first["pid"], first["process"]) == (2024380, "nvidia-smi")
    assert first["wallclock"] == "Sun Feb 23 16:24:18 2025" and first["monotonic_s"] is None
    assert first["message"].startswith("Timeout after 6s of waiting for RPC response from GPU4 GSP!")
    assert first["line"] == 3
    assert {e["process"] for e in events} == {"nvidia-smi", "cache_mgr_main", "gpud"}


def test_iso_dmesg_capture_yields_dbe_row_remap_and_contained_errors(captures: Path) -> None:
    events = xid_events(_read(captures, "dmesg.0.log"))
    assert Counter(e["xid"] for e in events) == {48: 1, 63: 1, 94: 9}
    dbe = events[0]
    assert (dbe["xid"], dbe["pci_bus_id"], dbe["pid"], dbe["process"]) == (48, "00000000:19:00.0", None, None)
    assert dbe["wallclock"] == "2024-11-15T12:02:03,470068+00:00"
    assert events[3]["pid"] == 1248209 and events[3]["process"] == "python3.10"
    assert events[3]["message"] == "Ch 00000008"


def test_decode_iso_capture_counts_xid_13_and_43(captures: Path) -> None:
    events = xid_events(_read(captures, "dmesg.decode.iso.log.0"))
    assert Counter(e["xid"] for e in events) == {13: 629, 43: 7}
    assert {e["pci_bus_id"] for e in events} == {"00000000:38:00.0"}
    assert events[0]["message"].startswith("Graphics SM Warp Exception on (GPC 8, TPC 5, SM 0)")


@pytest.mark.parametrize("name", ["kmsg.1.log", "kmsg.2.peermem.log", "dmesg.peermem.log.0", "dmesg.decode.iso.log.1",
                                  "fabric-manager.0.log", "fabricmanager.log"])
def test_capture_without_gpu_faults_yields_no_events(captures: Path, name: str) -> None:
    assert parse_kernel_log(_read(captures, name)).events == []


def test_every_capture_event_is_described_by_the_catalogue(captures: Path) -> None:
    codes = {e["xid"] for name in CAPTURE_NAMES for e in parse_kernel_log(_read(captures, name)).events}
    assert codes == {13, 43, 48, 63, 94, 119}
    assert all(code in CATALOGUE and describe(code).known for code in codes)


def test_kmsg_record_timestamp_becomes_monotonic_seconds() -> None:
    text = ("6,3964,206764307,-;nvidia-nvswitch2: open (major=510)\n"
            "4,3965,1234567890,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=77, name=python, GPU has fallen off the bus.\n"
            " SUBSYSTEM=pci\n"
            " DEVICE=+pci:0000:3b:00.0\n")
    result = parse_kernel_log(text)
    assert result.lines == 4 and result.unparsed == []
    [event] = result.events
    assert event["monotonic_s"] == pytest.approx(1234.567890)
    assert event["wallclock"] is None
    assert (event["xid"], event["line"], event["fallen_off_bus"]) == (79, 2, True)
    assert event["message"] == "GPU has fallen off the bus."


def test_bracket_timestamp_becomes_monotonic_seconds() -> None:
    [event] = parse_kernel_log("[ 1234.567890] NVRM: Xid (PCI:0000:9b:00): 31, pid=9, name=x, Ch 00000008\n").events
    assert event["monotonic_s"] == pytest.approx(1234.56789)
    assert (event["xid"], event["pid"], event["process"], event["message"]) == (31, 9, "x", "Ch 00000008")


def test_journalctl_prefix_gives_wallclock_and_monotonic() -> None:
    line = "Feb 23 16:24:18 gpu-node-7 kernel: [  88.000001] NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper\n"
    [event] = parse_kernel_log(line).events
    assert event["wallclock"] == "Feb 23 16:24:18"
    assert event["monotonic_s"] == pytest.approx(88.000001)
    # this driver printed pid but no name
    assert (event["pid"], event["process"], event["message"]) == (1896, None, "Row Remapper")
    assert event["pci_bus_id"] == "00000000:10:1C.0"


def test_xid_without_pid_and_old_pci_format_parse() -> None:
    text = ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)\n"
            "NVRM: Xid (0000:02:00): 13, 0003 00000000 0000a1c0 000002bc 00000000 00000000\n")
    first, second = parse_kernel_log(text).events
    assert (first["xid"], first["pid"], first["process"]) == (154, None, None)
    assert first["message"].endswith("(GPU Reset Required)")
    assert (second["xid"], second["pci_bus_id"]) == (13, "00000000:02:00.0")


def test_indented_continuation_joins_previous_event_message() -> None:
    text = ("NVRM: Xid (PCI:0000:3b:00): 31, pid=5, name=a, Ch 00000008, intr 10000000. MMU Fault:\n"
            "    ENGINE GRAPHICS faulted @ 0x7f2c_8c000000. Fault is of type FAULT_PDE\n"
            "unrelated line\n"
            "    indented but not after an event\n")
    result = parse_kernel_log(text)
    [event] = result.events
    assert event["message"].endswith("MMU Fault: ENGINE GRAPHICS faulted @ 0x7f2c_8c000000. Fault is of type FAULT_PDE")
    assert result.lines == 4


def test_fallen_off_bus_line_becomes_xid_79_equivalent() -> None:
    text = ("[ 5.0] NVRM: GPU at PCI:0000:3b:00: GPU-509665ad-b600-ac93-3616-d754b23d636d\n"
            "[ 9.5] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.\n"
            "[ 9.6] NVRM: The NVIDIA GPU 0000:5d:00.0 (PCI ID: 10de:2330) installed in this system has fallen off "
            "the bus and is not responding to commands.\n")
    events = parse_kernel_log(text).events
    assert [(e["kind"], e["xid"], e["pci_bus_id"], e["fallen_off_bus"]) for e in events] == [
        ("fallen_off_bus", 79, "00000000:3B:00.0", True), ("fallen_off_bus", 79, "00000000:5D:00.0", True)]
    assert events[0]["monotonic_s"] == pytest.approx(9.5)


def test_xid_line_missing_code_lands_in_unparsed_with_line_number() -> None:
    text = ("[ 1.0] ok line\n"
            "[ 2.0] NVRM: Xid (PCI:0000:9b:00): , pid=1, name=x, message without code\n"
            "[ 3.0] NVRM: Xid (PCI:0000:9b:00): 119, pid=1, name=x, fine\n")
    result = parse_kernel_log(text)
    assert [u["line"] for u in result.unparsed] == [2]
    assert "Xid" in result.unparsed[0]["text"] and result.unparsed[0]["reason"]
    assert [(e["xid"], e["line"]) for e in result.events] == [(119, 3)]


def test_garbage_lines_do_not_crash_and_suspect_ones_are_reported() -> None:
    garbage = "\n".join([
        "", "\x00\x01\xff\x1c\x85", "[", "[ abc] NVRM:", "6,1,notanumber,-;NVRM: Xid", "NVRM: Xid (", "Xid",
        "NVRM: Xid (PCI:zz:zz): 13, x", "kern  :warn  : NVRM: Xid (PCI:0000:9b:00): 99999999999999999999, x",
        "sunrpc: xid 0x1234 mismatch", ";;;;", "\t\t", "6,2,3,-;", "a" * 10000,
    ])
    result = parse_kernel_log(garbage)
    assert result.lines == len(garbage.split("\n"))
    assert result.events == []
    # "[ abc] NVRM:" has no Xid; the Xid lines (truncated, bad PCI id, absurd code) are all reported
    assert {u["line"] for u in result.unparsed} == {5, 6, 7, 8, 9}


def test_pci_bus_id_normalises_to_nvml_form() -> None:
    assert normalise_pci_bus_id("0000:9b:00") == "00000000:9B:00.0"
    assert normalise_pci_bus_id("9b:00.3") == "00000000:9B:00.3"
    assert normalise_pci_bus_id("00000000:9B:00.0") == "00000000:9B:00.0"


def test_fabric_manager_logs_yield_nvswitch_events_not_xids(captures: Path) -> None:
    result = parse_fabric_manager_log(_read(captures, "fabric-manager.0.log"))
    assert result.unparsed == []
    assert len(result.events) == 18
    first = result.events[0]
    assert (first["kind"], first["xid"], first["sxid"], first["fatal"]) == ("fabric_manager", None, 12028, False)
    assert (first["pci_bus_id"], first["port"], first["line"]) == ("00000000:83:00.0", 34, 191)
    assert first["wallclock"] == "Dec 19 2024 19:17:49"
    [last] = parse_fabric_manager_log(_read(captures, "fabricmanager.log")).events
    assert (last["pci_bus_id"], last["port"]) == ("00000000:86:00.0", 61)


def test_fabric_manager_fatal_error_is_flagged_fatal() -> None:
    line = ("[Dec 19 2024 19:17:49] [ERROR] [tid 1374] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch "
            "pci bus id 00000000:85:00.0 physical id 2 port 7")
    [event] = parse_fabric_manager_log(line).events
    assert (event["sxid"], event["fatal"], event["port"]) == (20034, True, 7)


def test_parser_and_catalogue_import_without_django() -> None:
    code = ("import sys, telemetry.agent.kernel_log, telemetry.xid; "
            "print(any(m.startswith('django') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False"
