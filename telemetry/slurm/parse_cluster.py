"""Pure parsers for Slurm's cluster-level outputs, the ones that carry no jobs.

Partitions (slurmrestd/sinfo JSON, ``sinfo -o %R,%C`` and ``sinfo -o %R|%D|%T|%b``), fair-share (``sshare -P``
and slurmrestd ``/shares``), reservations (``scontrol show reservation`` and slurmrestd ``/reservations``),
scheduler statistics (``sdiag`` and ``sdiag --json``/``/diag``), licenses (``scontrol show licenses -o`` and
``--json``), the ``sinfo -o %C`` CPU summary and nodes (slurmrestd/sinfo ``nodes`` JSON and ``sinfo -N -O`` text).

Stdlib only, no Django, like telemetry.slurm.parse: every parser raises SlurmParseError naming the line or key
rather than returning a partial answer. Where one kind has a JSON and a text form, the parser detects which.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from typing import Any

from telemetry.slurm.parse import (
    GresItem,
    SlurmParseError,
    _epoch,
    _hosts,
    _kv_tokens,
    _number,
    _obj,
    _seq,
    _shown,
    _text,
    _unwrap_number,
    load_json,
    parse_gres,
    parse_slurm_time,
)

__all__ = [
    "CpuCounts", "License", "Node", "Partition", "Reservation", "Share", "node_state", "parse_cpus", "parse_diag",
    "parse_licenses", "parse_nodes", "parse_partitions", "parse_reservations", "parse_shares",
]


@dataclass(frozen=True)
class CpuCounts:
    """``sinfo %C``: CPUs allocated/idle/other (down, drained)/total."""

    allocated: int
    idle: int
    other: int
    total: int


@dataclass
class Partition:
    """One partition; fields a source does not report are None (text sinfo has no time limit or node list)."""

    name: str
    state: str | None
    nodes: list[str]
    total_cpus: int | None
    total_nodes: int | None
    max_time: timedelta | None  # None: unlimited or not reported
    default: bool
    tres: str | None = None
    cpus: CpuCounts | None = None  # from sinfo %C
    node_states: dict[str, int] = field(default_factory=dict)  # from sinfo %D|%T: nodes per state


@dataclass(frozen=True)
class Share:
    """One association of the fair-share tree; ``user`` is "" on account rows."""

    account: str
    user: str
    raw_shares: int | None  # None: "parent" (the user shares its account's allotment) or unset
    norm_shares: float | None
    raw_usage: int | None
    norm_usage: float | None
    effective_usage: float | None  # slurmrestd only; sshare -o NormUsage does not print it
    fairshare: float | None  # None on account rows, which have no factor of their own
    level: int = 0  # depth in the tree (sshare's indentation)


@dataclass(frozen=True)
class Reservation:
    """An advance reservation; times are aware UTC, None when unknown."""

    name: str
    start: datetime | None
    end: datetime | None
    nodes: list[str]
    users: list[str]
    accounts: list[str]
    flags: list[str]
    state: str | None = None


@dataclass(frozen=True)
class License:
    """A license pool as slurmctld tracks it."""

    name: str
    total: int
    used: int
    free: int
    reserved: int
    remote: bool
    last_update: datetime | None


# --------------------------------------------------------------------------- shared helpers
def _load_json(text: str, source: str, key: str) -> tuple[dict[str, Any], Any]:
    """Decode a slurmrestd/CLI JSON document and return it with its ``key`` member."""
    doc = load_json(text, source)
    if not isinstance(doc, dict) or key not in doc:
        raise SlurmParseError(f"{source}: no {key!r} key in the document")
    value = doc[key]
    # Errors beside data (a generated example, a federation sibling down) still carry data; errors alone do not.
    if doc.get("errors") and not value:
        raise SlurmParseError(f"{source}: Slurm reported errors and no {key}: {doc['errors']!r}")
    return doc, value


def _lines(text: str, source: str) -> list[tuple[int, str]]:
    if text is None or not text.strip():
        raise SlurmParseError(f"{source}: empty input")
    return [(n, ln) for n, ln in enumerate(text.splitlines(), 1) if ln.strip()]


def _is_json(text: str) -> bool:
    return text.lstrip().startswith("{")


def _float(value: Any, key: str) -> float | None:
    """A float, or slurmrestd's {set, infinite, number} wrapper; unset/infinite -> None."""
    number = _unwrap_number(value, key)
    try:
        number = None if number is None else float(number)
    except OverflowError as exc:
        raise SlurmParseError(f"{key}: {_shown(number)} is out of range") from exc
    return None if number is None or math.isinf(number) or math.isnan(number) else number


def _int_field(value: str, what: str) -> int:
    # ASCII digits within int64: a longer run is damage (and int() refuses 4,300+ digits outright).
    digits = value.strip()  # str.strip() also drops \x1c-\x1f, which int() would refuse
    if not re.fullmatch(r"-?\d{1,18}", digits, re.ASCII):
        raise SlurmParseError(f"{what}: expected an integer, got {_shown(value)}")
    return int(digits)


def _time(value: Any, tz: tzinfo, where: str) -> datetime | None:
    try:
        return parse_slurm_time(value, tz)
    except SlurmParseError as exc:
        raise SlurmParseError(f"{where}: {exc}") from exc


def _names(value: str | None, where: str = "names") -> list[str]:
    # scontrol prints "(null)" for an empty list; slurmrestd uses "".
    if value is not None and not isinstance(value, str):
        raise SlurmParseError(f"{where}: expected a comma-separated string, got {_shown(value)}")
    if value is None or value.strip() in {"", "(null)", "N/A"}:
        return []
    return [v.strip() for v in value.split(",") if v.strip()]


# --------------------------------------------------------------------------- CPUs (sinfo %C)
def _cpu_counts(spec: str, where: str) -> CpuCounts:
    parts = spec.strip().split("/")
    if len(parts) != 4:
        raise SlurmParseError(f"{where}: expected A/I/O/T, got {spec!r}")
    a, i, o, t = (_int_field(p, where) for p in parts)
    if a + i + o != t:  # sinfo's invariant: a mismatch means a torn or mis-split line
        raise SlurmParseError(f"{where}: {a}+{i}+{o} != total {t}")
    return CpuCounts(a, i, o, t)


def parse_cpus(text: str) -> CpuCounts:
    """``sinfo -h -o %C``: one ``allocated/idle/other/total`` line for the whole cluster."""
    lines = _lines(text, "sinfo %C")
    if len(lines) != 1:
        raise SlurmParseError(f"sinfo %C: expected one line, got {len(lines)}")
    n, line = lines[0]
    return _cpu_counts(line, f"line {n}")


# --------------------------------------------------------------------------- partitions
def _minutes(value: Any, key: str) -> timedelta | None:
    # v0.0.38 uses -1 / null for UNLIMITED, v0.0.40+ the infinite flag; both mean "no limit".
    n = _number(value, key)
    try:
        return None if n is None or n < 0 else timedelta(minutes=n)
    except OverflowError as exc:
        raise SlurmParseError(f"{key}: {n} minutes is out of range") from exc


def _partition_v38(p: dict[str, Any], where: str) -> Partition:
    """openapi v0.0.37/38: flat keys (telegraf capture)."""
    return Partition(
        name=p["name"], state=_text(p.get("state"), f"{where}.state", None),
        nodes=_hosts(p.get("nodes"), f"{where}.nodes"),
        total_cpus=_number(p.get("total_cpus"), f"{where}.total_cpus"),
        total_nodes=_number(p.get("total_nodes"), f"{where}.total_nodes"),
        max_time=_minutes(p.get("max_time_limit"), f"{where}.max_time_limit"),
        default="default" in [str(f).lower() for f in _seq(p.get("flags"), f"{where}.flags")],
        tres=_text(p.get("tres"), f"{where}.tres") or None,
    )


def _partition_v40(p: dict[str, Any], where: str) -> Partition:
    """openapi v0.0.40+: nested nodes/cpus/maximums/partition objects."""
    nodes = _obj(p.get("nodes"), f"{where}.nodes")
    state = _seq(_obj(p.get("partition"), f"{where}.partition").get("state"), f"{where}.partition.state")
    flags = [str(s).upper() for s in state]
    return Partition(
        name=p["name"], state=flags[0] if flags else None,
        nodes=_hosts(nodes.get("configured"), f"{where}.nodes.configured"),
        total_cpus=_number(_obj(p.get("cpus"), f"{where}.cpus").get("total"), f"{where}.cpus.total"),
        total_nodes=_number(nodes.get("total"), f"{where}.nodes.total"),
        max_time=_minutes(_obj(p.get("maximums"), f"{where}.maximums").get("time"), f"{where}.maximums.time"),
        default="DEFAULT" in flags,
        tres=_text(_obj(p.get("tres"), f"{where}.tres").get("configured"), f"{where}.tres.configured") or None,
    )


def _partitions_json(text: str) -> list[Partition]:
    _, parts = _load_json(text, "partitions", "partitions")
    if not isinstance(parts, list):
        raise SlurmParseError("partitions: 'partitions' is not a list")
    out = []
    for i, p in enumerate(parts):
        where = f"partitions[{i}]"
        if not isinstance(p, dict) or not isinstance(p.get("name"), str):
            raise SlurmParseError(f"{where}: missing key 'name'")
        out.append(_partition_v40(p, where) if isinstance(p.get("nodes"), dict) else _partition_v38(p, where))
    return out


def _partition_text_line(n: int, line: str, seen: dict[str, Partition]) -> None:
    if "|" in line:  # sinfo -o '%R|%D|%T|%b': one row per (partition, node state)
        cols = line.split("|")
        if len(cols) < 3:
            raise SlurmParseError(f"line {n}: expected partition|nodes|state, got {line!r}")
        name, count, state = cols[0].strip(), _int_field(cols[1], f"line {n}"), cols[2].strip().lower()
    else:  # sinfo -o '%R,%C'
        name, sep, spec = line.strip().partition(",")
        if not sep:
            raise SlurmParseError(f"line {n}: expected partition,A/I/O/T or partition|nodes|state, got {line!r}")
    default = name.endswith("*")  # %P marks the default partition with '*'; %R does not
    name = name.rstrip("*")
    if not name:
        raise SlurmParseError(f"line {n}: empty partition name")
    part = seen.setdefault(name, Partition(name, None, [], None, None, None, default))
    if "|" in line:
        part.node_states[state] = part.node_states.get(state, 0) + count
        part.total_nodes = sum(part.node_states.values())
    else:
        part.cpus = _cpu_counts(spec, f"line {n}")
        part.total_cpus = part.cpus.total


def parse_partitions(text: str) -> list[Partition]:
    """slurmrestd/sinfo ``partitions`` JSON (v0.0.38 to v0.0.41), or ``sinfo -o %R,%C`` / ``%R|%D|%T|%b`` text."""
    lines = _lines(text, "partitions")
    if _is_json(text):
        return _partitions_json(text)
    seen: dict[str, Partition] = {}
    for n, line in lines:
        _partition_text_line(n, line, seen)
    return list(seen.values())


# --------------------------------------------------------------------------- fair-share
_SSHARE_COLS = 7  # sshare -a -P -n -o Account,User,RawShares,NormShares,RawUsage,NormUsage,FairShare


def _opt(value: str, conv: type[int] | type[float], where: str) -> int | float | None:
    v = value.strip()
    if v == "" or v == "parent":  # "parent": the user draws on its account's shares
        return None
    try:
        return conv(v)
    except ValueError as exc:
        raise SlurmParseError(f"{where}: bad number {value!r}") from exc


def _sshare_line(n: int, line: str) -> Share:
    cols = line.split("|")
    if len(cols) != _SSHARE_COLS:
        raise SlurmParseError(f"line {n}: expected {_SSHARE_COLS} '|' columns, got {len(cols)}: {line!r}")
    account = cols[0].strip()
    if not account:
        raise SlurmParseError(f"line {n}: empty Account column")
    w = f"line {n}"
    return Share(
        account=account, user=cols[1].strip(), raw_shares=_opt(cols[2], int, w), norm_shares=_opt(cols[3], float, w),
        raw_usage=_opt(cols[4], int, w), norm_usage=_opt(cols[5], float, w), effective_usage=None,
        fairshare=_opt(cols[6], float, w), level=len(cols[0]) - len(cols[0].lstrip(" ")),
    )


def _share_json(s: dict[str, Any], i: int) -> Share:
    where = f"shares[{i}]"
    if not isinstance(s, dict) or not isinstance(s.get("name"), str):
        raise SlurmParseError(f"{where}: missing key 'name'")
    is_user = "USER" in [str(t).upper() for t in _seq(s.get("type"), f"{where}.type")]
    return Share(
        account=_text(s.get("parent"), f"{where}.parent") if is_user else s["name"], user=s["name"] if is_user else "",
        raw_shares=_number(s.get("shares"), f"{where}.shares"),
        norm_shares=_float(s.get("shares_normalized"), f"{where}.shares_normalized"),
        raw_usage=_number(s.get("usage"), f"{where}.usage"),
        norm_usage=_float(s.get("usage_normalized"), f"{where}.usage_normalized"),
        effective_usage=_float(s.get("effective_usage"), f"{where}.effective_usage"),
        fairshare=_float(_obj(s.get("fairshare"), f"{where}.fairshare").get("factor"), f"{where}.fairshare.factor"),
    )


def parse_shares(text: str) -> list[Share]:
    """``sshare -a -P -n -o Account,User,RawShares,NormShares,RawUsage,NormUsage,FairShare`` or slurmrestd shares."""
    lines = _lines(text, "shares")
    if _is_json(text):
        _, wrapper = _load_json(text, "shares", "shares")
        if not isinstance(wrapper, dict) or not isinstance(wrapper.get("shares"), list):
            raise SlurmParseError("shares: no 'shares.shares' list in the document")
        return [_share_json(s, i) for i, s in enumerate(wrapper["shares"])]
    return [_sshare_line(n, ln) for n, ln in lines]


# --------------------------------------------------------------------------- reservations
_NO_RESERVATIONS = "No reservations in the system"


def _resv_time(value: str | None, tz: tzinfo, today: date | None, where: str) -> datetime | None:
    # scontrol drops the date for times within today ("14:24:22"); only the caller knows which day that was.
    if isinstance(value, str) and re.fullmatch(r"\d{1,2}:\d{2}:\d{2}", value, re.ASCII):
        if today is None:
            return None
        try:
            return datetime.combine(today, time.fromisoformat(value.zfill(8)), tz).astimezone(UTC)
        except (ValueError, OverflowError) as exc:  # "99:99:99"
            raise SlurmParseError(f"{where}: bad time of day {value!r}") from exc
    try:
        return parse_slurm_time(value, tz)
    except SlurmParseError as exc:
        raise SlurmParseError(f"{where}: {exc}") from exc


def _resv_text(record: str, n: int, tz: tzinfo, today: date | None) -> Reservation:
    kv = dict(_kv_tokens(record))
    if "ReservationName" not in kv:
        raise SlurmParseError(f"reservation {n}: missing ReservationName")
    where = f"reservation {kv['ReservationName']!r}"
    return Reservation(
        name=kv["ReservationName"], start=_resv_time(kv.get("StartTime"), tz, today, f"{where} StartTime"),
        end=_resv_time(kv.get("EndTime"), tz, today, f"{where} EndTime"), nodes=_hosts(kv.get("Nodes"), where),
        users=_names(kv.get("Users")), accounts=_names(kv.get("Accounts")), flags=_names(kv.get("Flags")),
        state=kv.get("State"),
    )


def _resv_records(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    records: list[tuple[int, list[str]]] = []
    for n, line in lines:
        if line.lstrip().startswith("ReservationName="):
            records.append((n, []))
        elif not records:
            raise SlurmParseError(f"line {n}: expected ReservationName=, got {line.strip()[:60]!r}")
        records[-1][1].append(line)
    return [(n, "\n".join(rec)) for n, rec in records]


def _resv_json(r: dict[str, Any], i: int) -> Reservation:
    where = f"reservations[{i}]"
    if not isinstance(r, dict) or not isinstance(r.get("name"), str):
        raise SlurmParseError(f"{where}: missing key 'name'")
    flags = r.get("flags") or []
    return Reservation(
        name=r["name"], start=_epoch(r.get("start_time"), f"{where}.start_time"),
        end=_epoch(r.get("end_time"), f"{where}.end_time"), nodes=_hosts(r.get("node_list"), f"{where}.node_list"),
        users=_names(r.get("users"), f"{where}.users"), accounts=_names(r.get("accounts"), f"{where}.accounts"),
        flags=[str(f).upper() for f in flags] if isinstance(flags, list) else _names(flags, f"{where}.flags"),
    )


def parse_reservations(text: str, tz: tzinfo = UTC, today: date | None = None) -> list[Reservation]:
    """``scontrol show reservation`` (``tz``: the zone it printed in) or slurmrestd ``/reservations`` JSON.

    "No reservations in the system" and an empty JSON list give []. ``today`` resolves time-only start/end
    values (scontrol omits the date for today); without it they are None.
    """
    lines = _lines(text, "reservations")
    if _is_json(text):
        _, items = _load_json(text, "reservations", "reservations")
        if not isinstance(items, list):
            raise SlurmParseError("reservations: 'reservations' is not a list")
        return [_resv_json(r, i) for i, r in enumerate(items)]
    if len(lines) == 1 and lines[0][1].strip() == _NO_RESERVATIONS:
        return []
    return [_resv_text(rec, n, tz, today) for n, rec in _resv_records(lines)]


# --------------------------------------------------------------------------- licenses
_NO_LICENSES = "No licenses configured in Slurm."
_LICENSE_KEYS = ("LicenseName", "Total", "Used", "Free", "Reserved")


def _license(kv: dict[str, Any], where: str, tz: tzinfo) -> License:
    if not isinstance(kv, dict):
        raise SlurmParseError(f"{where}: expected an object, got {_shown(kv)}")
    missing = [k for k in _LICENSE_KEYS if k not in kv]
    if missing:
        raise SlurmParseError(f"{where}: missing key {missing[0]!r}")
    remote = kv.get("Remote", False)
    nums = [_number(v, f"{where}.{k}") if isinstance(v, int) and not isinstance(v, bool)
            else _int_field(str(v), f"{where} {k}") for k, v in ((k, kv[k]) for k in _LICENSE_KEYS[1:])]
    return License(
        name=str(kv["LicenseName"]), total=nums[0], used=nums[1], free=nums[2], reserved=nums[3],
        remote=remote if isinstance(remote, bool) else str(remote).lower() == "yes",
        last_update=_time(kv.get("LastUpdate"), tz, f"{where}.LastUpdate"),
    )


def parse_licenses(text: str, tz: tzinfo = UTC) -> list[License]:
    """``scontrol show licenses -o`` or ``scontrol show licenses --json``; none configured gives []."""
    lines = _lines(text, "licenses")
    if _is_json(text):
        _, items = _load_json(text, "licenses", "licenses")
        if not isinstance(items, list):
            raise SlurmParseError("licenses: 'licenses' is not a list")
        return [_license(item, f"licenses[{i}]", tz) for i, item in enumerate(items)]
    if len(lines) == 1 and lines[0][1].strip() == _NO_LICENSES:
        return []
    out = []
    for n, line in lines:
        if not line.startswith("LicenseName="):
            raise SlurmParseError(f"line {n}: expected LicenseName=, got {line.strip()[:60]!r}")
        out.append(_license(dict(_kv_tokens(line)), f"line {n}", tz))
    return out


# --------------------------------------------------------------------------- sdiag
# Text labels -> the key sdiag --json uses, per section: "Last cycle" means one thing under the main scheduler
# and another under backfill, so the section decides.
_DIAG_TOP = {
    "Server thread count": "server_thread_count", "Agent queue size": "agent_queue_size",
    "Agent count": "agent_count", "Agent thread count": "agent_thread_count",
    "DBD Agent queue size": "dbd_agent_queue_size", "Jobs submitted": "jobs_submitted",
    "Jobs started": "jobs_started", "Jobs completed": "jobs_completed", "Jobs canceled": "jobs_canceled",
    "Jobs failed": "jobs_failed", "Jobs pending": "jobs_pending", "Jobs running": "jobs_running",
}
_DIAG_MAIN = {
    "Last cycle": "schedule_cycle_last", "Max cycle": "schedule_cycle_max", "Total cycles": "schedule_cycle_total",
    "Mean cycle": "schedule_cycle_mean", "Mean depth cycle": "schedule_cycle_mean_depth",
    "Cycles per minute": "schedule_cycle_per_minute", "Last queue length": "schedule_queue_length",
}
_DIAG_BF = {
    "Total backfilled jobs (since last slurm start)": "bf_backfilled_jobs",
    "Total backfilled jobs (since last stats cycle start)": "bf_last_backfilled_jobs",
    "Total backfilled heterogeneous job components": "bf_backfilled_het_jobs", "Total cycles": "bf_cycle_counter",
    "Last cycle": "bf_cycle_last", "Max cycle": "bf_cycle_max", "Mean cycle": "bf_cycle_mean",
    "Last depth cycle": "bf_last_depth", "Last depth cycle (try sched)": "bf_last_depth_try",
    "Depth Mean": "bf_depth_mean", "Depth Mean (try depth)": "bf_depth_mean_try", "Last queue length": "bf_queue_len",
    "Queue length mean": "bf_queue_len_mean", "Last table size": "bf_table_size",
    "Mean table size": "bf_table_size_mean",
}
_DIAG_SECTIONS = {"Main schedule statistics": _DIAG_MAIN, "Backfilling stats": _DIAG_BF}
_LATENCY = re.compile(r"^Latency for \d+ calls to gettimeofday\(\): (\d{1,18}) microseconds$", re.ASCII)


def _diag_text(lines: list[tuple[int, str]]) -> dict[str, int | bool | None]:
    out: dict[str, int | bool | None] = {}
    table = _DIAG_TOP
    for n, raw in lines:
        line = raw.strip()
        if not raw[0].isspace():  # an unindented line starts a section; unknown sections are skipped
            table = next((t for head, t in _DIAG_SECTIONS.items() if line.startswith(head)), _DIAG_TOP)
        if m := _LATENCY.match(line):
            out["gettimeofday_latency"] = int(m.group(1))
        label, sep, value = line.partition(":")
        key = table.get(label.strip()) if sep else None
        if key is None or key in out:
            continue
        if value.strip() == "N/A":
            out[key] = None
        else:
            out[key] = _int_field(value, f"line {n} ({label.strip()})")
    if "jobs_submitted" not in out:
        raise SlurmParseError("sdiag: no 'Jobs submitted:' line; not sdiag output")
    return out


def _diag_json(text: str) -> dict[str, int | bool | None]:
    _, stats = _load_json(text, "diag", "statistics")
    if not isinstance(stats, dict):
        raise SlurmParseError("diag: 'statistics' is not an object")
    out: dict[str, int | bool | None] = {}
    for key, value in stats.items():
        if isinstance(value, bool):
            out[key] = value
        elif isinstance(value, dict) and key in {"schedule_exit", "bf_exit"}:  # exit-reason counters
            out.update({f"{key}_{k}": _number(v, f"statistics.{key}.{k}") for k, v in value.items()})
        elif not isinstance(value, list):  # RPC tables are lists: per-type detail, not scheduler stats
            out[key] = _number(value, f"statistics.{key}")
    if "jobs_submitted" not in out:
        raise SlurmParseError("diag: missing key 'statistics.jobs_submitted'")
    return out


def parse_diag(text: str) -> dict[str, int | bool | None]:
    """``sdiag`` text or ``sdiag --json`` / slurmrestd ``/diag`` -> scheduler statistics keyed as in the JSON.

    Counters (jobs_submitted/started/completed/canceled/failed), main-scheduler cycle times in microseconds
    (schedule_cycle_*), backfill (bf_*); None where Slurm reports N/A or an unset number.
    """
    lines = _lines(text, "sdiag")
    return _diag_json(text) if _is_json(text) else _diag_text(lines)


# --------------------------------------------------------------------------- nodes
@dataclass
class Node:
    """One node; sinfo prints a row per (node, partition), merged here into ``partitions``. Unreported: None."""

    name: str
    state: str  # base state, upper case: IDLE, MIXED, ALLOCATED, DOWN, DRAINED, ...
    partitions: list[str]
    cpus: int | None  # total CPUs
    gres: list[GresItem]
    gres_used: list[GresItem]
    reason: str | None = None
    alloc_cpus: int | None = None
    memory_mb: int | None = None  # configured (RealMemory)
    alloc_memory_mb: int | None = None
    state_flags: list[str] = field(default_factory=list)  # JSON flags (DRAIN, ...) or sinfo's suffix ("*" etc.)


_NODE_STATES = {
    "IDLE", "ALLOCATED", "ALLOC", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN", "DRAINED", "DRAINING", "DRAIN",
    "FAIL", "FAILING", "COMPLETING", "MAINT", "RESERVED", "PLANNED", "POWERED_DOWN", "POWERING_DOWN",
    "POWERING_UP", "POWER_DOWN", "POWER_UP", "REBOOT_REQUESTED", "REBOOT_ISSUED", "INVAL", "BLOCKED", "PERFCTRS",
    "UNK", "NO_RESPOND", "CLOUD",
}
_STATE_SUFFIXES = "*~#!%$@^-+"  # sinfo: * not responding, ~ powered off, # powering up, ! pending power down, ...


def node_state(value: str | list[str], where: str) -> tuple[str, list[str]]:
    """("mixed" | "down*" | ["IDLE", "DRAIN"]) -> (base state, flags); an unknown base state raises."""
    if not isinstance(value, str | list):
        raise SlurmParseError(f"{where}: expected a node state, got {_shown(value)}")
    items = [value] if isinstance(value, str) else [str(v) for v in value]
    if not items or not items[0].strip():
        raise SlurmParseError(f"{where}: empty node state {value!r}")
    head = items[0].strip().upper()
    base = head.rstrip(_STATE_SUFFIXES)
    if base not in _NODE_STATES:
        raise SlurmParseError(f"{where}: unknown node state {items[0]!r}")
    suffix = [head[len(base):]] if head != base else []
    return ("ALLOCATED" if base == "ALLOC" else base), suffix + [s.upper() for s in items[1:]]


def _gres_at(value: Any, where: str) -> list[GresItem]:
    try:
        return parse_gres(value or "")
    except SlurmParseError as exc:
        raise SlurmParseError(f"{where}: {exc}") from exc


def _node_json(n: dict[str, Any], i: int) -> Node:
    where = f"nodes[{i}]"
    if not isinstance(n, dict) or not isinstance(n.get("name"), str) or not n["name"]:
        raise SlurmParseError(f"{where}: missing key 'name'")
    state, flags = node_state(n.get("state") or "", f"{where}.state")
    parts = n.get("partitions") or []
    partitions = [str(p) for p in parts] if isinstance(parts, list) else _names(parts, f"{where}.partitions")
    return Node(
        name=n["name"], state=state, partitions=partitions,
        cpus=_number(n.get("cpus"), f"{where}.cpus"), gres=_gres_at(n.get("gres"), f"{where}.gres"),
        gres_used=_gres_at(n.get("gres_used"), f"{where}.gres_used"), reason=n.get("reason") or None,
        alloc_cpus=_number(n.get("alloc_cpus"), f"{where}.alloc_cpus"),
        memory_mb=_number(n.get("real_memory"), f"{where}.real_memory"),
        alloc_memory_mb=_number(n.get("alloc_memory"), f"{where}.alloc_memory"),
        state_flags=flags + [str(f).upper() for f in _seq(n.get("state_flags"), f"{where}.state_flags")],
    )


def _node_text_line(n: int, line: str, seen: dict[str, Node]) -> None:
    cols = line.split()
    if len(cols) not in (5, 6, 8):  # sinfo -h -N -O 'NodeList: ,AllocMem: ,...' (trailing colons: no widths)
        raise SlurmParseError(f"line {n}: expected 5, 6 or 8 columns (sinfo -N -O NodeList,AllocMem,Memory,"
                              f"CPUsState,StateLong[,Partition[,Gres,GresUsed]]), got {len(cols)}: {line!r}")
    where = f"line {n}"
    cpus, (state, flags) = _cpu_counts(cols[3], where), node_state(cols[4], where)
    node = seen.get(cols[0])
    if node is None:
        node = seen[cols[0]] = Node(
            name=cols[0], state=state, partitions=[], cpus=cpus.total,
            gres=_gres_at(cols[6], where) if len(cols) == 8 else [],
            gres_used=_gres_at(cols[7], where) if len(cols) == 8 else [], alloc_cpus=cpus.allocated,
            memory_mb=_int_field(cols[2], where), alloc_memory_mb=_int_field(cols[1], where), state_flags=flags,
        )
    if len(cols) > 5 and cols[5].rstrip("*") not in node.partitions:  # '*' marks the default partition
        node.partitions.append(cols[5].rstrip("*"))


def parse_nodes(text: str) -> list[Node]:
    """slurmrestd/``sinfo --json`` ``nodes`` (v0.0.38 to v0.0.41) or ``sinfo -N -O`` node detail text.

    Text rows repeat per partition and are merged per node (state and counts from its first row).
    """
    lines = _lines(text, "nodes")
    if _is_json(text):
        _, items = _load_json(text, "nodes", "nodes")
        if not isinstance(items, list):
            raise SlurmParseError("nodes: 'nodes' is not a list")
        return [_node_json(n, i) for i, n in enumerate(items)]
    seen: dict[str, Node] = {}
    for n, line in lines:
        _node_text_line(n, line, seen)
    return list(seen.values())
