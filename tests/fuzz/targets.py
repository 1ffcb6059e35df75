"""The fuzz targets: for each parser, where its seeds come from, how inputs are generated, and its contract.

A target's `check(input)` calls the parser and returns normally when the parser either produced a
result or raised its documented "bad input" error with a message that names the place (line, path,
element, key). Anything else propagates: an unexpected exception type is a crash, and so is a
documented error without a location. The tests in this directory run each target under Hypothesis
(short, derandomized); bench/fuzz.py runs the same targets with ≥100,000 examples each.

Contracts (who raises what on bad input):
- exposition  `parse_dcgm_exposition` -> Batch | BatchError(where="line N")
- ingest-json `parse_json` / `parse_ndjson` -> Batch | BatchError(where=JSON path or "line N")
- ingest-arrow `parse_arrow` -> Batch | BatchError(where="stream N …" or "$")
- nvidia-smi  `parse_nvsmi_xml` / `parse_nvsmi_text` -> NvsmiResult | NvsmiError
- infiniband  `read_sysfs` never raises (bad files become Problems); `parse_perfquery_x` -> PerfqueryError
- redfish     `collect` never raises (failures become `problems` naming the URL)
- slurm       every parser -> its result | SlurmParseError
- topology    `load_topology_file` + `build_plan` -> (plan, issues) | TopologyError
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.message import Message
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hypothesis import strategies as st

from tests.fuzz import strategies as s

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = Path(os.environ.get("BREAKWATER_SHARED_DATA", REPO.parent / "shared" / "data"))
FIXED_NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Target:
    """One parser under fuzz: how to generate an input from a Chooser, and the contract check."""

    name: str
    generate: Callable[[s.Chooser], Any]
    check: Callable[[Any], None]

    def strategy(self) -> st.SearchStrategy:
        return s.cases(self.generate)


def _read_all(patterns: list[str]) -> list[bytes]:
    files = sorted({p for pattern in patterns for p in SHARED_DATA.glob(pattern) if p.is_file()})
    if not files:
        raise FileNotFoundError(f"no seed captures for {patterns} under {SHARED_DATA}")
    return [p.read_bytes() for p in files]


def _located(message: str, *words: str) -> None:
    """A clear error names where: fail (a crash by another name) when it does not."""
    assert message and any(w in message for w in words), f"error without a location: {message!r}"


def _times():
    from telemetry.ingest.schema import TimeParser

    return TimeParser(FIXED_NOW, timedelta(minutes=5), timedelta(days=7))


def _check_batch(batch) -> None:
    """A parsed batch holds only finite numbers, and 64-bit integers where the registry says so."""
    for records in batch.records.values():
        for rec in records:
            for value in (*rec.values.values(), *rec.extra.values()):
                assert isinstance(value, int | float) and not isinstance(value, bool), value
                assert math.isfinite(value), value
    for frames in batch.columnar.values():
        for frame in frames:
            for col in (*frame.values.values(), *frame.extra.values()):
                assert len(col) == frame.n
                col = col.tolist() if hasattr(col, "tolist") else col  # a masked array: masked reads as None
                assert all(v is None or (isinstance(v, int | float) and math.isfinite(v)) for v in col)


# --- exposition (dcgm-exporter) ---------------------------------------------------------------------


@cache
def exposition_seeds() -> list[bytes]:
    return _read_all(["dcgm/**/*.prom"])


def exposition_inputs(ch: s.Chooser) -> tuple[bytes | str, str | None]:
    kind = ch.below(5)
    if kind <= 1:
        body: bytes | str = s.mutated_seed(ch, exposition_seeds())
    elif kind == 2:
        body = s.exposition_text(ch).encode("utf-8", "surrogatepass")
    elif kind == 3:
        body = s.exposition_text(ch)
    else:
        body = ch.binary(200)
    return body, ch.pick((None, "fuzz-host"))


def check_exposition(case) -> None:
    from telemetry.ingest.exposition import parse_dcgm_exposition
    from telemetry.ingest.schema import BatchError

    body, host = case
    try:
        batch, blanks = parse_dcgm_exposition(body, _times(), host)
    except BatchError as exc:
        _located(f"{exc.where}: {exc.message}", "line ", "gpu", "mig", "fields", "extra", "time", "host", "uuid")
        return
    assert blanks >= 0
    _check_batch(batch)


# --- JSON / NDJSON ingest ---------------------------------------------------------------------------


def _jsonable_record(rec: dict) -> dict:
    out = {k: v for k, v in rec.items() if v is not None}
    if isinstance(out.get("time"), datetime):
        out["time"] = out["time"].isoformat()
    return out


@cache
def ingest_seeds() -> list[dict]:
    """Batches as agents push them, built from the real captures (dcgm scrape, nvidia-smi, IB sysfs)."""
    from telemetry.agent.infiniband import read_sysfs
    from telemetry.agent.nvsmi import parse_nvsmi_xml
    from telemetry.ingest.dcgm import dcgm_records
    from telemetry.ingest.prometheus import parse_exposition

    docs: list[dict] = []
    for body in exposition_seeds():
        recs = dcgm_records(parse_exposition(body))
        gpus = [_jsonable_record({**r, "host": r["host"] or "node-a"}) for r in recs.gpus]
        migs = [_jsonable_record({**r, "host": r["host"] or "node-a"}) for r in recs.migs]
        docs.append({"time": FIXED_NOW.isoformat(), "gpus": gpus, "migs": migs})
    for body in _read_all(["nvidia-smi/telegraf/a100-sxm4-v12.xml", "nvidia-smi/netdata/a100-sxm4-mig.xml"]):
        result = parse_nvsmi_xml(body, host="gpu-0001")
        docs.append({"time": FIXED_NOW.timestamp(), "gpus": result.gpus, "migs": result.migs})
        gpu = result.gpus[0]
        docs.append({"events": [{"host": "gpu-0001", "pci_bus_id": gpu.get("pci_bus_id", "00000000:07:00.0"),
                                 "kind": "xid", "code": 79, "message": "GPU has fallen off the bus.",
                                 "source": "kmsg", "time": FIXED_NOW.isoformat()}],
                     "agent": {"host": "gpu-0001", "pushes": 1}})
    ports = read_sysfs(SHARED_DATA / "fabric/gpud-sysfs-infiniband/sys-class-infiniband-h100.0", host="gpu-0001")
    docs.append({"ports": ports, "power": [{"device": "gpu-0001", "host": "gpu-0001", "fields": {"watts": 5400.5}}]})
    docs.append({"gpus": _columnar(docs[0]["gpus"]), "time": FIXED_NOW.isoformat()})
    return docs


def _columnar(records: list[dict]) -> dict:
    cols: dict[str, Any] = {}
    for key in ("host", "uuid", "index", "model", "pci_bus_id", "driver"):
        cols[key] = [r.get(key) for r in records]
    names = sorted({n for r in records for n in r.get("fields", {})})
    cols["fields"] = {n: [r.get("fields", {}).get(n) for r in records] for n in names}
    return cols


def _ndjson(doc: dict) -> bytes:
    kinds = {"gpus": "gpu", "migs": "mig", "ports": "port", "power": "power"}
    lines: list[Any] = []
    for key, kind in kinds.items():
        recs = doc.get(key)
        if isinstance(recs, list):
            # A record that is not an object goes out as it is: the parser must refuse that line.
            lines += [{**rec, "kind": kind} if isinstance(rec, dict) else rec for rec in recs]
    events = doc.get("events")
    lines += [{"kind": "event", "event": e} for e in events] if isinstance(events, list) else []
    return b"\n".join(s.dumps(line) for line in lines)


@cache
def ndjson_seeds() -> list[bytes]:
    return [_ndjson(d) for d in ingest_seeds()]


def ingest_inputs(ch: s.Chooser) -> tuple[str, bytes]:
    kind = ch.below(4)
    if kind <= 1:
        return "json", s.json_body(ch, ingest_seeds())
    if kind == 2:
        doc = s.mutate_tree(ch, ch.pick(ingest_seeds()))
        return "ndjson", _ndjson(doc) if isinstance(doc, dict) else s.dumps(doc)
    return "ndjson", s.mutated_seed(ch, ndjson_seeds(), 3)


def check_ingest(case) -> None:
    from telemetry.ingest.documents import parse_json, parse_ndjson
    from telemetry.ingest.schema import BatchError

    fmt, body = case
    try:
        batch = (parse_json if fmt == "json" else parse_ndjson)(body, _times())
    except BatchError as exc:
        assert exc.message, exc
        _located(f"{exc.where}", "$", "line ")
        return
    _check_batch(batch)


# --- Arrow IPC ingest -------------------------------------------------------------------------------


@cache
def arrow_seeds() -> list[bytes]:
    """The JSON seeds that have an Arrow form (no events, no agent report), as the simulator would send them."""
    from telemetry.ingest.arrow import encode_arrow

    return [body for body in map(encode_arrow, ingest_seeds()) if body]


def arrow_inputs(ch: s.Chooser) -> bytes:
    from telemetry.ingest.arrow import encode_arrow

    if ch.below(3) == 0:  # a mutated document, encoded: well-formed streams with odd columns and values
        doc = s.mutate_tree(ch, ch.pick(ingest_seeds()))
        try:
            body = encode_arrow(doc) if isinstance(doc, dict) else None
        except Exception:  # noqa: BLE001 (the encoder is a client helper: a tree it cannot encode is no input)
            body = None
        if body:
            return body
    return s.mutated_seed(ch, arrow_seeds())  # damaged bytes: the reader and the validator's turn


def check_arrow(body: bytes) -> None:
    from telemetry.ingest.arrow import parse_arrow
    from telemetry.ingest.schema import BatchError

    try:
        batch = parse_arrow(body, _times())
    except BatchError as exc:
        assert exc.message, exc
        _located(f"{exc.where}", "stream ", "$")
        return
    _check_batch(batch)


# --- nvidia-smi --------------------------------------------------------------------------------------


@cache
def nvsmi_xml_seeds() -> list[bytes]:
    return _read_all(["nvidia-smi/telegraf/*.xml", "nvidia-smi/netdata/*.xml"])


@cache
def nvsmi_text_seeds() -> list[bytes]:
    return _read_all(["nvidia-smi/gpud/nvidia-smi-query.*"])


def nvsmi_inputs(ch: s.Chooser) -> tuple[str, bytes]:
    if ch.below(3):
        return "xml", s.mutated_seed(ch, nvsmi_xml_seeds())
    return "text", s.mutated_seed(ch, nvsmi_text_seeds())


def check_nvsmi(case) -> None:
    from telemetry.agent.nvsmi import NvsmiError, parse_nvsmi_text, parse_nvsmi_xml

    kind, body = case
    try:
        result = (parse_nvsmi_xml if kind == "xml" else parse_nvsmi_text)(body, host="fuzz-host")
    except NvsmiError as exc:
        _located(str(exc), "line", "nvidia_smi_log", "empty", "root element", "no GPU")
        return
    for rec in result.gpus + result.migs:
        for value in (*rec["fields"].values(), *rec.get("extra", {}).values()):
            assert isinstance(value, int | float) and not isinstance(value, bool), (rec, value)
    for rec in result.gpus:
        assert isinstance(rec["uuid"], str) and rec["uuid"], rec


# --- InfiniBand sysfs and perfquery -----------------------------------------------------------------

SYSFS = "fabric/gpud-sysfs-infiniband/sys-class-infiniband-h100.0"
_SYSFS_DEVICES = ("mlx5_0", "mlx5_bond_0")  # one InfiniBand HCA and the RoCE bond: every code path, few files


@cache
def sysfs_seed() -> dict[str, bytes]:
    root = SHARED_DATA / SYSFS
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for device in _SYSFS_DEVICES for p in sorted((root / device).rglob("*")) if p.is_file()
    }


DIR = "<dir>"  # a sysfs change that puts a directory where the capture has a file
LOOP = "<loop>"  # ...or a symlink to itself


@cache
def _sysfs_paths() -> tuple[list[str], list[str]]:
    files = sorted(sysfs_seed())
    dirs = sorted({str(Path(f).parent) for f in files} | {"mlx5_9", "mlx5_0/ports/\u00b2", "mlx5_0/ports/01"})
    return files, dirs


_NEW_NAMES = ("ports", "1", "2", "10", "counters", "hw_counters", "rate", "state", "x", "\u0663", " ")
_NEW_BODIES = (DIR, b"", b"5: LinkUp", b"1" * 5000, b"18446744073709551616", b"400 Gb/sec")


def sysfs_changes(ch: s.Chooser) -> dict[str, bytes | str | None]:
    """Edits to the captured tree: path -> new bytes, None (remove), DIR or LOOP."""
    seed = sysfs_seed()
    files, dirs = _sysfs_paths()
    changes: dict[str, bytes | str | None] = {}
    for _ in range(1 + ch.below(6)):
        op = ch.below(7)
        path = ch.pick(dirs if op >= 5 and ch.chance(2) else files)
        if op <= 2:
            changes[path] = s.mutate_bytes(ch, seed.get(path, b"0"), 3)
        elif op == 3:
            changes[path] = DIR
        elif op == 4:
            changes[path] = LOOP
        elif op == 5:
            changes[path] = None
        else:
            changes[f"{path}/{ch.pick(_NEW_NAMES)}"] = ch.pick(_NEW_BODIES)
    return changes


class SysfsSandbox:
    """The captured tree on disk once; each case applies its edits and undoes exactly those afterwards."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="bw-fuzz-sysfs-"))
        self.dirs = {"/".join(Path(f).parts[:i]) for f in sysfs_seed() for i in range(1, len(Path(f).parts))}
        for rel in sysfs_seed():
            self._restore(rel)

    def _seeded(self, rel: str) -> str | None:
        return "file" if rel in sysfs_seed() else "dir" if rel in self.dirs else None

    def _restore(self, rel: str) -> None:
        for seeded, body in sysfs_seed().items():
            if seeded == rel or seeded.startswith(rel + "/"):
                path = self.root / seeded
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(body)

    @staticmethod
    def _on_disk(path: Path) -> str | None:
        return "link" if path.is_symlink() else "file" if path.is_file() else "dir" if path.is_dir() else None

    def _clear(self, path: Path) -> None:
        kind = self._on_disk(path)
        if kind in ("link", "file"):
            path.unlink()
        elif kind == "dir":
            shutil.rmtree(path)

    def apply(self, changes: dict) -> None:
        for rel, new in changes.items():
            path = self.root / rel
            try:
                self._clear(path)
                path.parent.mkdir(parents=True, exist_ok=True)
                if new == DIR:
                    (path / "1").mkdir(parents=True)
                elif new == LOOP:
                    path.symlink_to(path.name)
                elif new is not None:
                    path.write_bytes(new)
            except (NotADirectoryError, FileExistsError):
                pass  # an earlier edit turned a parent into a file: this edit cannot apply

    def undo(self, changes: dict) -> None:
        """Put back the first path on the way to each edit whose kind differs, else the edit itself."""
        for rel in changes:
            parts = rel.split("/")
            for i in range(1, len(parts) + 1):
                prefix = "/".join(parts[:i])
                want = self._seeded(prefix)
                if self._on_disk(self.root / prefix) != want:
                    self._clear(self.root / prefix)
                    break
            else:
                prefix = rel
                self._clear(self.root / rel)
            if self._seeded(prefix):
                self._restore(prefix)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


@cache
def perfquery_seeds() -> list[bytes]:
    return [b for b in _read_all(["fabric/infiniband_exporter-treydock/perfquery*/*.out"]) if b.strip()]


def infiniband_inputs(ch: s.Chooser) -> tuple[str, Any]:
    if ch.below(3):
        return "sysfs", sysfs_changes(ch)
    return "perfquery", s.as_text(s.mutated_seed(ch, perfquery_seeds()))


_sandbox: list[SysfsSandbox] = []


def sandbox() -> SysfsSandbox:
    if not _sandbox:
        _sandbox.append(SysfsSandbox())
    return _sandbox[0]


def check_infiniband(case) -> None:
    from telemetry.agent.infiniband import PerfqueryError, Problem, parse_perfquery_x, read_sysfs

    kind, payload = case
    if kind == "perfquery":
        try:
            records = parse_perfquery_x(payload, guid="0x506b4b03005c2740")
        except PerfqueryError as exc:
            _located(str(exc), "line ", "empty output")
            return
        _check_port_records(records)
        return
    box = sandbox()
    box.apply(payload)
    try:
        problems: list[Problem] = []
        records = read_sysfs(box.root, host="fuzz-host", problems=problems)
    finally:
        box.undo(payload)
    _check_port_records(records)
    assert all(str(p.path).startswith(str(box.root)) and p.reason for p in problems)


def _check_port_records(records: list[dict]) -> None:
    for rec in records:
        for value in (*rec["fields"].values(), *rec["extra"].values()):
            # The server stores counters as signed 64-bit: a reader must not hand it more.
            assert isinstance(value, int | float) and not isinstance(value, bool), value
            assert math.isfinite(value) and -(2**63) <= value < 2**63, value


# --- Redfish -----------------------------------------------------------------------------------------


@cache
def redfish_seeds() -> list[dict[str, bytes]]:
    """Each captured BMC as URL path -> body (the layouts of shared/data/README.md)."""
    trees = []
    power = SHARED_DATA / "power"
    roots = [p.parent for p in sorted(power.glob("redfish-lambdalabs-gpu/*/redfish"))]
    roots += sorted(power.glob("redfish-dmtf-mockups/public-*"))
    for root in roots:
        tree = {}
        for f in root.rglob("index.json"):
            rel = f.parent.relative_to(root).as_posix()
            url = "/" + rel if rel.startswith("redfish/v1") else "/redfish/v1" + ("/" + rel if rel != "." else "")
            tree[url] = f.read_bytes()
        trees.append(tree)
    return trees


class _TreeHandler(urllib.request.BaseHandler):
    """Answers the client's http requests from a captured tree: only the network is replaced."""

    tree: dict[str, bytes] = {}

    def http_open(self, req: urllib.request.Request):
        path = urlsplit(req.full_url).path.rstrip("/") or "/"
        body = self.tree.get(path)
        if body is None:
            raise urllib.error.HTTPError(req.full_url, 404, "Not Found", Message(), None)
        response = urllib.request.addinfourl(io.BytesIO(body), Message(), req.full_url, 200)
        return response


@cache
def _opener() -> tuple[urllib.request.OpenerDirector, _TreeHandler]:
    handler = _TreeHandler()
    opener = urllib.request.OpenerDirector()
    for h in (handler, urllib.request.UnknownHandler()):
        opener.add_handler(h)
    return opener, handler


def redfish_inputs(ch: s.Chooser) -> dict[str, bytes]:
    return s.redfish_tree(ch, redfish_seeds())


def check_redfish(tree: dict[str, bytes]) -> None:
    from telemetry.agent.redfish import RedfishClient, collect

    opener, handler = _opener()
    handler.tree = tree
    saved = urllib.request._opener
    urllib.request.install_opener(opener)
    try:
        reading = collect(RedfishClient("http://bmc.fuzz"), host="fuzz-host")
    finally:
        urllib.request._opener = saved
    for problem in reading.problems:
        assert isinstance(problem, str) and problem
    for rec in reading.power + reading.gpus:
        # The one documented non-number: a GPU keyed by its Redfish Id says so in extra["redfish_key"].
        extra = {k: v for k, v in rec["extra"].items() if not (k == "redfish_key" and v == "id")}
        for value in (*rec["fields"].values(), *extra.values()):
            assert isinstance(value, int | float) and not isinstance(value, bool), (rec, value)
            assert math.isfinite(value), (rec, value)
    for rec in reading.power:
        assert isinstance(rec["device"], str) and rec["device"], rec
    for rec in reading.gpus:
        assert isinstance(rec["uuid"], str) and rec["uuid"], rec


# --- Slurm -------------------------------------------------------------------------------------------

SLURM_JOBS = ["slurm/rivosinc-prometheus-slurm-exporter/squeue_out.json", "slurm/*/V004*OpenapiJobInfoResp.json",
              "slurm/telegraf-slurmrestd/responses/jobs.json"]


@cache
def slurm_seeds() -> dict[str, list]:
    """Parser name -> seed documents (parsed JSON) or texts."""
    from tests.slurm.test_parse import SACCT_2205, SCONTROL_D
    from tests.slurm.test_parse_cluster import KINDS

    def texts(patterns: list[str]) -> list[bytes]:
        return _read_all([f"slurm/{p}" for p in patterns])

    seeds: dict[str, list] = {
        "jobs": [json.loads(b) for b in _read_all(SLURM_JOBS)],
        "sacct": [SACCT_2205],
        "scontrol": [SCONTROL_D.encode()],
        "sinfo_gres": texts(["sckyzo-slurm-exporter/*/sinfo_gpus_*.txt", "datadog-integrations-core/*.txt"]),
    }
    for kind in ("partitions", "shares", "reservations", "diag", "licenses", "nodes"):
        seeds[kind] = [json.loads(b) for b in texts(KINDS.get(f"{kind}_json", []))]
        seeds[f"{kind}_text"] = texts(KINDS[f"{kind}_text"])
    seeds["cpus_text"] = texts(KINDS["cpus"])
    return seeds


def _slurm_parsers() -> dict[str, Callable]:
    from telemetry.slurm import parse, parse_cluster

    return {
        "jobs": parse.parse_squeue_json, "sacct": parse.parse_sacct_json,
        "scontrol": parse.parse_scontrol_show_job_detail, "sinfo_gres": parse.parse_sinfo_gres,
        "partitions": parse_cluster.parse_partitions, "shares": parse_cluster.parse_shares,
        "reservations": parse_cluster.parse_reservations, "diag": parse_cluster.parse_diag,
        "licenses": parse_cluster.parse_licenses, "nodes": parse_cluster.parse_nodes, "cpus": parse_cluster.parse_cpus,
    }


def slurm_inputs(ch: s.Chooser) -> tuple[str, str]:
    kinds = [k for k, docs in slurm_seeds().items() if docs]
    kind = ch.pick(kinds)
    docs = slurm_seeds()[kind]
    body = s.mutated_seed(ch, docs) if isinstance(docs[0], bytes) else s.json_body(ch, docs)
    return kind.removesuffix("_text"), s.as_text(body)


def check_slurm(case) -> None:
    from telemetry.slurm.parse import Job, SlurmParseError

    kind, text = case
    try:
        result = _slurm_parsers()[kind](text)
    except SlurmParseError as exc:
        assert str(exc), kind
        return
    for item in result if isinstance(result, list) else []:
        if isinstance(item, Job):
            _check_job(item)


def _check_job(job) -> None:
    """What the scheduler sync writes: a job with the column types it expects."""
    for name in ("job_id", "name", "user", "account", "partition", "qos", "state"):
        assert isinstance(getattr(job, name), str), (name, getattr(job, name))
    for name in ("raw_job_id", "node_count", "gpu_count", "gpus_requested"):
        assert type(getattr(job, name)) is int, (name, getattr(job, name))
    assert job.priority is None or type(job.priority) is int, job.priority
    assert job.restart_count is None or type(job.restart_count) is int, job.restart_count
    assert job.requeue is None or isinstance(job.requeue, bool), job.requeue
    assert all(isinstance(n, str) for n in job.nodes), job.nodes
    for t in (job.submit, job.start, job.end):
        assert t is None or (isinstance(t, datetime) and t.tzinfo is not None), t


# --- topology ----------------------------------------------------------------------------------------


@cache
def topology_seeds() -> list[tuple[str, bytes]]:
    folder = REPO / "tests/fixtures/topology"
    return [(p.suffix, p.read_bytes()) for p in sorted(folder.iterdir()) if p.suffix in (".yaml", ".json")]


@cache
def topology_trees() -> list[Any]:
    import yaml

    trees = []
    for suffix, body in topology_seeds():
        try:
            trees.append(json.loads(body) if suffix == ".json" else yaml.safe_load(body))
        except (ValueError, yaml.YAMLError):
            continue
    return trees


def topology_inputs(ch: s.Chooser) -> tuple[str, bytes]:
    import yaml

    kind = ch.below(3)
    if kind == 0:
        return ch.pick((".yaml", ".json", "")), s.mutated_seed(ch, [b for _, b in topology_seeds()])
    if kind == 1:
        return ".json", s.json_body(ch, topology_trees())
    doc = _yaml_safe(s.mutate_tree(ch, ch.pick(topology_trees())))
    try:
        return ".yaml", yaml.safe_dump(doc, allow_unicode=True).encode()
    except RecursionError:  # PyYAML's writer cannot nest that deep; JSON text is YAML too
        return ".yaml", s.dumps(doc)


def _yaml_safe(doc: Any) -> Any:
    # safe_dump cannot write lone surrogates; they are the JSON path's business.
    return json.loads(s.dumps(doc).decode("utf-8", "replace"))


def check_topology(case) -> None:
    from telemetry.topology import TopologyError, load_topology_file
    from telemetry.topology_schema import build_plan

    suffix, body = case
    with tempfile.NamedTemporaryFile(suffix=suffix) as f:
        f.write(body)
        f.flush()
        try:
            doc = load_topology_file(f.name)
        except TopologyError as exc:
            assert exc.issues and all(i.message for i in exc.issues), exc
            return
    plan, issues = build_plan(doc)
    assert all(isinstance(i.message, str) and i.message for i in issues)


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("exposition", exposition_inputs, check_exposition),
        Target("ingest-json", ingest_inputs, check_ingest),
        Target("ingest-arrow", arrow_inputs, check_arrow),
        Target("nvidia-smi", nvsmi_inputs, check_nvsmi),
        Target("infiniband", infiniband_inputs, check_infiniband),
        Target("redfish", redfish_inputs, check_redfish),
        Target("slurm", slurm_inputs, check_slurm),
        Target("topology", topology_inputs, check_topology),
    )
}
