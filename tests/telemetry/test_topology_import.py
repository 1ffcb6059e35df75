"""Topology files: parsing, every kind of validation issue, the upserting import and the command."""

from __future__ import annotations

import copy
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.models import Q

from telemetry.models import (
    Gpu,
    Hall,
    Link,
    MigInstance,
    Node,
    NvlinkDomain,
    Port,
    PowerDevice,
    Rack,
    Row,
    Site,
    Switch,
)
from telemetry.topology import (
    TopologyError,
    do_import_topology,
    load_topology_file,
    validate_topology,
)

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "topology"
INVENTORY = (Site, Hall, Row, Rack, NvlinkDomain, Node, Gpu, MigInstance, Switch, Port, Link,
             PowerDevice, PowerDevice.racks.through, PowerDevice.nodes.through)
RACK0 = "sites[0].halls[0].rows[0].racks[0]"
GPU_0001_2 = "GPU-167d8376-ee13-fca4-938a-a05167c43cdc"  # gpu-0001, index 2, in MIG mode


def _doc(name: str) -> dict:
    return load_topology_file(FIXTURES / name)


def _counts() -> dict[str, int]:
    return {m.__name__: m.objects.count() for m in INVENTORY}


def _port(owner: str, name: str) -> Port:
    return Port.objects.select_related("node", "switch").get(
        name=name, **({"switch__name": owner} if owner.startswith(("leaf", "spine")) else
                      {"node__hostname": owner}))


def _link(owner: str, name: str) -> Link:
    port = _port(owner, name)
    return Link.objects.select_related("a__node", "a__switch", "b__node", "b__switch").get(
        Q(a=port) | Q(b=port))


def _peer(owner: str, name: str) -> str:
    """The far end of the cable on a port, as 'owner:port'."""
    link = _link(owner, name)
    return str(link.b if str(link.a) == f"{owner}:{name}" else link.a)


def _assert_rejected(name: str, expected: dict[str, str]) -> None:
    """Importing the file raises exactly these issue paths, each message holding its fragment,
    and writes nothing (the good cluster imported first stays as it was)."""
    do_import_topology(_doc("good.yaml"))
    before = _counts()
    with pytest.raises(TopologyError) as caught:
        do_import_topology(_doc(name))
    got = {issue.path: issue.message for issue in caught.value.issues}
    assert sorted(got) == sorted(expected), got
    for path, fragment in expected.items():
        assert fragment in got[path], (path, got[path])
    assert _counts() == before


# --- a good file -------------------------------------------------------------------------
@pytest.mark.django_db
def test_good_yaml_imports_every_kind_with_counts():
    result = do_import_topology(_doc("good.yaml"))

    created = {kind: c.created for kind, c in result.counts.items()}
    assert created == {
        "sites": 1, "halls": 1, "rows": 2, "racks": 3, "nvlink_domains": 2, "nodes": 5, "gpus": 8,
        "mig_instances": 2, "switches": 2, "ports": 15, "links": 4, "power_devices": 4,
        "power_feeds": 8,
    }
    assert _counts()["Gpu"] == 8 and _counts()["Link"] == 4


@pytest.mark.django_db
def test_good_yaml_imports_places_and_hardware_relations():
    do_import_topology(_doc("good.yaml"))

    r0101, r0201 = Rack.objects.get(name="r01-01"), Rack.objects.get(name="r02-01")
    assert (str(r0101.row), r0101.position, r0101.u_height, r0101.power_cap_w) == (
        "dc1/hall-a/row-01", 1, 48, 40000)
    assert (str(r0201.row), r0201.position, r0201.u_height) == ("dc1/hall-a/row-02", 0, 42)
    node = Node.objects.get(hostname="gpu-0001")
    assert (node.rack, node.u_position, node.u_height, node.system_model) == (
        r0101, 2, 8, "DGX H100")
    assert node.nvlink_domain.name == "nvd-gpu-0001"
    assert [(g.index, g.serial) for g in node.gpus.order_by("index")][:2] == [
        (0, "1650124031592"), (1, "1650124008135")]
    mig_gpu = Gpu.objects.get(uuid=GPU_0001_2)
    assert mig_gpu.node == node and mig_gpu.mig_mode is True
    assert sorted(mig_gpu.mig_instances.values_list("gi_id", "ci_id", "profile")) == [
        (1, 0, "3g.40gb"), (2, 0, "3g.40gb")]
    nvl72 = NvlinkDomain.objects.get(name="nvl72-r02-01")
    assert (nvl72.kind, nvl72.rack) == ("rack", r0201)
    assert set(nvl72.nodes.values_list("hostname", flat=True)) == {"gb-0001", "gb-0002"}
    assert Node.objects.get(hostname="gpu-0003").u_position is None


@pytest.mark.django_db
def test_good_yaml_imports_fabric_links_and_ports():
    do_import_topology(_doc("good.yaml"))

    assert _peer("gpu-0001", "mlx5_0/1") == "leaf-01:p1"
    assert _peer("gpu-0001", "mlx5_1/1") == "leaf-01:p2"
    assert _peer("leaf-01", "p3") == "gpu-0002:mlx5_0/1"
    assert _peer("spine-01", "sw1") == "leaf-01:p7"
    leaf, spine = Switch.objects.get(name="leaf-01"), Switch.objects.get(name="spine-01")
    assert (leaf.rack.name, leaf.u_position, leaf.role) == ("r01-01", 42, "leaf")
    assert leaf.model == "QM9700"
    assert (spine.rack, spine.u_position, spine.role) == (None, None, "spine")
    assert sorted(spine.ports.values_list("name", flat=True)) == ["sw1", "sw2", "sw3", "sw4"]
    generated, explicit = _port("leaf-01", "p1"), _port("leaf-01", "p8")
    assert (generated.link_layer, generated.speed_gbps) == ("infiniband", 400)
    assert (explicit.link_layer, explicit.speed_gbps) == ("ethernet", 200)
    hca = _port("gpu-0001", "mlx5_0/1")
    assert (hca.guid, hca.lid, hca.rail, hca.speed_gbps) == ("0xa288c2fffee3142a", 12, 0, 400)


@pytest.mark.django_db
def test_good_yaml_imports_power_feeds_and_upstream():
    do_import_topology(_doc("good.yaml"))

    pdu = PowerDevice.objects.get(name="pdu-r01-01-a")
    psu = PowerDevice.objects.get(name="psu-gpu-0001-1")
    shelf = PowerDevice.objects.get(name="shelf-r02-01")
    loop = PowerDevice.objects.get(name="loop-hall-a-1")
    assert (pdu.kind, pdu.capacity_w, pdu.upstream) == ("pdu", 17300, None)
    assert (psu.kind, psu.upstream) == ("psu", pdu)
    assert list(pdu.racks.values_list("name", flat=True)) == ["r01-01"]
    assert list(psu.nodes.values_list("hostname", flat=True)) == ["gpu-0001"]
    assert set(shelf.nodes.values_list("hostname", flat=True)) == {"gb-0001", "gb-0002"}
    assert loop.kind == "cooling_loop" and loop.racks.count() == 3


@pytest.mark.django_db
def test_good_json_imports_with_generated_ports():
    result = do_import_topology(_doc("good.json"))

    assert (result["nodes"].created, result["ports"].created, result["links"].created) == (1, 3, 1)
    assert _peer("lab-0001", "mlx5_0/1") == "lab-leaf:p1"
    gpu = Gpu.objects.get(uuid="GPU-025f6884-1162-3032-9aab-14e0d5622783")
    assert gpu.node.hostname == "lab-0001"


# --- re-imports and edits ----------------------------------------------------------------
def _snapshot() -> dict[str, set]:
    return {m.__name__: set(m.objects.values_list("pk", flat=True)) for m in INVENTORY}


@pytest.mark.django_db
def test_reimport_same_file_is_noop_with_same_ids():
    do_import_topology(_doc("good.yaml"))
    before = _snapshot()

    result = do_import_topology(_doc("good.yaml"))

    assert not result.changed
    assert all(c.created == c.updated == c.removed == 0 for c in result.counts.values())
    assert result["gpus"].unchanged == 8 and result["ports"].unchanged == 15
    assert _snapshot() == before


@pytest.mark.django_db
def test_edited_file_updates_in_place_and_moves_gpu():
    do_import_topology(_doc("good.yaml"))
    moved = Gpu.objects.get(uuid="GPU-afe9f2ed-9dd0-572c-3cd8-b42b58b3bc99")
    old_link = _link("leaf-01", "p3")
    doc = _doc("good.yaml")
    racks = doc["sites"][0]["halls"][0]["rows"][0]["racks"]
    racks[0]["position"] = 5
    gpu = racks[0]["nodes"][0]["gpus"].pop(3)
    racks[0]["nodes"][1]["gpus"].append({**gpu, "index": 2})
    doc["links"][2] = ["leaf-01:p4", "gpu-0002:mlx5_0/1"]  # re-cabled to another leaf port
    doc["power"][0]["racks"] = ["r01-02"]

    result = do_import_topology(doc)

    assert Rack.objects.get(name="r01-01").position == 5
    gpu_row = Gpu.objects.get(pk=moved.pk)
    assert (gpu_row.node.hostname, gpu_row.index) == ("gpu-0002", 2)
    assert gpu_row.serial == "1650124032506"
    assert _peer("gpu-0002", "mlx5_0/1") == "leaf-01:p4"
    assert not Link.objects.filter(pk=old_link.pk).exists()
    pdu = PowerDevice.objects.get(name="pdu-r01-01-a")
    assert list(pdu.racks.values_list("name", flat=True)) == ["r01-02"]
    assert (result["gpus"].updated, result["racks"].updated) == (1, 1)
    assert (result["links"].created, result["links"].removed) == (1, 1)
    assert (result["power_feeds"].created, result["power_feeds"].removed) == (1, 1)


@pytest.mark.django_db
def test_a_swapped_gpu_gives_its_slot_to_the_one_the_file_puts_there():
    do_import_topology(_doc("good.yaml"))
    doc = _doc("good.yaml")
    node = doc["sites"][0]["halls"][0]["rows"][0]["racks"][0]["nodes"][0]
    old_uuid = node["gpus"][1]["uuid"]
    node["gpus"][1] = {**node["gpus"][1], "uuid": "GPU-00000000-1111-2222-3333-444444444444", "serial": "999"}

    result = do_import_topology(doc)

    old, new = Gpu.objects.get(uuid=old_uuid), Gpu.objects.get(uuid="GPU-00000000-1111-2222-3333-444444444444")
    assert (new.node_id, new.index) == (old.node_id, node["gpus"][1]["index"])
    assert old.index is None, "the swapped-out GPU keeps its history but no longer holds the slot"
    assert (result["gpus"].created, result["gpus"].removed) == (1, 1)
    assert Gpu.objects.filter(node_id=new.node_id, index=new.index).count() == 1


@pytest.mark.django_db
def test_auto_registered_unplaced_node_gets_placed_with_same_ids():
    # As ingest registers them: hostname only, no rack; the GPU with what telemetry reported.
    node = Node.objects.create(hostname="gpu-0003", rack=None)
    gpu = Gpu.objects.create(uuid="GPU-4ef109e9-e925-4834-2b85-0771b4ef696c", node=node, index=0,
                             model="NVIDIA H100 80GB HBM3", serial="1650124047010", mig_mode=True)

    result = do_import_topology(_doc("good.yaml"))

    placed = Node.objects.get(hostname="gpu-0003")
    assert placed.pk == node.pk and placed.placed and placed.rack.name == "r01-02"
    kept = Gpu.objects.get(uuid=gpu.uuid)
    assert (kept.pk, kept.node_id) == (gpu.pk, node.pk)
    # The file names neither model, serial nor MIG mode: what telemetry reported stays.
    assert (kept.model, kept.serial) == ("NVIDIA H100 80GB HBM3", "1650124047010")
    assert kept.mig_mode is True
    assert (result["nodes"].created, result["nodes"].updated) == (4, 1)
    assert Node.objects.count() == 5


@pytest.mark.django_db
def test_replace_removes_what_the_file_no_longer_names():
    do_import_topology(_doc("good.yaml"))
    gpu_0003 = Node.objects.get(hostname="gpu-0003")
    doc = _doc("good.yaml")
    doc["sites"][0]["halls"][0]["rows"][0]["racks"].pop(1)  # rack r01-02 with gpu-0003
    doc["switches"] = []
    doc["links"] = doc["links"][:3]
    doc["power"] = [p for p in doc["power"] if p["kind"] != "cooling_loop"]
    doc["sites"][0]["halls"][0]["rows"][0]["racks"][0]["nodes"][0]["gpus"][2].pop("mig")

    result = do_import_topology(doc, replace=True)

    assert not Switch.objects.filter(name="spine-01").exists()
    assert not Port.objects.filter(name__startswith="sw").exists()
    assert not PowerDevice.objects.filter(name="loop-hall-a-1").exists()
    assert not Rack.objects.filter(name="r01-02").exists()
    assert not MigInstance.objects.exists()
    unplaced = Node.objects.get(pk=gpu_0003.pk)
    assert unplaced.rack is None and unplaced.gpus.count() == 1  # history keeps its ids
    removed = {kind: c.removed for kind, c in result.counts.items() if c.removed}
    # Ports: spine-01's four. Power: the cooling loop. Nodes: gpu-0003, unplaced.
    assert removed == {"switches": 1, "ports": 4, "links": 1, "nodes": 1, "racks": 1,
                       "mig_instances": 2, "power_devices": 1, "power_feeds": 3}


# --- validation issues, one kind of mistake per fixture ----------------------------------
@pytest.mark.django_db
def test_structure_errors_report_exact_paths_and_write_nothing():
    node1 = f"{RACK0}.nodes[1]"
    _assert_rejected("bad_structure.yaml", {
        f"{RACK0}.u_height": "0 is out of range 1..32767",
        f"{RACK0}.nodes[0].hostnmae": "unknown key 'hostnmae'; did you mean 'hostname'?",
        f"{RACK0}.nodes[0].hostname": "required key is missing",
        f"{node1}.u_height": "expected an integer, got string 'four'",
        f"{node1}.gpus[0].uuid": "'gpu-1234' is not a GPU UUID",
        f"{node1}.gpus[1].index": "-1 is out of range",
        f"{node1}.gpus[1].mig_mode": "expected true or false, got string 'yes'",
        f"{node1}.hcas[0].link_layer": "'infiniband2' is not one of: infiniband, ethernet",
        f"{RACK0}.switches[0].role": "'lef' is not one of: leaf, spine, core",
        f"{RACK0}.switches[0].guid": "got integer 2202698922898097056 (quote it)",
        "switches[0].u": "unknown key 'u'",
        "nvlink_domains[0].kind": "'tray' is not one of: node, rack",
        "power[0].capacity_w": "-5 must be a positive number",
    })


@pytest.mark.django_db
def test_duplicates_report_both_paths_and_write_nothing():
    node0, switch0 = f"{RACK0}.nodes[0]", f"{RACK0}.switches[0]"
    _assert_rejected("bad_duplicates.yaml", {
        f"{node0}.gpus[1].index": f"duplicate GPU index 0 on this node; "
                                  f"first at {node0}.gpus[0].index",
        f"{node0}.gpus[0].mig[1].gi_id": "duplicate MIG instance (gi_id, ci_id) (1, 0) on this "
                                         f"GPU; first at {node0}.gpus[0].mig[0].gi_id",
        f"{node0}.hcas[1].name": "duplicate port name 'mlx5_0/1' on this node; "
                                 f"first at {node0}.hcas[0].name",
        f"{switch0}.ports[1].name": "duplicate port name 'x1' on this switch; "
                                    f"first at {switch0}.ports[0].name",
        "sites[0].halls[0].rows[0].racks[1].name": "duplicate rack name 'r01-01'; "
                                                   f"first at {RACK0}.name",
        f"{RACK0}.nodes[1].hostname": f"duplicate hostname 'gpu-0001'; first at {node0}.hostname",
        f"{RACK0}.nodes[1].gpus[0].uuid": "duplicate GPU UUID 'GPU-aaaa'; "
                                          f"first at {node0}.gpus[0].uuid",
        "switches[0].name": f"duplicate switch name 'leaf-01'; first at {switch0}.name",
        "nvlink_domains[1].name": "duplicate NVLink domain name 'nvd-1'; "
                                  "first at nvlink_domains[0].name",
        "power[1].name": "duplicate power device name 'pdu-1'; first at power[0].name",
        "links[1][0]": "port 'leaf-01:p1' is already cabled by the link at links[0][1]",
    })


@pytest.mark.django_db
def test_unresolved_references_report_exact_paths_and_write_nothing():
    _assert_rejected("bad_references.yaml", {
        f"{RACK0}.nodes[0].nvlink_domain": "no NVLink domain named 'nvd-missing'",
        f"{RACK0}.nodes[1].nvlink_domain": "domain 'nvl72-r01-02' is rack 'r01-02' but this node "
                                           "is in rack 'r01-01'",
        "nvlink_domains[0].rack": "no rack named 'r01-02' in this file",
        "nvlink_domains[1].rack": "a rack-scale domain (kind: rack) needs its rack",
        "links[0][0]": "node 'gpu-0001' has no port 'mlx5_9/1'",
        "links[1][0]": "no switch or node named 'gpu-0009' in this file",
        "links[2][0]": "string 'gpu-0001' is not an endpoint '<switch or hostname>:<port>'",
        "power[0].upstream": "no power device named 'pdu-missing' in this file",
        "power[0].racks[0]": "no rack named 'r09-09' in this file",
        "power[0].nodes[1]": "no node named 'gpu-0404' in this file",
    })


@pytest.mark.django_db
def test_u_ranges_outside_rack_or_overlapping_are_rejected():
    _assert_rejected("bad_u_ranges.yaml", {
        f"{RACK0}.nodes[2].u": "node 'gpu-0003' at U40-U43 does not fit in rack 'r01-01' (42U)",
        f"{RACK0}.nodes[1].u": f"node 'gpu-0002' at U8-U11 overlaps node 'gpu-0001' at U2-U9 "
                               f"({RACK0}.nodes[0].u)",
        f"{RACK0}.switches[0].u": f"switch 'leaf-01' at U11 overlaps node 'gpu-0002' at U8-U11 "
                                  f"({RACK0}.nodes[1].u)",
    })


@pytest.mark.django_db
def test_power_upstream_cycles_are_rejected():
    _assert_rejected("bad_power_cycle.yaml", {
        "power[0].upstream": "upstream cycle: pdu-a -> psu-c -> psu-b -> pdu-a",
        "power[3].upstream": "upstream cycle: loop-1 -> loop-1",
    })


def test_version_missing_or_unsupported_is_an_issue():
    assert [str(i) for i in validate_topology({})] == ["version: required key is missing"]
    assert [i.message for i in validate_topology({"version": 2})] == [
        "unsupported version 2; this loader reads version 1"]


def test_wrong_container_types_name_the_item():
    issues = validate_topology({"version": 1, "sites": [5], "links": "a:b", "power": [["x"]]})
    assert [str(i) for i in issues] == [
        "sites[0]: expected a mapping, got integer 5",
        "links: expected a list, got string 'a:b'",
        "power[0]: expected a mapping, got list ['x']",
    ]


def test_values_the_database_would_refuse_are_issues():
    rack = {"name": "r1", "nodes": [{"hostname": "h" * 254}, {"hostname": "bad:name"}],
            "switches": [{"name": "s1", "role": "leaf", "port_count": 5000}]}
    doc = {"version": 1, "sites": [{"name": "dc 1", "halls": [{"name": "h", "rows": [
        {"name": "r", "racks": [rack]}]}]}]}
    got = {i.path: i.message for i in validate_topology(doc)}
    base = "sites[0].halls[0].rows[0].racks[0]"
    assert got == {
        "sites[0].name": "'dc 1' is not a slug (letters, digits, '-' and '_')",
        f"{base}.nodes[0].hostname": f"{'h' * 40!r}... is 254 characters long; the limit is 253",
        f"{base}.nodes[1].hostname": "'bad:name' must have no spaces and no ':' "
                                     "(':' separates owner and port in links)",
        f"{base}.switches[0].port_count": "5000 is out of range 1..4096",
    }


def test_docs_example_is_valid():
    text = (REPO / "docs" / "topology.md").read_text()
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    doc = yaml.safe_load(example)
    assert validate_topology(doc) == []


def test_explicit_null_means_absent_but_not_for_required_keys():
    doc = {"version": 1, "power": [{"name": None, "kind": "pdu", "upstream": None,
                                    "capacity_w": None, "racks": None}]}
    assert [str(i) for i in validate_topology(doc)] == ["power[0].name: must not be null"]


@pytest.mark.django_db
def test_link_stored_on_a_port_the_file_cables_elsewhere_is_replaced():
    do_import_topology(_doc("good.yaml"))
    # An operator's manual entry: spine-01:sw2 cabled to gpu-0001's first HCA.
    Link.objects.filter(a=_port("gpu-0001", "mlx5_0/1")).delete()
    Link.objects.create(a=_port("spine-01", "sw2"), b=_port("gpu-0001", "mlx5_0/1"))

    result = do_import_topology(_doc("good.yaml"))

    assert _peer("gpu-0001", "mlx5_0/1") == "leaf-01:p1"
    assert not Link.objects.filter(a=_port("spine-01", "sw2")).exists()
    links = result["links"]
    assert (links.created, links.removed, links.unchanged) == (1, 1, 3)


# --- reading files -----------------------------------------------------------------------
def test_yaml_syntax_error_names_the_line():
    with pytest.raises(TopologyError) as caught:
        load_topology_file(FIXTURES / "syntax_error.yaml")
    (issue,) = caught.value.issues
    assert issue.path == "line 6, column 8"
    assert issue.message.startswith("YAML syntax error: did not find expected '-' indicator")


def test_yaml_duplicate_key_names_the_line():
    with pytest.raises(TopologyError) as caught:
        load_topology_file(FIXTURES / "duplicate_key.yaml")
    assert str(caught.value) == "line 4, column 5: YAML syntax error: found duplicate key 'name' " \
                                "(while constructing a mapping)"


def test_json_syntax_error_names_the_line():
    with pytest.raises(TopologyError) as caught:
        load_topology_file(FIXTURES / "syntax_error.json")
    assert str(caught.value) == (
        "line 4, column 19: JSON syntax error: trailing comma is not allowed")


def test_unknown_extension_is_read_as_json_then_yaml(tmp_path):
    (tmp_path / "a.topo").write_text('{"version": 1}')
    (tmp_path / "b.topo").write_text("version: 1\nsites: []\n")
    (tmp_path / "c.topo").write_text("- just\n- a list\n")
    assert load_topology_file(tmp_path / "a.topo") == {"version": 1}
    assert load_topology_file(tmp_path / "b.topo") == {"version": 1, "sites": []}
    with pytest.raises(TopologyError, match="expected a mapping with 'version: 1'"):
        load_topology_file(tmp_path / "c.topo")


# --- the command -------------------------------------------------------------------------
@pytest.mark.django_db
def test_command_imports_and_prints_summary_per_kind():
    out = io.StringIO()
    call_command("import_topology", str(FIXTURES / "good.yaml"), stdout=out)
    lines = out.getvalue().splitlines()
    assert any(line.split()[:3] == ["gpus", "8", "created"] for line in lines)
    assert lines[-1].endswith("good.yaml: imported")
    assert Gpu.objects.count() == 8


@pytest.mark.django_db
def test_command_dry_run_validates_and_writes_nothing():
    out = io.StringIO()
    call_command("import_topology", str(FIXTURES / "good.yaml"), "--dry-run", stdout=out)
    assert "valid (dry run, nothing written)" in out.getvalue()
    assert sum(_counts().values()) == 0


@pytest.mark.django_db
def test_command_errors_print_file_path_message_to_stderr():
    err = io.StringIO()
    path = str(FIXTURES / "bad_power_cycle.yaml")
    with pytest.raises(CommandError, match="2 problem"):
        call_command("import_topology", path, stderr=err)
    assert err.getvalue().splitlines() == [
        f"{path}: power[0].upstream: upstream cycle: pdu-a -> psu-c -> psu-b -> pdu-a",
        f"{path}: power[3].upstream: upstream cycle: loop-1 -> loop-1",
    ]
    assert sum(_counts().values()) == 0


@pytest.mark.django_db
def test_command_shows_fifty_issues_then_how_many_more(tmp_path):
    doc = {"version": 1, "power": [{"name": f"d{i}", "kind": "ups"} for i in range(60)]}
    path = tmp_path / "many.json"
    path.write_text(json.dumps(doc))
    err = io.StringIO()
    with pytest.raises(CommandError, match="60 problem"):
        call_command("import_topology", str(path), "--dry-run", stderr=err)
    lines = err.getvalue().splitlines()
    assert len(lines) == 51 and lines[-1] == "and 10 more"
    assert lines[0] == (
        f"{path}: power[0].kind: 'ups' is not one of: psu, pdu, power_shelf, cooling_loop")


@pytest.mark.django_db
def test_command_exit_status_is_nonzero_on_errors():
    # A real process, so the exit status is the one an operator or CI sees; it points at the
    # test database, though a rejected file never reaches the database at all.
    db = connection.settings_dict
    env = {**os.environ, "DATABASE_URL": f"postgresql://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:"
                                         f"{db['PORT']}/{db['NAME']}"}
    path = str(FIXTURES / "bad_u_ranges.yaml")
    proc = subprocess.run([sys.executable, "manage.py", "import_topology", path], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert f"{path}: {RACK0}.nodes[2].u: node 'gpu-0003'" in proc.stderr
    assert "3 problem(s); nothing was written" in proc.stderr


# --- scale ---------------------------------------------------------------------------------
def _big_cluster(nodes: int = 2048, gpus: int = 8, hcas: int = 4, leaves: int = 192,
                 spines: int = 16) -> dict:
    """16 rows x 16 racks x 8 nodes x 8 GPUs, 4 HCAs per node cabled to 48 down ports per leaf,
    every spine port cabled to a leaf uplink, a PDU per rack, two PSUs per node."""
    racks, links, power = [], [], []
    for n in range(nodes):
        rack_no, host = n // 8, f"gpu-{n:04d}"
        if n % 8 == 0:
            rack = {"name": f"r{rack_no:03d}", "position": rack_no % 16, "nodes": []}
            if rack_no < leaves:
                rack["switches"] = [{"name": f"leaf-{rack_no:03d}", "role": "leaf", "u": 44,
                                     "port_count": 64, "port_speed_gbps": 400}]
            racks.append(rack)
            power.append({"name": f"pdu-{rack_no:03d}", "kind": "pdu", "racks": [rack["name"]]})
        racks[-1]["nodes"].append({
            "hostname": host, "u": 2 + (n % 8) * 5, "u_height": 5, "nvlink_domain": f"nvd-{host}",
            "gpus": [{"index": g, "uuid": f"GPU-{n:08x}-0000-4000-8000-{g:012x}",
                      "model": "NVIDIA H100 80GB HBM3",
                      **({"mig": [{"gi_id": i, "profile": "1g.10gb"} for i in range(7)]}
                         if n % 8 == 0 and g == 0 else {})} for g in range(gpus)],
            "hcas": [{"name": f"mlx5_{h}/1", "rail": h, "speed_gbps": 400} for h in range(hcas)],
        })
        power += [{"name": f"psu-{host}-{i}", "kind": "psu", "upstream": f"pdu-{rack_no:03d}",
                   "nodes": [host]} for i in (1, 2)]
        for h in range(hcas):
            k = n * hcas + h
            links.append([f"{host}:mlx5_{h}/1", f"leaf-{k // 48:03d}:p{k % 48 + 1}"])
    for u in range(spines * 64):
        leaf, spine = f"leaf-{u % leaves:03d}", f"spine-{u // 64:02d}"
        links.append([f"{leaf}:p{49 + u // leaves}", f"{spine}:p{u % 64 + 1}"])
    rows = [{"name": f"row-{i:02d}", "racks": racks[i * 16:(i + 1) * 16]} for i in range(16)]
    return {
        "version": 1,
        "sites": [{"name": "dc1", "halls": [{"name": "hall-a", "rows": rows}]}],
        "switches": [{"name": f"spine-{s:02d}", "role": "spine", "port_count": 64}
                     for s in range(spines)],
        "nvlink_domains": [{"name": f"nvd-gpu-{n:04d}", "kind": "node"} for n in range(nodes)],
        "links": links,
        "power": power,
    }


@pytest.mark.slow
@pytest.mark.django_db
def test_16k_gpu_cluster_imports_in_well_under_a_minute(capsys):
    doc = _big_cluster()
    started = time.perf_counter()
    result = do_import_topology(copy.deepcopy(doc))
    first = time.perf_counter() - started
    started = time.perf_counter()
    again = do_import_topology(doc)
    second = time.perf_counter() - started
    with capsys.disabled():
        print(f"\n16,384-GPU topology: first import {first:.1f}s, re-import (no-op) {second:.1f}s")

    assert {k: result[k].created for k in ("nodes", "gpus", "switches", "ports", "links")} == {
        "nodes": 2048, "gpus": 16384, "switches": 208, "ports": 21504, "links": 9216}
    assert not again.changed
    assert first < 60 and second < 60
