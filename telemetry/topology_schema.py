"""Validation of topology files, format version 1 (the format is described in docs/topology.md).

`build_plan(doc)` checks a parsed document and flattens it into a `Plan`: one list of records
per inventory kind, each record keeping the path it came from, so that every later check and
the loader in `telemetry.topology` can name the place in the file. Two passes:

1. Structure, while walking the tree: mappings, required and unknown keys, types, enums,
   ranges, and string lengths taken from the model fields (so a value the database would refuse
   is caught here, not as an error from PostgreSQL), plus what must be unique inside one object
   (GPU index and port name per node, port name per switch, MIG ids per GPU).
2. Cross-references on the flat plan: names unique across the file, references that resolve,
   U ranges inside the rack and not overlapping, links that reuse a port, power upstream cycles.

Every problem is collected; nothing stops at the first. This module never touches the database.
"""

from __future__ import annotations

import difflib
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from telemetry import models as inv

FORMAT_VERSION = 1
SMALLINT_MAX = 32767  # PositiveSmallIntegerField
INT_MAX = 2147483647  # PositiveIntegerField
MAX_PORT_COUNT = 4096  # far above any switch made; a typo (6400 for 64) should not make 6400 ports

# An omitted key with this default keeps the value stored in the database: these describe the
# hardware, and telemetry may have filled them in before the file named the object.
KEEP = object()

Check = Callable[[Any], "str | None"]


@dataclass(frozen=True)
class TopologyIssue:
    """One problem in a topology file: where it is (`path`) and what is wrong (`message`)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class TopologyError(Exception):
    """A topology file that cannot be imported; `issues` lists every problem found."""

    def __init__(self, issues: Iterable[TopologyIssue]) -> None:
        self.issues = list(issues)
        shown = "; ".join(str(i) for i in self.issues[:3])
        more = f" (and {len(self.issues) - 3} more)" if len(self.issues) > 3 else ""
        super().__init__(shown + more)


@dataclass
class Rec:
    """One object from the file: its path, model field values, names it refers to, its parent."""

    path: str
    values: dict[str, Any] = field(default_factory=dict)
    refs: dict[str, Any] = field(default_factory=dict)
    parent: Any = None
    bad: set[str] = field(default_factory=set)  # keys that failed their check


@dataclass
class Plan:
    """A checked file flattened into one list of records per inventory kind."""

    sites: list[Rec] = field(default_factory=list)
    halls: list[Rec] = field(default_factory=list)
    rows: list[Rec] = field(default_factory=list)
    racks: list[Rec] = field(default_factory=list)
    domains: list[Rec] = field(default_factory=list)
    nodes: list[Rec] = field(default_factory=list)
    gpus: list[Rec] = field(default_factory=list)
    migs: list[Rec] = field(default_factory=list)
    switches: list[Rec] = field(default_factory=list)
    ports: list[Rec] = field(default_factory=list)
    links: list[Rec] = field(default_factory=list)
    power: list[Rec] = field(default_factory=list)


# --- value checks: each returns a message naming the bad value, or None -------------------
def _shown(value: Any) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list",
             dict: "mapping", type(None): "null"}
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{names.get(type(value), type(value).__name__)} {text}"


def _text(max_length: int, *, blank: bool = True, pattern: re.Pattern | None = None,
          hint: str = "") -> Check:
    def check(value: Any) -> str | None:
        if not isinstance(value, str):
            # YAML turns unquoted 0x1f, 0012 or yes into numbers and booleans.
            quote = " (quote it)" if isinstance(value, int | float | bool) else ""
            return f"expected a string, got {_shown(value)}{quote}"
        if not value and not blank:
            return "must not be empty"
        if "\x00" in value:  # PostgreSQL text cannot hold NUL
            return f"{value[:40]!r} contains a NUL character"
        if len(value) > max_length:
            return f"{value[:40]!r}... is {len(value)} characters long; the limit is {max_length}"
        if pattern is not None and not pattern.fullmatch(value):
            return f"{value!r} {hint}"
        return None
    return check


def _model_text(model: type, name: str, **kwargs: Any) -> Check:
    return _text(model._meta.get_field(name).max_length, **kwargs)


def _integer(lowest: int, highest: int) -> Check:
    def check(value: Any) -> str | None:
        if not isinstance(value, int) or isinstance(value, bool):
            return f"expected an integer, got {_shown(value)}"
        if not lowest <= value <= highest:
            return f"{value} is out of range {lowest}..{highest}"
        return None
    return check


def _positive_number(value: Any) -> str | None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return f"expected a number, got {_shown(value)}"
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an integer past float range: stored as a float, it cannot be
        return f"{_shown(value)} is out of range for a number"
    if not finite or value <= 0:
        return f"{_shown(value)} must be a positive number"
    return None


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"expected true or false, got {_shown(value)}"


def _choice(values: list[str]) -> Check:
    def check(value: Any) -> str | None:
        if not isinstance(value, str):
            return f"expected a string, got {_shown(value)}"
        return None if value in values else f"{value!r} is not one of: {', '.join(values)}"
    return check


def _version(value: Any) -> str | None:
    if type(value) is not int or value != FORMAT_VERSION:
        return f"unsupported version {value!r}; this loader reads version {FORMAT_VERSION}"
    return None


# --- object specs ------------------------------------------------------------------------
@dataclass(frozen=True)
class F:
    """How one key of an object is checked and where its value goes."""

    check: Check
    required: bool = False
    default: Any = None
    dest: str | None = None  # the model field, when it is not named like the key
    ref: bool = False  # a name to resolve or a generator setting: kept in Rec.refs


def _name(model: type, **kwargs: Any) -> F:
    """A required, non-empty name no longer than the model's `name` column."""
    return F(_model_text(model, kwargs.pop("field", "name"), blank=False, **kwargs), required=True)


_SLUG = re.compile(r"[-a-zA-Z0-9_]+")
# ":" separates owner and port in a link endpoint, so owner names may not contain one.
_OWNER = re.compile(r"[^\s:]+")
_OWNER_HINT = "must have no spaces and no ':' (':' separates owner and port in links)"
_GPU_UUID = re.compile(r"GPU-\S+")
_UUID_HINT = "is not a GPU UUID (expected 'GPU-' followed by the UUID, as nvidia-smi prints it)"

TOP = {"version": F(_version, required=True)}
SITE = {
    "name": _name(inv.Site, pattern=_SLUG, hint="is not a slug (letters, digits, '-' and '_')"),
    "description": F(_model_text(inv.Site, "description"), default=""),
}
HALL = {"name": _name(inv.Hall)}
ROW = {"name": _name(inv.Row)}
RACK = {
    "name": _name(inv.Rack),
    "position": F(_integer(0, SMALLINT_MAX), default=0),
    "u_height": F(_integer(1, SMALLINT_MAX), default=48),
    "power_cap_w": F(_positive_number),
}
NODE = {
    "hostname": _name(inv.Node, field="hostname", pattern=_OWNER, hint=_OWNER_HINT),
    "u": F(_integer(1, SMALLINT_MAX), dest="u_position"),
    "u_height": F(_integer(1, SMALLINT_MAX), default=4),
    "system_model": F(_model_text(inv.Node, "system_model"), default=KEEP),
    "nvlink_domain": F(_model_text(inv.NvlinkDomain, "name", blank=False), ref=True),
}
GPU = {
    "index": F(_integer(0, SMALLINT_MAX), required=True),
    "uuid": F(_model_text(inv.Gpu, "uuid", pattern=_GPU_UUID, hint=_UUID_HINT), required=True),
    "model": F(_model_text(inv.Gpu, "model"), default=KEEP),
    "serial": F(_model_text(inv.Gpu, "serial"), default=KEEP),
    "pci_bus_id": F(_model_text(inv.Gpu, "pci_bus_id"), default=KEEP),
    "mig_mode": F(_boolean, default=KEEP),
}
MIG = {
    "gi_id": F(_integer(0, SMALLINT_MAX), required=True),
    "ci_id": F(_integer(0, SMALLINT_MAX), default=0),
    "profile": F(_model_text(inv.MigInstance, "profile"), default=""),
}
PORT = {
    "name": _name(inv.Port),
    "guid": F(_model_text(inv.Port, "guid"), default=KEEP),
    "lid": F(_integer(0, INT_MAX), default=KEEP),
    "link_layer": F(_choice(inv.Port.LinkLayer.values)),
    "speed_gbps": F(_positive_number),
    "rail": F(_integer(0, SMALLINT_MAX)),
}
SWITCH = {
    "name": _name(inv.Switch, pattern=_OWNER, hint=_OWNER_HINT),
    "role": F(_choice(inv.Switch.Role.values), required=True),
    "model": F(_model_text(inv.Switch, "model"), default=KEEP),
    "guid": F(_model_text(inv.Switch, "guid"), default=KEEP),
    "port_count": F(_integer(1, MAX_PORT_COUNT), ref=True),
    "port_prefix": F(_text(inv.Port._meta.get_field("name").max_length - 4, blank=False),
                     default="p", ref=True),
    "port_speed_gbps": F(_positive_number, ref=True),
    "port_link_layer": F(_choice(inv.Port.LinkLayer.values), default="infiniband", ref=True),
}
RACK_SWITCH = {**SWITCH, "u": F(_integer(1, SMALLINT_MAX), dest="u_position")}
DOMAIN = {
    "name": _name(inv.NvlinkDomain),
    "kind": F(_choice(inv.NvlinkDomain.Kind.values), default=inv.NvlinkDomain.Kind.NODE.value),
    "rack": F(_model_text(inv.Rack, "name", blank=False), ref=True),
}
POWER = {
    "name": _name(inv.PowerDevice),
    "kind": F(_choice(inv.PowerDevice.Kind.values), required=True),
    "capacity_w": F(_positive_number),
    "upstream": F(_model_text(inv.PowerDevice, "name", blank=False), ref=True),
}


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _unknown_key(path: str, key: Any, known: list[str]) -> TopologyIssue:
    close = difflib.get_close_matches(str(key), known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"expected one of: {', '.join(known)}"
    return TopologyIssue(_join(path, key), f"unknown key {key!r}; {hint}")


def _record(raw: Any, spec: dict[str, F], nested: tuple[str, ...], path: str,
            issues: list[TopologyIssue]) -> Rec | None:
    """Check one mapping against its spec; None when it is not a mapping at all."""
    if not isinstance(raw, dict):
        issues.append(TopologyIssue(path, f"expected a mapping, got {_shown(raw)}"))
        return None
    rec = Rec(path)
    for key in raw:
        if key not in spec and key not in nested:
            issues.append(_unknown_key(path, key, [*spec, *nested]))
    for key, f in spec.items():
        value = raw.get(key)
        target = rec.refs if f.ref else rec.values
        if value is None:  # an explicit null means the same as leaving the key out
            if f.required:
                problem = "required key is missing" if key not in raw else "must not be null"
                issues.append(TopologyIssue(_join(path, key), problem))
                rec.bad.add(key)
            elif f.default is not KEEP:
                target[f.dest or key] = f.default
            continue
        problem = f.check(value)
        if problem:
            issues.append(TopologyIssue(_join(path, key), problem))
            rec.bad.add(key)
        else:
            target[f.dest or key] = value
    return rec


def _items(raw: dict, key: str, path: str, issues: list[TopologyIssue]) -> list[tuple[str, Any]]:
    """The (path, item) pairs of the list under `key`; [] when absent or not a list."""
    value = raw.get(key)
    if value is None:
        return []
    where = _join(path, key)
    if not isinstance(value, list):
        issues.append(TopologyIssue(where, f"expected a list, got {_shown(value)}"))
        return []
    return [(f"{where}[{i}]", item) for i, item in enumerate(value)]


def _children(raw: dict, key: str, spec: dict[str, F], nested: tuple[str, ...], path: str,
              parent: Any, issues: list[TopologyIssue]) -> list[tuple[Rec, dict]]:
    """Records for the list under `key`, each with its raw mapping (for its own children)."""
    out = []
    for item_path, item in _items(raw, key, path, issues):
        rec = _record(item, spec, nested, item_path, issues)
        if rec is not None:
            rec.parent = parent
            out.append((rec, item))
    return out


def _unique(records: Iterable[Rec], key: str, what: str, issues: list[TopologyIssue], *,
            value: Callable[[Rec], Any] | None = None,
            scope: Callable[[Rec], Any] | None = None) -> None:
    """Report each record whose value repeats an earlier one, naming both paths.

    `what` is a phrase with one `{}` for the value, e.g. "GPU index {} on this node".
    """
    first: dict[Any, str] = {}
    for rec in records:
        v = value(rec) if value else rec.values.get(key)
        if v is None:
            continue
        k = (scope(rec) if scope else None, v)
        where = _join(rec.path, key)
        if k in first:
            shown = what.format(repr(v))
            issues.append(TopologyIssue(where, f"duplicate {shown}; first at {first[k]}"))
        else:
            first[k] = where


# --- pass 1: walk the tree ---------------------------------------------------------------
def _walk_sites(plan: Plan, doc: dict, issues: list[TopologyIssue]) -> None:
    for site, site_raw in _children(doc, "sites", SITE, ("halls",), "", None, issues):
        plan.sites.append(site)
        s = site.values.get("name")
        for hall, hall_raw in _children(site_raw, "halls", HALL, ("rows",), site.path, s, issues):
            plan.halls.append(hall)
            h = hall.values.get("name")
            for row, row_raw in _children(hall_raw, "rows", ROW, ("racks",), hall.path, (s, h),
                                          issues):
                plan.rows.append(row)
                key = (s, h, row.values.get("name"))
                for rack, rack_raw in _children(row_raw, "racks", RACK, ("nodes", "switches"),
                                                row.path, key, issues):
                    _walk_rack(plan, rack, rack_raw, issues)


def _walk_rack(plan: Plan, rack: Rec, raw: dict, issues: list[TopologyIssue]) -> None:
    plan.racks.append(rack)
    name = rack.values.get("name")
    for node, node_raw in _children(raw, "nodes", NODE, ("gpus", "hcas"), rack.path, name, issues):
        _walk_node(plan, node, node_raw, issues)
    for switch, switch_raw in _children(raw, "switches", RACK_SWITCH, ("ports",), rack.path, name,
                                        issues):
        _walk_switch(plan, switch, switch_raw, issues)


def _walk_node(plan: Plan, node: Rec, raw: dict, issues: list[TopologyIssue]) -> None:
    plan.nodes.append(node)
    host = node.values.get("hostname")
    gpus = _children(raw, "gpus", GPU, ("mig",), node.path, host, issues)
    _unique((g for g, _ in gpus), "index", "GPU index {} on this node", issues)
    for gpu, gpu_raw in gpus:
        plan.gpus.append(gpu)
        migs = [m for m, _ in _children(gpu_raw, "mig", MIG, (), gpu.path, gpu.values.get("uuid"),
                                        issues)]
        _unique(migs, "gi_id", "MIG instance (gi_id, ci_id) {} on this GPU", issues,
                value=lambda m: None if m.bad else (m.values["gi_id"], m.values["ci_id"]))
        plan.migs.extend(migs)
    hcas = [p for p, _ in _children(raw, "hcas", PORT, (), node.path, ("node", host), issues)]
    _unique(hcas, "name", "port name {} on this node", issues)
    for port in hcas:
        port.values["link_layer"] = port.values.get("link_layer") or "infiniband"
    plan.ports.extend(hcas)


def _walk_switch(plan: Plan, switch: Rec, raw: dict, issues: list[TopologyIssue]) -> None:
    """A switch, its explicit ports, and p1..pN from port_count for names not given explicitly.

    Explicit ports take port_speed_gbps and port_link_layer as their defaults, so a file can
    list only the ports that differ (an Ethernet uplink, a port with a known GUID).
    """
    plan.switches.append(switch)
    owner = ("switch", switch.values.get("name"))
    ports = [p for p, _ in _children(raw, "ports", PORT, (), switch.path, owner, issues)]
    _unique(ports, "name", "port name {} on this switch", issues)
    speed, layer = switch.refs.get("port_speed_gbps"), switch.refs.get("port_link_layer")
    for port in ports:
        port.values["link_layer"] = port.values.get("link_layer") or layer or "infiniband"
        if port.values.get("speed_gbps") is None:
            port.values["speed_gbps"] = speed
    plan.ports.extend(ports)
    count, prefix = switch.refs.get("port_count"), switch.refs.get("port_prefix")
    if count is None or prefix is None:
        return
    given = {p.values.get("name") for p in ports}
    where = _join(switch.path, "port_count")
    for i in range(1, count + 1):
        if f"{prefix}{i}" not in given:
            values = {"name": f"{prefix}{i}", "link_layer": layer or "infiniband",
                      "speed_gbps": speed, "rail": None}
            plan.ports.append(Rec(where, values, parent=owner))


def _walk_link(plan: Plan, raw: Any, path: str, issues: list[TopologyIssue]) -> None:
    if not isinstance(raw, list) or len(raw) != 2:
        issues.append(TopologyIssue(path, "expected a pair of endpoints "
                                    f"['<switch or hostname>:<port>', ...], got {_shown(raw)}"))
        return
    ends = []
    for i, end in enumerate(raw):
        owner, sep, port = end.partition(":") if isinstance(end, str) else ("", "", "")
        if not (owner and sep and port):
            issues.append(TopologyIssue(f"{path}[{i}]", f"{_shown(end)} is not an endpoint "
                                        "'<switch or hostname>:<port>'"))
        ends.append((owner, port, f"{path}[{i}]"))
    if all(owner and port for owner, port, _ in ends):
        plan.links.append(Rec(path, refs={"ends": ends}))


def _walk_power(plan: Plan, raw: Any, path: str, issues: list[TopologyIssue]) -> None:
    rec = _record(raw, POWER, ("racks", "nodes"), path, issues)
    if rec is None:
        return
    for key in ("racks", "nodes"):
        names = []
        for item_path, item in _items(raw, key, path, issues):
            if isinstance(item, str):
                names.append((item, item_path))
            else:
                issues.append(TopologyIssue(item_path, f"expected a name, got {_shown(item)}"))
        rec.refs[key] = names
    plan.power.append(rec)


# --- pass 2: the whole file --------------------------------------------------------------
def _check_names(plan: Plan, issues: list[TopologyIssue]) -> None:
    _unique(plan.sites, "name", "site name {}", issues)
    _unique(plan.halls, "name", "hall name {} in this site", issues, scope=lambda r: r.parent)
    _unique(plan.rows, "name", "row name {} in this hall", issues, scope=lambda r: r.parent)
    _unique(plan.racks, "name", "rack name {}", issues)
    _unique(plan.nodes, "hostname", "hostname {}", issues)
    _unique(plan.gpus, "uuid", "GPU UUID {}", issues)
    _unique(plan.switches, "name", "switch name {}", issues)
    _unique(plan.domains, "name", "NVLink domain name {}", issues)
    _unique(plan.power, "name", "power device name {}", issues)
    hosts = {n.values.get("hostname"): _join(n.path, "hostname") for n in plan.nodes}
    for switch in plan.switches:
        name = switch.values.get("name")
        if name is not None and name in hosts:
            message = f"switch name {name!r} is also the hostname at {hosts[name]}"
            issues.append(TopologyIssue(_join(switch.path, "name"),
                                        f"{message}; links would be ambiguous"))


def _check_domains(plan: Plan, issues: list[TopologyIssue]) -> None:
    domains = {d.values.get("name"): d for d in plan.domains}
    racks = {r.values.get("name") for r in plan.racks}
    for d in plan.domains:
        rack = d.refs.get("rack")
        if rack is not None and rack not in racks:
            issues.append(TopologyIssue(_join(d.path, "rack"),
                                        f"no rack named {rack!r} in this file"))
        elif rack is None and d.values.get("kind") == "rack" and "rack" not in d.bad:
            issues.append(TopologyIssue(_join(d.path, "rack"),
                                        "a rack-scale domain (kind: rack) needs its rack"))
    owner: dict[str, str] = {}
    for node in plan.nodes:
        name = node.refs.get("nvlink_domain")
        if name is None:
            continue
        where, d = _join(node.path, "nvlink_domain"), domains.get(name)
        if d is None:
            issues.append(TopologyIssue(where, f"no NVLink domain named {name!r}; declare it "
                                        "under nvlink_domains"))
        elif d.values.get("kind") == "node" and name in owner:
            issues.append(TopologyIssue(where, f"node-kind domain {name!r} already belongs to the "
                                        f"node at {owner[name]}"))
        elif d.values.get("kind") == "rack" and d.refs.get("rack") not in (None, node.parent):
            issues.append(TopologyIssue(where, f"domain {name!r} is rack {d.refs['rack']!r} but "
                                        f"this node is in rack {node.parent!r}"))
        owner.setdefault(name, where)


def _span(low: int, top: int) -> str:
    return f"U{low}" if low == top else f"U{low}-U{top}"


def _check_u_ranges(plan: Plan, issues: list[TopologyIssue]) -> None:
    """Nodes and rack switches (1U each) must fit in their rack and not overlap."""
    racks = {r.values.get("name"): r for r in plan.racks}
    spans: dict[str, list] = defaultdict(list)
    placed = [(n, "node", n.values.get("hostname"), n.values.get("u_height")) for n in plan.nodes]
    placed += [(s, "switch", s.values.get("name"), 1) for s in plan.switches if s.parent]
    for rec, what, name, height in placed:
        low, rack = rec.values.get("u_position"), racks.get(rec.parent)
        if low is None or height is None or rack is None:
            continue
        top, rack_top = low + height - 1, rack.values.get("u_height")
        where = _join(rec.path, "u")
        if rack_top is not None and top > rack_top:
            issues.append(TopologyIssue(where, f"{what} {name!r} at {_span(low, top)} does not fit "
                                        f"in rack {rec.parent!r} ({rack_top}U)"))
        spans[rec.parent].append((low, top, f"{what} {name!r}", where))
    for items in spans.values():
        items.sort(key=lambda item: (item[0], item[1]))
        highest = None  # the span reaching highest so far
        for low, top, label, where in items:
            if highest is not None and low <= highest[1]:
                here, there = _span(low, top), _span(*highest[:2])
                message = f"{label} at {here} overlaps {highest[2]} at {there} ({highest[3]})"
                issues.append(TopologyIssue(where, message))
            if highest is None or top > highest[1]:
                highest = (low, top, label, where)


def _check_links(plan: Plan, issues: list[TopologyIssue]) -> None:
    owners: dict[str, tuple[str, set[str]]] = {}
    for port in plan.ports:
        kind, name = port.parent
        owners.setdefault(name, (kind, set()))[1].add(port.values.get("name"))
    used: dict[tuple[str, str], str] = {}
    for link in plan.links:
        (a_owner, a_port, _), (b_owner, b_port, b_path) = link.refs["ends"]
        if (a_owner, a_port) == (b_owner, b_port):
            issues.append(TopologyIssue(b_path, f"link joins port '{a_owner}:{a_port}' to itself"))
            continue
        for owner, port, where in link.refs["ends"]:
            kind, ports = owners.get(owner, (None, set()))
            if kind is None:
                issues.append(TopologyIssue(where,
                                            f"no switch or node named {owner!r} in this file"))
            elif port not in ports:
                issues.append(TopologyIssue(where, f"{kind} {owner!r} has no port {port!r}"))
            elif (owner, port) in used:
                issues.append(TopologyIssue(where, f"port '{owner}:{port}' is already cabled by "
                                            f"the link at {used[(owner, port)]}"))
            else:
                used[(owner, port)] = where


def _check_power(plan: Plan, issues: list[TopologyIssue]) -> None:
    devices = {p.values.get("name"): p for p in plan.power}
    known = {"racks": {r.values.get("name") for r in plan.racks},
             "nodes": {n.values.get("hostname") for n in plan.nodes}}
    for rec in plan.power:
        upstream = rec.refs.get("upstream")
        if upstream is not None and upstream not in devices:
            issues.append(TopologyIssue(_join(rec.path, "upstream"),
                                        f"no power device named {upstream!r} in this file"))
        for key, what in (("racks", "rack"), ("nodes", "node")):
            for name, where in rec.refs.get(key, []):
                if name not in known[key]:
                    issues.append(TopologyIssue(where, f"no {what} named {name!r} in this file"))
    _check_power_cycles(plan.power, devices, issues)


def _check_power_cycles(power: list[Rec], devices: dict[Any, Rec],
                        issues: list[TopologyIssue]) -> None:
    """Follow each device's upstream chain; a chain that meets itself is a cycle (reported once)."""
    done: set[str] = set()
    for rec in power:
        chain, name = [], rec.values.get("name")
        while name is not None and name not in done and name not in chain:
            chain.append(name)
            name = devices[name].refs.get("upstream") if name in devices else None
        if name is not None and name in chain:
            cycle = chain[chain.index(name):]
            where = _join(devices[cycle[0]].path, "upstream")
            loop = " -> ".join([*cycle, cycle[0]])
            issues.append(TopologyIssue(where, f"upstream cycle: {loop}"))
        done.update(chain)


def build_plan(doc: Any) -> tuple[Plan, list[TopologyIssue]]:
    """Check a parsed topology document; return its plan and every issue found."""
    plan, issues = Plan(), []
    nested = ("sites", "switches", "nvlink_domains", "links", "power")
    if _record(doc, TOP, nested, "", issues) is None:
        return plan, issues
    _walk_sites(plan, doc, issues)
    for switch, raw in _children(doc, "switches", SWITCH, ("ports",), "", None, issues):
        _walk_switch(plan, switch, raw, issues)
    plan.domains = [d for d, _ in _children(doc, "nvlink_domains", DOMAIN, (), "", None, issues)]
    for path, raw in _items(doc, "links", "", issues):
        _walk_link(plan, raw, path, issues)
    for path, raw in _items(doc, "power", "", issues):
        _walk_power(plan, raw, path, issues)
    for check in (_check_names, _check_domains, _check_u_ranges, _check_links, _check_power):
        check(plan, issues)
    return plan, issues


def validate_topology(doc: Any) -> list[TopologyIssue]:
    """Every problem in a parsed topology document; [] when it can be imported."""
    return build_plan(doc)[1]
