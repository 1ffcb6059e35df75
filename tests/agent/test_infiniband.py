"""InfiniBand/RoCE counters: the sysfs reader, the perfquery -x parser and the counter tracker.

Pure tests, no database: values are checked against the real captures in shared/data/fabric,
read independently of the code under test (file contents, regexes over the raw text).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from telemetry.agent.infiniband import (
    LEGACY_WRAP,
    CounterTracker,
    PerfqueryError,
    Problem,
    counter_fields,
    parse_perfquery_x,
    read_sysfs,
)

SYSFS = Path("fabric/gpud-sysfs-infiniband/sys-class-infiniband-h100.0")
PERFQUERY = Path("fabric/infiniband_exporter-treydock/perfquery")
EMPTY_CAPTURE = "0x506b4b0300cc02a6.out"

# registry field -> (sysfs file under counters/, scale to bytes); written out here rather than
# taken from the registry so the test checks the mapping instead of repeating it.
SYSFS_EXPECTED = {
    "xmit_data_bytes": ("port_xmit_data", 4),
    "rcv_data_bytes": ("port_rcv_data", 4),
    "xmit_pkts": ("port_xmit_packets", 1),
    "rcv_pkts": ("port_rcv_packets", 1),
    "xmit_wait": ("port_xmit_wait", 1),
    "symbol_errors": ("symbol_error", 1),
    "link_downed": ("link_downed", 1),
    "link_error_recovery": ("link_error_recovery", 1),
    "rcv_errors": ("port_rcv_errors", 1),
    "rcv_remote_phys_errors": ("port_rcv_remote_physical_errors", 1),
    "xmit_discards": ("port_xmit_discards", 1),
    "local_link_integrity_errors": ("local_link_integrity_errors", 1),
    "buffer_overrun_errors": ("excessive_buffer_overrun_errors", 1),
}
PERFQUERY_EXPECTED = {
    "xmit_data_bytes": ("PortXmitData", 4),
    "rcv_data_bytes": ("PortRcvData", 4),
    "xmit_pkts": ("PortXmitPkts", 1),
    "rcv_pkts": ("PortRcvPkts", 1),
    "xmit_wait": ("PortXmitWait", 1),
    "symbol_errors": ("SymbolErrorCounter", 1),
    "link_downed": ("LinkDownedCounter", 1),
    "link_error_recovery": ("LinkErrorRecoveryCounter", 1),
    "rcv_errors": ("PortRcvErrors", 1),
    "rcv_remote_phys_errors": ("PortRcvRemotePhysicalErrors", 1),
    "xmit_discards": ("PortXmitDiscards", 1),
    "local_link_integrity_errors": ("LocalLinkIntegrityErrors", 1),
    "buffer_overrun_errors": ("ExcessiveBufferOverrunErrors", 1),
}
# Unmapped perfquery counters land under the names sysfs gives them, so both sources agree.
PERFQUERY_EXTRA = {
    "PortUnicastXmitPkts": "ib.unicast_xmit_packets",
    "PortUnicastRcvPkts": "ib.unicast_rcv_packets",
    "PortMulticastXmitPkts": "ib.multicast_xmit_packets",
    "PortMulticastRcvPkts": "ib.multicast_rcv_packets",
    "PortRcvSwitchRelayErrors": "ib.port_rcv_switch_relay_errors",
    "VL15Dropped": "ib.VL15_dropped",
    "QP1Dropped": "ib.qp1_dropped",
}


@pytest.fixture
def sysfs_tree(shared_data: Path) -> Path:
    return shared_data / SYSFS


@pytest.fixture
def sysfs_copy(sysfs_tree: Path, tmp_path: Path) -> Path:
    """A writable copy of the real tree (the shared data is read-only)."""
    copy = tmp_path / "infiniband"
    shutil.copytree(sysfs_tree, copy, copy_function=shutil.copyfile)
    for dirpath, _dirs, _files in os.walk(copy):
        os.chmod(dirpath, 0o755)
    return copy


def _int(path: Path) -> int:
    return int(path.read_text().strip())


def _by_port(records: list[dict]) -> dict[str, dict]:
    return {r["port"]: r for r in records}


# --- sysfs ------------------------------------------------------------------------------------


def test_read_sysfs_every_port_read_without_problems(sysfs_tree: Path) -> None:
    problems: list[Problem] = []
    records = read_sysfs(sysfs_tree, host="h100-0", problems=problems)
    on_disk = sorted(f"{p.parent.parent.name}/{p.name}" for p in sysfs_tree.glob("*/ports/*"))
    assert len(on_disk) == 9
    assert sorted(r["port"] for r in records) == on_disk
    assert problems == []
    assert {r["host"] for r in records} == {"h100-0"}


def test_read_sysfs_values_equal_file_contents(sysfs_tree: Path) -> None:
    records = _by_port(read_sysfs(sysfs_tree, host="h100-0"))
    for port_dir in sysfs_tree.glob("*/ports/*"):
        record = records[f"{port_dir.parent.parent.name}/{port_dir.name}"]
        for name, (source, scale) in SYSFS_EXPECTED.items():
            assert record["fields"][name] == _int(port_dir / "counters" / source) * scale, (port_dir, name)
        mapped = {source for source, _ in SYSFS_EXPECTED.values()}
        for f in (port_dir / "counters").iterdir():
            if f.name not in mapped:
                assert record["extra"][f"ib.{f.name}"] == _int(f)
        for f in (port_dir / "hw_counters").iterdir():
            if f.name != "lifespan":  # the driver's cache period, not a counter
                assert record["extra"][f"roce.{f.name}"] == _int(f)
        assert "roce.lifespan" not in record["extra"]


def test_read_sysfs_data_counters_in_bytes(sysfs_tree: Path) -> None:
    record = _by_port(read_sysfs(sysfs_tree, host="h"))["mlx5_0/1"]
    # port_xmit_data holds 230442669431839 four-byte words.
    assert record["fields"]["xmit_data_bytes"] == 230442669431839 * 4


def test_read_sysfs_link_layer_ethernet_for_roce_bond(sysfs_tree: Path) -> None:
    records = _by_port(read_sysfs(sysfs_tree, host="h"))
    layers = {port: r["link_layer"] for port, r in records.items()}
    assert layers.pop("mlx5_bond_0/1") == "ethernet"  # sysfs says "Ethernet": RoCE
    assert set(layers.values()) == {"infiniband"} and len(layers) == 8


def test_read_sysfs_rate_and_state_parsed(sysfs_tree: Path) -> None:
    records = _by_port(read_sysfs(sysfs_tree, host="h"))
    assert records["mlx5_0/1"]["fields"]["link_speed_gbps"] == 400.0  # "400 Gb/sec (4X NDR)"
    assert records["mlx5_bond_0/1"]["fields"]["link_speed_gbps"] == 200.0  # "200 Gb/sec (2X NDR)"
    assert {r["fields"]["link_state"] for r in records.values()} == {4}  # "4: ACTIVE"
    assert {r["extra"]["ib.phys_state"] for r in records.values()} == {5}  # "5: LinkUp"


def test_read_sysfs_garbage_counter_counted_as_problem(sysfs_copy: Path) -> None:
    bad = sysfs_copy / "mlx5_0/ports/1/counters/symbol_error"
    bad.write_text("garbage\n")
    problems: list[Problem] = []
    records = _by_port(read_sysfs(sysfs_copy, host="h", problems=problems))
    assert [p.path for p in problems] == [bad]
    assert "not a counter value" in problems[0].reason
    assert len(records) == 9
    assert "symbol_errors" not in records["mlx5_0/1"]["fields"]
    assert records["mlx5_0/1"]["fields"]["xmit_wait"] == 2489603687  # the rest of the port survives
    assert records["mlx5_1/1"]["fields"]["symbol_errors"] == 0


def test_read_sysfs_unreadable_files_counted_as_problems(sysfs_copy: Path) -> None:
    # A directory where a file should be fails on read as an unreadable sysfs attribute does.
    unreadable = sysfs_copy / "mlx5_4/ports/1/hw_counters/out_of_buffer"
    unreadable.unlink()
    unreadable.mkdir()
    (sysfs_copy / "mlx5_5/ports/1/rate").write_text("fast")
    (sysfs_copy / "mlx5_6/ports/1/link_layer").write_text("Token Ring")
    problems: list[Problem] = []
    records = _by_port(read_sysfs(sysfs_copy, host="h", problems=problems))
    assert len(problems) == 3
    assert "unreadable" in problems[0].reason
    assert "roce.out_of_buffer" not in records["mlx5_4/1"]["extra"]
    assert "link_speed_gbps" not in records["mlx5_5/1"]["fields"]
    assert "link_layer" not in records["mlx5_6/1"]


def test_read_sysfs_problems_logged_without_list(sysfs_copy: Path, caplog: pytest.LogCaptureFixture) -> None:
    (sysfs_copy / "mlx5_0/ports/1/counters/link_downed").write_text("-1")
    read_sysfs(sysfs_copy, host="h")
    assert "link_downed" in caplog.text


def test_read_sysfs_missing_root_no_records(tmp_path: Path) -> None:
    problems: list[Problem] = []
    assert read_sysfs(tmp_path / "absent", host="h", problems=problems) == []
    assert problems == []


# --- tracker ----------------------------------------------------------------------------------


def test_tracker_first_reading_no_change() -> None:
    assert CounterTracker().update("mlx5_0/1", 0.0, {"xmit_pkts": 5}) == {}


def test_tracker_increase_delta_and_rate_per_second() -> None:
    tracker = CounterTracker()
    tracker.update("p", 100.0, {"xmit_data_bytes": 1_000, "symbol_errors": 2})
    changes = tracker.update("p", 110.0, {"xmit_data_bytes": 51_000, "symbol_errors": 2})
    assert changes["xmit_data_bytes"].delta == 50_000
    assert changes["xmit_data_bytes"].rate == 5_000.0
    assert changes["xmit_data_bytes"].how == "ok"
    assert changes["symbol_errors"].rate == 0.0


def test_tracker_wrap_at_2_32_right_delta() -> None:
    tracker = CounterTracker(wrap_at=LEGACY_WRAP)
    tracker.update("p", 0.0, {"xmit_pkts": 2**32 - 10})
    change = tracker.update("p", 2.0, {"xmit_pkts": 5})["xmit_pkts"]
    assert (change.delta, change.how, change.rate) == (15, "wrap", 7.5)


def test_tracker_legacy_data_wraps_in_bytes() -> None:
    # 2**32 four-byte words wrap at 4 * 2**32 bytes once the reader has scaled them.
    tracker = CounterTracker(wrap_at=LEGACY_WRAP)
    tracker.update("p", 0.0, {"xmit_data_bytes": 4 * (2**32 - 1)})
    assert tracker.update("p", 1.0, {"xmit_data_bytes": 4 * 3})["xmit_data_bytes"].delta == 16


def test_tracker_64bit_wrap_right_delta() -> None:
    tracker = CounterTracker()
    tracker.update("p", 0.0, {"xmit_wait": 2**64 - 1})
    assert tracker.update("p", 1.0, {"xmit_wait": 0})["xmit_wait"].delta == 1


def test_tracker_small_drop_is_reset() -> None:
    tracker = CounterTracker(wrap_at=LEGACY_WRAP)
    tracker.update("p", 0.0, {"xmit_pkts": 1_000_000, "rcv_errors": 40})
    changes = tracker.update("p", 1.0, {"xmit_pkts": 300, "rcv_errors": 2})
    assert (changes["xmit_pkts"].delta, changes["xmit_pkts"].how) == (300, "reset")
    assert (changes["rcv_errors"].delta, changes["rcv_errors"].how) == (2, "reset")


def test_tracker_value_over_legacy_width_treated_as_64bit() -> None:
    # A reading above 2**32 proves the counter is extended; a drop from it is then a reset.
    tracker = CounterTracker(wrap_at=LEGACY_WRAP)
    tracker.update("p", 0.0, {"xmit_pkts": 315487941081})
    assert tracker.update("p", 1.0, {"xmit_pkts": 7})["xmit_pkts"].how == "reset"


def test_tracker_stale_reading_ignored() -> None:
    tracker = CounterTracker()
    tracker.update("p", 10.0, {"xmit_pkts": 100})
    assert tracker.update("p", 10.0, {"xmit_pkts": 200}) == {}
    assert tracker.update("p", 12.0, {"xmit_pkts": 300})["xmit_pkts"].delta == 200


def test_tracker_repeated_sysfs_reading_zero_deltas(sysfs_tree: Path) -> None:
    tracker = CounterTracker()
    records = read_sysfs(sysfs_tree, host="h")
    for r in records:
        assert tracker.update(r["port"], 0.0, counter_fields(r)) == {}
    again = tracker.update("mlx5_0/1", 15.0, counter_fields(records[0]))
    assert "link_speed_gbps" not in again  # gauges and states are not fed to the tracker
    assert {c.delta for c in again.values()} == {0}


# --- perfquery -x -----------------------------------------------------------------------------


def _captures() -> list[str]:
    from tests.conftest import SHARED_DATA

    return sorted(p.name for p in (SHARED_DATA / PERFQUERY).glob("*.out") if p.name != EMPTY_CAPTURE)


@pytest.mark.parametrize("name", _captures())
def test_parse_perfquery_x_capture_values_match_text(shared_data: Path, name: str) -> None:
    text = (shared_data / PERFQUERY / name).read_text()
    guid = name.removesuffix(".out")
    records = parse_perfquery_x(text, guid=guid)
    ports = re.findall(r"^# Port extended counters: Lid \d+ port (\d+)", text, re.M)
    assert ports and [r["port"] for r in records] == [f"{guid}/{p}" for p in ports]
    for field, (counter, scale) in PERFQUERY_EXPECTED.items():
        values = [int(v) for v in re.findall(rf"^{counter}:\.+(\d+)$", text, re.M)]
        assert [r["fields"][field] for r in records] == [v * scale for v in values], field
    for counter, extra in PERFQUERY_EXTRA.items():
        values = [int(v) for v in re.findall(rf"^{counter}:\.+(\d+)$", text, re.M)]
        assert [r["extra"][extra] for r in records] == values, counter
    assert all(r["switch"] == guid and r["guid"] == guid for r in records)


def test_parse_perfquery_x_two_port_capture_both_ports(shared_data: Path) -> None:
    records = parse_perfquery_x((shared_data / PERFQUERY / "0x7cfe9003009ce5b0.out").read_text(), host="leaf1")
    assert [r["port"] for r in records] == ["lid1719/1", "lid1719/2"]
    assert [r["host"] for r in records] == ["leaf1", "leaf1"]
    assert records[1]["fields"]["xmit_data_bytes"] == 26006570014026 * 4


def test_parse_perfquery_x_empty_capture_raises_empty_output(shared_data: Path) -> None:
    with pytest.raises(PerfqueryError, match="empty output"):
        parse_perfquery_x((shared_data / PERFQUERY / EMPTY_CAPTURE).read_text(), guid="0x506b4b0300cc02a6")


def test_parse_perfquery_x_rcv_error_details_rejected(shared_data: Path) -> None:
    # perfquery -E output (PortRcvErrorDetails) is not -x output.
    path = shared_data / "fabric/infiniband_exporter-treydock/perfquery-rcv-error/0x7cfe9003009ce5b0-1.out"
    with pytest.raises(PerfqueryError, match="line 1: not a `perfquery -x` block header"):
        parse_perfquery_x(path.read_text())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("# Port extended counters: Lid 2 port 1\nPortXmitData:....12\nPortRcvData:....twelve\n", "line 3: malformed"),
        ("PortXmitData:....12\n", "line 1: counter before any"),
        ("# Port extended counters: Lid 2 port 1\nPortSelect:....2\n", "line 2: PortSelect 2"),
        ("# Port extended counters: Lid 2 port 1\nPortXmitData:..1\nPortXmitData:..1\n", "line 3: PortXmitData rep"),
        ("# Port extended counters: Lid 2 port 1\n\n", "line 1: header without counters"),
    ],
)
def test_parse_perfquery_x_malformed_raises_with_line(text: str, message: str) -> None:
    with pytest.raises(PerfqueryError, match=message):
        parse_perfquery_x(text)


def test_parse_perfquery_x_host_and_switch_rejected() -> None:
    with pytest.raises(ValueError, match="not both"):
        parse_perfquery_x("x", host="a", switch="b")
