"""Load a cluster topology file (YAML or JSON) and import it into the inventory.

`load_topology_file(path)` parses a file, `validate_topology(doc)` lists its problems and
`do_import_topology(doc)` writes it; the cluster simulator builds the same document as a dict
and calls `do_import_topology` directly. The format is described in docs/topology.md, the
checks live in `telemetry.topology_schema`.

An import, in one transaction:

1. validates the whole document and raises `TopologyError`, having written nothing, if there is
   any issue;
2. takes a transaction-level advisory lock, so that two imports never race on the same keys;
3. upserts each kind by its natural key, parents before children, with one read and bulk
   writes per kind. Only rows that differ are written, so re-importing a file is a no-op, and an
   edited file updates rows in place: ids are kept, which matters because time-series rows
   refer to Gpu.id, Node.id and Port.id. A node or GPU that telemetry registered before the file
   named it (no rack) is the same row, now placed;
4. with `replace=True`, removes what the file no longer names. Nodes and GPUs are never deleted
   (their history refers to their ids): a node missing from the file is unplaced instead.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml
from django.db import DataError, IntegrityError, connection, models, transaction
from django.db.models import Q

from telemetry.ingest.entities import clear_cache
from telemetry.models import (
    Gpu,
    Hall,
    Link,
    MigInstance,
    Node,
    NvlinkDomain,
    Port,
    PowerDevice,
    Rack,
    Row,
    Site,
    Switch,
)
from telemetry.topology_schema import (
    Plan,
    Rec,
    TopologyError,
    TopologyIssue,
    build_plan,
    validate_topology,
)

__all__ = [
    "ImportResult", "KindCounts", "TopologyError", "TopologyIssue",
    "do_import_topology", "load_topology_file", "validate_topology",
]

logger = logging.getLogger(__name__)

BATCH = 2000
# pg_advisory_xact_lock key shared by every import ("topo" in ASCII).
IMPORT_LOCK_KEY = 0x746F706F
KINDS = ("sites", "halls", "rows", "racks", "nvlink_domains", "nodes", "gpus", "mig_instances",
         "switches", "ports", "links", "power_devices", "power_feeds")


@dataclass
class KindCounts:
    """Rows of one kind that an import created, updated, left alone and removed.

    `removed` nodes were unplaced, not deleted.
    """

    created: int = 0
    updated: int = 0
    unchanged: int = 0
    removed: int = 0


@dataclass
class ImportResult:
    """What one import did, per kind (see KINDS)."""

    counts: dict[str, KindCounts] = field(default_factory=lambda: {k: KindCounts() for k in KINDS})

    def __getitem__(self, kind: str) -> KindCounts:
        return self.counts[kind]

    @property
    def changed(self) -> bool:
        return any(c.created or c.updated or c.removed for c in self.counts.values())

    def summary_lines(self) -> list[str]:
        return [
            f"{kind:<15} {c.created:>7} created {c.updated:>7} updated {c.unchanged:>7} unchanged"
            + (f" {c.removed:>7} removed" if c.removed else "")
            for kind, c in self.counts.items()
        ]


# --- reading files -----------------------------------------------------------------------
class _StrictYamlLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """Safe YAML loader (libyaml when present) that refuses duplicate keys in a mapping.

    PyYAML silently keeps the last of two equal keys, which would hide a pasted-twice line.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # "<<" merges may override keys on purpose
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:
                continue  # an unhashable key: the base class reports it
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found duplicate key {key!r}", key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _syntax_error(kind: str, line: int | None, column: int | None, problem: str) -> TopologyError:
    where = f"line {line}, column {column}" if line is not None else ""
    return TopologyError([TopologyIssue(where, f"{kind} syntax error: {problem}")])


def _alias_expansion_issue(doc: Any, limit: int) -> str | None:
    """Why `doc` cannot be walked: a container that contains itself, or more than `limit` values once
    aliases are expanded (each use of an anchored container counts its values again, as the importer
    would visit them). None when it is fine. Iterative and memoised: linear in what was written."""
    sizes: dict[int, int] = {}
    path: set[int] = set()  # containers being counted: meeting one again is a cycle
    stack: list[tuple[Any, bool]] = [(doc, False)]
    while stack:
        obj, leaving = stack.pop()
        if not isinstance(obj, dict | list):
            continue
        children = list(obj.values()) if isinstance(obj, dict) else obj
        if leaving:
            path.discard(id(obj))
            sizes[id(obj)] = 1 + sum(sizes.get(id(c), 1) for c in children)
            if sizes[id(obj)] > limit:
                return f"YAML aliases expand the document to more than {limit:,} values"
            continue
        if id(obj) in sizes:
            continue
        if id(obj) in path:
            return "a YAML alias refers to a mapping or list that contains it"
        path.add(id(obj))
        stack.append((obj, True))
        stack.extend((c, False) for c in children if isinstance(c, dict | list) and id(c) not in sizes)
    return None


def _parse_yaml(data: bytes) -> Any:
    doc = _load_yaml(data)
    # A 1 KiB file of nested aliases ("billion laughs") expands to millions of racks and GPUs: refuse
    # more values than the file has bytes (a written value takes at least two), with room for small files.
    problem = _alias_expansion_issue(doc, max(100_000, len(data)))
    if problem:
        raise TopologyError([TopologyIssue("", problem)])
    return doc


def _load_yaml(data: bytes) -> Any:
    try:
        return yaml.load(data, Loader=_StrictYamlLoader)  # a SafeLoader: builds no objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join(p for p in (exc.problem, f"({exc.context})" if exc.context else "") if p)
        if mark is None:
            raise _syntax_error("YAML", None, None, problem or str(exc)) from exc
        raise _syntax_error("YAML", mark.line + 1, mark.column + 1, problem) from exc
    except yaml.YAMLError as exc:  # undecodable bytes and the like carry no line
        raise _syntax_error("YAML", None, None, str(exc)) from exc
    except ValueError as exc:  # PyYAML's int() of a number with more than 4,300 digits; it keeps no line
        raise _syntax_error("YAML", None, None, f"a number is too long: {exc}") from exc


def _parse_json(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise _syntax_error("JSON", exc.lineno, exc.colno, exc.msg) from exc


def load_topology_file(path: str | Path) -> dict:
    """Parse a topology file: .yaml/.yml or .json by extension, otherwise JSON then YAML.

    Raises TopologyError naming the line and column of a syntax error.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TopologyError([TopologyIssue("", f"cannot read the file: {exc.strerror}")]) from exc
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        doc = _parse_yaml(data)
    elif suffix == ".json":
        doc = _parse_json(data)
    else:
        try:
            doc = _parse_json(data)
        except TopologyError:
            doc = _parse_yaml(data)
    if not isinstance(doc, dict):
        kind = "empty" if doc is None else type(doc).__name__
        raise TopologyError([TopologyIssue("", f"expected a mapping with 'version: 1' at the "
                                           f"top of the file, got {kind}")])
    return doc


# --- writing -----------------------------------------------------------------------------
ANALYZE_AFTER_ROWS = 1000
_INVENTORY_TABLES = ("telemetry_rack", "telemetry_node", "telemetry_gpu", "telemetry_switch", "telemetry_port",
                     "telemetry_link", "telemetry_powerdevice", "telemetry_nvlinkdomain")


@transaction.atomic
def do_import_topology(doc: Any, *, replace: bool = False) -> ImportResult:
    """Validate `doc` and write it to the inventory (see the module docstring).

    Raises TopologyError with every issue, having written nothing, if the document is invalid.
    """
    plan, issues = build_plan(doc)
    if issues:
        raise TopologyError(issues)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [IMPORT_LOCK_KEY])
    result = ImportResult()
    try:
        ids = _write(plan, result, replace=replace)
        if replace:
            _prune(ids, result)
    except (IntegrityError, DataError) as exc:
        # Validation is meant to make this unreachable; if it is not, say so plainly.
        raise TopologyError([TopologyIssue("", f"the database refused the import: {exc}")]) from exc
    if replace:
        # Ingest caches ids per process; deleted ports, MIG instances or devices must not linger.
        transaction.on_commit(clear_cache)
    if sum(c.created + c.removed for c in result.counts.values()) >= ANALYZE_AFTER_ROWS:
        # A first import of a big cluster leaves the planner believing the tables are empty until
        # autovacuum catches up, and the page queries that join them would pick nested loops over
        # 16k rows in the meantime.
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {', '.join(_INVENTORY_TABLES)}")
    changes = [f"{kind} +{c.created} ~{c.updated} -{c.removed}"
               for kind, c in result.counts.items() if c.created or c.updated or c.removed]
    logger.info("topology import: %s", ", ".join(changes) or "no changes")
    return result


def _write(plan: Plan, result: ImportResult, *, replace: bool) -> dict[str, dict]:
    """Write every kind, parents first; return natural key -> id per kind."""
    ids: dict[str, dict] = {}
    _write_places(plan, result, ids)
    _write_nodes(plan, result, ids)
    _write_fabric(plan, result, ids)
    _write_links(plan, result, ids, replace=replace)
    _write_power(plan, result, ids)
    return ids


def _stored(model: type[models.Model], columns: list[str], match: str, values: list) -> list[dict]:
    """Rows of `model` whose `match` column is any of `values`, as dicts of `columns` (attnames).

    One array parameter instead of an IN list: Django spends longer building an IN list of 16k
    parameters than PostgreSQL spends running the query, and model instances are not needed.
    """
    if not values:
        return []
    opts, quote = model._meta, connection.ops.quote_name
    names = ", ".join(quote(opts.get_field(c).column) for c in columns)
    sql = (f"SELECT {names} FROM {quote(opts.db_table)} "
           f"WHERE {quote(opts.get_field(match).column)} = ANY(%s)")
    with connection.cursor() as cursor:
        cursor.execute(sql, [list(values)])
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]


def _upsert(model: type[models.Model], key: tuple[str, ...], rows: list[dict],
            counts: KindCounts, match: tuple[str, list]) -> dict:
    """Insert or update `rows` by natural `key` (attnames); return natural key -> id.

    `match` (column, values) selects the stored rows that could match. Only rows whose values
    differ are updated, and a field a row leaves out (a KEEP default) keeps its stored value.
    New rows go in with ON CONFLICT DO UPDATE because ingest may register the same node or GPU
    between our read and our insert. Keys of one field are returned bare, longer ones as tuples.
    """
    fields = sorted({f for row in rows for f in row} - set(key))
    stored = _stored(model, ["id", *key, *fields], *match)
    existing = {tuple(s[k] for k in key): s for s in stored}
    found, new, changed, touched = {}, [], [], set()
    for row in rows:
        natural = tuple(row[k] for k in key)
        old = existing.get(natural)
        if old is None:
            new.append(model(**row))
            continue
        found[natural] = old["id"]
        diff = [f for f in fields if f in row and old[f] != row[f]]
        if diff:
            changed.append(model(**{**old, **row}))
            touched.update(diff)
    if changed:
        model.objects.bulk_update(changed, sorted(touched), batch_size=BATCH)
    if new and fields:
        model.objects.bulk_create(new, batch_size=BATCH, update_conflicts=True,
                                  unique_fields=list(key), update_fields=fields)
    elif new:
        model.objects.bulk_create(new, batch_size=BATCH)
    found.update({tuple(getattr(o, k) for k in key): o.pk for o in new})
    counts.created += len(new)
    counts.updated += len(changed)
    counts.unchanged += len(rows) - len(new) - len(changed)
    return found if len(key) > 1 else {k[0]: pk for k, pk in found.items()}


def _write_places(plan: Plan, result: ImportResult, ids: dict[str, dict]) -> None:
    sites = _upsert(Site, ("name",), [dict(r.values) for r in plan.sites], result["sites"],
                    ("name", [r.values["name"] for r in plan.sites]))
    hall_rows = [{**r.values, "site_id": sites[r.parent]} for r in plan.halls]
    halls = _upsert(Hall, ("site_id", "name"), hall_rows, result["halls"],
                    ("site_id", list(sites.values())))
    row_rows = [{**r.values, "hall_id": halls[(sites[r.parent[0]], r.parent[1])]}
                for r in plan.rows]
    rows = _upsert(Row, ("hall_id", "name"), row_rows, result["rows"],
                   ("hall_id", list(halls.values())))

    def row_id(parent: tuple[str, str, str]) -> int:
        site, hall, row = parent
        return rows[(halls[(sites[site], hall)], row)]

    rack_rows = [{**r.values, "row_id": row_id(r.parent)} for r in plan.racks]
    ids["racks"] = _upsert(Rack, ("name",), rack_rows, result["racks"],
                           ("name", [r["name"] for r in rack_rows]))
    ids.update(sites=sites, halls=halls, rows=rows)


def _write_nodes(plan: Plan, result: ImportResult, ids: dict[str, dict]) -> None:
    racks = ids["racks"]
    domain_rows = [{**d.values, "rack_id": racks.get(d.refs.get("rack"))} for d in plan.domains]
    ids["domains"] = _upsert(
        NvlinkDomain, ("name",), domain_rows, result["nvlink_domains"],
        ("name", [r["name"] for r in domain_rows]),
    )
    node_rows = [
        {**n.values, "rack_id": racks[n.parent],
         "nvlink_domain_id": ids["domains"].get(n.refs.get("nvlink_domain"))}
        for n in plan.nodes
    ]
    ids["nodes"] = _upsert(Node, ("hostname",), node_rows, result["nodes"],
                           ("hostname", [r["hostname"] for r in node_rows]))
    gpu_rows = [{**g.values, "node_id": ids["nodes"][g.parent]} for g in plan.gpus]
    # By UUID alone: a GPU the file puts under another node is moved there, keeping its id.
    ids["gpus"] = _upsert(Gpu, ("uuid",), gpu_rows, result["gpus"],
                          ("uuid", [r["uuid"] for r in gpu_rows]))
    _unslot(list(ids["gpus"].values()), result)
    mig_rows = [{**m.values, "gpu_id": ids["gpus"][m.parent]} for m in plan.migs]
    ids["migs"] = _upsert(MigInstance, ("gpu_id", "gi_id", "ci_id"), mig_rows,
                          result["mig_instances"],
                          ("gpu_id", list(ids["gpus"].values())))


def _write_fabric(plan: Plan, result: ImportResult, ids: dict[str, dict]) -> None:
    # A switch moved out of its rack must lose its U as well; top-level ones have no "u" key.
    switch_rows = [{"u_position": None, **s.values, "rack_id": ids["racks"].get(s.parent)}
                   for s in plan.switches]
    ids["switches"] = _upsert(Switch, ("name",), switch_rows, result["switches"],
                              ("name", [r["name"] for r in switch_rows]))
    owners = {"node": ("node_id", ids["nodes"]), "switch": ("switch_id", ids["switches"])}
    ids["ports"] = {}
    for kind, (column, owner_ids) in owners.items():
        records = [p for p in plan.ports if p.parent[0] == kind]
        rows = [{**p.values, column: owner_ids[p.parent[1]]} for p in records]
        found = _upsert(Port, (column, "name"), rows, result["ports"],
                        (column, list(owner_ids.values())))
        for port, row in zip(records, rows, strict=True):
            ids["ports"][(port.parent[1], row["name"])] = found[(row[column], row["name"])]


def _write_links(plan: Plan, result: ImportResult, ids: dict[str, dict], *, replace: bool) -> None:
    """Links by their (unordered) port pair.

    A stored link that shares a port with a link in the file, but is not that link, was
    re-cabled and is deleted (a port has one cable). With replace, every stored link that the
    file does not list is deleted.
    """
    counts, ports = result["links"], ids["ports"]
    wanted: dict[frozenset, tuple[int, int]] = {}
    for link in plan.links:
        (a_owner, a_port, _), (b_owner, b_port, _) = link.refs["ends"]
        a, b = ports[(a_owner, a_port)], ports[(b_owner, b_port)]
        wanted[frozenset((a, b))] = (a, b)
    cabled, columns = [p for pair in wanted for p in pair], ["id", "a_id", "b_id"]
    if replace:
        stored = list(Link.objects.values(*columns))
    else:
        stored = _stored(Link, columns, "a_id", cabled) + _stored(Link, columns, "b_id", cabled)
    kept, stale = set(), set()
    for link in stored:
        pair = frozenset((link["a_id"], link["b_id"]))
        if pair in wanted:
            kept.add(pair)
        else:
            stale.add(link["id"])
    if stale:
        Link.objects.filter(pk__in=stale).delete()
    new = [Link(a_id=a, b_id=b) for pair, (a, b) in wanted.items() if pair not in kept]
    Link.objects.bulk_create(new, batch_size=BATCH)
    counts.created, counts.unchanged, counts.removed = len(new), len(kept), len(stale)


def _power_levels(power: list[Rec]) -> list[list[Rec]]:
    """Devices grouped by distance from the top of their upstream chain (validated acyclic)."""
    by_name = {p.values["name"]: p for p in power}
    depth: dict[str, int] = {}
    for rec in power:
        chain, name = [], rec.values["name"]
        while name is not None and name not in depth:
            chain.append(name)
            name = by_name[name].refs.get("upstream")
        level = depth[name] + 1 if name is not None else 0
        for name in reversed(chain):
            depth[name], level = level, level + 1
    levels: dict[int, list[Rec]] = defaultdict(list)
    for rec in power:
        levels[depth[rec.values["name"]]].append(rec)
    return [levels[d] for d in sorted(levels)]


def _write_power(plan: Plan, result: ImportResult, ids: dict[str, dict]) -> None:
    # Upstream devices are written first, so each level can point at ids that already exist.
    devices: dict[str, int] = {}
    for level in _power_levels(plan.power):
        rows = [{**p.values, "upstream_id": devices.get(p.refs.get("upstream"))} for p in level]
        match = ("name", [r["name"] for r in rows])
        devices.update(_upsert(PowerDevice, ("name",), rows, result["power_devices"], match))
    ids["power"] = devices
    counts = result["power_feeds"]
    for attr, column, targets in (("racks", "rack_id", ids["racks"]),
                                  ("nodes", "node_id", ids["nodes"])):
        through = getattr(PowerDevice, attr).through
        wanted = {(devices[p.values["name"]], targets[name])
                  for p in plan.power for name, _ in p.refs.get(attr, [])}
        rows = _stored(through, ["id", "powerdevice_id", column], "powerdevice_id",
                       list(devices.values()))
        stored = {(r["powerdevice_id"], r[column]): r["id"] for r in rows}
        stale = [pk for pair, pk in stored.items() if pair not in wanted]
        through.objects.filter(pk__in=stale).delete()
        new = [through(powerdevice_id=d, **{column: t}) for d, t in wanted - stored.keys()]
        through.objects.bulk_create(new, batch_size=BATCH)
        counts.created += len(new)
        counts.removed += len(stale)
        counts.unchanged += len(wanted) - len(new)


def _unslot(named: list[int], result: ImportResult) -> None:
    """A GPU the file does not name loses its slot (its index) when the file puts another GPU there:
    it was swapped out, and whatever finds a GPU by node and index (the scheduler's allocations)
    must find the one there now. It keeps its row and history."""
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE telemetry_gpu o SET index = NULL FROM telemetry_gpu n WHERE n.id = ANY(%(named)s)"
            " AND o.node_id = n.node_id AND o.index = n.index AND NOT o.id = ANY(%(named)s)",
            {"named": named})
        result["gpus"].removed += cur.rowcount


def _delete(queryset: models.QuerySet) -> int:
    return queryset.delete()[1].get(queryset.model._meta.label, 0)


def _prune(ids: dict[str, dict], result: ImportResult) -> None:
    """Remove what the file does not name, children first (links went in _write_links).

    Ports on nodes the file does not name are kept: telemetry registers them, and the node keeps
    its history. GPUs are never deleted (`_unslot` takes a swapped-out GPU's slot away).
    """
    def keep(kind: str) -> list[int]:
        return list(ids[kind].values())

    migs = MigInstance.objects.filter(gpu_id__in=keep("gpus")).exclude(pk__in=keep("migs"))
    result["mig_instances"].removed += _delete(migs)
    ports = Port.objects.filter(Q(node_id__in=keep("nodes")) | Q(switch__isnull=False))
    result["ports"].removed += _delete(ports.exclude(pk__in=keep("ports")))
    result["switches"].removed += _delete(Switch.objects.exclude(pk__in=keep("switches")))
    devices = PowerDevice.objects.exclude(pk__in=keep("power"))
    devices.update(upstream=None)  # PROTECT would refuse a device whose downstream goes too
    deleted = devices.delete()[1]
    result["power_devices"].removed += deleted.get(PowerDevice._meta.label, 0)
    feeds = (PowerDevice.racks.through, PowerDevice.nodes.through)
    result["power_feeds"].removed += sum(deleted.get(m._meta.label, 0) for m in feeds)
    unplaced = Node.objects.exclude(pk__in=keep("nodes")).filter(
        Q(rack__isnull=False) | Q(nvlink_domain__isnull=False)
    ).update(rack=None, u_position=None, nvlink_domain=None)
    result["nodes"].removed += unplaced
    domains = NvlinkDomain.objects.exclude(pk__in=keep("domains"))
    result["nvlink_domains"].removed += _delete(domains)
    for kind, model in (("racks", Rack), ("rows", Row), ("halls", Hall), ("sites", Site)):
        result[kind].removed += _delete(model.objects.exclude(pk__in=keep(kind)))
