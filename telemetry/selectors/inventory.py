"""Read-side queries for the GPU and node drill-downs and the allocation ledger.

Everything returned is JSON-able (ISO 8601 strings for times, None where there is no data), so a
Dash callback can hand it to the page unchanged. A GPU or node nobody knows gives None, never an
exception. Each function is a handful of statements whatever the fleet size: lookups by unique
key, the last-value table by primary key, and the ledger by its (gpu, start) / (node, end) indexes.

The small helpers here (latest GPU values, GPU health, a node's fabric peers) are shared with the
Jobs selectors in `telemetry.selectors.jobs`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from django.contrib.postgres.aggregates import ArrayAgg
from django.db import connection
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from telemetry import health as health_model
from telemetry.fields import KINDS
from telemetry.health import health_fields
from telemetry.models import SAMPLE_MODELS, Allocation, Gpu, GpuEvent, Job, JobState, Node, Port, PowerDevice

GPU_LATEST = SAMPLE_MODELS["gpu"]["latest"]
# The columns the health rule and the drill-down tiles need from the last-value table.
HEALTH_FIELDS = (
    "gpu_util", "gpu_temp", "memory_temp", "power_w", "power_limit_w", "ecc_dbe_vol", "xid",
    "throttle_reasons", "row_remap_failure", "row_remap_pending",
)


def iso(moment: datetime | None) -> str | None:
    """ISO 8601 in UTC, or None."""
    return None if moment is None else moment.astimezone(UTC).isoformat()


def job_key(source: str, external_id: str) -> str:
    """The key a job's page URL uses: `source:external_id`."""
    return f"{source}:{external_id}"


# --- Latest values and health ------------------------------------------------------------------

def gpu_ids(uuids: Iterable[str]) -> dict[str, int]:
    """GPU uuid -> id, for the uuids the inventory knows."""
    return dict(Gpu.objects.filter(uuid__in=list(uuids)).values_list("uuid", "id"))


def node_ids(hostnames: Iterable[str]) -> dict[str, int]:
    """Hostname -> node id, for the hostnames the inventory knows."""
    return dict(Node.objects.filter(hostname__in=list(hostnames)).values_list("hostname", "id"))


def entity_id(kind: str, key: str | None) -> int | None:
    """The id of the GPU (by uuid), port (by id) or node (by hostname) `key` names, or None."""
    if not key:
        return None
    if kind == "gpu":
        return Gpu.objects.filter(uuid=key).values_list("id", flat=True).first()
    if kind == "port":
        return Port.objects.filter(pk=int(key)).values_list("id", flat=True).first() if key.isdigit() else None
    return Node.objects.filter(hostname=key).values_list("id", flat=True).first()


def gpu_uuid(gpu_id: int) -> str | None:
    """The uuid of GPU `gpu_id`, or None when there is none."""
    return Gpu.objects.filter(pk=gpu_id).values_list("uuid", flat=True).first()


def node_gpus(node_id: int) -> list[tuple[int, int | None, str]]:
    """(id, index, uuid) of every GPU of node `node_id`, by index."""
    return list(Gpu.objects.filter(node_id=node_id).order_by("index", "id").values_list("id", "index", "uuid"))


def latest_gpu_rows(gpu_ids: Iterable[int], fields: Iterable[str] = HEALTH_FIELDS) -> dict[int, dict]:
    """{gpu_id: {"time": ..., field: value}} from the GPU last-value table (its primary key)."""
    ids = [i for i in set(gpu_ids) if i is not None]
    if not ids:
        return {}
    rows = GPU_LATEST.objects.filter(gpu_id__in=ids).values("gpu_id", "time", *fields)
    return {r.pop("gpu_id"): r for r in rows}


def gpu_tile(latest: dict | None, h: health_model.Health) -> dict:
    """Utilization, temperature, power and health of one GPU, as the drill-downs show them.

    Values older than the health model's freshness limit are not current, so a tile carries
    none of them: the page shows the state and how old the newest sample is instead."""
    latest = latest if latest and h.fresh else {}
    return {
        "gpu_util": latest.get("gpu_util"), "gpu_temp": latest.get("gpu_temp"),
        "power_w": latest.get("power_w"), "sample_time": iso(latest.get("time")),
        **health_fields(h),
    }


# --- Fabric ------------------------------------------------------------------------------------

# Each HCA port of the given nodes with the switch at the far end of its cable. A link stores its
# ends as (a, b) in either order, so both directions are joined; each side uses the unique index
# on telemetry_link.a_id / b_id, and the node's ports come from telemetry_port's node_id index.
_PEERS_SQL = """
SELECT p.id, p.node_id, p.name, p.rail, p.guid, p.lid, p.link_layer, p.speed_gbps,
       s.name, s.role, q.name
FROM telemetry_port p
LEFT JOIN LATERAL (
    SELECT l.b_id AS peer_id FROM telemetry_link l WHERE l.a_id = p.id
    UNION ALL
    SELECT l.a_id FROM telemetry_link l WHERE l.b_id = p.id
) peer ON true
LEFT JOIN telemetry_port q ON q.id = peer.peer_id
LEFT JOIN telemetry_switch s ON s.id = q.switch_id
WHERE p.node_id = ANY(%s)
ORDER BY p.node_id, p.rail NULLS LAST, p.name
"""


def node_ports(node_ids: Iterable[int]) -> dict[int, list[dict]]:
    """{node_id: [HCA port with its peer switch]}, lowest rail first."""
    ids = sorted(set(node_ids))
    if not ids:
        return {}
    out: dict[int, list[dict]] = {}
    with connection.cursor() as cur:
        cur.execute(_PEERS_SQL, [ids])
        for pid, node_id, name, rail, guid, lid, layer, speed, switch, role, peer_port in cur.fetchall():
            out.setdefault(node_id, []).append({
                "id": pid, "name": name, "rail": rail, "guid": guid, "lid": lid, "link_layer": layer,
                "speed_gbps": speed,
                "peer": {"switch": switch, "role": role, "port": peer_port} if switch else None,
            })
    return out


def node_leaves(node_ids: Iterable[int]) -> dict[int, list[str]]:
    """{node_id: leaf switch names}, one per rail, lowest rail first (a node may sit under several)."""
    out: dict[int, list[str]] = {}
    for node_id, ports in node_ports(node_ids).items():
        for port in ports:
            peer = port["peer"]
            if peer and peer["role"] == "leaf" and peer["switch"] not in out.get(node_id, []):
                out.setdefault(node_id, []).append(peer["switch"])
    return out


# --- Locations ---------------------------------------------------------------------------------

def location(node: Node) -> dict:
    """Site, hall, row, rack and U position of a node (select_related the chain first)."""
    rack = node.rack
    row = rack.row if rack else None
    hall = row.hall if row else None
    return {
        "site": hall.site.name if hall else None, "hall": hall.name if hall else None,
        "row": row.name if row else None, "rack": rack.name if rack else None,
        "u_position": node.u_position, "u_height": node.u_height,
        "nvlink_domain": node.nvlink_domain.name if node.nvlink_domain_id else None,
        "nvlink_domain_kind": node.nvlink_domain.kind if node.nvlink_domain_id else None,
    }


_NODE_CHAIN = ("rack__row__hall__site", "nvlink_domain")


# --- GPU drill-down ----------------------------------------------------------------------------

def gpu_detail(uuid: str, *, now: datetime | None = None) -> dict | None:
    """One GPU: where it sits, what it is, who holds it, and its latest value of every field.

    `uuid` may omit the "GPU-" prefix. None if no GPU has that UUID.
    """
    now = now or timezone.now()
    uuid = uuid.strip()
    uuid = f"GPU-{uuid[4:] if uuid.upper().startswith('GPU-') else uuid}"
    chain = [f"node__{c}" for c in _NODE_CHAIN]
    gpu = Gpu.objects.select_related(*chain).filter(uuid=uuid).first()  # telemetry_gpu_uuid_key
    if gpu is None:
        return None
    node = gpu.node
    fields = KINDS["gpu"].fields
    latest = latest_gpu_rows([gpu.id], [f.name for f in fields]).get(gpu.id)
    h = health_model.gpu_health([gpu.id], now=now)[gpu.id]
    last_xid = _newer_xid_event(gpu.id, latest["time"] if latest else None)
    allocations = _current_allocations(Allocation.objects.filter(gpu=gpu, end__isnull=True))
    return {
        "id": gpu.id, "uuid": gpu.uuid, "index": gpu.index, "model": gpu.model, "serial": gpu.serial,
        "pci_bus_id": gpu.pci_bus_id, "driver": gpu.driver, "mig_mode": gpu.mig_mode,
        "mig_instances": list(gpu.mig_instances.order_by("gi_id", "ci_id").values("id", "gi_id", "ci_id", "profile")),
        "node": {"id": node.id, "hostname": node.hostname, "state": node.state, "system_model": node.system_model},
        "location": location(node),
        **health_fields(h),
        "allocation": allocations[0] if allocations else None,
        "allocations": allocations,
        "sample_time": iso(latest["time"]) if latest else None,
        "latest": [
            {"name": f.name, "label": f.help, "unit": f.unit, "kind": f.kind, **_value(f.name, latest, last_xid)}
            for f in fields
        ],
        "fields": [{"name": f.name, "label": f.help, "unit": f.unit, "kind": f.kind} for f in fields],
    }


def _newer_xid_event(gpu_id: int, sample_time: datetime | None) -> tuple[int, datetime] | None:
    """(code, time) of the GPU's newest XID event when it is newer than its last sample.

    dcgm-exporter's XID gauge is a last value and a GPU that fell off the bus never reports
    again, so the event log (kmsg, NVML events) is the newer truth for "last XID"."""
    ev = (GpuEvent.objects.filter(gpu_id=gpu_id, kind__in=("xid", "fallen_off_bus"))
          .order_by("-last_seen").values_list("code", "kind", "last_seen").first())
    if ev is None or (sample_time is not None and ev[2] <= sample_time):
        return None
    return (ev[0] or 79 if ev[1] == "fallen_off_bus" else ev[0]), ev[2]


def _value(name: str, latest: dict | None, last_xid: tuple[int, datetime] | None) -> dict:
    if name == "xid" and last_xid:
        return {"value": last_xid[0], "time": iso(last_xid[1])}
    return {"value": latest.get(name) if latest else None, "time": iso(latest["time"]) if latest else None}


def _current_allocations(queryset) -> list[dict]:
    """Open allocations as job summaries, newest first (a MIG or shared GPU can hold several)."""
    rows = queryset.select_related("job").order_by("-start", "gpu_index")
    return [
        {"job_id": a.job_id, "key": job_key(a.job.source, a.job.external_id), "name": a.job.name,
         "user": a.job.user, "account": a.job.account, "tenant": a.job.account, "state": a.job.state,
         "gpu_index": a.gpu_index, "fraction": a.fraction, "start": iso(a.start)}
        for a in rows
    ]


# --- Node drill-down ---------------------------------------------------------------------------

def node_detail(hostname: str, *, now: datetime | None = None) -> dict | None:
    """One node: location, state, health, GPUs with their latest tiles, HCA ports with the switch
    at the far end, the power devices feeding it and the jobs on it now. None if unknown."""
    now = now or timezone.now()
    node = Node.objects.select_related(*_NODE_CHAIN).filter(hostname=hostname.strip()).first()
    if node is None:
        return None
    gpus = list(node.gpus.order_by("index", "id"))
    latest = latest_gpu_rows(g.id for g in gpus)
    healths = health_model.gpu_health([g.id for g in gpus], now=now)
    tiles = [{"id": g.id, "uuid": g.uuid, "index": g.index, "model": g.model, "mig_mode": g.mig_mode,
              **gpu_tile(latest.get(g.id), healths[g.id])} for g in gpus]
    h = health_model.node_health([node.id], now=now)[node.id]
    # allocation_node_end_idx: WHERE node_id = %s AND end IS NULL.
    open_allocs = Allocation.objects.filter(node=node, end__isnull=True)
    return {
        "id": node.id, "hostname": node.hostname, "state": node.state, "system_model": node.system_model,
        "placed": node.placed, "location": location(node),
        **health_fields(h),
        "gpus": tiles,
        "ports": _with_port_health(node_ports([node.id]).get(node.id, []), now),
        "power_devices": _power_devices(node),
        "jobs": _jobs_on(open_allocs),
    }


def _with_port_health(ports: list[dict], now: datetime) -> list[dict]:
    """Each HCA port with its state from the health model (its negotiated speed shows a slow link)."""
    states = health_model.port_health([p["id"] for p in ports], now=now) if ports else {}
    return [{**p, **health_fields(states[p["id"]])} for p in ports]


def _power_devices(node: Node) -> list[dict]:
    """Devices wired to the node itself, then those feeding its rack."""
    match = Q(nodes=node) | Q(racks=node.rack_id) if node.rack_id else Q(nodes=node)
    feeds_node = PowerDevice.nodes.through.objects.filter(powerdevice_id=OuterRef("pk"), node_id=node.id)
    devices = (PowerDevice.objects.filter(match).distinct().select_related("upstream")
               .annotate(direct=Exists(feeds_node)))
    out = [
        {"id": d.id, "name": d.name, "kind": d.kind, "capacity_w": d.capacity_w,
         "upstream": d.upstream.name if d.upstream_id else None, "via": "node" if d.direct else "rack"}
        for d in devices
    ]
    return sorted(out, key=lambda d: (d["via"] != "node", d["kind"], d["name"]))


def _jobs_on(allocations) -> list[dict]:
    """Open allocations grouped per job, with the GPU indexes each holds."""
    jobs: dict[int, dict] = {}
    for a in allocations.select_related("job").order_by("start", "gpu_index"):
        entry = jobs.setdefault(a.job_id, {
            "job_id": a.job_id, "key": job_key(a.job.source, a.job.external_id), "name": a.job.name,
            "user": a.job.user, "account": a.job.account, "tenant": a.job.account,
            "state": a.job.state, "state_colour": JobState.colour(a.job.state), "start": iso(a.start),
            "gpu_indexes": [],
        })
        entry["gpu_indexes"].append(a.gpu_index)
    return list(jobs.values())


# --- Allocation ledger -------------------------------------------------------------------------

def allocation_history(*, gpu_id: int | None = None, node_id: int | None = None, limit: int = 100,
                       now: datetime | None = None) -> list[dict]:
    """Who held this GPU (or node) when, newest first.

    One entry per job holding over one [start, end): on a node, the GPUs a job held there
    together are one entry with their indexes. `end` and `duration_s` are measured to `now`
    while the allocation is open. Raises ValueError when neither gpu_id nor node_id is given
    (the whole fleet's ledger is not a page).

    Indexes: allocation_gpu_start_idx (gpu_id, start) serves the GPU history in order; the node
    history filters on allocation_node_end_idx (node_id, end) and sorts that node's rows.
    """
    if gpu_id is None and node_id is None:
        raise ValueError("allocation_history needs gpu_id or node_id")
    now = now or timezone.now()
    qs = Allocation.objects.all()
    if gpu_id is not None:
        qs = qs.filter(gpu_id=gpu_id)
    if node_id is not None:
        qs = qs.filter(node_id=node_id)
    groups = list(
        qs.values("job_id", "node_id", "start", "end")
        .annotate(gpu_indexes=ArrayAgg("gpu_index", order_by="gpu_index"))
        .order_by("-start", "job_id")[:limit]
    )
    jobs = Job.objects.in_bulk({g["job_id"] for g in groups})
    hosts = dict(Node.objects.filter(id__in={g["node_id"] for g in groups}).values_list("id", "hostname"))
    out = []
    for g in groups:
        job = jobs[g["job_id"]]
        out.append({
            "job_id": job.id, "key": job_key(job.source, job.external_id), "name": job.name, "user": job.user,
            "account": job.account, "tenant": job.account, "state": job.state,
            "state_colour": JobState.colour(job.state),
            "node_id": g["node_id"], "host": hosts.get(g["node_id"]), "gpu_indexes": g["gpu_indexes"],
            "start": iso(g["start"]), "end": iso(g["end"]), "open": g["end"] is None,
            "duration_s": max(0.0, ((g["end"] or now) - g["start"]).total_seconds()),
        })
    return out
