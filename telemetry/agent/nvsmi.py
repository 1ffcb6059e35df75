"""Parsers for ``nvidia-smi -q -x`` (XML) and ``nvidia-smi -q`` (text): the agent's fallback without NVML.

Both outputs are read into one small tree (`Node`) whose names are normalised (``"GPU Current Temp"``
and ``<gpu_current_temp>`` both become ``gpu_current_temp``), so one extraction path serves both
formats; only the tables of where each registry field lives differ.

Decisions worth knowing:

- ``index`` is the GPU's position in the output, which is NVML's enumeration index (what DCGM labels
  ``gpu`` and ``nvidia-smi -i N`` selects). ``minor_number`` (``/dev/nvidiaN``) is *not* used: on
  the 8-GPU captures it runs 3 2 1 0 7 6 5 4.
- "N/A", "[Not Supported]", "Unknown", "Requested functionality has been deprecated"… mean *missing*:
  the field is omitted (never 0) and counted in `NvsmiResult.missing` (once per registry field whose
  sources were present but all unavailable; fields of an older schema that has no such element are
  simply absent and not counted).
- ECC totals are sums: older schemas give ``single_bit/double_bit`` with a ``total``; newer ones split
  by location (``sram_correctable``, ``dram_uncorrectable``, v13 ``sram_uncorrectable_parity`` +
  ``sram_uncorrectable_secded``). Correctable parts sum to ``ecc_sbe_*``, uncorrectable to
  ``ecc_dbe_*`` (what NVML's total ECC counters report); parts that are N/A are left out of the sum.
- ``power_w`` is ``power_draw`` (older schemas), else ``average_power_draw`` (what NVML's power usage
  reports on Ampere and newer), else ``instant_power_draw``. ``power_limit_w`` is the enforced limit
  (``enforced_power_limit``, called ``current_power_limit`` since schema v12).
- ``energy_mj``: no capture we have carries ``total_energy_consumption``; if present, "J" is converted
  to mJ and a bare number is taken as mJ (NVML's unit).
- MIG ``profile`` is derived only for A100/A30 (14 SMs per GPU slice: ``Ng.<ceil GiB>gb``); Hopper
  slices are not a fixed SM count, so the profile is left out there rather than guessed.
- A *text* capture whose ``Attached GPUs`` differs from the number of GPU sections is refused as
  truncated (the agent runs a full ``nvidia-smi -q``, never ``-i``); truncated XML fails to parse.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

# defusedxml is not available on the nodes; plain ElementTree is acceptable because the input is
# produced locally by nvidia-smi (never by a remote party), and expat refuses external entities.
from xml.etree import ElementTree

from telemetry.fields import GPU_FIELDS, MIG_FIELDS

__all__ = ["NvsmiError", "NvsmiResult", "parse_nvsmi_text", "parse_nvsmi_xml"]


class NvsmiError(ValueError):
    """The nvidia-smi output cannot be read; the message names the line or element."""


@dataclass(slots=True)
class NvsmiResult:
    """Ingest records parsed from one nvidia-smi run ("time" is left to the caller)."""

    gpus: list[dict] = field(default_factory=list)
    migs: list[dict] = field(default_factory=list)
    missing: int = 0  # registry fields reported as N/A (or similar) and therefore omitted
    driver: str | None = None


# --- the shared tree ---------------------------------------------------------------------------

# Values that mean "no reading", compared after stripping brackets and case.
_UNAVAILABLE = {
    "n/a", "na", "not supported", "unknown", "unknown error", "requested functionality has been deprecated",
    "insufficient permissions", "gpu requires reset", "not available", "not found", "none", "",
}


def _norm(name: str) -> str:
    """``"SRAM Uncorrectable SEC-DED"`` -> ``sram_uncorrectable_sec_ded``: one naming for XML and text."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


@dataclass(slots=True)
class Node:
    """One XML element or one text line, with its children."""

    key: str  # normalised name
    raw: str  # name as written
    value: str | None  # stripped text; None for a pure section
    where: str  # "line 12" or an element path, for error messages
    children: list[Node] = field(default_factory=list)

    def child(self, key: str) -> Node | None:
        return next((c for c in self.children if c.key == key), None)

    def walk(self) -> Iterator[Node]:
        """Every descendant, depth first; iterative, so a deeply nested capture cannot exhaust the stack."""
        stack = list(reversed(self.children))
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))


def _unavailable(text: str | None) -> bool:
    return text is not None and text.strip().strip("[]").strip().lower() in _UNAVAILABLE


_ABSENT = object()  # the capture has no such element (older schema): not counted as missing
_NA = object()  # the element is there but holds no reading: counted as missing


def _lookup(node: Node, path: tuple[str, ...]) -> str | object:
    """The text at `path`, `_NA` if it (or a section on the way, e.g. ``<remapped_rows>N/A``) is
    unavailable, `_ABSENT` if the schema has no such element."""
    for key in path:
        nxt = node.child(key)
        if nxt is None:
            # A section replaced by "N/A" has no children at all.
            return _NA if not node.children and _unavailable(node.value) else _ABSENT
        node = nxt
    if node.value is None or _unavailable(node.value):
        return _NA
    return node.value


# --- values and units --------------------------------------------------------------------------

# ASCII digits only, and no more of them than any reading has: a 5,000-digit "count" is damage, not data
# (and int() refuses strings over 4,300 digits).
_NUMBER = re.compile(r"^([-+]?\d{1,40}(?:\.\d{1,40})?)\s*([A-Za-z%/()]*)$", re.ASCII)

# Accepted unit spellings per unit family and their scale to the registry unit.
_UNITS: dict[str, dict[str, float]] = {
    "%": {"%": 1, "": 1},
    "MHz": {"MHz": 1, "GHz": 1000},
    "MiB": {"MiB": 1, "KiB": 1 / 1024, "GiB": 1024},
    "C": {"C": 1},
    "W": {"W": 1, "mW": 0.001},
    "mJ": {"mJ": 1, "J": 1000, "": 1},
    "count": {"": 1},
}


def _number(text: str, unit: str) -> float | int | None:
    """`text` in the registry unit, or None when it is not a number in an accepted unit."""
    m = _NUMBER.match(text.strip())
    if m is None or m.group(2) not in _UNITS[unit]:
        return None
    num, scale = m.group(1), _UNITS[unit][m.group(2)]
    if scale == 1 and re.fullmatch(r"[-+]?\d+", num):
        return int(num)
    value = float(num) * scale
    return value if math.isfinite(value) else None


def _flag(text: str) -> int | None:
    """Yes/No (and Active/Not Active) as 1/0."""
    return {"yes": 1, "no": 0, "active": 1, "not active": 0}.get(text.strip().lower())


# --- where each registry field lives -----------------------------------------------------------

_INT_FIELDS = frozenset(f.name for f in GPU_FIELDS if f.is_int)
_REGISTRY = frozenset(f.name for f in GPU_FIELDS)
_MIG_REGISTRY = frozenset(f.name for f in MIG_FIELDS)

# field -> (unit family or "flag", alternative paths; the first one that is present wins)
Paths = tuple[tuple[str, ...], ...]
_POWER_XML = ("gpu_power_readings", "power_readings")
_POWER_TEXT = ("gpu_power_readings", "power_readings")


def _power_paths(sections: tuple[str, ...], names: tuple[str, ...]) -> Paths:
    return tuple((s, n) for n in names for s in sections)


XML_FIELDS: dict[str, tuple[str, Paths]] = {
    "gpu_util": ("%", (("utilization", "gpu_util"),)),
    "mem_copy_util": ("%", (("utilization", "memory_util"),)),
    "enc_util": ("%", (("utilization", "encoder_util"),)),
    "dec_util": ("%", (("utilization", "decoder_util"),)),
    "sm_clock": ("MHz", (("clocks", "sm_clock"),)),
    "mem_clock": ("MHz", (("clocks", "mem_clock"),)),
    "fb_used": ("MiB", (("fb_memory_usage", "used"),)),
    "fb_free": ("MiB", (("fb_memory_usage", "free"),)),
    "fb_reserved": ("MiB", (("fb_memory_usage", "reserved"),)),
    "gpu_temp": ("C", (("temperature", "gpu_temp"),)),
    "memory_temp": ("C", (("temperature", "memory_temp"),)),
    "power_w": ("W", _power_paths(_POWER_XML, ("power_draw", "average_power_draw", "instant_power_draw"))),
    "power_limit_w": ("W", _power_paths(_POWER_XML, ("enforced_power_limit", "current_power_limit"))),
    "energy_mj": ("mJ", (("total_energy_consumption",),)),
    "retired_sbe": ("count", (("retired_pages", "multiple_single_bit_retirement", "retired_count"),)),
    "retired_dbe": ("count", (("retired_pages", "double_bit_retirement", "retired_count"),)),
    "retired_pending": ("flag", (("retired_pages", "pending_retirement"), ("retired_pages", "pending_blacklist"))),
    "remapped_rows_correctable": ("count", (("remapped_rows", "remapped_row_corr"),)),
    "remapped_rows_uncorrectable": ("count", (("remapped_rows", "remapped_row_unc"),)),
    "row_remap_failure": ("flag", (("remapped_rows", "remapped_row_failure"),)),
    "row_remap_pending": ("flag", (("remapped_rows", "remapped_row_pending"),)),
    "pcie_replay": ("count", (("pci", "replay_counter"),)),
}

TEXT_FIELDS: dict[str, tuple[str, Paths]] = {
    "gpu_util": ("%", (("utilization", "gpu"),)),
    "mem_copy_util": ("%", (("utilization", "memory"),)),
    "enc_util": ("%", (("utilization", "encoder"),)),
    "dec_util": ("%", (("utilization", "decoder"),)),
    "sm_clock": ("MHz", (("clocks", "sm"),)),
    "mem_clock": ("MHz", (("clocks", "memory"),)),
    "fb_used": ("MiB", (("fb_memory_usage", "used"),)),
    "fb_free": ("MiB", (("fb_memory_usage", "free"),)),
    "fb_reserved": ("MiB", (("fb_memory_usage", "reserved"),)),
    "gpu_temp": ("C", (("temperature", "gpu_current_temp"),)),
    "memory_temp": ("C", (("temperature", "memory_current_temp"),)),
    "power_w": ("W", _power_paths(_POWER_TEXT, ("power_draw", "average_power_draw", "instantaneous_power_draw"))),
    "power_limit_w": ("W", _power_paths(_POWER_TEXT, ("enforced_power_limit", "current_power_limit"))),
    "energy_mj": ("mJ", (("total_energy_consumption",),)),
    "retired_sbe": ("count", (("retired_pages", "single_bit_ecc"),)),
    "retired_dbe": ("count", (("retired_pages", "double_bit_ecc"),)),
    "retired_pending": (
        "flag", (("retired_pages", "pending_page_retirement"), ("retired_pages", "pending_page_blacklist")),
    ),
    "remapped_rows_correctable": ("count", (("remapped_rows", "correctable_error"),)),
    "remapped_rows_uncorrectable": ("count", (("remapped_rows", "uncorrectable_error"),)),
    "row_remap_failure": ("flag", (("remapped_rows", "remapping_failure_occurred"),)),
    "row_remap_pending": ("flag", (("remapped_rows", "pending"),)),
    "pcie_replay": ("count", (("pci", "replays_since_reset"),)),
}

# NVML clocks-event (throttle) reason bits; keys are the normalised names of both formats.
THROTTLE_BITS = {
    "gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
    "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80, "display_clock_setting": 0x100,
}
_THROTTLE_ALIASES = {"idle": "gpu_idle", "display_clocks_setting": "display_clock_setting"}
_THROTTLE_SECTIONS = ("clocks_event_reasons", "clocks_throttle_reasons")


@dataclass(frozen=True, slots=True)
class _Schema:
    """Where one output format keeps what the records need."""

    fields: dict[str, tuple[str, Paths]]
    uuid: tuple[str, ...]
    model: tuple[str, ...]
    serial: tuple[str, ...]
    bus_id: tuple[str, ...]
    mig_section: str
    mig_gi: str
    mig_ci: str
    mig_sms: tuple[str, ...]


XML_SCHEMA = _Schema(
    XML_FIELDS, ("uuid",), ("product_name",), ("serial",), ("pci", "pci_bus_id"),
    "mig_devices", "gpu_instance_id", "compute_instance_id", ("device_attributes", "shared", "multiprocessor_count"),
)
TEXT_SCHEMA = _Schema(
    TEXT_FIELDS, ("gpu_uuid",), ("product_name",), ("serial_number",), ("pci", "bus_id"),
    "mig_devices", "gpu_instance_id", "compute_instance_id", ("device_attributes", "shared", "multiprocessor_count"),
)


# --- extraction --------------------------------------------------------------------------------


class _Fields:
    """Collects one record's fields and counts the unavailable ones."""

    def __init__(self) -> None:
        self.values: dict[str, float | int] = {}
        self.missing = 0

    def put(self, name: str, value: float | int | object) -> None:
        if value is _NA:
            self.missing += 1
        elif value is not _ABSENT:
            self.values[name] = int(round(value)) if name in _INT_FIELDS else value  # type: ignore[arg-type]


def _field_value(node: Node, unit: str, paths: Paths) -> float | int | object:
    """The first present path's value, `_NA` if every present path is unavailable."""
    result: object = _ABSENT
    for path in paths:
        text = _lookup(node, path)
        if text is _ABSENT:
            continue
        if text is not _NA:
            value = _flag(text) if unit == "flag" else _number(text, unit)  # type: ignore[arg-type]
            if value is not None:
                return value
        result = _NA  # unavailable or unparsable: keep looking at the alternatives
    return result


def _sum_parts(parts: list[Node]) -> int | object:
    """Sum of the numeric parts; `_NA` if there were parts but none held a number."""
    numbers = [_number(p.value, "count") for p in parts if p.value is not None and not _unavailable(p.value)]
    numbers = [n for n in numbers if n is not None]
    if numbers:
        return int(sum(numbers))
    return _NA if parts else _ABSENT


def _ecc_totals(section: Node | None) -> tuple[int | object, int | object]:
    """(correctable, uncorrectable) totals of one ``volatile``/``aggregate`` ECC section."""
    if section is None:
        return _ABSENT, _ABSENT
    if not section.children:
        return (_NA, _NA) if _unavailable(section.value) else (_ABSENT, _ABSENT)
    if section.child("single_bit") is not None or section.child("double_bit") is not None:
        # Pascal/Volta-era schemas: per-location counts plus a total per bit class.
        totals: list[int | object] = []
        for kind in ("single_bit", "double_bit"):
            sub = section.child(kind)
            total = sub.child("total") if sub is not None else None
            totals.append(_ABSENT if sub is None else _sum_parts([total] if total is not None else sub.children))
        return totals[0], totals[1]
    # Location-split schemas: sram/dram x correctable/uncorrectable (parity + sec-ded in v13).
    corr = [c for c in section.children if "correctable" in c.key and "uncorrectable" not in c.key]
    unc = [c for c in section.children if "uncorrectable" in c.key]
    return _sum_parts(corr), _sum_parts(unc)


def _throttle_mask(gpu: Node) -> int | object:
    """The NVML clocks-event bitmask from the "Active" flags; `_NA` if none had a definite state."""
    section = next((s for name in _THROTTLE_SECTIONS if (s := gpu.child(name)) is not None), None)
    if section is None:
        return _ABSENT
    mask, known = 0, False
    for node in section.walk():  # text nests the HW thermal/power-brake reasons under HW Slowdown
        name = re.sub(r"^clocks_(event|throttle)_reason_", "", node.key)
        bit = THROTTLE_BITS.get(_THROTTLE_ALIASES.get(name, name))
        state = _flag(node.value) if bit is not None and node.value is not None else None
        if state is not None:
            known = True
            mask |= bit if state else 0
    return mask if known else _NA


def _gpu_fields(gpu: Node, schema: _Schema) -> _Fields:
    out = _Fields()
    for name, (unit, paths) in schema.fields.items():
        out.put(name, _field_value(gpu, unit, paths))
    ecc = gpu.child("ecc_errors")
    for scope, suffix in (("volatile", "vol"), ("aggregate", "agg")):
        sbe, dbe = _ecc_totals(ecc.child(scope) if ecc is not None else None)
        out.put(f"ecc_sbe_{suffix}", sbe)
        out.put(f"ecc_dbe_{suffix}", dbe)
    out.put("throttle_reasons", _throttle_mask(gpu))
    return out


def _text_at(node: Node, path: tuple[str, ...]) -> str | None:
    text = _lookup(node, path)
    return text if isinstance(text, str) else None


def _extra(gpu: Node) -> dict[str, float | int]:
    """Unmapped readings worth keeping in the narrow table."""
    extra: dict[str, float | int] = {}
    fan = _text_at(gpu, ("fan_speed",))
    if fan is not None and (value := _number(fan, "%")) is not None:
        extra["nvsmi_fan_speed_pct"] = value
    pstate = _text_at(gpu, ("performance_state",))
    if pstate is not None and re.fullmatch(r"P\d{1,2}", pstate.strip()):
        extra["nvsmi_pstate"] = int(pstate.strip()[1:])
    return extra


def _gpu_record(
    gpu: Node, index: int, host: str, driver: str | None, schema: _Schema, bus_id: str | None
) -> tuple[dict, int]:
    """The ingest GPU record (identity, fields, extra) and its count of unavailable fields."""
    uuid = _text_at(gpu, schema.uuid)
    if uuid is None:
        raise NvsmiError(f"{gpu.where}: GPU section without a UUID; cannot identify the GPU")
    fields = _gpu_fields(gpu, schema)
    ident = {
        "host": host, "uuid": uuid.strip(), "index": index, "model": _text_at(gpu, schema.model),
        "serial": _text_at(gpu, schema.serial), "pci_bus_id": _text_at(gpu, schema.bus_id) or bus_id,
        "driver": driver,
    }
    record = {k: v for k, v in ident.items() if v is not None}
    record["fields"] = fields.values
    record["extra"] = _extra(gpu)
    return record, fields.missing


def _mig_profile(model: str | None, sms: int | None, total_mib: float | int | None) -> str | None:
    """``"1g.20gb"`` for A100/A30 slices (14 SMs per GPU slice); None where not derivable."""
    if model is None or sms is None or total_mib is None or not re.search(r"\bA(100|30)\b", model):
        return None
    slices, rest = divmod(sms, 14)
    if rest or slices not in (1, 2, 3, 4, 7):
        return None
    return f"{slices}g.{math.ceil(total_mib / 1024)}gb"


def _mig_records(gpu: Node, record: dict, schema: _Schema) -> tuple[list[dict], int]:
    section = gpu.child(schema.mig_section)
    if section is None:
        return [], 0
    migs, missing = [], 0
    for dev in section.children:
        gi = _number(_text_at(dev, (schema.mig_gi,)) or "", "count")
        if gi is None:  # a GPU instance without an id cannot be stored
            missing += 1
            continue
        out = _Fields()
        for name in ("fb_used", "fb_free", "fb_reserved"):
            unit, paths = schema.fields[name]
            out.put(name, _field_value(dev, unit, paths))
        ci = _number(_text_at(dev, (schema.mig_ci,)) or "", "count")
        sms = _number(_text_at(dev, schema.mig_sms) or "", "count")
        total = _number(_text_at(dev, ("fb_memory_usage", "total")) or "", "MiB")
        mig = {"host": record["host"], "gpu_uuid": record["uuid"], "gpu_index": record["index"], "gi_id": gi,
               "ci_id": ci, "profile": _mig_profile(record.get("model"), sms, total), "fields": out.values}
        migs.append({k: v for k, v in mig.items() if v is not None})
        missing += out.missing
    return migs, missing


def _build(root: Node, gpus: list[tuple[Node, str | None]], host: str, schema: _Schema) -> NvsmiResult:
    """Records for every GPU section; refuses a capture that lost GPU sections."""
    if not host:
        raise NvsmiError("host must be a non-empty name")
    if not gpus:
        raise NvsmiError("no GPU sections found in the nvidia-smi output")
    result = NvsmiResult(driver=_text_at(root, ("driver_version",)))
    for index, (gpu, bus_id) in enumerate(gpus):
        record, missing = _gpu_record(gpu, index, host, result.driver, schema, bus_id)
        result.missing += missing
        result.gpus.append(record)
        migs, missing = _mig_records(gpu, record, schema)
        result.migs += migs
        result.missing += missing
    return result


# --- XML ---------------------------------------------------------------------------------------


# nvidia-smi nests at most ~6 levels; anything far deeper is damage (and would cost a stack per level).
MAX_XML_DEPTH = 64


def _xml_node(elem: ElementTree.Element, where: str) -> Node:
    root = Node(_norm(elem.tag), elem.tag, (elem.text or "").strip() or None, where)
    stack = [(elem, root, 0)]
    while stack:
        parent, node, depth = stack.pop()
        if depth > MAX_XML_DEPTH:
            raise NvsmiError(f"{node.where}: elements nested deeper than {MAX_XML_DEPTH} levels")
        seen: dict[str, int] = {}
        for child in parent:
            n = seen[child.tag] = seen.get(child.tag, 0) + 1
            text = (child.text or "").strip() or None
            sub = Node(_norm(child.tag), child.tag, text, f"{node.where}/{child.tag}[{n}]")
            node.children.append(sub)
            stack.append((child, sub, depth + 1))
        if len(parent) and node.value is not None and not _unavailable(node.value):
            node.value = None  # only a section's "N/A" placeholder text matters; other text is whitespace
    return root


def parse_nvsmi_xml(data: bytes | str, *, host: str) -> NvsmiResult:
    """Records from ``nvidia-smi -q -x`` output (schemas v10 to v13 and trimmed captures)."""
    if not data or not data.strip():
        raise NvsmiError("empty nvidia-smi -q -x output")
    try:
        elem = ElementTree.fromstring(data)
    except ElementTree.ParseError as exc:
        line, column = exc.position
        raise NvsmiError(f"malformed nvidia-smi XML at line {line}, column {column}: {exc}") from exc
    if elem.tag != "nvidia_smi_log":
        raise NvsmiError(f"root element <{elem.tag}> is not <nvidia_smi_log>; not nvidia-smi -q -x output")
    root = _xml_node(elem, "nvidia_smi_log")
    gpus = [(node, el.get("id")) for node, el in zip(root.children, elem, strict=True) if node.key == "gpu"]
    return _build(root, gpus, host, XML_SCHEMA)


# --- text --------------------------------------------------------------------------------------

_KEY_VALUE = re.compile(r"^(\S.*?)\s+:(?:\s(.*))?$")  # nvidia-smi pads keys, so " :" always separates
_GPU_HEADER = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])$")


def _text_tree(text: str) -> Node:
    """The indented outline as a tree; raises on lines that break the nesting."""
    root = Node("", "", None, "line 0")
    stack: list[tuple[int, Node]] = [(-1, root)]
    for lineno, line in enumerate(text.splitlines(), 1):
        body = line.rstrip()
        if not body.strip() or re.fullmatch(r"=+\s*NVSMI LOG\s*=+", body.strip()):
            continue
        if "\t" in line[: len(line) - len(line.lstrip())]:
            raise NvsmiError(f"line {lineno}: tab in the indentation of {body.strip()!r}")
        indent = len(body) - len(body.lstrip(" "))
        while stack[-1][0] >= indent:
            stack.pop()
        parent_indent, parent = stack[-1]
        if parent is not root and indent > parent_indent + 8:
            raise NvsmiError(f"line {lineno}: {body.strip()!r} is indented deeper than its section allows")
        match = _KEY_VALUE.match(body.strip())
        raw, value = (match.group(1), (match.group(2) or "").strip()) if match else (body.strip(), None)
        node = Node(_norm(raw), raw, value, f"line {lineno}")
        parent.children.append(node)
        stack.append((indent, node))
    return root


def parse_nvsmi_text(data: str | bytes, *, host: str) -> NvsmiResult:
    """Records from text ``nvidia-smi -q`` output (an indented ``key : value`` outline)."""
    if isinstance(data, bytes):
        data = data.decode("utf-8", errors="replace")
    if not data or not data.strip():
        raise NvsmiError("empty nvidia-smi -q output")
    if data.lstrip().startswith("<"):
        raise NvsmiError("line 1: this is XML; use parse_nvsmi_xml for nvidia-smi -q -x output")
    root = _text_tree(data)
    gpus = []
    for node in root.children:
        match = _GPU_HEADER.match(node.raw)
        if match:
            gpus.append((node, match.group(1)))
    if not root.children:  # blank lines and the "==== NVSMI LOG ====" banner only
        raise NvsmiError("line 1: no 'key : value' lines; not nvidia-smi -q output")
    if not gpus and root.child("attached_gpus") is None:
        first = root.children[0]
        raise NvsmiError(f"{first.where}: {first.raw!r}: not nvidia-smi -q output (no 'GPU <bus id>' section)")
    _check_attached(root, len(gpus))
    return _build(root, gpus, host, TEXT_SCHEMA)


def _check_attached(root: Node, found: int) -> None:
    """Refuse a text capture that lost GPU sections.

    Truncated XML fails to parse, but a truncated text outline is still a valid outline, so the
    count is the only witness. Only text is checked: real XML captures (telegraf's A100) were
    saved with fewer <gpu> elements than attached_gpus, e.g. from ``nvidia-smi -q -x -i 0``.
    """
    attached = root.child("attached_gpus")
    count = _number(attached.value or "", "count") if attached is not None else None
    if attached is not None and count is not None and count != found:
        raise NvsmiError(
            f"{attached.where}: '{attached.raw} : {attached.value}' but {found} 'GPU <bus id>' section(s) "
            f"were found; the capture is truncated or broken"
        )
