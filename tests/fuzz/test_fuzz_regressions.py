"""Every crash the fuzzers found, as its minimal input: now the parser's documented error, or a result.

Each case names the crash it was (the exception that escaped before the fix) and checks the clear error
that replaced it: the documented type, and a message naming the line, path or field and the value.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest

from telemetry.agent import infiniband, nvsmi, redfish
from telemetry.ingest.documents import parse_json, parse_ndjson
from telemetry.ingest.schema import BatchError
from telemetry.slurm import parse, parse_cluster
from telemetry.slurm.parse import SlurmParseError
from tests.fuzz import targets

JOB = {"job_id": 1, "job_state": "RUNNING"}


def _squeue(**job) -> str:
    return json.dumps({"jobs": [{**JOB, **job}]})


def _batch_error(call, where: str, message: str) -> None:
    with pytest.raises(BatchError) as info:
        call()
    assert info.value.where == where
    assert re.search(message, info.value.message), info.value.message


# --- JSON / NDJSON ingest ---------------------------------------------------------------------------

GPU = {"host": "node-a", "uuid": "GPU-1"}


@pytest.mark.parametrize(("body", "where", "message"), [
    # TypeError: unhashable type: 'list' (the time cache looked the value up before checking its type)
    (b'{"time": []}', "$.time", "RFC 3339 string or epoch seconds, got list"),
    # OverflowError: int too large to convert to float (math.isfinite on an integer time)
    (b'{"time": 1' + b"0" * 400 + b"}", "$.time", "out of range"),
    # OverflowError from astimezone: the offset moves the time before year 1
    (b'{"time": "0001-01-01T00:00:00+01:00"}', "$.time", "out of range"),
    # RecursionError: orjson refuses the depth, the fallback parser ran out of stack
    (b"[" * 100_000, "$", "nested deeper than 1,024 levels"),
    # ValueError: Exceeds the limit (4300 digits) for integer string conversion
    (b'{"time": 1e999, "gpus": [' + b"9" * 4301 + b"]}", "$", "number too long"),
    # a BatchError without a location: the non-UTF-8 body said only "byte 0"
    (b'{"gpus": []}\n\x82', "line 2 column 1", r"not UTF-8 \(byte 0x82 at offset 13\)"),
    # TypeError: unhashable type: 'dict' (an event's kind checked against a set)
    (b'{"events": [{"host": "h", "gpu_uuid": "GPU-1", "kind": {}}]}', "$.events[0].kind", "must be one of"),
    # 503 from PostgreSQL (value too long for varchar(64)): the identity was not length-checked
    (json.dumps({"gpus": [{**GPU, "uuid": "G" * 65, "fields": {"gpu_util": 1}}]}).encode(), "$.gpus[0].uuid",
     "longer than 64 characters"),
    # 503 from PostgreSQL (smallint out of range)
    (json.dumps({"gpus": [{**GPU, "index": 40000, "fields": {"gpu_util": 1}}]}).encode(), "$.gpus[0].index",
     "from 0 to 32767, got 40000"),
    # 503 from PostgreSQL (NUL in text)
    (json.dumps({"gpus": [{**GPU, "host": "a\x00b", "fields": {"gpu_util": 1}}]}).encode(), "$.gpus[0].host",
     "NUL character"),
    # 500 from psycopg (a lone surrogate cannot be encoded to UTF-8)
    (b'{"gpus": [{"host": "a\\ud800", "uuid": "GPU-1", "fields": {"gpu_util": NaN}}]}', "$.gpus[0].host",
     "lone surrogate"),
    # 503 from PostgreSQL (integer out of range): an event code past int32
    (json.dumps({"events": [{"host": "h", "gpu_uuid": "GPU-1", "kind": "xid", "code": 2**40}]}).encode(),
     "$.events[0].code", "from 0 to 2147483647"),
    # 503 from PostgreSQL (NaN is not JSON for jsonb): the agent report was stored as it came
    (b'{"agent": {"host": "h", "x": NaN}}', "$.agent", "not storable as JSON"),
    (json.dumps({"gpus": {"host": ["h"], "uuid": ["U" * 65], "fields": {"gpu_util": [1]}}}).encode(),
     "$.gpus.uuid[0]", "longer than 64 characters"),
])
def test_json_ingest_regressions_give_located_errors(body, where, message):
    _batch_error(lambda: parse_json(body, targets._times()), where, message)


def test_ndjson_unhashable_kind_is_a_line_error():
    # TypeError: unhashable type: 'dict'
    _batch_error(lambda: parse_ndjson(b'{"kind": {}}', targets._times()), "line 1.kind", "must be one of")


@pytest.mark.parametrize(("fields", "reason"), [
    # OverflowError in the writer's float4 COPY: 1e39 passed validation as a finite number
    ({"gpu_util": 1e39}, "out of range for a 32-bit float field"),
    ({"gpu_util": 10**39}, "out of range for a 32-bit float field"),
])
def test_values_a_real_column_cannot_hold_are_rejected_samples(fields, reason):
    batch = parse_json(json.dumps({"gpus": [{**GPU, "fields": {**fields, "power_w": 300.5}}]}).encode(),
                       targets._times())
    assert batch.rejected == 1 and reason in batch.rejections[0]["reason"]
    assert batch.records["gpu"][0].values == {"power_w": 300.5}


def test_extra_integer_past_double_range_is_a_rejected_sample():
    # accepted, then OverflowError converting to float8 in the writer
    body = json.dumps({"gpus": [{**GPU, "extra": {"big": 10**400, "ok": 1}}]}).encode()
    batch = parse_json(body, targets._times())
    assert batch.rejected == 1 and "64-bit float" in batch.rejections[0]["reason"]
    assert batch.records["gpu"][0].extra == {"ok": 1}


def test_time_true_is_refused_even_after_time_one_was_parsed():
    # The cache answered True with the entry of 1 (True == 1 as a dict key).
    times = targets._times()
    times.parse(1, "$.time")
    with pytest.raises(BatchError, match="got True"):
        times.parse(True, "$.gpus[0].time")


# --- exposition (dcgm-exporter) ----------------------------------------------------------------------

DCGM_LINE = 'DCGM_FI_DEV_GPU_UTIL{gpu="%s",UUID="GPU-1",Hostname="node-a"} 42'


def test_exposition_timestamp_outside_the_calendar_names_its_line():
    # OverflowError: date value out of range (epoch + timedelta(milliseconds=2**63 - 1))
    from telemetry.ingest.exposition import parse_dcgm_exposition

    body = f"{DCGM_LINE % 0} 1\n{DCGM_LINE % 0} 9223372036854775807\n"
    _batch_error(lambda: parse_dcgm_exposition(body, targets._times(), None), "line 2",
                 "timestamp 9223372036854775807 ms is outside the years 1 to 9999")


def test_exposition_gpu_label_of_5000_digits_is_no_index():
    # ValueError: Exceeds the limit (4300 digits) for integer string conversion
    from telemetry.ingest.exposition import parse_dcgm_exposition

    batch, _ = parse_dcgm_exposition(DCGM_LINE % ("1" * 5000), targets._times(), None)
    assert [(r.ident["uuid"], r.ident.get("index")) for r in batch.records["gpu"]] == [("GPU-1", None)]


# --- nvidia-smi --------------------------------------------------------------------------------------

def _nvsmi_xml(value: str) -> bytes:
    return (f"<nvidia_smi_log><gpu id='00000000:07:00.0'><uuid>GPU-1</uuid><fan_speed>{value}</fan_speed>"
            "</gpu></nvidia_smi_log>").encode()


def test_nvsmi_number_of_4301_digits_is_missing_not_a_crash():
    # ValueError: Exceeds the limit (4300 digits) for integer string conversion
    result = nvsmi.parse_nvsmi_xml(_nvsmi_xml("9" * 4301 + " %"), host="h")
    assert "nvsmi_fan_speed_pct" not in result.gpus[0]["extra"]
    assert nvsmi.parse_nvsmi_xml(_nvsmi_xml("40 %"), host="h").gpus[0]["extra"]["nvsmi_fan_speed_pct"] == 40


def test_nvsmi_deeply_nested_xml_is_an_nvsmi_error():
    # RecursionError in the recursive tree builder
    deep = "<a>" * 5000 + "</a>" * 5000
    body = f"<nvidia_smi_log><gpu><uuid>GPU-1</uuid>{deep}</gpu></nvidia_smi_log>".encode()
    with pytest.raises(nvsmi.NvsmiError, match=r"nvidia_smi_log/gpu\[1\]/a\[1\]/.*nested deeper than 64"):
        nvsmi.parse_nvsmi_xml(body, host="h")


def test_nvsmi_text_of_only_the_banner_is_an_nvsmi_error():
    # IndexError: list index out of range (the first line of an outline that has none)
    with pytest.raises(nvsmi.NvsmiError, match="line 1: no 'key : value' lines"):
        nvsmi.parse_nvsmi_text(b"==============NVSMI LOG==============", host="h")


# --- InfiniBand ----------------------------------------------------------------------------------------

SYSFS_PORT = {"link_layer": "InfiniBand", "rate": "400 Gb/sec (4X NDR)", "state": "4: ACTIVE",
              "phys_state": "5: LinkUp"}


def _port(tmp_path: Path, name: str = "1", **files: str) -> Path:
    """One port directory as the captured H100 node has it, with `files` (counters__x: counters/x) changed."""
    port = tmp_path / "mlx5_0" / "ports" / name
    (port / "counters").mkdir(parents=True)
    for rel, body in {**SYSFS_PORT, **files}.items():
        (port / rel.replace("__", "/")).write_text(body)
    return tmp_path


def test_sysfs_port_named_superscript_two_sorts_instead_of_crashing(tmp_path):
    # ValueError: invalid literal for int() with base 10: '²' ("²".isdigit() is True)
    root = _port(tmp_path, "\u00b2", counters__symbol_error="0")
    _port(tmp_path, "2", counters__symbol_error="0")
    assert [r["port"] for r in infiniband.read_sysfs(root, host="h", problems=[])] == ["mlx5_0/2", "mlx5_0/\u00b2"]


@pytest.mark.parametrize(("body", "reason"), [
    ("1" * 5000, "not a counter value"),  # ValueError: Exceeds the limit (4300 digits)
    (str(2**63), "does not fit a signed 64-bit integer"),  # the server would refuse the whole batch
])
def test_sysfs_counter_out_of_range_is_a_problem(tmp_path, body, reason):
    problems: list[infiniband.Problem] = []
    records = infiniband.read_sysfs(_port(tmp_path, counters__symbol_error=body, counters__link_downed="3"),
                                    host="h", problems=problems)
    assert records[0]["fields"]["link_downed"] == 3 and "symbol_errors" not in records[0]["fields"]
    assert [p.path.name for p in problems] == ["symbol_error"] and reason in problems[0].reason


def test_sysfs_rate_of_400_digits_is_a_problem_not_infinity(tmp_path):
    problems: list[infiniband.Problem] = []
    records = infiniband.read_sysfs(_port(tmp_path, rate="1" * 400 + " Gb/sec"), host="h", problems=problems)
    assert "link_speed_gbps" not in records[0]["fields"] and "unexpected format" in problems[0].reason


PQ_HEADER = "# Port extended counters: Lid 133 port 1 (CapMask: 0x5A00)\n"


def test_perfquery_leading_zero_counter_parses_as_decimal():
    # ValueError: invalid literal for int() with base 0: '0123'
    records = infiniband.parse_perfquery_x(PQ_HEADER + "SymbolErrorCounter:......0123\n", guid="0x1")
    assert records[0]["fields"]["symbol_errors"] == 123


def test_perfquery_counter_past_int64_names_its_line():
    with pytest.raises(infiniband.PerfqueryError, match=r"line 2: PortXmitData value 9{20} does not fit"):
        infiniband.parse_perfquery_x(PQ_HEADER + "PortXmitData:......" + "9" * 20 + "\n", guid="0x1")


# --- Redfish -------------------------------------------------------------------------------------------

ROOT = {"@odata.id": "/redfish/v1", "Chassis": {"@odata.id": "/redfish/v1/Chassis"},
        "Systems": {"@odata.id": "/redfish/v1/Systems"}}


def _collect(tree: dict[str, dict | bytes]) -> redfish.RedfishReading:
    """A walk of `tree` through the real client, only the network replaced (see targets.check_redfish)."""
    bodies = {url: body if isinstance(body, bytes) else json.dumps(body).encode() for url, body in tree.items()}
    targets.check_redfish(bodies)
    opener, handler = targets._opener()
    handler.tree = bodies
    saved = urllib.request._opener
    urllib.request.install_opener(opener)
    try:
        return redfish.collect(redfish.RedfishClient("http://bmc.fuzz"), host="h")
    finally:
        urllib.request._opener = saved


def _chassis(**body) -> dict:
    return {"/redfish/v1": ROOT, "/redfish/v1/Chassis": {"Members": [{"@odata.id": "/redfish/v1/Chassis/1"}]},
            "/redfish/v1/Chassis/1": {"@odata.id": "/redfish/v1/Chassis/1", "Id": "1", **body}}


def test_redfish_chassis_type_list_is_read_not_a_crash():
    # TypeError: unhashable type: 'list' (ChassisType tested with `in` against a set)
    reading = _collect(_chassis(ChassisType=["Shelf"], Power={"@odata.id": "/redfish/v1/Chassis/1/Power"}))
    assert reading.problems == []


def test_redfish_deeply_nested_body_is_a_problem():
    # RecursionError from json.loads
    reading = _collect({"/redfish/v1": b"[" * 100_000})
    assert reading.problems == ["service root: http://bmc.fuzz/redfish/v1: bad JSON: nested too deeply"]


def test_redfish_link_to_a_local_file_is_not_followed():
    # urllib would have opened file:///etc/hostname for a BMC that links there
    reading = _collect({"/redfish/v1": {**ROOT, "Chassis": {"@odata.id": "file:///etc/hostname"}}})
    assert reading.problems == ["chassis collection: file:///etc/hostname: link leaves the BMC (another scheme or "
                                "host); not followed"]


def test_redfish_link_with_a_broken_ipv6_host_is_a_problem():
    # ValueError: Invalid IPv6 URL (urlsplit, outside the client's try)
    reading = _collect({"/redfish/v1": {**ROOT, "Chassis": {"@odata.id": "http://[::1/redfish/v1/Chassis"}}})
    assert reading.problems == ["chassis collection: http://[::1/redfish/v1/Chassis: bad URL: Invalid IPv6 URL"]


def test_redfish_processor_with_object_id_and_numeric_uuid():
    # TypeError: unhashable type: 'dict' (the processor's @odata.id put in a set), and a GPU keyed by UUID -1
    tree = {"/redfish/v1": ROOT, "/redfish/v1/Systems": {"Members": [{"@odata.id": "/redfish/v1/Systems/1"}]},
            "/redfish/v1/Systems/1": {"Processors": {"@odata.id": "/redfish/v1/Systems/1/Processors"}},
            "/redfish/v1/Systems/1/Processors": {"Members": [
                {"@odata.id": {"x": 1}, "ProcessorType": "GPU", "Id": "GPU_0", "UUID": -1, "Model": 7}]}}
    gpus = _collect(tree).gpus
    assert [(g["uuid"], "model" in g) for g in gpus] == [("GPU_0", False)]


def test_redfish_reading_past_float_range_is_a_problem():
    # OverflowError: int too large to convert to float
    env = {"@odata.id": "/redfish/v1/Chassis/1/EnvironmentMetrics", "PowerWatts": 10**400}
    tree = {**_chassis(EnvironmentMetrics={"@odata.id": env["@odata.id"]}), env["@odata.id"]: env}
    reading = _collect(tree)
    assert reading.power == [] and "not a number: 1000" in reading.problems[0]


# --- Slurm ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("call", "text", "message"), [
    # TypeError: 'float' object is not iterable
    (parse.parse_squeue_json, json.dumps({"jobs": [], "errors": 1.5}), r"squeue --json: errors: expected a list"),
    # TypeError: argument of type 'int' is not iterable
    (parse.parse_squeue_json, json.dumps({"jobs": [7]}), r"jobs\[0\]: expected an object, got 7"),
    # OverflowError: cannot convert float infinity to integer
    (parse.parse_squeue_json, _squeue(priority=1e999), r"jobs\[0\]\.priority: expected a number, got inf"),
    # ValueError: cannot convert float NaN to integer
    (parse.parse_squeue_json, _squeue(node_count=float("nan")), r"jobs\[0\]\.node_count: expected a number"),
    (parse.parse_squeue_json, _squeue(priority=2**64), r"jobs\[0\]\.priority: \d+ does not fit a 64-bit integer"),
    # AttributeError: 'int' object has no attribute 'strip'
    (parse.parse_squeue_json, _squeue(nodes=5), r"jobs\[0\]\.nodes: host list 5: not a string"),
    # a Job whose qos is an int, written as such by the scheduler sync
    (parse.parse_squeue_json, _squeue(qos=-1), r"jobs\[0\]\.qos: expected a string, got -1"),
    (parse.parse_squeue_json, _squeue(submit_time=10**15), r"jobs\[0\]\.submit_time: \d+ is not a time"),
    # ValueError: Exceeds the limit (4300 digits) for integer string conversion (in json.loads)
    (parse.parse_squeue_json, '{"jobs": [' + "9" * 4301 + "]}", "squeue --json: invalid JSON: Exceeds the limit"),
    # RecursionError in json.loads
    (parse.parse_squeue_json, "[" * 100_000, "squeue --json: invalid JSON: nested too deeply"),
    # ValueError: the 4,683-digit upper end of a host range
    (parse.parse_squeue_json, _squeue(nodes="n[1-" + "9" * 4683 + "]"), r"jobs\[0\]\.nodes: bad range"),
    # a hang: "n[0-99999999999]" expanded one host at a time
    (parse.parse_squeue_json, _squeue(nodes="n[0-99999999999]"), "expands past 100,000 entries"),
    (parse.parse_squeue_json, _squeue(nodes="a[1-1000]b[1-1000]"), "expands past 100,000 hosts"),
    (parse.parse_sacct_json, json.dumps({"jobs": [{"job_id": 1, "state": "RUNNING", "time": []}]}),
     r"jobs\[0\]\.time: expected an object, got \[\]"),
    # ValueError: Exceeds the limit (4300 digits), in sdiag text
    (parse_cluster.parse_diag, "Jobs submitted: " + "9" * 4301, r"line 1 \(Jobs submitted\): expected an integer"),
    # ValueError: invalid literal for int() with base 10: ' \x1f4585' (str.strip drops \x1f, int() does not)
    (parse_cluster.parse_diag, "Jobs submitted: \x1f4585\nJobs started: x", r"line 2 \(Jobs started\)"),
    # AttributeError: 'list' object has no attribute 'get'
    (parse_cluster.parse_reservations, '{"reservations": [[]]}', r"reservations\[0\]: missing key 'name'"),
    # AttributeError: 'str' object has no attribute 'get'
    (parse_cluster.parse_nodes, '{"nodes": ["n1"]}', r"nodes\[0\]: missing key 'name'"),
    # TypeError: argument of type 'float' is not iterable
    (parse_cluster.parse_licenses, '{"licenses": [1.5]}', r"licenses\[0\]: expected an object, got 1\.5"),
    # AttributeError: 'list' object has no attribute 'strip'
    (parse_cluster.parse_licenses, json.dumps({"licenses": [
        {"LicenseName": "a", "Total": 1, "Used": 0, "Free": 1, "Reserved": 0, "LastUpdate": []}]}),
     r"licenses\[0\]\.LastUpdate: bad Slurm time \[\]: not a string"),
])
def test_slurm_regressions_give_slurm_parse_errors(call, text, message):
    with pytest.raises(SlurmParseError, match=message):
        call(text)


def test_gres_with_a_newline_is_parsed_not_an_assertion_error():
    # AssertionError: the "matches any string" pattern did not match across a newline
    assert [g.name for g in parse.parse_gres("gpu:h100:1(S:0\n)")] == ["gpu"]


def test_superscript_digits_are_not_counts():
    # ValueError: invalid literal for int() with base 10: '²' (isdigit() accepts it, int() does not)
    line = parse.parse_sinfo_gres("\u00b2|gpu:\u00b2")[0]
    assert line.node_count is None and line.gres == [[parse.GresItem("gpu", "\u00b2", 1)]]


# --- topology ------------------------------------------------------------------------------------------

def _alias_bomb(fan: int) -> str:
    nodes = "[&node {hostname: n, gpus: [{index: 0, uuid: GPU-x}]}" + ", *node" * (fan - 1) + "]"
    racks = f"[&rack {{name: r, nodes: {nodes}}}" + ", *rack" * (fan - 1) + "]"
    rows = f"[&row {{name: row, racks: {racks}}}" + ", *row" * (fan - 1) + "]"
    halls = f"[&hall {{name: h, rows: {rows}}}" + ", *hall" * (fan - 1) + "]"
    return f"version: 1\nsites: [{{name: dc1, halls: {halls}}}]\n"


@pytest.mark.parametrize(("text", "message"), [
    # a hang: 956 bytes of nested aliases took 19 s and 1.6 million issues; 60 per level would take hours
    (_alias_bomb(30), "YAML aliases expand the document to more than 100,000 values"),
    # a list that contains itself: the walk would never end
    ("version: 1\nsites: &s [{name: dc1, halls: *s}]\n", "a YAML alias refers to a mapping or list that contains it"),
])
def test_topology_alias_bombs_are_refused(tmp_path, text, message):
    from telemetry.topology import TopologyError, load_topology_file

    path = tmp_path / "topology.yaml"
    path.write_text(text)
    with pytest.raises(TopologyError, match=message):
        load_topology_file(path)


def test_topology_yaml_number_of_4301_digits_is_a_syntax_error(tmp_path):
    # ValueError: Exceeds the limit (4300 digits), raised by PyYAML's int() and not a YAMLError
    from telemetry.topology import TopologyError, load_topology_file

    path = tmp_path / "topology.yaml"
    path.write_text("version: " + "9" * 4301 + "\n")
    with pytest.raises(TopologyError, match="YAML syntax error: a number is too long"):
        load_topology_file(path)


def test_topology_positive_number_past_float_range_is_an_issue():
    # OverflowError: int too large to convert to float (math.isfinite on a YAML integer)
    from telemetry.topology_schema import validate_topology

    doc = {"version": 1, "sites": [{"name": "dc1", "halls": [{"name": "h", "rows": [{"name": "r", "racks": [
        {"name": "r01", "power_cap_w": 10**400}]}]}]}]}
    issues = validate_topology(doc)
    assert [(i.path, i.message) for i in issues] == [
        ("sites[0].halls[0].rows[0].racks[0].power_cap_w", f"integer 1{'0' * 56}... is out of range for a number")]
