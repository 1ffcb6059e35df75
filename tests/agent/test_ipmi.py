"""ipmitool text parsers on the real telegraf captures."""

from __future__ import annotations

import pytest

from telemetry.agent.ipmi import IpmiError, parse_dcmi_power_reading, parse_sdr_elist


@pytest.fixture
def ipmi_dir(shared_data):
    return shared_data / "power" / "ipmi-telegraf"


def test_dcmi_power_reading_capture_gives_watts(ipmi_dir):
    got = parse_dcmi_power_reading((ipmi_dir / "ipmitool_dcmi_power_reading.txt").read_text())
    assert got["instantaneous_watts"] == 167 and got["min_watts"] == 124
    assert got["max_watts"] == 422 and got["avg_watts"] == 156
    assert got["sampling_period_s"] == 699043 and got["state"] == "activated"
    assert got["timestamp"] == "Mon Aug  1 21:22:51 2016"


def test_dcmi_deactivated_drops_watts(ipmi_dir):
    text = (ipmi_dir / "ipmitool_dcmi_power_reading.txt").read_text().replace("activated", "deactivated")
    got = parse_dcmi_power_reading(text)
    assert "instantaneous_watts" not in got and "deactivated" in got["reason"]


def test_dcmi_malformed_raises_naming_line(ipmi_dir):
    text = (ipmi_dir / "ipmitool_dcmi_power_reading.txt").read_text().replace("422 Watts", "lots")
    with pytest.raises(IpmiError, match="line 3"):
        parse_dcmi_power_reading(text)


def test_sdr_elist_capture_gives_units_and_missing(ipmi_dir):
    sensors = {s["name"]: s for s in parse_sdr_elist((ipmi_dir / "ipmitool_sdr_elist_v2.txt").read_text())}
    assert sensors["Inlet Temp"]["value"] == 25 and sensors["Inlet Temp"]["unit"] == "°C"
    assert sensors["Fan1"]["value"] == 5040 and sensors["Fan1"]["kind"] == "fan"
    assert sensors["Power Supply 1"]["value"] == 110 and sensors["Power Supply 1"]["unit"] == "W"
    assert sensors["SEL"]["value"] is None and sensors["SEL"]["id"] == "72h"


def test_sdr_list_capture_parses_every_line(ipmi_dir):
    text = (ipmi_dir / "ipmitool_sdr_list_v1.txt").read_text()
    sensors = parse_sdr_elist(text)
    assert len(sensors) == len([line for line in text.splitlines() if line.strip()])
    by_name = {s["name"]: s for s in sensors}
    assert by_name["Avg Power"]["value"] == 210 and by_name["Ambient Temp"]["value"] == 20
    assert by_name["DASD Backplane 3"]["value"] is None


def test_sdr_malformed_raises_naming_line():
    with pytest.raises(IpmiError, match="line 2"):
        parse_sdr_elist("Fan1 | 30h | ok | 7.1 | 5040 RPM\ngarbage without cells\n")
