"""Cluster-level Slurm parsers (partitions, shares, reservations, sdiag, licenses, CPUs) against every capture.

No database. Expected values come from the raw capture itself (regex or json.load), so each test checks the
parser against the file rather than against numbers copied by hand. The last test makes sure every file in
shared/data/slurm is claimed by some parser test, here or in test_parse.py.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest

from telemetry.slurm.parse import SlurmParseError
from telemetry.slurm.parse_cluster import (
    parse_cpus,
    parse_diag,
    parse_licenses,
    parse_nodes,
    parse_partitions,
    parse_reservations,
    parse_shares,
)
from telemetry.slurm.parse_text import (
    account_users,
    parse_drain_reasons,
    parse_sacctmgr_associations,
    parse_sinfo_text,
    parse_squeue_text,
    parse_trace_info,
)
from tests.conftest import SHARED_DATA

SLURM = SHARED_DATA / "slurm"

# Glob patterns, relative to shared/data/slurm, of each kind this module parses.
KINDS: dict[str, list[str]] = {
    "cpus": ["sckyzo-slurm-exporter/cpus.txt", "sckyzo-slurm-exporter/*/cpus.txt",
             "vpenso-prometheus-slurm-exporter/sinfo_cpus.txt"],
    "partitions_json": ["*/V0040OpenapiPartitionResp.json", "*/V0041OpenapiPartitionResp.json",
                        "telegraf-slurmrestd/responses/partitions.json"],
    "partitions_text": ["sckyzo-slurm-exporter/*/partitions_cpu.txt", "sckyzo-slurm-exporter/*/nodes_global.txt"],
    "shares_text": ["sckyzo-slurm-exporter/fairshare.txt", "sckyzo-slurm-exporter/*/fairshare.txt"],
    "shares_json": ["lcrownover-slurmrestd-json/*Shares*.json"],
    "reservations_text": ["sckyzo-slurm-exporter/reservations*.txt", "sckyzo-slurm-exporter/*/reservations.txt"],
    "reservations_json": ["telegraf-slurmrestd/responses/reservations.json"],
    "diag_text": ["sckyzo-slurm-exporter/scheduler.txt", "sckyzo-slurm-exporter/*/scheduler.txt",
                  "vpenso-prometheus-slurm-exporter/sdiag.txt"],
    "diag_json": ["lcrownover-slurmrestd-json/*Diag*.json", "rivosinc-prometheus-slurm-exporter/sdiag*.json",
                  "telegraf-slurmrestd/responses/diag.json"],
    "licenses_text": ["sckyzo-slurm-exporter/licenses.txt", "sckyzo-slurm-exporter/*/licenses.txt"],
    "licenses_json": ["rivosinc-prometheus-slurm-exporter/license_out.json"],
    "nodes_text": ["sckyzo-slurm-exporter/node_detail*.txt", "sckyzo-slurm-exporter/*/node_detail*.txt",
                   "vpenso-prometheus-slurm-exporter/sinfo_mem.txt"],
    "nodes_json": ["lcrownover-slurmrestd-json/V004*OpenapiNodesResp.json", "telegraf-slurmrestd/responses/nodes.json",
                   "rivosinc-prometheus-slurm-exporter/sinfo_out.json"],
    "drain_text": ["sckyzo-slurm-exporter/*/drain_reason.txt"],
    "sinfo_text": ["vpenso-prometheus-slurm-exporter/sinfo.txt",
                   "rivosinc-prometheus-slurm-exporter/sinfo_fallback.txt"],
    "squeue_text": ["vpenso-prometheus-slurm-exporter/squeue.txt", "sckyzo-slurm-exporter/squeue_jobs_*_view.txt",
                    "rivosinc-prometheus-slurm-exporter/squeue_fallback.txt"],
    "sacctmgr": ["rivosinc-prometheus-slurm-exporter/sacctmgr.txt"],
    "trace": ["rivosinc-prometheus-slurm-exporter/trace_info_body.json"],
}


def _files(kind: str) -> list[Path]:
    found = sorted({p for pattern in KINDS[kind] for p in SLURM.glob(pattern) if p.is_file()})
    if not found:  # a glob that matches nothing would make its parametrized test vanish silently
        pytest.fail(f"no capture for {kind}: {KINDS[kind]}")
    return found


def _params(kind: str) -> list:
    return [pytest.param(p, id=str(p.relative_to(SLURM))) for p in _files(kind)]


def _rows(path: Path) -> list[str]:
    return [ln for ln in path.read_text().splitlines() if ln.strip()]


# ----------------------------------------------------------------------------- CPUs
@pytest.mark.parametrize("path", _params("cpus"))
def test_cpus_capture_matches_counts(path: Path) -> None:
    a, i, o, t = (int(x) for x in re.fullmatch(r"(\d+)/(\d+)/(\d+)/(\d+)", path.read_text().strip()).groups())
    counts = parse_cpus(path.read_text())
    assert (counts.allocated, counts.idle, counts.other, counts.total) == (a, i, o, t)


@pytest.mark.parametrize(("text", "match"), [("", "empty input"), ("1/2/3\n", "line 1: expected A/I/O/T"),
                                             ("1/2/3/7\n", r"line 1: 1\+2\+3 != total 7"),
                                             ("1/1/0/2\n1/1/0/2\n", "expected one line")])
def test_cpus_broken_raises(text: str, match: str) -> None:
    with pytest.raises(SlurmParseError, match=match):
        parse_cpus(text)


# ----------------------------------------------------------------------------- partitions
@pytest.mark.parametrize("path", _params("partitions_json"))
def test_partitions_json_matches_capture(path: Path) -> None:
    raw = json.loads(path.read_text())["partitions"]
    parts = parse_partitions(path.read_text())
    assert [p.name for p in parts] == [r["name"] for r in raw]
    for part, r in zip(parts, raw, strict=True):
        nested = isinstance(r["nodes"], dict)
        assert part.total_nodes == (r["nodes"]["total"] if nested else r["total_nodes"])
        assert part.total_cpus == (r["cpus"]["total"] if nested else r["total_cpus"])
        assert part.state in {"UP", "DOWN", "DRAIN", "INACTIVE"}


def test_partitions_v0040_values_expected() -> None:
    compute = parse_partitions((SLURM / "lcrownover-slurmrestd-json/V0040OpenapiPartitionResp.json").read_text())[0]
    assert compute.name == "compute" and compute.state == "UP" and len(compute.nodes) == compute.total_nodes == 42
    assert compute.nodes[0] == "n0111" and compute.nodes[-1] == "n0196"
    assert compute.max_time == timedelta(days=1) and compute.tres.startswith("cpu=5376,")


def test_partitions_v0038_default_unlimited() -> None:
    (atlas,) = parse_partitions((SLURM / "telegraf-slurmrestd/responses/partitions.json").read_text())
    assert atlas.default and atlas.max_time is None  # max_time_limit -1: UNLIMITED
    assert len(atlas.nodes) == atlas.total_nodes == 21


@pytest.mark.parametrize("path", _params("partitions_text"))
def test_partitions_text_matches_capture(path: Path) -> None:
    rows = [re.split(r"[,|]", ln) for ln in _rows(path)]
    parts = {p.name: p for p in parse_partitions(path.read_text())}
    assert list(parts) == list(dict.fromkeys(r[0] for r in rows))
    for r in rows:
        if "/" in r[1]:  # %R,%C
            assert parts[r[0]].total_cpus == int(r[1].split("/")[3])
        else:  # %R|%D|%T|%b: node counts summed per partition
            assert parts[r[0]].total_nodes == sum(int(x[1]) for x in rows if x[0] == r[0])
            assert parts[r[0]].node_states[r[2]] >= int(r[1])


@pytest.mark.parametrize(("text", "match"), [
    ("", "empty input"), ("{", "invalid JSON at line 1"), ('{"meta": {}}', "no 'partitions' key"),
    ('{"partitions": [], "errors": [{"error": "down"}]}', "errors and no partitions"),
    ('{"partitions": [{"state": "UP"}]}', r"partitions\[0\]: missing key 'name'"),
    ("cpu 1/2/0/3\n", "line 1: expected partition"), ("cpu,1/2/0/4\n", r"line 1: 1\+2\+0 != total 4"),
    ("cpu|x|idle|cpu\n", "line 1: expected an integer"),
])
def test_partitions_broken_raises(text: str, match: str) -> None:
    with pytest.raises(SlurmParseError, match=match):
        parse_partitions(text)


# ----------------------------------------------------------------------------- fair-share
@pytest.mark.parametrize("path", _params("shares_text"))
def test_shares_text_matches_capture(path: Path) -> None:
    rows = [ln.split("|") for ln in _rows(path)]
    shares = parse_shares(path.read_text())
    assert len(shares) == len(rows)
    for share, r in zip(shares, rows, strict=True):
        assert (share.account, share.user) == (r[0].strip(), r[1])
        assert share.raw_usage == int(r[4])
        assert share.fairshare == (float(r[6]) if r[6] else None)
        assert share.raw_shares == (int(r[2]) if r[2].isdigit() else None)


def test_shares_text_tree_values_expected() -> None:
    shares = parse_shares((SLURM / "sckyzo-slurm-exporter/fairshare.txt").read_text())
    ci = next(s for s in shares if s.user == "ci-bot")
    assert ci.account == "root" and ci.raw_shares is None and ci.norm_usage == 0.05 and ci.level == 1
    user2 = next(s for s in shares if s.user == "user2")
    assert user2.level == 2 and user2.fairshare == 0.8


@pytest.mark.parametrize("path", _params("shares_json"))
def test_shares_json_matches_capture(path: Path) -> None:
    raw = json.loads(path.read_text())["shares"]["shares"]
    shares = parse_shares(path.read_text())
    assert len(shares) == len(raw)
    for share, r in zip(shares, raw, strict=True):
        is_user = "USER" in r.get("type", [])
        assert (share.user or share.account) == r["name"]
        assert share.account == (r["parent"] if is_user else r["name"])
        assert share.fairshare == (r.get("fairshare") or {}).get("factor")


def test_shares_json_real_row_expected() -> None:
    # The v0.0.40 capture holds one real association among generated examples (whose numbers are "infinite").
    shares = parse_shares((SLURM / "lcrownover-slurmrestd-json/V0040OpenapiSharesResp.json").read_text())
    real = shares[1]
    assert (real.account, real.raw_shares, real.norm_shares, real.fairshare) == ("user1", 1, 0.333333, None)
    assert shares[0].norm_shares is None and shares[0].effective_usage == pytest.approx(2.30213588)


@pytest.mark.parametrize(("text", "match"), [
    ("  \n", "empty input"), ("root|user|1|0.5|10|0.1\n", "line 1: expected 7 '|' columns, got 6"),
    ("root|user|x|0.5|10|0.1|0.5\n", "line 1: bad number 'x'"), ("|user|1|0.5|10|0.1|0.5\n", "line 1: empty Account"),
    ('{"shares": {"total_shares": 1}}', "no 'shares.shares' list"),
    ('{"shares": {"shares": [{"id": 1}]}}', r"shares\[0\]: missing key 'name'"),
])
def test_shares_broken_raises(text: str, match: str) -> None:
    with pytest.raises(SlurmParseError, match=match):
        parse_shares(text)


# ----------------------------------------------------------------------------- reservations
@pytest.mark.parametrize("path", _params("reservations_text"))
def test_reservations_text_matches_capture(path: Path) -> None:
    text = path.read_text()
    names = re.findall(r"^ReservationName=(\S+)", text, re.M)
    resvs = parse_reservations(text)
    assert [r.name for r in resvs] == names
    for resv, count in zip(resvs, re.findall(r"NodeCnt=(\d+)", text), strict=True):
        assert len(resv.nodes) == int(count)


def test_reservations_text_values_expected() -> None:
    (maint,) = parse_reservations((SLURM / "sckyzo-slurm-exporter/reservations.txt").read_text())
    assert maint.start == datetime(2025, 8, 26, 7, tzinfo=UTC) and maint.end - maint.start == timedelta(
        days=3, hours=13)
    assert maint.users == ["user01"] and maint.accounts == [] and maint.flags == ["SPEC_NODES", "ALL_NODES"]
    assert maint.state == "INACTIVE" and maint.nodes[-1] == "node102"


def test_reservations_relative_time_needs_today() -> None:
    text = (SLURM / "sckyzo-slurm-exporter/reservations_relative_time.txt").read_text()
    (resv,) = parse_reservations(text)
    assert resv.start is None and resv.end is None and resv.flags == ["MAINT", "SPEC_NODES"]
    (resv,) = parse_reservations(text, today=date(2026, 7, 31))
    assert resv.start == datetime(2026, 7, 31, 14, 24, 22, tzinfo=UTC) and resv.end - resv.start == timedelta(hours=2)


@pytest.mark.parametrize("path", _params("reservations_json"))
def test_reservations_json_matches_capture(path: Path) -> None:
    assert len(parse_reservations(path.read_text())) == len(json.loads(path.read_text())["reservations"])


def test_reservations_json_v0040_shape_expected() -> None:
    doc = {"reservations": [{"name": "maint", "node_list": "g[01-02]", "users": "alice,bob", "accounts": "",
                             "flags": ["MAINT"], "start_time": {"set": True, "infinite": False, "number": 1785469902},
                             "end_time": {"set": True, "infinite": True, "number": 0}}]}
    (resv,) = parse_reservations(json.dumps(doc))
    assert resv.nodes == ["g01", "g02"] and resv.users == ["alice", "bob"] and resv.flags == ["MAINT"]
    assert resv.start == datetime.fromtimestamp(1785469902, UTC) and resv.end is None


@pytest.mark.parametrize(("text", "match"), [
    ("", "empty input"), ("No jobs in the system\n", "line 1: expected ReservationName="),
    ("ReservationName=x StartTime=26/08/2025 EndTime=None\n", "reservation 'x' StartTime: bad Slurm time"),
    ('{"reservations": [{"node_list": "a"}]}', r"reservations\[0\]: missing key 'name'"),
])
def test_reservations_broken_raises(text: str, match: str) -> None:
    with pytest.raises(SlurmParseError, match=match):
        parse_reservations(text)


# ----------------------------------------------------------------------------- sdiag
_DIAG_TEXT_KEYS = {"Jobs submitted": "jobs_submitted", "Jobs started": "jobs_started",
                   "Jobs completed": "jobs_completed", "Jobs failed": "jobs_failed", "Jobs canceled": "jobs_canceled"}


@pytest.mark.parametrize("path", _params("diag_text"))
def test_diag_text_matches_capture(path: Path) -> None:
    text = path.read_text()
    stats = parse_diag(text)
    for label, key in _DIAG_TEXT_KEYS.items():
        assert stats[key] == int(re.search(rf"^{label}:\s+(\d+)", text, re.M).group(1))
    main, backfill = text.split("Backfilling stats")[:2]
    assert stats["schedule_cycle_last"] == int(re.search(r"^\s+Last cycle:\s+(\d+)", main, re.M).group(1))
    assert stats["bf_cycle_last"] == int(re.search(r"^\s+Last cycle:\s+(\d+)", backfill, re.M).group(1))
    assert stats["bf_backfilled_jobs"] == int(re.search(r"since last slurm start\):\s+(\d+)", text).group(1))


def test_diag_text_2605_latency_and_pending() -> None:
    stats = parse_diag((SLURM / "sckyzo-slurm-exporter/slurm-26.05.2/scheduler.txt").read_text())
    assert stats["gettimeofday_latency"] == 14 and stats["jobs_pending"] == 6 and stats["jobs_running"] == 8
    assert stats["schedule_cycle_mean"] == 796 and stats["bf_table_size"] == 0


@pytest.mark.parametrize("path", _params("diag_json"))
def test_diag_json_matches_capture(path: Path) -> None:
    raw = json.loads(path.read_text())["statistics"]
    stats = parse_diag(path.read_text())
    for key in ("jobs_submitted", "jobs_started", "jobs_completed", "jobs_failed", "schedule_cycle_last",
                "bf_backfilled_jobs", "bf_cycle_last"):
        assert stats[key] == raw[key], key
    assert isinstance(stats["bf_active"], bool)
    if isinstance(raw.get("schedule_exit"), dict):
        assert stats["schedule_exit_end_job_queue"] == raw["schedule_exit"]["end_job_queue"]


@pytest.mark.parametrize(("text", "match"), [
    ("", "empty input"), ("hello: world\n", "no 'Jobs submitted:' line"),
    ("Jobs submitted: many\n", r"line 1 \(Jobs submitted\): expected an integer"),
    ('{"statistics": {"jobs_started": 1}}', "missing key 'statistics.jobs_submitted'"),
    ('{"statistics": {"jobs_submitted": "x"}}', r"statistics\.jobs_submitted: expected a number"),
    ('{"meta": {}}', "no 'statistics' key"),
])
def test_diag_broken_raises(text: str, match: str) -> None:
    with pytest.raises(SlurmParseError, match=match):
        parse_diag(text)


# ----------------------------------------------------------------------------- licenses
@pytest.mark.parametrize("path", _params("licenses_text"))
def test_licenses_text_matches_capture(path: Path) -> None:
    text = path.read_text()
    rows = re.findall(r"^LicenseName=(\S+) Total=(\d+) Used=(\d+) Free=(\d+)", text, re.M)
    lics = parse_licenses(text)
    assert [(lic.name, lic.total, lic.used, lic.free) for lic in lics] == [
        (n, int(t), int(u), int(f)) for n, t, u, f in rows]


def test_licenses_text_values_expected() -> None:
    lics = parse_licenses((SLURM / "sckyzo-slurm-exporter/licenses.txt").read_text())
    assert lics[1].reserved == 5 and lics[1].remote and lics[1].last_update == datetime(2025, 8, 16, 10, 10,
                                                                                          tzinfo=UTC)


@pytest.mark.parametrize("path", _params("licenses_json"))
def test_licenses_json_matches_capture(path: Path) -> None:
    raw = json.loads(path.read_text())["licenses"]
    lics = parse_licenses(path.read_text())
    assert [(lic.name, lic.total, lic.used, lic.free, lic.reserved, lic.remote) for lic in lics] == [
        (r["LicenseName"], r["Total"], r["Used"], r["Free"], r["Reserved"], r["Remote"]) for r in raw]


@pytest.mark.parametrize(("text", "match"), [
    ("", "empty input"), ("Licenses: none\n", "line 1: expected LicenseName="),
    ("LicenseName=a Total=1 Used=0 Free=1\n", "line 1: missing key 'Reserved'"),
    ("LicenseName=a Total=x Used=0 Free=1 Reserved=0\n", "line 1 Total: expected an integer"),
    ('{"licenses": [{"LicenseName": "a"}]}', r"licenses\[0\]: missing key 'Total'"),
])
def test_licenses_broken_raises(text: str, match: str) -> None:
    with pytest.raises(SlurmParseError, match=match):
        parse_licenses(text)


# ----------------------------------------------------------------------------- nodes
@pytest.mark.parametrize("path", _params("nodes_text"))
def test_nodes_text_matches_capture(path: Path) -> None:
    rows = [ln.split() for ln in _rows(path)]
    nodes = {n.name: n for n in parse_nodes(path.read_text())}
    assert list(nodes) == list(dict.fromkeys(r[0] for r in rows))
    for r in rows:
        node = nodes[r[0]]
        a, _, _, t = (int(x) for x in re.fullmatch(r"(\d+)/(\d+)/(\d+)/(\d+)", r[3]).groups())
        if r is next(x for x in rows if x[0] == r[0]):  # counts and state come from a node's first row
            assert (node.alloc_cpus, node.cpus, node.alloc_memory_mb, node.memory_mb) == (a, t, int(r[1]), int(r[2]))
            assert node.state == r[4].rstrip("*").upper()
        if len(r) > 5:
            assert r[5].rstrip("*") in node.partitions
        if len(r) == 8 and r[6] != "(null)":
            assert sum(g.count for g in node.gres) == sum(int(c) for c in re.findall(r":(\d+)(?:\(|,|$)", r[6]))


def test_nodes_text_gres_values_expected() -> None:
    (g2,) = parse_nodes((SLURM / "sckyzo-slurm-exporter/slurm-25.11.2/node_detail_gres_multitype.txt").read_text())
    assert [(g.type, g.count) for g in g2.gres] == [("model_a", 2), ("model_b", 2)]
    assert [g.indexes for g in g2.gres_used] == [[], [2]]
    default = parse_nodes((SLURM / "sckyzo-slurm-exporter/node_detail_default_partition.txt").read_text())
    assert default[0].partitions == ["gpu", "long"]


@pytest.mark.parametrize("path", [p for p in _params("nodes_json") if "V0041" not in p.id])
def test_nodes_json_matches_capture(path: Path) -> None:
    raw = json.loads(path.read_text())["nodes"]
    nodes = parse_nodes(path.read_text())
    assert [n.name for n in nodes] == [r["name"] for r in raw]
    for node, r in zip(nodes, raw, strict=True):
        state = r["state"][0] if isinstance(r["state"], list) else r["state"]
        assert node.state == state.upper() and node.cpus == r["cpus"] and node.partitions == list(r["partitions"])
        assert node.reason == (r.get("reason") or None)


def test_nodes_json_v0041_generated_example() -> None:
    # Like V0041OpenapiJobInfoResp.json, the openapi generator's example: strings hold their field names and the
    # state is the enum's INVALID placeholder. The parser names the key, and copes once the values are real.
    doc = json.loads((SLURM / "lcrownover-slurmrestd-json/V0041OpenapiNodesResp.json").read_text())
    with pytest.raises(SlurmParseError, match=r"nodes\[0\]\.state: unknown node state 'INVALID'"):
        parse_nodes(json.dumps(doc))
    for n in doc["nodes"]:
        n.update(state=["IDLE", "DRAIN"], gres="gpu:h100:4", gres_used="gpu:h100:1(IDX:2)")
    node = parse_nodes(json.dumps(doc))[0]
    assert node.state == "IDLE" and node.state_flags == ["DRAIN"] and node.gres_used[0].indexes == [2]
    assert (node.cpus, node.alloc_cpus, node.memory_mb) == (9, 8, 4)


@pytest.mark.parametrize(("text", "match"), [
    ("", "empty input"), ("a048 1 2 16/0/0/16\n", "line 1: expected 5, 6 or 8 columns"),
    ("a048 1 2 16/0/0/16 sleepy\n", "line 1: unknown node state 'sleepy'"),
    ("a048 x 2 16/0/0/16 idle\n", "line 1: expected an integer"),
    ('{"nodes": [{"state": "IDLE"}]}', r"nodes\[0\]: missing key 'name'"),
])
def test_nodes_broken_raises(text: str, match: str) -> None:
    with pytest.raises(SlurmParseError, match=match):
        parse_nodes(text)


# ----------------------------------------------------------------------------- drain reasons
@pytest.mark.parametrize("path", _params("drain_text"))
def test_drain_reasons_match_capture(path: Path) -> None:
    text = path.read_text()
    groups = parse_drain_reasons(text)
    by_node = {n: g for g in groups for n in g.nodes}
    names = re.findall(r"^([^|]+)\|", text, re.M)
    assert sorted(by_node) == sorted(set(names)) and sum(len(g.nodes) for g in groups) == len(set(names))
    for name, reason, since, state in re.findall(r"^([^|]+)\|([^|]*)\|([^|]*)\|(\S+)$", text, re.M):
        g = by_node[name]
        assert g.reason == (None if reason == "none" else reason) and g.user is None
        assert (g.since is None) == (since == "Unknown") and g.state == state.upper()


def test_drain_reasons_inline_shapes() -> None:
    text = ("gpu[01-02]|Kill task failed|2025-08-26T07:00:00|drained\ngpu03|Kill task failed|2025-08-26T07:00:00|"
            "drained\ngpu04|none|Unknown|idle\n")
    (drained, idle) = parse_drain_reasons(text)
    assert drained.nodes == ["gpu01", "gpu02", "gpu03"] and drained.reason == "Kill task failed"
    assert drained.since == datetime(2025, 8, 26, 7, tzinfo=UTC) and idle.reason is None and idle.since is None
    (row,) = parse_drain_reasons("n1|bad gpu|root|2025-08-26T07:00:00|draining\n")
    assert row.user == "root" and row.state == "DRAINING"


@pytest.mark.parametrize(("text", "match"), [
    ("", "empty input"), ("n1|none|idle\n", "line 1: expected node|reason"),
    ("n1|none|yesterday|idle\n", "line 1: bad Slurm time"), ("n1|none|Unknown|sleepy\n", "line 1: unknown node"),
])
def test_drain_reasons_broken_raises(text: str, match: str) -> None:
    with pytest.raises(SlurmParseError, match=match):
        parse_drain_reasons(text)


# ----------------------------------------------------------------------------- sinfo / squeue short text
@pytest.mark.parametrize("path", _params("sinfo_text"))
def test_sinfo_text_matches_capture(path: Path) -> None:
    text = path.read_text()
    rows = re.findall(r'^(?:([^,{\s]+),(\S+)|\{"s": "(\w+)".*"n": "([^"]+)".*"p": "([^"]+)".*"cstate": "([\d/]+)")',
                      text, re.M)
    assert len(rows) == len(_rows(path))
    nodes = {n.name: n for n in parse_sinfo_text(text)}
    for node_a, state_a, state_b, node_b, part, cstate in rows:
        node = nodes[node_a or node_b]
        assert node.state == (state_a or state_b).rstrip("*").upper()
        if part:
            assert part in node.partitions and node.cpus == int(cstate.split("/")[3])
    assert len(nodes) == len({a or b for a, _, _, b, _, _ in rows})


@pytest.mark.parametrize("path", _params("squeue_text"))
def test_squeue_text_matches_capture(path: Path) -> None:
    text = path.read_text()
    ids = re.findall(r'^(\d+)[,| ]|^\{.*"id": (\d+)', text, re.M)
    errors: list[str] = []
    column2 = "user" if "users_view" in path.name else "account"
    rows = parse_squeue_text(text, column2, errors=errors)
    bad = re.findall(r'"cpu": xx', text)  # rivosinc's deliberately faulty lines
    assert len(rows) == len(ids) - len(bad) and len(errors) == len(bad)
    assert [r.job_id for r in rows] == [a or b for a, b in ids][:len(rows)]
    for row, line in zip(rows, [ln for ln in text.splitlines() if "|" in ln], strict=False):
        cols = [c.strip() for c in line.split("|")]
        assert getattr(row, column2) == cols[1] and row.node_count == int(cols[3]) and row.cpus == int(cols[4])
    if bad:
        with pytest.raises(SlurmParseError, match=r"line \d+: invalid JSON"):
            parse_squeue_text(text)


def test_squeue_fallback_values_expected() -> None:
    rows = parse_squeue_text((SLURM / "rivosinc-prometheus-slurm-exporter/squeue_fallback.txt").read_text(), errors=[])
    assert rows[0].account == "account1" and rows[0].partition == "hw-h" and rows[0].reason == "cs10"
    assert rows[2].state == "PENDING" and rows[2].reason == "(Dependency)" and rows[-1].cpus == 24


@pytest.mark.parametrize(("call", "text", "match"), [
    (parse_sinfo_text, "", "empty input"), (parse_sinfo_text, "lxfoo0001 idle\n", "line 1: expected node,state"),
    (parse_sinfo_text, '{"s": "idle", "n": "a"}\n', "line 1: missing key 'cstate'"),
    (parse_squeue_text, "", "empty input"), (parse_squeue_text, "123 RUNNING\n", "line 1: expected jobid,state"),
    (parse_squeue_text, "1|acct|RUNNING|1\n", "line 1: expected 6 '|' columns"),
    (parse_squeue_text, "1,SLEEPING\n", "line 1: unknown job state"),
])
def test_sinfo_squeue_text_broken_raises(call, text: str, match: str) -> None:
    with pytest.raises(SlurmParseError, match=match):
        call(text)


# ----------------------------------------------------------------------------- sacctmgr associations
@pytest.mark.parametrize("path", _params("sacctmgr"))
def test_sacctmgr_associations_match_capture(path: Path) -> None:
    text = path.read_text()
    rows = [ln.split("|") for ln in _rows(path)]
    assocs = parse_sacctmgr_associations(text)
    assert [(a.user, a.account) for a in assocs] == [(r[0], r[1]) for r in rows]
    for a, r in zip(assocs, rows, strict=True):
        assert (a.grp_cpus, a.grp_mem_mb, a.grp_jobs, a.grp_submit_jobs) == tuple(int(x) if x else None for x in r[2:])
    mapping = account_users(assocs)
    assert set(mapping) == set(re.findall(r"^[^|]*\|([^|]+)\|", text, re.M))
    assert mapping["account5"] == ["shouldignore"] and mapping["account1"] == []


@pytest.mark.parametrize(("text", "match"), [
    ("", "empty input"), ("|acct|1|2|3\n", "line 1: expected 6 '|' columns"),
    ("|acct|x||||\n", "line 1: expected 6"), ("|acct|x|||\n", "line 1: expected an integer"),
    ("bob||1|2|3|4\n", "line 1: expected 6"),
])
def test_sacctmgr_broken_raises(text: str, match: str) -> None:
    with pytest.raises(SlurmParseError, match=match):
        parse_sacctmgr_associations(text)


# ----------------------------------------------------------------------------- rivosinc trace body
@pytest.mark.parametrize("path", _params("trace"))
def test_trace_info_matches_capture(path: Path) -> None:
    raw = json.loads(path.read_text())
    info = parse_trace_info(path.read_text())
    assert (info.pid, info.job_id, info.username, info.hostname, info.mem) == (
        raw["pid"], raw["job_id"], raw["username"], raw["hostname"], raw["mem"])


@pytest.mark.parametrize(("text", "match"), [
    ("", "empty input"), ("{", "invalid JSON at line 1"), ('{"pid": 1}', "missing key 'cpus'"),
    ('{"pid": "1"}', r"trace\.pid: expected int"), ("[1]", "expected a JSON object"),
])
def test_trace_info_broken_raises(text: str, match: str) -> None:
    with pytest.raises(SlurmParseError, match=match):
        parse_trace_info(text)


# ----------------------------------------------------------------------------- every capture is claimed
# Files test_parse.py parses (GRES/sinfo, node JSON, jobs JSON, squeue/sacct text), as globs.
PARSE_PY_CLAIMS = [
    "datadog-integrations-core/sinfo_gres_2505.txt",
    "sckyzo-slurm-exporter/slurm-*/sinfo_gpus_*.txt", "sckyzo-slurm-exporter/gpus_snapshot*.txt",
    "sckyzo-slurm-exporter/*/gpus_snapshot.txt", "sckyzo-slurm-exporter/partitions_gpu_long_gres.txt",
    "sckyzo-slurm-exporter/*/partitions_gpu.txt", "sckyzo-slurm-exporter/slurm-25.05/node_detail_gres.txt",
    "sckyzo-slurm-exporter/slurm-25.11.2/node_detail_gres_multitype.txt",
    "sckyzo-slurm-exporter/slurm-24.11.7/node_detail.txt", "sckyzo-slurm-exporter/slurm-26.05.2/node_detail.txt",
    "sckyzo-slurm-exporter/scontrol_nodes.txt", "sckyzo-slurm-exporter/*/scontrol_nodes.txt",
    "lcrownover-slurmrestd-json/V0040OpenapiNodesResp.json", "telegraf-slurmrestd/responses/nodes.json",
    "rivosinc-prometheus-slurm-exporter/sinfo_out.json", "rivosinc-prometheus-slurm-exporter/squeue_out.json",
    "telegraf-slurmrestd/responses/jobs.json", "lcrownover-slurmrestd-json/V004*OpenapiJobInfoResp.json",
    "sckyzo-slurm-exporter/queue_all_states.txt", "sckyzo-slurm-exporter/*/queue_*_states.txt",
    "sckyzo-slurm-exporter/squeue_jobs.txt", "sckyzo-slurm-exporter/*/squeue_jobs.txt",
    "sckyzo-slurm-exporter/sacct_efficiency.txt",
]
# Provenance and documentation, not Slurm output.
NOT_CAPTURES = ["SOURCE.md", "sckyzo-slurm-exporter/readme.md", "sckyzo-slurm-exporter/*/provenance.txt",
                "telegraf-slurmrestd/expected.out"]
# Real captures that no parser reads yet. Listed by exact path so the gap stays visible: this test fails if one
# of them disappears or becomes claimed (then delete it here), and any new file must be claimed or added.
NOT_YET_PARSED: set[str] = set()


def _claimed(patterns: list[str]) -> set[str]:
    return {str(p.relative_to(SLURM)) for pattern in patterns for p in SLURM.glob(pattern) if p.is_file()}


def test_every_slurm_capture_claimed() -> None:
    every = {str(p.relative_to(SLURM)) for p in SLURM.rglob("*") if p.is_file()}
    mine = _claimed([p for patterns in KINDS.values() for p in patterns])
    claimed = mine | _claimed(PARSE_PY_CLAIMS) | _claimed(NOT_CAPTURES)
    assert sorted(every - claimed - NOT_YET_PARSED) == [], "unclaimed capture: add a parser test or list it"
    assert sorted(NOT_YET_PARSED - every) == [], "listed as unparsed but gone"
    assert sorted(NOT_YET_PARSED & claimed) == [], "now parsed: remove it from NOT_YET_PARSED"
