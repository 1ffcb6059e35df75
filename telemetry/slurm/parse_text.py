"""Small text parsers for Slurm CLI outputs that exporters read: sinfo/squeue column and line-JSON forms,
``sinfo -N -o '%N|%E|%H|%T'`` drain reasons, ``sacctmgr`` associations and the rivosinc exporter's trace body.

Stdlib only, like telemetry.slurm.parse: every parser raises SlurmParseError naming the line or key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from typing import Any

from telemetry.slurm.parse import SlurmParseError, expand_hostlist, normalize_state, parse_slurm_time
from telemetry.slurm.parse_cluster import Node, _cpu_counts, _int_field, _lines, node_state

__all__ = [
    "Association", "DrainReason", "SqueueRow", "TraceInfo", "account_users", "parse_drain_reasons",
    "parse_sacctmgr_associations", "parse_sinfo_text", "parse_squeue_text", "parse_trace_info",
]


@dataclass(frozen=True)
class SqueueRow:
    """One job row of a short squeue report; fields the format lacks are None."""

    job_id: str
    state: str
    account: str | None = None
    user: str | None = None
    partition: str | None = None
    node_count: int | None = None
    cpus: int | None = None
    tres: str | None = None  # tres-alloc as printed
    reason: str | None = None  # fallback "r": node list when running, (Reason) when pending
    memory: str | None = None  # as printed ("128G")


@dataclass(frozen=True)
class DrainReason:
    """Nodes sharing one (reason, user, since, state) in ``sinfo -N -o '%N|%E|%H|%T'``; reason None: "none"."""

    nodes: list[str]
    reason: str | None
    user: str | None  # only with a %u column ('%N|%E|%u|%H|%T')
    since: datetime | None
    state: str


@dataclass(frozen=True)
class Association:
    """A ``sacctmgr`` association row (User|Account|GrpCPUs|GrpMem|GrpJobs|GrpSubmitJobs, no header).

    ``user`` "" is the account's own row, which carries the account limits; the others map a user to an account.
    """

    user: str
    account: str
    grp_cpus: int | None
    grp_mem_mb: int | None
    grp_jobs: int | None  # running
    grp_submit_jobs: int | None  # running or pending


@dataclass(frozen=True)
class TraceInfo:
    """rivosinc exporter's ``/trace`` POST body: one process sample of a job, sent by its wrapper on the node."""

    pid: int
    cpus: float  # CPU percent of the process
    threads: int
    mem: int  # bytes (RSS)
    read_bytes: int
    write_bytes: int
    username: str
    io_wait: float
    hostname: str
    job_id: int


def _json_line(n: int, line: str) -> dict[str, Any]:
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as exc:
        raise SlurmParseError(f"line {n}: invalid JSON at column {exc.colno}: {exc.msg}") from exc
    if not isinstance(doc, dict):
        raise SlurmParseError(f"line {n}: expected a JSON object")
    return doc


def _req(doc: dict[str, Any], key: str, n: int) -> Any:
    if key not in doc:
        raise SlurmParseError(f"line {n}: missing key {key!r}")
    return doc[key]


def _rows(text: str, source: str, errors: list[str] | None, parse_line: Any) -> list[Any]:
    """Parse each non-comment line; with ``errors`` a bad line is recorded there and skipped instead of raising."""
    out = []
    for n, line in _lines(text, source):
        if line.lstrip().startswith("#"):
            continue
        try:
            out.append(parse_line(n, line))
        except SlurmParseError as exc:
            if errors is None:
                raise
            errors.append(str(exc))
    return out


# --------------------------------------------------------------------------- sinfo
def _sinfo_line(n: int, line: str) -> Node:
    if line.lstrip().startswith("{"):  # rivosinc fallback: sinfo -N -o with a JSON template, one node/partition
        d = _json_line(n, line)
        state, flags = node_state(str(_req(d, "s", n)), f"line {n}")
        cpus = _cpu_counts(str(_req(d, "cstate", n)), f"line {n}")
        mem = _req(d, "mem", n)
        return Node(str(_req(d, "n", n)), state, [str(_req(d, "p", n))], cpus.total, [], [], None, cpus.allocated,
                    mem if isinstance(mem, int) else _int_field(str(mem), f"line {n} mem"), None, flags)
    cols = line.strip().split(",")  # vpenso: sinfo -h -N -o '%N,%T'
    if len(cols) != 2 or not cols[0]:
        raise SlurmParseError(f"line {n}: expected node,state or a JSON object, got {line!r}")
    state, flags = node_state(cols[1], f"line {n}")
    return Node(cols[0], state, [], None, [], [], state_flags=flags)


def parse_sinfo_text(text: str, errors: list[str] | None = None) -> list[Node]:
    """``sinfo -h -N -o '%N,%T'`` or the rivosinc line-JSON fallback -> one Node per name, partitions merged."""
    seen: dict[str, Node] = {}
    for node in _rows(text, "sinfo", errors, _sinfo_line):
        first = seen.setdefault(node.name, node)
        first.partitions.extend(p for p in node.partitions if p not in first.partitions)
    return list(seen.values())


# --------------------------------------------------------------------------- squeue
def _squeue_line(n: int, line: str, column2: str) -> SqueueRow:
    where = f"line {n}"
    if line.lstrip().startswith("{"):  # rivosinc fallback: squeue -o with a JSON template
        d = _json_line(n, line)
        cpu = _req(d, "cpu", n)
        return SqueueRow(str(_req(d, "id", n)), normalize_state(str(_req(d, "state", n)))[0], account=d.get("a"),
                         partition=d.get("p"), cpus=cpu if isinstance(cpu, int) else _int_field(str(cpu), where),
                         reason=d.get("r"), memory=d.get("mem"))
    if "|" in line:  # sckyzo: squeue -h -O 'JobID:|,Account:|(or UserName:|),State:|,NumNodes:|,NumCPUs:|,tres-alloc:'
        cols = [c.strip() for c in line.split("|")]
        if len(cols) != 6 or not cols[0]:
            raise SlurmParseError(f"{where}: expected 6 '|' columns (id|{column2}|state|nodes|cpus|tres), got {line!r}")
        return SqueueRow(cols[0], normalize_state(cols[2])[0], **{column2: cols[1]},
                         node_count=_int_field(cols[3], where), cpus=_int_field(cols[4], where), tres=cols[5] or None)
    cols = line.strip().split(",")  # vpenso: squeue -h -o '%A,%T'
    if len(cols) != 2 or not cols[0]:
        raise SlurmParseError(f"{where}: expected jobid,state, id|..., or a JSON object, got {line!r}")
    return SqueueRow(cols[0], normalize_state(cols[1])[0])


def parse_squeue_text(text: str, column2: str = "account", errors: list[str] | None = None) -> list[SqueueRow]:
    """``squeue -o '%A,%T'``, the six-column pipe views, or the rivosinc line-JSON fallback (``#`` lines skipped).

    ``column2`` says what the pipe views' second column holds: "account" or "user" (squeue cannot tell).
    """
    if column2 not in {"account", "user"}:
        raise ValueError(f"column2 must be 'account' or 'user', not {column2!r}")

    def one(n: int, line: str) -> SqueueRow:
        try:
            return _squeue_line(n, line, column2)
        except SlurmParseError as exc:
            raise SlurmParseError(str(exc) if str(exc).startswith("line ") else f"line {n}: {exc}") from exc

    return _rows(text, "squeue", errors, one)


# --------------------------------------------------------------------------- drain reasons
def parse_drain_reasons(text: str, tz: tzinfo = UTC) -> list[DrainReason]:
    """``sinfo -h -N -o '%N|%E|%H|%T'`` (or ``'%N|%E|%u|%H|%T'``): nodes grouped per (reason, user, since, state).

    Rows repeat per partition; a node is listed once per group. "none" reason and "Unknown" time give None.
    """
    groups: dict[tuple[str | None, str | None, datetime | None, str], list[str]] = {}
    for n, line in _lines(text, "drain reasons"):
        cols = [c.strip() for c in line.split("|")]
        if len(cols) not in (4, 5) or not cols[0]:
            raise SlurmParseError(f"line {n}: expected node|reason|[user|]time|state, got {line!r}")
        user = (cols[2] or None) if len(cols) == 5 else None
        try:
            since = parse_slurm_time(cols[-2], tz)
        except SlurmParseError as exc:
            raise SlurmParseError(f"line {n}: {exc}") from exc
        state = node_state(cols[-1], f"line {n}")[0]
        key = (None if cols[1].lower() in {"none", ""} else cols[1], user, since, state)
        nodes = groups.setdefault(key, [])
        nodes.extend(h for h in expand_hostlist(cols[0]) if h not in nodes)
    return [DrainReason(nodes, reason, user, since, state) for (reason, user, since, state), nodes in groups.items()]


# --------------------------------------------------------------------------- sacctmgr
def _opt_int(value: str, where: str) -> int | None:
    return _int_field(value, where) if value.strip() else None


def parse_sacctmgr_associations(text: str) -> list[Association]:
    """``sacctmgr -n -P show assoc format=User,Account,GrpCPUs,GrpMem,GrpJobs,GrpSubmitJobs`` (rivosinc's query)."""
    out = []
    for n, line in _lines(text, "sacctmgr"):
        cols = [c.strip() for c in line.split("|")]
        if len(cols) != 6 or not cols[1]:
            raise SlurmParseError(f"line {n}: expected 6 '|' columns user|account|cpus|mem|jobs|submit, got {line!r}")
        w = f"line {n}"
        out.append(Association(cols[0], cols[1], _opt_int(cols[2], w), _opt_int(cols[3], w), _opt_int(cols[4], w),
                               _opt_int(cols[5], w)))
    return out


def account_users(associations: list[Association]) -> dict[str, list[str]]:
    """Account -> its users (the Slurm-account-to-tenant mapping); an account with no user rows maps to []."""
    out: dict[str, list[str]] = {}
    for a in associations:
        users = out.setdefault(a.account, [])
        if a.user and a.user not in users:
            users.append(a.user)
    return out


# --------------------------------------------------------------------------- rivosinc trace body
_TRACE_TYPES = {"pid": int, "cpus": float, "threads": int, "mem": int, "read_bytes": int, "write_bytes": int,
                "username": str, "io_wait": float, "hostname": str, "job_id": int}


def parse_trace_info(text: str) -> TraceInfo:
    """The JSON body rivosinc's job wrapper POSTs to the exporter's /trace endpoint (one process sample)."""
    _lines(text, "trace")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmParseError(f"trace: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
    if not isinstance(doc, dict):
        raise SlurmParseError("trace: expected a JSON object")
    vals: dict[str, Any] = {}
    for key, kind in _TRACE_TYPES.items():
        if key not in doc:
            raise SlurmParseError(f"trace: missing key {key!r}")
        v = doc[key]
        ok = isinstance(v, str) if kind is str else isinstance(v, int | float) and not isinstance(v, bool)
        if not ok or (kind is int and not isinstance(v, int)):
            raise SlurmParseError(f"trace.{key}: expected {kind.__name__}, got {v!r}")
        vals[key] = float(v) if kind is float else v
    return TraceInfo(**vals)
