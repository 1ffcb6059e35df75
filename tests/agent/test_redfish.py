"""Redfish collection against a real local HTTP server playing each captured BMC tree."""

from __future__ import annotations

import json

import pytest

from telemetry.agent.redfish import KWH_TO_J, RedfishClient, RedfishError, collect
from tests.agent.redfish_server import redfish_server  # noqa: F401 (pytest fixture)
from tests.procs import free_port


def _json(path):
    return json.loads(path.read_text())


@pytest.fixture
def power_dir(shared_data):
    return shared_data / "power"


def _dell_routes(tg, power="dell_power.json", thermal="dell_thermal.json", chassis="dell_chassis.json"):
    return {
        "/redfish/v1": tg / "base.json",
        "/redfish/v1/Chassis": {"Members": [{"@odata.id": "/redfish/v1/Chassis/System.Embedded.1"}]},
        "/redfish/v1/Chassis/System.Embedded.1": tg / "dell" / chassis,
        "/redfish/v1/Chassis/System.Embedded.1/Power": tg / "dell" / power,
        "/redfish/v1/Chassis/System.Embedded.1/Thermal": tg / "dell" / thermal,
    }


def test_dell_legacy_power_thermal_values_match_files(redfish_server, power_dir):  # noqa: F811
    tg = power_dir / "redfish-telegraf"
    server = redfish_server(routes=_dell_routes(tg))
    got = collect(RedfishClient(server.url), host="n1")
    power = _json(tg / "dell" / "dell_power.json")
    [rec] = got.power
    assert rec["device"] == "n1" and got.problems == []
    assert rec["fields"]["watts"] == power["PowerControl"][0]["PowerConsumedWatts"]
    assert rec["extra"]["psu_psu_slot_1_input_watts"] == power["PowerSupplies"][0]["PowerInputWatts"]
    thermal = _json(tg / "dell" / "dell_thermal.json")
    assert rec["extra"]["temp_cpu1_temp"] == thermal["Temperatures"][0]["ReadingCelsius"]
    assert rec["extra"]["fan_system_board_fan1a_rpm"] == thermal["Fans"][0]["Reading"]


@pytest.mark.parametrize("variant", ["power", "thermal", "chassis"])
def test_dell_malformed_variant_is_problem_not_crash(redfish_server, power_dir, variant):  # noqa: F811
    tg = power_dir / "redfish-telegraf"
    server = redfish_server(routes=_dell_routes(tg, **{variant: f"dell_{variant}invalid.json"}))
    got = collect(RedfishClient(server.url), host="n1")
    assert len(got.problems) == 1
    name = {"power": "/Power", "thermal": "/Thermal", "chassis": "System.Embedded.1"}[variant]
    assert name in got.problems[0] and "bad JSON" in got.problems[0]


def test_hp_legacy_inlet_and_watts_match_files(redfish_server, power_dir):  # noqa: F811
    tg = power_dir / "redfish-telegraf"
    routes = {
        "/redfish/v1": tg / "base.json",
        "/redfish/v1/Chassis": {"Members": [{"@odata.id": "/redfish/v1/Chassis/1"}]},
        "/redfish/v1/Chassis/1": tg / "hp" / "hp_chassis.json",
        "/redfish/v1/Chassis/1/Power": tg / "hp" / "hp_power.json",
        "/redfish/v1/Chassis/1/Thermal": tg / "hp" / "hp_thermal.json",
    }
    got = collect(RedfishClient(redfish_server(routes=routes).url), host="n1")
    thermal = _json(tg / "hp" / "hp_thermal.json")
    inlet = next(t for t in thermal["Temperatures"] if t["PhysicalContext"] == "Intake")
    assert got.power[0]["fields"]["inlet_temp"] == inlet["ReadingCelsius"]
    power = _json(tg / "hp" / "hp_power.json")
    assert got.power[0]["fields"]["watts"] == power["PowerControl"][0]["PowerConsumedWatts"]


def test_hp_power_subsystem_energy_kwh_converted(redfish_server, power_dir):  # noqa: F811
    tg, ps = power_dir / "redfish-telegraf", power_dir / "redfish-telegraf" / "hp" / "power_subsys"
    ts = tg / "hp" / "thermal_subsys"
    routes = {
        "/redfish/v1": tg / "base.json",
        "/redfish/v1/Chassis": {"Members": [{"@odata.id": "/redfish/v1/Chassis/1"}]},
        "/redfish/v1/Chassis/1": tg / "hp" / "hp_chassis_subsys.json",
        "/redfish/v1/Chassis/1/PowerSubsystem": ps / "hp_power_subsys.json",
        "/redfish/v1/Chassis/1/PowerSubsystem/PowerSupplies": ps / "hp_power_subsys_psu.json",
        "/redfish/v1/Chassis/1/PowerSubsystem/PowerSupplies/PowerSupply1": ps / "hp_power_subsys_psu_1.json",
        "/redfish/v1/Chassis/1/PowerSubsystem/PowerSupplies/PowerSupply1/Metrics": ps / "hp_power_subsys_metrics.json",
        "/redfish/v1/Chassis/1/ThermalSubsystem": ts / "hp_thermal_subsys.json",
        "/redfish/v1/Chassis/1/ThermalSubsystem/ThermalMetrics": ts / "hp_thermal_metrics.json",
    }
    got = collect(RedfishClient(redfish_server(routes=routes).url), host="n1")
    metrics = _json(ps / "hp_power_subsys_metrics.json")
    fields = got.power[0]["fields"]
    assert fields["energy_j"] == metrics["EnergykWh"]["Reading"] * KWH_TO_J
    assert fields["watts"] == metrics["InputPowerWatts"]["Reading"]
    tm = _json(tg / "hp" / "thermal_subsys" / "hp_thermal_metrics.json")
    assert fields["inlet_temp"] == tm["TemperatureReadingsCelsius"][0]["Reading"]


def test_dmtf_rackmount_prefers_new_model(redfish_server, power_dir):  # noqa: F811
    tree = power_dir / "redfish-dmtf-mockups" / "public-rackmount1"
    got = collect(RedfishClient(redfish_server(tree).url), host="n1")
    env = _json(tree / "Chassis" / "1U" / "EnvironmentMetrics" / "index.json")
    tm = _json(tree / "Chassis" / "1U" / "ThermalSubsystem" / "ThermalMetrics" / "index.json")
    [rec] = got.power
    assert rec["fields"]["watts"] == env["PowerWatts"]["Reading"]
    assert rec["fields"]["inlet_temp"] == tm["TemperatureSummaryCelsius"]["Intake"]["Reading"]
    assert rec["fields"]["outlet_temp"] == tm["TemperatureSummaryCelsius"]["Exhaust"]["Reading"]
    psu = _json(tree / "Chassis" / "1U" / "PowerSubsystem" / "PowerSupplies" / "Bay1" / "Metrics" / "index.json")
    assert rec["fields"]["energy_j"] == psu["EnergykWh"]["Reading"] * KWH_TO_J
    assert got.problems == [] and got.gpus == []


def test_dmtf_pdu_outlets_become_power_records(redfish_server, power_dir):  # noqa: F811
    tree = power_dir / "redfish-dmtf-mockups" / "public-pdu"
    got = collect(RedfishClient(redfish_server(tree).url), host="n1")
    by_device = {r["device"]: r["fields"] for r in got.power}
    metrics = _json(tree / "PowerEquipment" / "RackPDUs" / "1" / "Metrics" / "index.json")
    assert by_device["n1/PDU"]["watts"] == metrics["PowerWatts"]["Reading"]
    assert by_device["n1/PDU"]["energy_j"] == metrics["EnergykWh"]["Reading"] * KWH_TO_J
    outlet = _json(tree / "PowerEquipment" / "RackPDUs" / "1" / "Outlets" / "A1" / "index.json")
    assert by_device["n1/PDU/A1"]["watts"] == outlet["PowerWatts"]["Reading"]


def test_dmtf_power_shelf_record_named_by_chassis(redfish_server, power_dir):  # noqa: F811
    tree = power_dir / "redfish-dmtf-mockups" / "public-power-shelf"
    got = collect(RedfishClient(redfish_server(tree).url), host="n1")
    metrics = _json(tree / "PowerEquipment" / "PowerShelves" / "1" / "Metrics" / "index.json")
    shelf = next(r for r in got.power if r["device"] == "n1/PowerShelf")
    assert shelf["fields"]["watts"] == metrics["PowerWatts"]["Reading"]


def test_liteon_shelf_watts_from_sensors(redfish_server, power_dir):  # noqa: F811
    tree = power_dir / "redfish-lambdalabs-gpu" / "powershelf_liteon"
    got = collect(RedfishClient(redfish_server(tree).url), host="n1")
    sensors = _json(tree / "redfish" / "v1" / "Chassis" / "powershelf" / "Sensors" / "index.json")["Members"]
    expected = next(s["Reading"] for s in sensors if s["Id"] == "chassis_input_power")
    [shelf] = got.power
    assert shelf["device"] == "n1/powershelf" and shelf["fields"]["watts"] == expected


def test_delta_shelf_calling_itself_rackmount_is_a_power_shelf(redfish_server, power_dir):  # noqa: F811
    tree = power_dir / "redfish-lambdalabs-gpu" / "powershelf_delta"
    got = collect(RedfishClient(redfish_server(tree).url), host="n1")
    sensors = _json(tree / "redfish" / "v1" / "Chassis" / "PowerShelf_0" / "Sensors" / "index.json")["Members"]
    expected = next(s["Reading"] for s in sensors if s["Id"] == "total_power_in")
    [shelf] = got.power
    assert shelf["device"] == "n1/PowerShelf_0" and shelf["fields"]["watts"] == expected
    assert got.problems == []


def test_gb300_gpus_keyed_by_uuid_with_pcie_counters(redfish_server, power_dir):  # noqa: F811
    tree = power_dir / "redfish-lambdalabs-gpu" / "gb300_happypath"
    got = collect(RedfishClient(redfish_server(tree).url), host="n1")
    procs = tree / "redfish" / "v1" / "Systems" / "HGX_Baseboard_0" / "Processors"
    assert [g["uuid"] for g in got.gpus] == [_json(procs / f"GPU_{i}" / "index.json")["UUID"] for i in range(4)]
    metrics = _json(procs / "GPU_0" / "ProcessorMetrics" / "index.json")
    gpu0 = got.gpus[0]
    assert gpu0["fields"]["pcie_replay"] == metrics["PCIeErrors"]["ReplayCount"]
    assert gpu0["extra"]["redfish_pcie_l0torecoverycount"] == metrics["PCIeErrors"]["L0ToRecoveryCount"]
    assert gpu0["fields"]["sm_clock"] == metrics["OperatingSpeedMHz"]
    assert got.problems == []


def test_gpu_without_uuid_keyed_by_redfish_id(redfish_server, power_dir):  # noqa: F811
    tree = power_dir / "redfish-lambdalabs-gpu" / "gpu_info_unknown_multi"
    got = collect(RedfishClient(redfish_server(tree).url), host="n1")
    assert [g["uuid"] for g in got.gpus] == ["GPU_SXM_1", "GPU_SXM_2"]
    assert all(g["extra"]["redfish_key"] == "id" for g in got.gpus)


def test_gpu_environment_metrics_power_read(redfish_server, power_dir):  # noqa: F811
    tree = power_dir / "redfish-lambdalabs-gpu" / "gpu_info_unknown_multi"
    env_path = "/redfish/v1/Systems/HGX_Baseboard_0/Processors/GPU_SXM_1/EnvironmentMetrics"
    env = {"PowerWatts": {"Reading": 612.5}, "TemperatureCelsius": {"Reading": 51}}
    got = collect(RedfishClient(redfish_server(tree, routes={env_path: env}).url), host="n1")
    assert got.gpus[0]["fields"]["power_w"] == 612.5 and got.gpus[0]["fields"]["gpu_temp"] == 51


def test_hashedresponses_served_by_md5_of_path_and_query(redfish_server, power_dir):  # noqa: F811
    tree = power_dir / "redfish-lambdalabs-gpu" / "gb300_happypath"
    server = redfish_server(tree)
    assert server.body("/redfish/v1/Systems?$expand=nothing") is None
    assert server.body("/redfish/v1/Systems/") == (tree / "redfish" / "v1" / "Systems" / "index.json").read_bytes()


def test_wrong_credentials_raise_naming_url_and_status(redfish_server, power_dir):  # noqa: F811
    tree = power_dir / "redfish-lambdalabs-gpu" / "gb300_happypath"
    server = redfish_server(tree, username="admin", password="secret")
    with pytest.raises(RedfishError, match=r"/redfish/v1: HTTP 401") as info:
        RedfishClient(server.url, username="admin", password="wrong").get("/redfish/v1")
    assert info.value.status == 401
    assert RedfishClient(server.url, username="admin", password="secret").get("/redfish/v1")["Id"] == "RootService"


def test_wrong_credentials_in_collect_is_problem(redfish_server, power_dir):  # noqa: F811
    tree = power_dir / "redfish-lambdalabs-gpu" / "gb300_happypath"
    server = redfish_server(tree, username="admin", password="secret")
    got = collect(RedfishClient(server.url, username="admin", password="wrong"), host="n1")
    assert got.power == [] and "HTTP 401" in got.problems[0]


def test_closed_port_raises_redfish_error():
    port = free_port()
    with pytest.raises(RedfishError, match=f"127.0.0.1:{port}/redfish/v1: connection failed"):
        RedfishClient(f"http://127.0.0.1:{port}", timeout=2).get("/redfish/v1")


def test_non_object_json_raises_bad_json(redfish_server):  # noqa: F811
    server = redfish_server(routes={"/redfish/v1": b"[1, 2]"})
    with pytest.raises(RedfishError, match="bad JSON: expected an object"):
        RedfishClient(server.url).get("/redfish/v1")
