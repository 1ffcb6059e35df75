"""Turn kernel-log text (dmesg, journalctl, /dev/kmsg) into GPU fault events.

Runs on the node agent: stdlib only, no Django. The server later deduplicates the events and joins them to
``telemetry.xid`` for meaning and action.

Input formats handled (all seen in the gpud captures or produced by standard tools):

* ``dmesg``                     ``[ 1234.567890] NVRM: Xid ...``            -> monotonic_s
* ``dmesg -T``                  ``[Sun Feb 23 16:24:18 2025] NVRM: ...``     -> wallclock
* ``dmesg --decode --time-format iso``
                                ``kern  :warn  : 2025-01-21T02:21:33,498559+00:00 NVRM: ...`` -> wallclock
* journalctl / syslog           ``Feb 23 16:24:18 host kernel: [ 12.3] NVRM: ...`` (any mix of the above)
* ``/dev/kmsg`` records         ``6,3964,206764307,-;NVRM: ...``             -> monotonic_s = timestamp_us / 1e6;
                                kmsg dictionary lines (`` SUBSYSTEM=pci``) are skipped.

Xid lines vary by driver: ``NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, <message>``,
``pid='<unknown>', name=<unknown>``, ``pid=1896, <message>`` (no name), no pid/name at all, and old drivers'
``Xid (0000:02:00): 13, ...``. The PCI id is normalised to NVML/DCGM form ``00000000:9B:00.0`` (8-digit
domain, upper-case hex as ``nvmlDeviceGetPciInfo().busId`` prints it; function 0 when the log omits it).
An indented line with no log prefix right after an event is a wrapped continuation and joins its message.

Besides Xid lines, any ``NVRM:`` line saying a GPU "has fallen off the bus" becomes a ``fallen_off_bus`` event
(Xid 79 equivalent). The captures contain no stand-alone ECC / page-retirement / row-remap lines: those faults
arrive as Xid 48/63/64 lines, which are parsed like any other Xid.

A line containing ``Xid`` that does not parse goes to ``unparsed`` with its line number; nothing crashes.

Fabric Manager logs are a different format (``[Dec 19 2024 19:17:49] [ERROR] [tid 1374] detected NVSwitch
non-fatal error 12028 on fid 0 on NVSwitch pci bus id 00000000:83:00.0 physical id 0 port 34``); they contain no
Xid lines, so ``parse_kernel_log`` yields nothing for them. ``parse_fabric_manager_log`` turns their NVSwitch
fatal / non-fatal errors (SXids) into events of kind ``fabric_manager``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TypedDict


class KernelEvent(TypedDict):
    """One GPU fault. ``kind`` is "xid", "fallen_off_bus" or "fabric_manager"."""

    kind: str
    pci_bus_id: str | None
    xid: int | None
    message: str
    pid: int | None
    process: str | None
    monotonic_s: float | None
    wallclock: str | None
    line: int
    fallen_off_bus: bool


class UnparsedLine(TypedDict):
    line: int
    text: str
    reason: str


@dataclass(slots=True)
class KernelLogResult:
    """Everything one parse produced: events, lines that looked like faults but did not parse, line count."""

    events: list[KernelEvent] = field(default_factory=list)
    unparsed: list[UnparsedLine] = field(default_factory=list)
    lines: int = 0


_PCI = r"(?:PCI:)?(?P<pci>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
_XID_RE = re.compile(r"NVRM: Xid \(" + _PCI + r"\): (?P<code>\d+)(?:,\s*(?P<rest>.*))?$")
_XID_HINT_RE = re.compile(r"\bXid\b")  # capital X: NFS/sunrpc "xid 0x..." lines are not GPU faults
_PID_RE = re.compile(r"^pid=(?:'?<unknown>'?|(?P<pid>\d+)),\s*")
_NAME_RE = re.compile(r"^name=(?P<name>[^,]*),\s*")
_MAX_XID = 65535  # real codes are < 200; anything huge is corruption and would overflow the server's int column
_FALLEN_RE = re.compile(r"NVRM: .*fallen off the bus", re.IGNORECASE)
_PCI_ANY_RE = re.compile(r"(?<![0-9a-fA-F:])" + _PCI)

_KMSG_RE = re.compile(r"^(?P<prio>\d+),(?P<seq>\d+),(?P<ts>\d+),[^;]*;(?P<body>.*)$")
_KMSG_DICT_RE = re.compile(r"^ [A-Z_]+=")  # kmsg continuation records: " SUBSYSTEM=pci", " DEVICE=+pci:..."
# Prefixes a log line can carry, in any order; each is stripped and its timestamp kept.
_PREFIXES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("monotonic", re.compile(r"^\[\s*(\d+\.\d+)\]\s*")),
    ("wallclock", re.compile(r"^\[([A-Z][a-z]{2} [A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2} \d{4})\]\s*")),
    ("wallclock", re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)\s+")),
    ("wallclock", re.compile(r"^([A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2})\s+(?=\S+\s+kernel:)")),
    ("skip", re.compile(r"^[a-z]+\s*:[a-z]+\s*:\s+")),  # dmesg --decode "kern  :warn  : "
    ("skip", re.compile(r"^(?:\S+\s+)?kernel:\s*")),  # journalctl/syslog "host kernel: "
)


def normalise_pci_bus_id(raw: str) -> str:
    """``0000:9b:00`` / ``9b:00.0`` / ``00000000:9B:00.0`` -> ``00000000:9B:00.0`` (NVML busId form)."""
    head, _, function = raw.partition(".")
    parts = head.split(":")
    domain = parts[0] if len(parts) == 3 else "0"
    bus, device = parts[-2], parts[-1]
    return f"{int(domain, 16):08X}:{int(bus, 16):02X}:{int(device, 16):02X}.{function or '0'}"


def _split_prefix(line: str) -> tuple[float | None, str | None, str]:
    """Strip log prefixes; return (monotonic seconds, wall-clock text, remaining message)."""
    kmsg = _KMSG_RE.match(line)
    if kmsg:
        return int(kmsg["ts"]) / 1e6, None, kmsg["body"]
    monotonic: float | None = None
    wallclock: str | None = None
    body = line
    stripped = True
    while stripped:  # prefixes stack (journalctl time + host + dmesg stamp), so strip until none applies
        stripped = False
        for what, pattern in _PREFIXES:
            match = pattern.match(body)
            if match is None or not match.group(0):
                continue
            if what == "monotonic" and monotonic is None:
                monotonic = float(match.group(1))
            elif what == "wallclock" and wallclock is None:
                wallclock = match.group(1)
            body = body[match.end():]
            stripped = True
    return monotonic, wallclock, body


def _event(kind: str, line_no: int, stamps: tuple[float | None, str | None], **fields: object) -> KernelEvent:
    event: KernelEvent = {
        "kind": kind, "pci_bus_id": None, "xid": None, "message": "", "pid": None, "process": None,
        "monotonic_s": stamps[0], "wallclock": stamps[1], "line": line_no, "fallen_off_bus": False,
    }
    event.update(fields)  # type: ignore[typeddict-item]
    return event


def _parse_xid(body: str, line_no: int, stamps: tuple[float | None, str | None]) -> KernelEvent | None:
    match = _XID_RE.search(body)
    if match is None or int(match["code"]) > _MAX_XID:
        return None
    rest = match["rest"] or ""
    pid: int | None = None
    process: str | None = None
    pid_match = _PID_RE.match(rest)
    if pid_match:
        pid = int(pid_match["pid"]) if pid_match["pid"] else None
        rest = rest[pid_match.end():]
    name_match = _NAME_RE.match(rest)
    if name_match:
        name = name_match["name"].strip().strip("'")
        process = None if name in ("", "<unknown>") else name
        rest = rest[name_match.end():]
    code = int(match["code"])
    return _event("xid", line_no, stamps, pci_bus_id=normalise_pci_bus_id(match["pci"]), xid=code,
                  message=rest.strip(), pid=pid, process=process, fallen_off_bus=code == 79)


def _parse_fallen(body: str, line_no: int, stamps: tuple[float | None, str | None]) -> KernelEvent:
    pci = _PCI_ANY_RE.search(body[body.find("NVRM:"):])
    return _event("fallen_off_bus", line_no, stamps, xid=79, fallen_off_bus=True,
                  pci_bus_id=normalise_pci_bus_id(pci["pci"]) if pci else None,
                  message=body[body.find("NVRM:") + 5:].strip())


def _parse_line(line: str, line_no: int, result: KernelLogResult) -> KernelEvent | None:
    """Parse one line into ``result``; return the event it produced, if any."""
    monotonic, wallclock, body = _split_prefix(line)
    stamps = (monotonic, wallclock)
    if _XID_HINT_RE.search(body):
        event = _parse_xid(body, line_no, stamps)
        if event is None:
            reason = "not of the form 'NVRM: Xid (PCI:<id>): <code>, ...'" if "NVRM" in body else "Xid outside NVRM"
            result.unparsed.append({"line": line_no, "text": line, "reason": reason})
            return None
    elif _FALLEN_RE.search(body):
        event = _parse_fallen(body, line_no, stamps)
    else:
        return None
    result.events.append(event)
    return event


def _split_lines(text: str) -> list[str]:
    """Split on newlines only, so line numbers match ``grep -n``; str.splitlines() also breaks on \\x1c, \\x85..."""
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    return lines[:-1] if lines and lines[-1] == "" else lines


def parse_kernel_log(text: str) -> KernelLogResult:
    """Parse dmesg / journalctl / kmsg text into GPU fault events; never raises on malformed lines."""
    result = KernelLogResult()
    previous: KernelEvent | None = None  # last event, while the lines after it may still continue it
    for line_no, line in enumerate(_split_lines(text), start=1):
        result.lines += 1
        if _KMSG_DICT_RE.match(line):
            continue  # kmsg metadata for the previous record, not log text
        if previous is not None and line[:1] in (" ", "\t") and line.strip() and "NVRM:" not in line:
            previous["message"] = f"{previous['message']} {line.strip()}".strip()
            continue
        try:
            previous = _parse_line(line, line_no, result)
        except (ValueError, IndexError) as exc:  # defensive: one odd line must not lose the rest of the log
            result.unparsed.append({"line": line_no, "text": line, "reason": f"parser error: {exc}"})
            previous = None
    return result


_FM_RE = re.compile(
    r"^\[(?P<when>[A-Z][a-z]{2} \d{1,2} \d{4} \d{2}:\d{2}:\d{2})\] \[(?P<level>[A-Z]+)\] \[tid \d+\] "
    r"(?P<message>detected NVSwitch (?P<fatal>non-fatal|fatal) error (?P<sxid>\d+) .*?"
    r"pci bus id (?P<pci>[0-9a-fA-F:.]+)(?: physical id \d+)?(?: port (?P<port>\d+))?.*)$")


def parse_fabric_manager_log(text: str) -> KernelLogResult:
    """Parse NVIDIA Fabric Manager logs: NVSwitch (non-)fatal errors become ``fabric_manager`` events.

    Events carry the NVSwitch's PCI id, ``sxid`` (the NVSwitch error code), ``fatal`` and ``port`` on top of
    the common fields; ``xid`` stays None because SXids are a separate numbering from GPU Xids.
    """
    result = KernelLogResult()
    for line_no, line in enumerate(_split_lines(text), start=1):
        result.lines += 1
        match = _FM_RE.match(line)
        if match is None:
            if "NVSwitch" in line and " error " in line and "detected" in line:
                result.unparsed.append({"line": line_no, "text": line, "reason": "NVSwitch error line not parsed"})
            continue
        event = _event("fabric_manager", line_no, (None, match["when"]), message=match["message"],
                       pci_bus_id=normalise_pci_bus_id(match["pci"]))
        event.update({"sxid": int(match["sxid"]), "fatal": match["fatal"] == "fatal",  # type: ignore[typeddict-item]
                      "port": int(match["port"]) if match["port"] else None})
        result.events.append(event)
    return result
