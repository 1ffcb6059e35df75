"""Pure parsers for Slurm's JSON and text outputs: jobs, GRES strings, host lists and per-node GPU allocations.

No Django imports: these run in the agent, in management commands and in tests alike. Every parser raises
SlurmParseError (naming the key or line) on input it cannot trust, rather than returning a partial answer.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

__all__ = [
    "Allocation", "GresItem", "Job", "SinfoGresLine", "SlurmParseError", "expand_hostlist", "gpu_count",
    "normalize_state", "parse_duration", "parse_gres", "parse_sacct_json", "parse_scontrol_show_job_detail",
    "parse_sinfo_gres", "parse_slurm_time", "parse_slurmrestd_jobs", "parse_squeue_json", "parse_tres",
]


class SlurmParseError(ValueError):
    """Input that is empty, malformed or not the shape the parser expects; the message says where."""


MAX_HOSTS = 100_000  # hosts one host list may expand to: "gpu[1-99999999999]" is damage, not a cluster
_INT64 = 2**63
_DIGITS = re.compile(r"\d{1,18}", re.ASCII)  # a count or an index: ASCII digits, within int64


def _shown(value: Any) -> str:
    """repr() for an error message, cut short."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _obj(value: Any, where: str) -> dict[str, Any]:
    """An object member; absent (None) is {}, any other type is an error naming the place."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SlurmParseError(f"{where}: expected an object, got {_shown(value)}")
    return value


def _seq(value: Any, where: str) -> list[Any]:
    """A list member; absent (None) is []."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise SlurmParseError(f"{where}: expected a list, got {_shown(value)}")
    return value


def _text(value: Any, where: str, default: str = "") -> str:
    """A string member; absent (None) is `default`."""
    if value is None:
        return default
    if not isinstance(value, str):
        raise SlurmParseError(f"{where}: expected a string, got {_shown(value)}")
    return value


def load_json(text: str, source: str) -> Any:
    """json.loads with every failure as SlurmParseError (syntax, nesting, a number of 4,300+ digits)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmParseError(f"{source}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
    except ValueError as exc:
        raise SlurmParseError(f"{source}: invalid JSON: {exc}") from exc
    except RecursionError as exc:  # the C scanner's own depth guard: safe to catch
        raise SlurmParseError(f"{source}: invalid JSON: nested too deeply") from exc


@dataclass(frozen=True)
class GresItem:
    """One ``name[:type][:count][(S:..)(IDX:..)]`` element of a GRES string."""

    name: str
    type: str | None
    count: int
    indexes: list[int] | None = None  # None: the string carried no IDX; []: IDX:N/A (nothing allocated)
    sockets: list[int] | None = None


@dataclass
class Job:
    """A job as seen by squeue/slurmrestd (live) or sacct (accounting); times are aware UTC."""

    job_id: str  # "123", "123_4" (array task), "123_[5-9]" (pending array), "123+1" (het component)
    raw_job_id: int
    name: str
    user: str
    account: str
    partition: str
    qos: str
    priority: int | None
    state: str
    submit: datetime | None
    start: datetime | None
    end: datetime | None
    nodes: list[str]
    node_count: int
    gpu_count: int  # allocated GPUs (0 while pending)
    gpus_requested: int
    requeue: bool | None
    restart_count: int | None  # None: the source does not report it (sacct JSON)
    preempted: bool
    state_flags: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Allocation:
    """GPUs a job holds on one node: the row of the allocation ledger."""

    job_id: str
    node: str
    gpu_indexes: list[int]
    start: datetime | None
    end: datetime | None


@dataclass(frozen=True)
class SinfoGresLine:
    """One line of an ``sinfo`` GRES report; ``gres`` has one parsed list per GRES-looking column."""

    line_no: int
    fields: list[str]
    node_count: int | None
    gres: list[list[GresItem]]


# --------------------------------------------------------------------------- states and times
_STATE_CODES = {
    "BF": "BOOT_FAIL", "CA": "CANCELLED", "CD": "COMPLETED", "CF": "CONFIGURING", "CG": "COMPLETING",
    "DL": "DEADLINE", "F": "FAILED", "NF": "NODE_FAIL", "OOM": "OUT_OF_MEMORY", "PD": "PENDING",
    "PR": "PREEMPTED", "R": "RUNNING", "RD": "RESV_DEL_HOLD", "RF": "REQUEUE_FED", "RH": "REQUEUE_HOLD",
    "RQ": "REQUEUED", "RS": "RESIZING", "RV": "REVOKED", "SI": "SIGNALING", "SE": "SPECIAL_EXIT",
    "SO": "STAGE_OUT", "ST": "STOPPED", "S": "SUSPENDED", "TO": "TIMEOUT",
}
_BASE_STATES = set(_STATE_CODES.values())
_EMPTY_TIMES = {"", "unknown", "none", "n/a", "(null)", "0"}


def normalize_state(value: str | list[str]) -> tuple[str, list[str]]:
    """Return (base state, extra flags) from "R", "CANCELLED by 0", "RUNNING" or ["PENDING", "REQUEUED"]."""
    items = [value] if isinstance(value, str) else list(value) if isinstance(value, list) else []
    if not items or not isinstance(items[0], str) or not items[0].strip():
        raise SlurmParseError(f"empty job state {value!r}")
    head = items[0].split()[0].upper().rstrip("+")  # sacct prints "CANCELLED by 0"; sinfo-style "+" suffixes
    head = _STATE_CODES.get(head, head)
    if head not in _BASE_STATES:
        raise SlurmParseError(f"unknown job state {items[0]!r}")
    return head, [str(s).upper() for s in items[1:]]


def parse_slurm_time(text: str | None, tz: tzinfo = UTC) -> datetime | None:
    """Slurm's ``YYYY-MM-DDTHH:MM:SS`` (printed in the cluster's local zone ``tz``) to aware UTC; Unknown -> None."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise SlurmParseError(f"bad Slurm time {_shown(text)}: not a string")
    if text.strip().lower() in _EMPTY_TIMES:
        return None
    try:
        return datetime.fromisoformat(text.strip()).replace(tzinfo=tz).astimezone(UTC)
    except (ValueError, OverflowError) as exc:  # OverflowError: year 1 or 9999 moved past the calendar's ends
        raise SlurmParseError(f"bad Slurm time {_shown(text)}") from exc


_DURATION = re.compile(r"^(?:(\d{1,6})-)?(?:(\d{1,9}):)?(\d{1,9}):(\d{1,9})(?:\.(\d{1,9}))?$", re.ASCII)


def parse_duration(text: str) -> timedelta | None:
    """``[D-][HH:]MM:SS[.fff]`` (sacct Elapsed, TotalCPU) to timedelta; UNLIMITED/Partition_Limit -> None."""
    t = text.strip()
    if t.upper() in {"UNLIMITED", "PARTITION_LIMIT", "INVALID", ""}:
        return None
    m = _DURATION.match(t)
    if not m:
        raise SlurmParseError(f"bad Slurm duration {text!r}")
    days, hours, minutes, seconds, frac = m.groups()
    try:
        return timedelta(days=int(days or 0), hours=int(hours or 0), minutes=int(minutes), seconds=int(seconds),
                         microseconds=int((frac or "0").ljust(6, "0")[:6]))
    except OverflowError as exc:
        raise SlurmParseError(f"bad Slurm duration {text!r}: out of range") from exc


def _epoch(value: Any, key: str) -> datetime | None:
    # 0 and unset/infinite mean "no time" in every openapi version (v0.0.40+ wraps numbers in set/infinite/number).
    n = _number(value, key)
    if n is None or n <= 0:
        return None
    try:
        return datetime.fromtimestamp(n, UTC)
    except (OverflowError, OSError, ValueError) as exc:
        raise SlurmParseError(f"{key}: {n} is not a time (seconds since 1970)") from exc


def _unwrap_number(value: Any, key: str) -> int | float | None:
    """A plain number, or slurmrestd's {set, infinite, number} wrapper; unset or infinite -> None."""
    if isinstance(value, dict):
        if not {"set", "number"} <= value.keys():
            raise SlurmParseError(f"{key}: expected a number or {{set, infinite, number}}, got {value!r}")
        if not value["set"] or value.get("infinite"):
            return None
        value = value["number"]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SlurmParseError(f"{key}: expected a number, got {value!r}")
    return value


def _number(value: Any, key: str) -> int | None:
    number = _unwrap_number(value, key)
    if number is None:
        return None
    if isinstance(number, float) and not math.isfinite(number):
        raise SlurmParseError(f"{key}: expected a number, got {number!r}")
    if not -_INT64 <= number < _INT64:
        raise SlurmParseError(f"{key}: {_shown(number)} does not fit a 64-bit integer")
    return int(number)


# --------------------------------------------------------------------------- host lists
def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets and parentheses (``a[1,3],b`` and ``gpu:2(IDX:0,3),mig:1``)."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
            if depth < 0:
                raise SlurmParseError(f"unbalanced brackets in {text!r}")
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise SlurmParseError(f"unbalanced brackets in {text!r}")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _expand_ranges(spec: str, ctx: str) -> list[str]:
    """``001-004,010`` -> ['001', ..., '004', '010'], keeping zero padding."""
    out: list[str] = []
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        # ASCII digits only: isdigit() would admit "²", which int() refuses.
        if not _DIGITS.fullmatch(lo) or (hi and not _DIGITS.fullmatch(hi)):
            raise SlurmParseError(f"bad range {_shown(part)} in {_shown(ctx)}")
        if hi and int(hi) < int(lo):
            raise SlurmParseError(f"descending range {_shown(part)} in {_shown(ctx)}")
        if int(hi or lo) - int(lo) + 1 + len(out) > MAX_HOSTS:
            raise SlurmParseError(f"range {_shown(part)} in {_shown(ctx)} expands past {MAX_HOSTS:,} entries")
        width = len(lo)
        out.extend(str(i).zfill(width) for i in range(int(lo), int(hi or lo) + 1))
    return out


def expand_hostlist(text: str) -> list[str]:
    """``gpu[001-004,010],login1`` -> every host name, in order; "", "(null)" and "None assigned" -> []."""
    if text is None:
        return []
    if not isinstance(text, str):
        raise SlurmParseError(f"host list {_shown(text)}: not a string")
    if text.strip() in {"", "(null)", "None assigned", "N/A"}:
        return []
    hosts: list[str] = []
    for item in _split_top(text.strip()):
        m = re.search(r"\[([^\]]*)\]", item)
        if not m:
            hosts.append(item)
            continue
        head, tail = item[: m.start()], item[m.end():]
        for value in _expand_ranges(m.group(1), text):
            hosts.extend(expand_hostlist(head + value + tail))  # recursion handles a[1-2]b[3-4]
            if len(hosts) > MAX_HOSTS:
                raise SlurmParseError(f"host list {_shown(text)} expands past {MAX_HOSTS:,} hosts")
    return hosts


def _expand_indexes(spec: str, ctx: str) -> list[int]:
    if spec.strip().upper() == "N/A":
        return []
    return [int(i) for i in _expand_ranges(spec, ctx)]


# --------------------------------------------------------------------------- GRES and TRES
# DOTALL and \Z: "matches any string" must hold for a value with a newline in it too (JSON can carry one).
_GRES_TAIL = re.compile(r"^(?P<main>.*?)(?P<extra>(?:\([^()]*\))*)\Z", re.DOTALL)
_GRES_NAME = re.compile(r"^[A-Za-z_][\w.-]*$")


def _gres_extras(extra: str, item: str) -> tuple[list[int] | None, list[int] | None]:
    indexes = sockets = None
    for group in re.findall(r"\(([^()]*)\)", extra):
        key, _, spec = group.partition(":")
        if key == "IDX":
            indexes = _expand_indexes(spec, item)
        elif key == "S":
            sockets = _expand_indexes(spec, item)
    return indexes, sockets


def _gres_item(item: str) -> GresItem:
    m = _GRES_TAIL.match(item)
    assert m is not None  # the pattern matches any string
    main = m.group("main").removeprefix("gres/")
    main, _, eq_count = main.partition("=")  # TRES form: gres/gpu:h100=4
    parts = main.split(":")
    count_txt = eq_count or (parts.pop() if len(parts) > 1 and _DIGITS.fullmatch(parts[-1]) else "")
    bad_count = bool(count_txt) and not _DIGITS.fullmatch(count_txt)
    if not parts or not _GRES_NAME.match(parts[0]) or len(parts) > 2 or bad_count:
        raise SlurmParseError(f"bad GRES element {_shown(item)}")
    gtype = parts[1] if len(parts) == 2 and parts[1] not in {"", "(null)"} else None
    indexes, sockets = _gres_extras(m.group("extra"), item)
    # Slurm's default count is 1 ("gpu:h100"); "gpu(IDX:0-1)" (GRES_IDX=) counts its indexes.
    count = int(count_txt) if count_txt else (len(indexes) if indexes is not None else 1)
    return GresItem(parts[0], gtype, count, indexes, sockets)


def parse_gres(text: str) -> list[GresItem]:
    """``gpu:h100:8(S:0-1)``, ``gpu:a100:2(IDX:0,3)``, ``gres/gpu:4``, ``gpu:a:2,gpu:b:2`` -> GresItem list.

    "(null)" and "" mean "no GRES" and give [].
    """
    if not isinstance(text, str):
        raise SlurmParseError(f"GRES string {_shown(text)}: not a string")
    t = text.strip()
    if t in {"", "(null)", "N/A"}:
        return []
    return [_gres_item(item) for item in _split_top(t)]


def gpu_count(items: list[GresItem]) -> int:
    """GPUs in a parsed GRES list (shards, MPS and other GRES are not GPUs)."""
    return sum(i.count for i in items if i.name == "gpu")


def parse_tres(text: str) -> dict[str, int]:
    """``cpu=2,mem=4000M,node=1,gres/gpu=4`` -> {name: value}; memory is kept in MiB."""
    out: dict[str, int] = {}
    if text is not None and not isinstance(text, str):
        raise SlurmParseError(f"TRES string {_shown(text)}: not a string")
    for item in _split_top(text or ""):
        name, sep, value = item.partition("=")
        if not sep:
            raise SlurmParseError(f"bad TRES element {item!r} in {text!r}")
        out[name] = _tres_value(value, item)
    return out


_UNITS = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2, "P": 1024**3}


def _tres_value(value: str, item: str) -> int:
    m = re.match(r"^(\d{1,15}(?:\.\d{1,15})?)([KMGTP]?)$", value, re.ASCII)
    if not m:
        raise SlurmParseError(f"bad TRES value in {item!r}")
    return round(float(m.group(1)) * _UNITS.get(m.group(2), 1))


def _tres_gpus(tres: dict[str, int]) -> int:
    # With typed GPUs in AccountingStorageTRES Slurm reports both gres/gpu and gres/gpu:h100; never add both.
    if "gres/gpu" in tres:
        return tres["gres/gpu"]
    return sum(v for k, v in tres.items() if k.startswith("gres/gpu:"))


# --------------------------------------------------------------------------- JSON jobs
def _load_jobs(text: str, source: str) -> list[dict[str, Any]]:
    if not text or not text.strip():
        raise SlurmParseError(f"{source}: empty input")
    doc = load_json(text, source)
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        raise SlurmParseError(f"{source}: no 'jobs' list in the document")
    for i, job in enumerate(doc["jobs"]):
        if not isinstance(job, dict):
            raise SlurmParseError(f"{source}: jobs[{i}]: expected an object, got {_shown(job)}")
    errors = [e for e in _seq(doc.get("errors"), f"{source}: errors") if not _nothing_found(e)]
    if errors and not doc["jobs"]:  # errors beside jobs (e.g. one federation sibling down) still carry data
        raise SlurmParseError(f"{source}: Slurm reported errors and no jobs: {errors!r}")
    return doc["jobs"]


# sacct --json answers a window without jobs with error 9003 ("Nothing found"): an empty result, not a failure.
NOTHING_FOUND = 9003


def _nothing_found(error: Any) -> bool:
    return isinstance(error, dict) and (error.get("error_number") == NOTHING_FOUND
                                        or "nothing found" in str(error.get("description", "")).lower())


def _req(job: dict[str, Any], key: str, idx: int) -> Any:
    if key not in job:
        raise SlurmParseError(f"jobs[{idx}]: missing key {key!r}")
    return job[key]


def _ctld_job_id(job: dict[str, Any], idx: int) -> tuple[str, int]:
    raw = _number(_req(job, "job_id", idx), f"jobs[{idx}].job_id")
    if raw is None:
        raise SlurmParseError(f"jobs[{idx}].job_id is not set")
    array_id = _number(job.get("array_job_id"), f"jobs[{idx}].array_job_id") or 0
    task = _number(job.get("array_task_id"), f"jobs[{idx}].array_task_id")
    het = _number(job.get("het_job_id"), f"jobs[{idx}].het_job_id") or 0
    if array_id and task is not None:
        return f"{array_id}_{task}", raw
    if array_id and job.get("array_task_string"):
        tasks = _text(job["array_task_string"], f"jobs[{idx}].array_task_string")
        return f"{array_id}_[{tasks}]", raw  # the pending rest of an array
    if het:
        return f"{het}+{_number(job.get('het_job_offset'), f'jobs[{idx}].het_job_offset') or 0}", raw
    return str(raw), raw


def _hosts(value: Any, where: str) -> list[str]:
    try:
        return expand_hostlist(value)
    except SlurmParseError as exc:
        raise SlurmParseError(f"{where}: {exc}") from exc


def _tres_field(job: dict[str, Any], key: str, idx: int) -> int:
    try:
        return _tres_gpus(parse_tres(job.get(key) or ""))
    except SlurmParseError as exc:
        raise SlurmParseError(f"jobs[{idx}].{key}: {exc}") from exc


def _ctld_job(job: dict[str, Any], idx: int) -> Job:
    """One job of squeue --json / slurmrestd /jobs (openapi v0.0.37 to v0.0.41)."""
    job_id, raw = _ctld_job_id(job, idx)
    state, flags = normalize_state(_req(job, "job_state", idx))
    nodes = _hosts(job.get("nodes"), f"jobs[{idx}].nodes")
    preempt = _number(job.get("preempt_time"), f"jobs[{idx}].preempt_time") or 0
    requeue = job.get("requeue")
    if requeue is not None and not isinstance(requeue, bool):
        raise SlurmParseError(f"jobs[{idx}].requeue: expected true or false, got {_shown(requeue)}")
    text = {k: _text(job.get(k), f"jobs[{idx}].{k}") for k in ("name", "user_name", "account", "partition", "qos")}
    return Job(
        job_id=job_id, raw_job_id=raw, name=text["name"], user=text["user_name"],
        account=text["account"], partition=text["partition"], qos=text["qos"],
        priority=_number(job.get("priority"), f"jobs[{idx}].priority"), state=state,
        submit=_epoch(job.get("submit_time"), f"jobs[{idx}].submit_time"),
        start=_epoch(job.get("start_time"), f"jobs[{idx}].start_time") if state != "PENDING" else None,
        end=_epoch(job.get("end_time"), f"jobs[{idx}].end_time") if state not in {"PENDING", "RUNNING"} else None,
        nodes=nodes, node_count=_number(job.get("node_count"), f"jobs[{idx}].node_count") or len(nodes),
        gpu_count=_tres_field(job, "tres_alloc_str", idx), gpus_requested=_tres_field(job, "tres_req_str", idx),
        requeue=requeue, restart_count=_number(job.get("restart_cnt"), f"jobs[{idx}].restart_cnt"),
        preempted=state == "PREEMPTED" or preempt > 0, state_flags=flags,
    )


def parse_slurmrestd_jobs(text: str) -> list[Job]:
    """slurmrestd ``GET /slurm/v0.0.XX/jobs`` (v0.0.37/38 plain numbers, v0.0.40/41 set/infinite/number)."""
    return [_ctld_job(j, i) for i, j in enumerate(_load_jobs(text, "slurmrestd jobs"))]


def parse_squeue_json(text: str) -> list[Job]:
    """``squeue --json``: the same openapi job schema slurmrestd serves."""
    return [_ctld_job(j, i) for i, j in enumerate(_load_jobs(text, "squeue --json"))]


def _sacct_tres_gpus(entries: Any, where: str) -> int:
    tres = {}
    for i, raw in enumerate(_seq(entries, where)):
        e = _obj(raw, f"{where}[{i}]")
        name = _text(e.get("name"), f"{where}[{i}].name")
        key = _text(e.get("type"), f"{where}[{i}].type") + (f"/{name}" if name else "")
        tres[key] = _number(e.get("count"), f"{where}[{i}].count") or 0
    return _tres_gpus(tres)


def _sacct_job_id(job: dict[str, Any], idx: int) -> tuple[str, int]:
    raw = _number(_req(job, "job_id", idx), f"jobs[{idx}].job_id")
    if raw is None:
        raise SlurmParseError(f"jobs[{idx}].job_id is not set")
    array, het = _obj(job.get("array"), f"jobs[{idx}].array"), _obj(job.get("het"), f"jobs[{idx}].het")
    array_id = _number(array.get("job_id"), f"jobs[{idx}].array.job_id") or 0
    task = _number(array.get("task_id"), f"jobs[{idx}].array.task_id")
    if array_id and task is not None:
        return f"{array_id}_{task}", raw
    if array_id and array.get("task"):
        return f"{array_id}_[{_text(array['task'], f'jobs[{idx}].array.task')}]", raw
    het_id = _number(het.get("job_id"), f"jobs[{idx}].het.job_id") or 0
    if het_id:
        return f"{het_id}+{_number(het.get('job_offset'), f'jobs[{idx}].het.job_offset') or 0}", raw
    return str(raw), raw


def _sacct_job(job: dict[str, Any], idx: int) -> Job:
    job_id, raw = _sacct_job_id(job, idx)
    state_obj = _req(job, "state", idx)
    state, flags = normalize_state(state_obj.get("current") if isinstance(state_obj, dict) else state_obj)
    times = _obj(_req(job, "time", idx), f"jobs[{idx}].time")
    nodes = _hosts(job.get("nodes"), f"jobs[{idx}].nodes")
    tres = _obj(job.get("tres"), f"jobs[{idx}].tres")
    user = job.get("user")
    if not isinstance(user, str):
        user = _text(_obj(job.get("association"), f"jobs[{idx}].association").get("user"),
                     f"jobs[{idx}].association.user")
    text = {k: _text(job.get(k), f"jobs[{idx}].{k}") for k in ("name", "account", "partition", "qos")}
    return Job(
        job_id=job_id, raw_job_id=raw, name=text["name"], user=user,
        account=text["account"], partition=text["partition"], qos=text["qos"],
        priority=_number(job.get("priority"), f"jobs[{idx}].priority"), state=state,
        submit=_epoch(times.get("submission"), f"jobs[{idx}].time.submission"),
        start=_epoch(times.get("start"), f"jobs[{idx}].time.start"),
        end=_epoch(times.get("end"), f"jobs[{idx}].time.end"),
        nodes=nodes, node_count=_number(job.get("allocation_nodes"), f"jobs[{idx}].allocation_nodes") or len(nodes),
        gpu_count=_sacct_tres_gpus(tres.get("allocated"), f"jobs[{idx}].tres.allocated"),
        gpus_requested=_sacct_tres_gpus(tres.get("requested"), f"jobs[{idx}].tres.requested"),
        requeue=None, restart_count=None, preempted=state == "PREEMPTED", state_flags=flags,
    )


def parse_sacct_json(text: str) -> list[Job]:
    """``sacct --json`` (openapi dbv0.0.38+): one Job per job record; steps are not jobs and are skipped."""
    return [_sacct_job(j, i) for i, j in enumerate(_load_jobs(text, "sacct --json"))]


# --------------------------------------------------------------------------- scontrol show job -d
def _kv_tokens(record: str) -> list[tuple[str, str]]:
    """``Key=Value`` tokens of one scontrol record; words without '=' belong to the previous value."""
    out: list[tuple[str, str]] = []
    for word in record.split():
        key, sep, value = word.partition("=")
        if sep and re.match(r"^[A-Za-z_][\w:/]*$", key):
            out.append((key, value))
        elif out:
            out[-1] = (out[-1][0], f"{out[-1][1]} {word}")
    return out


def _job_records(text: str) -> list[str]:
    records, cur = [], []
    for line in text.splitlines():
        if line.lstrip().startswith("JobId=") and cur:
            records.append("\n".join(cur))
            cur = []
        if line.strip():
            cur.append(line)
    if cur:
        records.append("\n".join(cur))
    return records


def _record_allocations(record: str, tz: tzinfo, n: int) -> list[Allocation]:
    tokens = _kv_tokens(record)
    head = dict(tokens)
    if "JobId" not in head or "JobState" not in head:
        raise SlurmParseError(f"scontrol record {n}: missing JobId or JobState")
    job_id = head["JobId"] if "ArrayTaskId" not in head else f"{head.get('ArrayJobId')}_{head['ArrayTaskId']}"
    state, _ = normalize_state(head["JobState"])
    start = parse_slurm_time(head.get("StartTime"), tz)
    end = None if state in {"RUNNING", "PENDING", "SUSPENDED"} else parse_slurm_time(head.get("EndTime"), tz)
    allocs: list[Allocation] = []
    nodes: list[str] = []
    for key, value in tokens:
        if key == "Nodes":  # the -d detail lines: Nodes=... CPU_IDs=... Mem=... GRES=...
            nodes = expand_hostlist(value)
        elif key in {"GRES", "GRES_IDX"} and nodes:
            idx = sorted(i for g in parse_gres(value) if g.name == "gpu" for i in (g.indexes or []))
            allocs.extend(Allocation(job_id, node, idx, start, end) for node in nodes if idx)
            nodes = []
    return allocs


def parse_scontrol_show_job_detail(text: str, tz: tzinfo = UTC) -> list[Allocation]:
    """``scontrol show job -d`` (multi-line or ``-o``) -> one Allocation per (job, node) holding GPUs.

    ``tz`` is the zone scontrol printed its times in (the cluster's local zone unless TZ was set).
    """
    if not text or not text.strip():
        raise SlurmParseError("scontrol show job: empty input")
    records = _job_records(text)
    if not records[0].lstrip().startswith("JobId="):
        raise SlurmParseError(f"scontrol show job: line 1 does not start with JobId=: {records[0][:60]!r}")
    return [a for n, rec in enumerate(records, 1) for a in _record_allocations(rec, tz, n)]


# --------------------------------------------------------------------------- sinfo GRES reports
_GRES_FIELD = re.compile(r"^(?:\(null\)|(?:gres/)?[A-Za-z_][\w.-]*:\S*)$")


def _sinfo_line(line: str, line_no: int) -> SinfoGresLine:
    fields = [f.strip() for f in line.split("|")] if "|" in line else line.split()
    count = int(fields[0]) if _DIGITS.fullmatch(fields[0]) else None
    gres: list[list[GresItem]] = []
    for f in fields:
        if _GRES_FIELD.match(f):
            try:
                gres.append(parse_gres(f))
            except SlurmParseError as exc:
                raise SlurmParseError(f"line {line_no}: {exc}") from exc
    if not gres:
        raise SlurmParseError(f"line {line_no}: no GRES column in {line!r}")
    return SinfoGresLine(line_no, fields, count, gres)


def parse_sinfo_gres(text: str, allow_empty: bool = False) -> list[SinfoGresLine]:
    """``sinfo`` outputs that carry GRES/GRES_USED columns (space- or pipe-separated, no header).

    Empty output raises unless ``allow_empty``: an ``sinfo -t alloc`` query legitimately prints nothing when no
    GPU is allocated, but a caller has to say that it asked such a question.
    """
    lines = [(n, ln) for n, ln in enumerate((text or "").splitlines(), 1) if ln.strip()]
    if not lines:
        if allow_empty:
            return []
        raise SlurmParseError("sinfo: empty input")
    return [_sinfo_line(ln, n) for n, ln in lines]
