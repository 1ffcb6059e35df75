"""InfiniBand / RoCE port counters for the node agent: sysfs, `perfquery -x`, and a rate tracker.

Three pieces, all standard library and free of Django:

- `read_sysfs(root, host=...)` walks ``/sys/class/infiniband/<dev>/ports/<n>/`` and returns one
  ingest port record per port (see docs/ingest.md): ``{"host", "port": "mlx5_0/1", "link_layer",
  "fields", "extra"}``. Files named in a `PORT_FIELDS` entry's ``sources`` fill registry fields;
  other counters go to ``extra`` as ``ib.<file>`` (``counters/``) or ``roce.<file>``
  (``hw_counters/``). A file that cannot be read or does not hold a non-negative integer is
  skipped and reported as a `Problem` (appended to the caller's ``problems`` list, or logged
  as a warning when none is given), so one bad file never costs the rest of the port.
- `parse_perfquery_x(text, ...)` turns ``perfquery -x`` output into the same record shape, keyed
  by GUID and port number; malformed input raises `PerfqueryError` naming the line.
- `CounterTracker` turns successive cumulative readings into deltas and per-second rates with
  counter wraps and resets told apart (rule in its docstring). The agent pushes raw counters;
  the server derives rates itself. The tracker only serves the agent's own log and tests.

Units: the PMA data counters (sysfs ``port_xmit_data``/``port_rcv_data``, perfquery
``PortXmitData``/``PortRcvData``) count 4-byte words (octets / 4); the registry stores bytes, so
both readers multiply them by 4.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from telemetry.fields import COUNTER, PORT_FIELDS

log = logging.getLogger(__name__)

SYSFS_ROOT = Path("/sys/class/infiniband")

# sysfs counter file name -> registry field. Only counter-kind fields: `rate` and `state` are
# also registry sources but live beside the counter directories and are parsed separately.
SOURCE_TO_FIELD: dict[str, str] = {s: f.name for f in PORT_FIELDS if f.kind == COUNTER for s in f.sources}

# Counters the PMA reports in 4-byte words rather than octets.
WORD_COUNTERS = frozenset({"port_xmit_data", "port_rcv_data"})

# hw_counters/lifespan is the driver's cache period for the other hw counters (ms), not a counter.
NOT_COUNTERS = frozenset({"lifespan"})

LINK_LAYERS = {"infiniband": "infiniband", "ethernet": "ethernet"}
# Digit counts are capped: sysfs prints u64 counters (20 digits), a rate like "400" and a state 0-7, so a
# longer run of digits is damage, and int() refuses strings over 4,300 digits outright.
_RATE = re.compile(r"^\s*(\d{1,6}(?:\.\d{1,6})?)\s*Gb/sec", re.ASCII)
_STATE = re.compile(r"^\s*(\d{1,3})\s*:", re.ASCII)
_INT = re.compile(r"^\d{1,20}$", re.ASCII)
# The server stores counters as signed 64-bit integers (data counters after the words-to-bytes x4),
# and refuses a whole batch that holds a larger one: such a reading is skipped here as a problem.
_COUNTER_LIMIT = 2**63


@dataclass(frozen=True, slots=True)
class Problem:
    """A sysfs file that was skipped: which one and why."""

    path: Path
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def map_counters(raw: Mapping[str, int], extra_prefix: str) -> tuple[dict[str, int], dict[str, int]]:
    """Split counters keyed by sysfs name into registry fields (data in bytes) and extras."""
    fields: dict[str, int] = {}
    extra: dict[str, int] = {}
    for name, value in raw.items():
        if name in SOURCE_TO_FIELD:
            fields[SOURCE_TO_FIELD[name]] = value * 4 if name in WORD_COUNTERS else value
        else:
            extra[f"{extra_prefix}.{name}"] = value
    return fields, extra


# --- sysfs ------------------------------------------------------------------------------------


def read_sysfs(root: Path = SYSFS_ROOT, *, host: str, problems: list[Problem] | None = None) -> list[dict]:
    """One ingest port record per ``<root>/<device>/ports/<n>``, devices and ports in order.

    Unreadable or garbage files are skipped; each becomes a `Problem` appended to ``problems``
    (count them with ``len``). Without a list they are logged, never dropped silently. A missing
    root (a node without HCAs) gives no records and no problem.
    """
    found: list[Problem] = [] if problems is None else problems
    start = len(found)
    records = []
    if root.is_dir():
        for device in sorted(p for p in root.iterdir() if p.is_dir()):
            ports = device / "ports"
            if not ports.is_dir():
                found.append(Problem(ports, "missing ports directory"))
                continue
            for port in sorted((p for p in ports.iterdir() if p.is_dir()), key=_port_sort_key):
                records.append(_read_port(port, f"{device.name}/{port.name}", host, found))
    if problems is None:
        for p in found[start:]:
            log.warning("infiniband sysfs: skipped %s", p)
    return records


def _port_sort_key(path: Path) -> tuple[int, str]:
    # Ports are numbered; "10" sorts after "9". isdigit() alone would admit "²", which int() refuses.
    name = path.name
    return (int(name), "") if name.isascii() and name.isdecimal() and len(name) < 10 else (1 << 30, name)


def _read_port(port: Path, name: str, host: str, problems: list[Problem]) -> dict:
    """The record of one sysfs port directory."""
    fields, extra = map_counters(_read_counter_dir(port / "counters", problems), "ib")
    hw_fields, hw_extra = map_counters(_read_counter_dir(port / "hw_counters", problems), "roce")
    fields.update(hw_fields)
    extra.update(hw_extra)
    record: dict = {"host": host, "port": name}

    layer = _read_text(port / "link_layer", problems)
    if layer is not None:
        if layer.lower() in LINK_LAYERS:
            record["link_layer"] = LINK_LAYERS[layer.lower()]
        else:
            problems.append(Problem(port / "link_layer", f"unknown link layer {layer!r}"))
    rate = _read_match(port / "rate", _RATE, problems)
    if rate is not None:
        fields["link_speed_gbps"] = float(rate)
    state = _read_match(port / "state", _STATE, problems)
    if state is not None:
        fields["link_state"] = int(state)
    # phys_state ("5: LinkUp", "2: Polling") tells a cabling fault from an SM problem.
    phys = _read_match(port / "phys_state", _STATE, problems)
    if phys is not None:
        extra["ib.phys_state"] = int(phys)

    record["fields"] = fields
    record["extra"] = extra
    return record


def _read_counter_dir(directory: Path, problems: list[Problem]) -> dict[str, int]:
    """Every integer file in a counters directory; absent directories are normal (older drivers)."""
    values: dict[str, int] = {}
    if not directory.is_dir():
        return values
    for path in sorted(directory.iterdir()):
        if path.name in NOT_COUNTERS:
            continue
        text = _read_text(path, problems)
        if text is None:
            continue
        if not _INT.match(text):
            problems.append(Problem(path, f"not a counter value: {text[:40]!r}"))
            continue
        value, scale = int(text), 4 if path.name in WORD_COUNTERS else 1
        if value * scale >= _COUNTER_LIMIT:
            problems.append(Problem(path, f"counter value {value} does not fit a signed 64-bit integer"))
            continue
        values[path.name] = value
    return values


def _read_text(path: Path, problems: list[Problem]) -> str | None:
    """The stripped contents of a sysfs file, or None (and a problem) if it cannot be read."""
    try:
        return path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        problems.append(Problem(path, "missing"))
    except (OSError, UnicodeDecodeError) as exc:
        # Some hw_counters answer EINVAL/EOPNOTSUPP on read when the firmware lacks them.
        problems.append(Problem(path, f"unreadable: {exc.__class__.__name__}: {exc}"))
    return None


def _read_match(path: Path, pattern: re.Pattern[str], problems: list[Problem]) -> str | None:
    """The first group of `pattern` in a sysfs file, or None (and a problem)."""
    text = _read_text(path, problems)
    if text is None:
        return None
    m = pattern.match(text)
    if m is None:
        problems.append(Problem(path, f"unexpected format: {text[:40]!r}"))
        return None
    return m.group(1)


# --- perfquery -x -----------------------------------------------------------------------------


class PerfqueryError(ValueError):
    """`perfquery -x` output that cannot be parsed; the message names the line."""


# perfquery's names -> the sysfs file names, so both sources share one mapping and one set of
# extra names (a switch port's ib.unicast_xmit_packets means what a host's does).
PERFQUERY_TO_SYSFS: dict[str, str] = {
    "PortXmitData": "port_xmit_data",
    "PortRcvData": "port_rcv_data",
    "PortXmitPkts": "port_xmit_packets",
    "PortRcvPkts": "port_rcv_packets",
    "PortUnicastXmitPkts": "unicast_xmit_packets",
    "PortUnicastRcvPkts": "unicast_rcv_packets",
    "PortMulticastXmitPkts": "multicast_xmit_packets",
    "PortMulticastRcvPkts": "multicast_rcv_packets",
    "SymbolErrorCounter": "symbol_error",
    "LinkErrorRecoveryCounter": "link_error_recovery",
    "LinkDownedCounter": "link_downed",
    "PortRcvErrors": "port_rcv_errors",
    "PortRcvRemotePhysicalErrors": "port_rcv_remote_physical_errors",
    "PortRcvSwitchRelayErrors": "port_rcv_switch_relay_errors",
    "PortXmitDiscards": "port_xmit_discards",
    "PortXmitConstraintErrors": "port_xmit_constraint_errors",
    "PortRcvConstraintErrors": "port_rcv_constraint_errors",
    "LocalLinkIntegrityErrors": "local_link_integrity_errors",
    "ExcessiveBufferOverrunErrors": "excessive_buffer_overrun_errors",
    "VL15Dropped": "VL15_dropped",
    "PortXmitWait": "port_xmit_wait",
}
# Echoes of the query itself, not counters.
PERFQUERY_SELECTORS = frozenset({"PortSelect", "CounterSelect", "CounterSelect2"})

_PQ_HEADER = re.compile(r"^# Port extended counters: Lid (\d{1,5}) port (\d{1,3})\b", re.ASCII)
# 64-bit counters: at most 16 hex or 20 decimal digits (int() refuses more than 4,300 outright).
_PQ_LINE = re.compile(r"^(\w+):\.*\s*(0x[0-9a-fA-F]{1,16}|\d{1,20})$", re.ASCII)


def parse_perfquery_x(
    text: str, *, host: str | None = None, switch: str | None = None, guid: str | None = None
) -> list[dict]:
    """Port records from ``perfquery -x [-G GUID] [port...]`` output, one per counter block.

    perfquery prints only the LID, so pass the queried ``guid``: records are keyed
    ``port = "<guid>/<port>"`` (GUIDs are burned in; LIDs are reassigned by the subnet manager).
    Without it the port is named ``lid<LID>/<port>``. The owner is ``host`` or ``switch`` when
    given, else ``switch = <guid>``: fabric sweeps query switches, and the server rejects an
    unknown switch visibly, where an unknown host would be registered under a GUID.
    """
    if host is not None and switch is not None:
        raise ValueError("give host or switch, not both")
    if not text.strip():
        raise PerfqueryError("empty output")
    blocks = _perfquery_blocks(text)
    records = []
    for lid, port, counters in blocks:
        ident = guid or f"lid{lid}"
        owner = {"host": host} if host is not None else {"switch": switch or ident}
        raw = {PERFQUERY_TO_SYSFS.get(n, _snake(n)): v for n, v in counters.items()}
        fields, extra = map_counters(raw, "ib")
        record = {**owner, "port": f"{ident}/{port}", "link_layer": "infiniband", "fields": fields, "extra": extra}
        if guid:
            record["guid"] = guid
        records.append(record)
    return records


def _perfquery_blocks(text: str) -> list[tuple[int, int, dict[str, int]]]:
    """(lid, port, counters by perfquery name) per header block, checking every line."""
    blocks: list[tuple[int, int, dict[str, int]]] = []
    header_line = 0
    for n, raw_line in enumerate(text.splitlines(), start=1):
        line = raw_line.strip()
        if not line:
            continue
        if line.startswith("#"):
            m = _PQ_HEADER.match(line)
            if m is None:
                raise PerfqueryError(f"line {n}: not a `perfquery -x` block header: {line[:80]!r}")
            _check_block(blocks, header_line)
            blocks.append((int(m.group(1)), int(m.group(2)), {}))
            header_line = n
            continue
        m = _PQ_LINE.match(line)
        if m is None:
            raise PerfqueryError(f"line {n}: malformed counter line: {line[:80]!r}")
        if not blocks:
            raise PerfqueryError(f"line {n}: counter before any '# Port extended counters' header")
        # Base 16 or 10 by hand: int(x, 0) refuses the leading zeros of "0123".
        name, digits = m.group(1), m.group(2)
        value = int(digits, 16) if digits[:2] == "0x" else int(digits)
        if value * (4 if PERFQUERY_TO_SYSFS.get(name) in WORD_COUNTERS else 1) >= _COUNTER_LIMIT:
            raise PerfqueryError(f"line {n}: {name} value {digits} does not fit a signed 64-bit counter")
        _lid, port, counters = blocks[-1]
        if name in counters:
            raise PerfqueryError(f"line {n}: {name} repeated in one block")
        if name == "PortSelect" and value != port:
            raise PerfqueryError(f"line {n}: PortSelect {value} under a header for port {port}")
        if name not in PERFQUERY_SELECTORS:
            counters[name] = value
    _check_block(blocks, header_line)
    return blocks


def _check_block(blocks: list[tuple[int, int, dict[str, int]]], header_line: int) -> None:
    # A header followed by no counters means perfquery was cut off mid-output.
    if blocks and not blocks[-1][2]:
        raise PerfqueryError(f"line {header_line}: header without counters")


def _snake(name: str) -> str:
    """QP1Dropped -> qp1_dropped, for counters perfquery has and sysfs does not."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


# --- rates ------------------------------------------------------------------------------------

# Modulus of the legacy 32-bit PortCounters data/packet counters, in the units the readers emit
# (data converted to bytes, so 2**32 words wrap at 4 * 2**32 bytes). For ports without
# PortCountersExtended; everything else wraps at 2**64.
LEGACY_WRAP: dict[str, int] = {
    "xmit_data_bytes": 4 * 2**32,
    "rcv_data_bytes": 4 * 2**32,
    "xmit_pkts": 2**32,
    "rcv_pkts": 2**32,
}


@dataclass(frozen=True, slots=True)
class Change:
    """One counter's movement between two readings: `how` is "ok", "wrap" or "reset"."""

    delta: int
    rate: float  # per second
    how: str


@dataclass
class CounterTracker:
    """Per-port deltas and per-second rates from successive cumulative readings.

    Rule for a counter that went down (new < old), with modulus M (``wrap_at[name]``, default
    2**64):

    - a drop of more than M/2 is a wrap: ``delta = new + M - old`` (the counter went round once;
      any shorter drop would mean it moved more than half its range forward in one interval,
      which no link does);
    - any other drop is a reset (driver reload, ``perfquery -R``): ``delta = new``, counting
      from zero as the server's rollups do.

    A value at or above its declared modulus proves the counter is wider, so M becomes 2**64
    for it. The first reading of a port or counter gives no change; a reading not later than
    the previous one is ignored (use a monotonic clock). Feed counters only, not gauges.
    """

    wrap_at: Mapping[str, int] = field(default_factory=dict)
    _last: dict[str, tuple[float, dict[str, int]]] = field(default_factory=dict, repr=False)

    def update(self, port: str, time: float, counters: Mapping[str, int]) -> dict[str, Change]:
        """Record a reading of `port` and return the change of every counter seen before."""
        previous = self._last.get(port)
        if previous is not None and time <= previous[0]:
            return {}
        self._last[port] = (time, dict(counters))
        if previous is None:
            return {}
        then, old = previous
        seconds = time - then
        changes = {}
        for name, new in counters.items():
            if name in old:
                delta, how = self.delta(name, old[name], new)
                changes[name] = Change(delta, delta / seconds, how)
        return changes

    def delta(self, name: str, old: int, new: int) -> tuple[int, str]:
        """The increase from `old` to `new` and how it was read ("ok", "wrap" or "reset")."""
        if new >= old:
            return new - old, "ok"
        modulus = self.wrap_at.get(name, 2**64)
        if old >= modulus:
            modulus = 2**64
        if old - new > modulus // 2:
            return new + modulus - old, "wrap"
        return new, "reset"


def counter_fields(record: Mapping) -> dict[str, int]:
    """The counter-kind registry fields of a port record: what `CounterTracker` should see."""
    kinds = {f.name: f.kind for f in PORT_FIELDS}
    return {k: v for k, v in record.get("fields", {}).items() if kinds.get(k) == COUNTER}
