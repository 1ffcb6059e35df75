"""The search box's telemetry half: nodes, GPUs, jobs, racks, switches and fabric ports.

`search(q, limit=, narrow=)` returns {kind: {"hits": [...], "more": bool}} for the kinds with a
match. A hit is {"kind", "key", "label", "detail", "match", "state", "state_detail"}: `key` is what
the entity's page URL carries, `match` how well it matched (exact, prefix, contains: each compared
case-insensitively) and `state` its health from the one health model (`telemetry.health`) for
hardware, the scheduler's state for jobs. Within a kind, hits run best match first, then the ones that need
looking at (unhealthy hardware, running and pending jobs), then by name or newest job.

`narrow(queryset)` is how a caller scopes what a user may see (the dashboard passes tenancy's
`visible`); telemetry itself knows nothing of tenants. Every kind is one LIMITed query (limit + 1
rows, to tell "more" apart), and the states of the hits come from one read of each last-value
table by primary key; which index serves each query is said where it is built.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime

from django.db.models import Case, Count, IntegerField, Q, QuerySet, Value, When
from django.utils import timezone

from telemetry import health
from telemetry.models import Gpu, Job, JobState, Node, Port, Rack, Switch
from telemetry.selectors.inventory import job_key

EXACT, PREFIX, CONTAINS = "exact", "prefix", "contains"
TIERS = (EXACT, PREFIX, CONTAINS)
KINDS = ("node", "gpu", "job", "rack", "switch", "port")
MAX_QUERY = 200  # longer than any name, UUID or key this fleet holds
# Shorter fragments match most of the fleet: no use to anyone typing, and a scan for nothing.
MIN_CONTAINS = 2
ACTIVE_JOB_STATES = (JobState.RUNNING, JobState.PENDING)

# "node-0227 gpu 7", "node-0227 gpu7", "gpu-0227/7", "node-0227:7", "node-0227#7".
_GPU_AT = re.compile(r"^(?P<host>[a-z0-9][a-z0-9._-]*?)(?:\s*[/:#]\s*|\s+gpu\s*|\s+)(?:gpu\s*)?(?P<index>\d{1,2})$",
                     re.IGNORECASE)
# "leaf-03/p12", "leaf-03:p12", "gpu-0001/mlx5_0/1" (the owner ends at the first / or :).
_PORT_AT = re.compile(r"^(?P<owner>[^/:\s]+)\s*[/:]\s*(?P<port>\S*)$")
_HEX = re.compile(r"[0-9a-f-]+")
_GUID = re.compile(r"(?:0x)?[0-9a-f]{4,16}")

Narrow = Callable[[QuerySet], QuerySet]


def search(q: str | None, limit: int = 20, *, narrow: Narrow | None = None, now: datetime | None = None) -> dict:
    """{kind: {"hits": [...], "more": bool}} for each kind `q` names; {} for a blank or over-long query."""
    q = clean_query(q)
    if not q or limit <= 0:
        return {}
    narrow = narrow or (lambda qs: qs)
    now = now or timezone.now()
    finders = {"node": _nodes, "gpu": _gpus, "job": _jobs, "rack": _racks, "switch": _switches, "port": _ports}
    found = {kind: finders[kind](q, limit + 1, narrow, now) for kind in KINDS}
    return {kind: {"hits": hits[:limit], "more": len(hits) > limit} for kind, hits in found.items() if hits}


def clean_query(q: str | None) -> str:
    """The query as searched: trimmed, "" when blank, too long or holding control characters (NUL
    would make PostgreSQL refuse the statement)."""
    q = (q or "").strip()
    if len(q) > MAX_QUERY or any(ord(c) < 32 or ord(c) == 127 for c in q):
        return ""
    return q


def tiered(qs: QuerySet, fields: tuple[str, ...], q: str) -> QuerySet:
    """`qs` filtered to rows where any of `fields` holds `q` (case-insensitive), annotated with `tier`:
    0 exact, 1 prefix, 2 contains. A query shorter than MIN_CONTAINS matches exactly or by prefix only."""
    cases, match = [], Q()
    for tier, lookup in enumerate(("iexact", "istartswith", "icontains")):
        if tier == 2 and len(q) < MIN_CONTAINS:
            break
        cond = Q()
        for f in fields:
            cond |= Q(**{f"{f}__{lookup}": q})
        cases.append(When(cond, then=Value(tier)))
        match |= cond
    return qs.filter(match).annotate(tier=Case(*cases, default=Value(2), output_field=IntegerField()))


def _ranked(hits: list[dict], limit: int) -> list[dict]:
    """Best tier first, then the states that need a look, then label (the SQL order already broke ties)."""
    return sorted(hits, key=lambda h: (TIERS.index(h["match"]), health.RANK.get(h["state"], 9), h["label"]))[:limit]


# --- Health of the hits: the one health model (telemetry.health) --------------------------------

def _grouped_state(states: list[str]) -> str:
    """A rack's or switch's state from its members' (nodes', ports'): the health model's rack rule,
    so one bad port of a switch reads degraded, not failed."""
    return health.rack_state_from(states)


def _unwell(states: list[str]) -> str:
    bad = sum(s != "ok" for s in states)
    return f"{bad} not ok" if bad else ""


# --- Nodes and racks -----------------------------------------------------------------------------

def _nodes(q: str, limit: int, narrow: Narrow, now: datetime) -> list[dict]:
    """Hostname, case-insensitive: exact, prefix, fragment. UPPER(hostname) LIKE scans the node
    table (one row per host: 256 at 2,048 GPUs), ordered by tier then hostname."""
    nodes = list(tiered(narrow(Node.objects.all()), ("hostname",), q).select_related("rack")
                 .annotate(gpu_total=Count("gpus")).order_by("tier", "hostname")[:limit])
    return _ranked(_node_hits(nodes, now), limit)


def _node_hits(nodes: list[Node], now: datetime) -> list[dict]:
    states = health.node_health([n.id for n in nodes], now=now)
    return [{"kind": "node", "key": n.hostname, "label": n.hostname, "match": TIERS[n.tier],
             "state": states[n.id].state, "state_detail": states[n.id].detail,
             "detail": " · ".join([f"rack {n.rack.name}" if n.rack_id else "unplaced", f"{n.gpu_total} GPUs",
                                   n.state])}
            for n in nodes]


def _racks(q: str, limit: int, narrow: Narrow, now: datetime) -> list[dict]:
    """Rack name (unique index; a fragment scans the rack table), with its nodes' worst health."""
    racks = list(tiered(narrow(Rack.objects.all()), ("name",), q).select_related("row__hall")
                 .order_by("tier", "name")[:limit])
    nodes = list(Node.objects.filter(rack__in=racks).values_list("id", "rack_id"))
    states = health.node_health([n for n, _ in nodes], now=now)
    hits = []
    for r in racks:
        mine = [states[n].state for n, rack in nodes if rack == r.id]
        hits.append({"kind": "rack", "key": r.name, "label": r.name, "match": TIERS[r.tier],
                     "state": _grouped_state(mine), "state_detail": _unwell(mine),
                     "detail": f"hall {r.row.hall.name} row {r.row.name} · {len(mine)} nodes"})
    return _ranked(hits, limit)


# --- GPUs ----------------------------------------------------------------------------------------

def _gpus(q: str, limit: int, narrow: Narrow, now: datetime) -> list[dict]:
    """A GPU by host and index ("node-0227 gpu 7"), by UUID (prefix, "GPU-" optional) or serial."""
    base = narrow(Gpu.objects.all()).select_related("node")
    found: list[tuple[Gpu, str]] = []
    at = _GPU_AT.match(q)
    if at:
        found += _gpus_at(base, at["host"], int(at["index"]), limit)
    found += [(g, EXACT) for g in base.filter(uuid=q)[:1]]  # whatever its spelling (telemetry_gpu_uuid_key)
    hex_part = (q[4:] if q.lower().startswith("gpu-") else q).lower()
    if len(hex_part) >= MIN_CONTAINS and _HEX.fullmatch(hex_part):
        # telemetry_gpu_uuid_*_like (varchar_pattern_ops): NVIDIA prints the hex in lower case.
        uuid = f"GPU-{hex_part}"
        found += [(g, EXACT if g.uuid == uuid else PREFIX) for g in base.filter(uuid__startswith=uuid)[:limit]]
    # gpu_serial_idx serves the exact serial; a prefix scans the GPU table (2,048 rows), only from 4 characters.
    serial = base.filter(Q(serial=q) | Q(serial__startswith=q) if len(q) >= 4 else Q(serial=q))
    found += [(g, EXACT if g.serial == q else PREFIX) for g in serial.order_by("serial")[:limit]]
    return _gpu_hits(found, limit, now)


def _gpus_at(base: QuerySet, host: str, index: int, limit: int) -> list[tuple[Gpu, str]]:
    """GPU `index` of the hosts whose name holds `host`: exact host, then prefix, then fragment."""
    rows = tiered(base.filter(index=index), ("node__hostname",), host).order_by("tier", "node__hostname")[:limit]
    return [(g, TIERS[g.tier]) for g in rows]


def _gpu_hits(found: list[tuple[Gpu, str]], limit: int, now: datetime) -> list[dict]:
    best: dict[int, tuple[Gpu, str]] = {}
    for g, match in found:
        if g.id not in best or TIERS.index(match) < TIERS.index(best[g.id][1]):
            best[g.id] = (g, match)
    states = health.gpu_health(list(best), now=now) if best else {}
    hits = [{"kind": "gpu", "key": g.uuid, "label": f"{g.node.hostname} GPU {g.index}" if g.index is not None
             else g.uuid, "match": match, "state": states[g.id].state, "state_detail": states[g.id].detail,
             "detail": " · ".join(filter(None, [g.uuid, g.model, f"serial {g.serial}" if g.serial else ""]))}
            for g, match in best.values()]
    return _ranked(hits, limit)


# --- Jobs ----------------------------------------------------------------------------------------

def _jobs(q: str, limit: int, narrow: Narrow, now: datetime) -> list[dict]:
    """A job by key (`slurm:1234`), scheduler id (exact or prefix: a pod UID's first characters do),
    name or user (exact, prefix, fragment); running and pending before finished, newest first.

    The key uses job_unique_per_source (source, external_id); ids, names and users use the indexes
    of migration 0013 (the job table keeps every job ever run, so a scan would grow with it).
    """
    base = narrow(Job.objects.all())
    source, sep, ext = q.partition(":")
    if sep and source.strip().lower() in Job.Source.values:
        rows = base.filter(source=source.strip().lower(), external_id=ext.strip()) if ext.strip() else base.none()
        return [_job_hit(j, EXACT) for j in rows[:limit]]
    tiers = [Q(external_id=q) | Q(name__iexact=q) | Q(user__iexact=q),
             Q(external_id__startswith=q) | Q(name__istartswith=q) | Q(user__istartswith=q)]
    if len(q) >= MIN_CONTAINS:
        tiers.append(Q(name__icontains=q) | Q(user__icontains=q))
    tier = Case(*[When(c, then=Value(i)) for i, c in enumerate(tiers)], default=Value(2), output_field=IntegerField())
    active = Case(When(state__in=ACTIVE_JOB_STATES, then=Value(0)), default=Value(1), output_field=IntegerField())
    # The WHERE holds only the widest test per column (an exact or prefix match is also a fragment), so
    # each column is one arm of a BitmapOr: job_external_id_pattern and job_search_text_trgm (0013).
    text = "icontains" if len(q) >= MIN_CONTAINS else "istartswith"
    match = Q(external_id__startswith=q) | Q(**{f"name__{text}": q}) | Q(**{f"user__{text}": q})
    rows = base.filter(match).annotate(tier=tier, active=active).order_by("tier", "active", "-id")[:limit]
    return [_job_hit(j, TIERS[j.tier]) for j in rows]


def _job_hit(job: Job, match: str) -> dict:
    key = job_key(job.source, job.external_id)
    return {"kind": "job", "key": key, "label": f"{key} {job.name}".strip(), "match": match, "state": job.state,
            "source": job.source, "account": job.account,
            "detail": " · ".join(filter(None, [job.user, job.account, JobState(job.state).label]))}


# --- Fabric: switches and ports ------------------------------------------------------------------

def _switches(q: str, limit: int, narrow: Narrow, now: datetime) -> list[dict]:
    """Switch name (unique index; a fragment scans the switch table), with its ports' worst health."""
    switches = list(tiered(narrow(Switch.objects.all()), ("name",), q).select_related("rack")
                    .order_by("tier", "name")[:limit])
    ports = list(Port.objects.filter(switch__in=switches).values_list("id", "switch_id"))
    states = health.port_health([pid for pid, _ in ports], now=now) if ports else {}
    hits = []
    for s in switches:
        mine = [states[pid].state for pid, sid in ports if sid == s.id]
        where = f"rack {s.rack.name}" if s.rack_id else ""
        hits.append({"kind": "switch", "key": s.name, "label": s.name, "match": TIERS[s.tier],
                     "state": _grouped_state(mine), "state_detail": _unwell(mine),
                     "detail": " · ".join(filter(None, [s.get_role_display(), where, f"{len(mine)} ports"]))})
    return _ranked(hits, limit)


def _ports(q: str, limit: int, narrow: Narrow, now: datetime) -> list[dict]:
    """A fabric port by owner and name ("leaf-03/p12", "gpu-0001/mlx5_0/1"), by name alone
    ("mlx5_2", "p12"), by GUID (prefix, "0x" optional) or by LID. An owner's ports come through
    port_unique_on_switch / _on_node; a bare name, GUID or LID scans the port table (a few rows per GPU)."""
    exact, prefix = Q(name__iexact=q), Q(pk__in=[])
    at = _PORT_AT.match(q)
    if at:
        owner = Q(switch__name__iexact=at["owner"]) | Q(node__hostname__iexact=at["owner"])
        exact |= owner & Q(name__iexact=at["port"])
        prefix |= owner & Q(name__istartswith=at["port"])
    if _GUID.fullmatch(q.lower()):
        guid = q.lower() if q.lower().startswith("0x") else f"0x{q.lower()}"
        exact, prefix = exact | Q(guid__iexact=guid), prefix | Q(guid__istartswith=guid)
    if q.isdigit() and len(q) <= 6:  # a LID is 16 bits
        exact |= Q(lid=int(q))
    tier = Case(When(exact, then=Value(0)), default=Value(1), output_field=IntegerField())
    ports = list(narrow(Port.objects.all()).select_related("switch", "node").filter(exact | prefix)
                 .annotate(tier=tier).order_by("tier", "switch__name", "node__hostname", "name")[:limit])
    states = health.port_health([p.id for p in ports], now=now) if ports else {}
    return _ranked([_port_hit(p, states[p.id]) for p in ports], limit)


def _port_hit(p: Port, h: health.Health) -> dict:
    owner = p.switch.name if p.switch_id else p.node.hostname
    return {"kind": "port", "key": str(p.id), "label": f"{owner}/{p.name}", "match": TIERS[p.tier],
            "state": h.state, "state_detail": h.detail,
            "detail": " · ".join(filter(None, [
                f"{p.switch.get_role_display().lower()} switch port" if p.switch_id else "HCA port",
                f"rail {p.rail}" if p.rail is not None else "", p.guid, f"LID {p.lid}" if p.lid is not None else "",
                f"{p.speed_gbps:g} Gb/s" if p.speed_gbps else ""]))}
