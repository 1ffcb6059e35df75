"""The simulated cluster's physical layout and its topology document.

The layout follows a DGX-SuperPOD-like build of HGX H100 nodes:

- site ``dc1``; halls of at most 16 rows; rows of 8 racks; 8 nodes (4U, from U2 up) per rack;
- 8 GPUs and 8 InfiniBand HCAs (``mlx5_0/1`` .. ``mlx5_7/1``, 400 Gb/s, rail = HCA index) per node;
- a rail-optimised fabric: a *group* of 32 nodes (4 racks) gets one 64-port leaf per rail, half
  its ports down to the group's HCAs of that rail, half up. Each rail is its own leaf/spine plane
  (cross-rail traffic stays inside a node over NVLink), so a rail with L leaves needs
  ``ceil(L * 32 / 64)`` 64-port spines for full bisection. 16,384 GPUs is exactly the size where
  one spine has one port per leaf of its rail, the largest two-tier plane 64-port switches allow;
- two PDUs per rack (A/B feeds), one cooling loop per row, a 40 kW rack power cap.

Names, UUIDs and serials are a pure function of the seed and the position (never of the
cluster size), so resizing the simulated cluster keeps every existing GPU's identity.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from dataclasses import dataclass, field

GPUS_PER_NODE = 8
NODES_PER_RACK = 8
RACKS_PER_ROW = 8
ROWS_PER_HALL = 16
NODES_PER_GROUP = 32  # one leaf per rail serves 32 nodes: the 32 down ports of a 64-port leaf
SWITCH_PORTS = 64
LEAF_DOWN = SWITCH_PORTS // 2
MIN_GPUS, MAX_GPUS = 8, 16_384

GPU_MODEL = "NVIDIA H100 80GB HBM3"
SYSTEM_MODEL = "HGX H100 8-GPU"
PORT_SPEED_GBPS = 400
RACK_U = 48
# Eight HGX H100 nodes (~10 kW each at full load) make a high-density, liquid-assisted rack:
# budget 80 kW, fed by two 3-phase 415 V / 100 A PDUs (~57 kW each) so either feed carries
# the rack at its typical ~55 kW draw.
RACK_POWER_CAP_W = 80_000.0
PDU_CAPACITY_W = 57_500.0
NODE_U = 4
FIRST_NODE_U = 2
FIRST_SWITCH_U = 41
# PCI bus ids of the eight SXM GPUs on an HGX H100 baseboard, in GPU index order.
PCI_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
# Mellanox/NVIDIA OUI-style prefix for simulated port GUIDs.
GUID_BASE = 0xA088C20300000000


@dataclass(slots=True)
class GpuSpec:
    """One GPU's identity."""

    index: int
    uuid: str
    serial: str
    pci_bus_id: str


@dataclass(slots=True)
class HcaSpec:
    """One HCA port of a node; `rail` is also the HCA index."""

    name: str
    guid: str
    lid: int
    rail: int


@dataclass(slots=True)
class NodeSpec:
    """One HGX node and where it sits."""

    hostname: str
    rack: int  # index into Layout.racks
    u: int
    group: int  # fabric group: which leaf per rail serves it
    slot: int  # position in the group = its leaf down port - 1
    gpus: list[GpuSpec]
    hcas: list[HcaSpec]


@dataclass(slots=True)
class SwitchSpec:
    """A leaf or spine switch; spines sit outside the racks."""

    name: str
    role: str
    rail: int
    group: int  # the group for a leaf, the spine's number within its rail for a spine
    rack: int | None = None
    u: int | None = None


@dataclass(slots=True)
class RackSpec:
    """One rack: its row, hall and the nodes and switches mounted in it."""

    name: str
    hall: str
    row: str
    position: int
    nodes: list[int] = field(default_factory=list)
    switches: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Layout:
    """The whole cluster. `links` are (a, b) endpoint names ``owner:port``."""

    seed: int
    nodes: list[NodeSpec]
    racks: list[RackSpec]
    rows: list[tuple[str, str, list[int]]]  # (hall, row name, rack indexes)
    switches: list[SwitchSpec]
    links: list[tuple[str, str]]
    pdus: list[tuple[str, int]]  # (name, rack index)
    loops: list[tuple[str, list[int]]]  # (name, rack indexes)

    @property
    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

    @property
    def leaves(self) -> list[SwitchSpec]:
        return [s for s in self.switches if s.role == "leaf"]

    @property
    def spines(self) -> list[SwitchSpec]:
        return [s for s in self.switches if s.role == "spine"]

    def summary(self) -> dict[str, int]:
        return {
            "nodes": len(self.nodes), "gpus": self.gpu_count, "racks": len(self.racks),
            "rows": len(self.rows), "halls": len({h for h, _, _ in self.rows}),
            "leaves": len(self.leaves), "spines": len(self.spines), "links": len(self.links),
            "pdus": len(self.pdus), "cooling_loops": len(self.loops),
        }


def check_gpu_count(gpus: int) -> None:
    """Raise ValueError unless `gpus` is a cluster size the layout supports."""
    if not MIN_GPUS <= gpus <= MAX_GPUS or gpus % GPUS_PER_NODE:
        raise ValueError(
            f"--gpus must be a multiple of {GPUS_PER_NODE} from {MIN_GPUS} to {MAX_GPUS}, "
            f"got {gpus}"
        )


def _digest(seed: int, *parts) -> bytes:
    return hashlib.sha256(":".join(str(p) for p in (seed, *parts)).encode()).digest()


def _gpu(seed: int, hostname: str, index: int) -> GpuSpec:
    d = _digest(seed, "gpu", hostname, index)
    gpu_uuid = uuid.UUID(bytes=d[:16], version=4)
    serial = "1654" + str(int.from_bytes(d[16:24], "big") % 10**9).zfill(9)
    return GpuSpec(index, f"GPU-{gpu_uuid}", serial, f"00000000:{PCI_BUSES[index]}:00.0")


def _hca(node_number: int, rail: int) -> HcaSpec:
    seq = node_number * GPUS_PER_NODE + rail
    # LIDs 1..1023 are left to switches and the subnet manager.
    return HcaSpec(f"mlx5_{rail}/1", f"0x{GUID_BASE + seq + 1:016x}", 1024 + seq, rail)


def _place_racks(node_count: int) -> tuple[list[RackSpec], list[tuple[str, str, list[int]]]]:
    racks: list[RackSpec] = []
    rows: list[tuple[str, str, list[int]]] = []
    for r in range(math.ceil(node_count / NODES_PER_RACK)):
        row_no, pos = divmod(r, RACKS_PER_ROW)
        hall = f"hall-{chr(ord('a') + row_no // ROWS_PER_HALL)}"
        if pos == 0:
            rows.append((hall, f"row-{row_no + 1:02d}", []))
        rows[-1][2].append(r)
        racks.append(RackSpec(f"r{row_no + 1:02d}-{pos + 1:02d}", hall, rows[-1][1], pos + 1))
    return racks, rows


def _place_nodes(seed: int, node_count: int, racks: list[RackSpec]) -> list[NodeSpec]:
    nodes = []
    for n in range(node_count):
        rack, in_rack = divmod(n, NODES_PER_RACK)
        group, slot = divmod(n, NODES_PER_GROUP)
        host = f"gpu-{n + 1:04d}"
        nodes.append(NodeSpec(
            host, rack, FIRST_NODE_U + in_rack * NODE_U, group, slot,
            [_gpu(seed, host, i) for i in range(GPUS_PER_NODE)],
            [_hca(n, rail) for rail in range(GPUS_PER_NODE)],
        ))
        racks[rack].nodes.append(n)
    return nodes


def _leaf_name(rail: int, group: int) -> str:
    return f"leaf-r{rail}-{group + 1:02d}"


def _build_leaves(nodes, racks, switches, links) -> list[int]:
    """One leaf per rail per group, two per rack in the group's racks; HCA down-links."""
    groups = nodes[-1].group + 1
    racks_per_group = NODES_PER_GROUP // NODES_PER_RACK
    for g in range(groups):
        first = g * racks_per_group
        in_group = min(racks_per_group, len(racks) - first)
        for rail in range(GPUS_PER_NODE):
            # Two leaves per rack; a short last group stacks its leaves in the racks it has.
            rack = first + min(rail * in_group // GPUS_PER_NODE, in_group - 1)
            u = FIRST_SWITCH_U + len(racks[rack].switches)
            racks[rack].switches.append(len(switches))
            switches.append(SwitchSpec(_leaf_name(rail, g), "leaf", rail, g, rack, u))
    for n in nodes:
        for hca in n.hcas:
            leaf = _leaf_name(hca.rail, n.group)
            links.append((f"{n.hostname}:{hca.name}", f"{leaf}:p{n.slot + 1}"))
    return [min(NODES_PER_GROUP, len(nodes) - g * NODES_PER_GROUP) for g in range(groups)]


def _build_spines(group_sizes: list[int], switches, links) -> None:
    """Per rail, enough 64-port spines for the leaves' uplinks, spread round-robin.

    A leaf has as many uplinks as it has nodes below it (32 in a full group): full bisection
    for what is attached, and a small cluster does not get a full-size spine layer.
    """
    uplinks = [(g, up) for g, size in enumerate(group_sizes) for up in range(size)]
    per_rail = math.ceil(len(uplinks) / SWITCH_PORTS)
    for rail in range(GPUS_PER_NODE):
        names = [f"spine-r{rail}-{k + 1:02d}" for k in range(per_rail)]
        switches.extend(SwitchSpec(name, "spine", rail, k) for k, name in enumerate(names))
        next_port = [1] * per_rail
        for i, (g, up) in enumerate(uplinks):
            k = i % per_rail
            leaf_port = f"{_leaf_name(rail, g)}:p{LEAF_DOWN + up + 1}"
            links.append((leaf_port, f"{names[k]}:p{next_port[k]}"))
            next_port[k] += 1


def build_layout(gpus: int = 2048, seed: int = 1) -> Layout:
    """The cluster for `gpus` GPUs (a multiple of 8 from 8 to 16,384)."""
    check_gpu_count(gpus)
    node_count = gpus // GPUS_PER_NODE
    racks, rows = _place_racks(node_count)
    nodes = _place_nodes(seed, node_count, racks)
    switches: list[SwitchSpec] = []
    links: list[tuple[str, str]] = []
    group_sizes = _build_leaves(nodes, racks, switches, links)
    _build_spines(group_sizes, switches, links)
    pdus = [(f"pdu-{r.name}-{feed}", i) for i, r in enumerate(racks) for feed in ("a", "b")]
    loops = [(f"loop-{name}", list(members)) for _, name, members in rows]
    return Layout(seed, nodes, racks, rows, switches, links, pdus, loops)


# --- the topology document ------------------------------------------------------------------
def _node_doc(n: NodeSpec) -> dict:
    return {
        "hostname": n.hostname, "u": n.u, "u_height": NODE_U, "system_model": SYSTEM_MODEL,
        "nvlink_domain": f"nvd-{n.hostname}",
        "gpus": [
            {"index": g.index, "uuid": g.uuid, "model": GPU_MODEL, "serial": g.serial,
             "pci_bus_id": g.pci_bus_id, "mig_mode": False}
            for g in n.gpus
        ],
        "hcas": [
            {"name": h.name, "guid": h.guid, "lid": h.lid, "link_layer": "infiniband",
             "speed_gbps": PORT_SPEED_GBPS, "rail": h.rail}
            for h in n.hcas
        ],
    }


def _switch_doc(s: SwitchSpec) -> dict:
    doc = {"name": s.name, "role": s.role}
    if s.u is not None:
        doc["u"] = s.u
    doc.update({
        "port_count": SWITCH_PORTS, "port_prefix": "p", "port_speed_gbps": PORT_SPEED_GBPS,
        "port_link_layer": "infiniband",
    })
    return doc


def _rack_doc(layout: Layout, r: RackSpec) -> dict:
    return {
        "name": r.name, "position": r.position, "u_height": RACK_U, "power_cap_w": RACK_POWER_CAP_W,
        "nodes": [_node_doc(layout.nodes[i]) for i in r.nodes],
        "switches": [_switch_doc(layout.switches[i]) for i in r.switches],
    }


def _halls_doc(layout: Layout) -> list[dict]:
    halls: dict[str, list[dict]] = {}
    for hall, row, members in layout.rows:
        racks = [_rack_doc(layout, layout.racks[i]) for i in members]
        halls.setdefault(hall, []).append({"name": row, "racks": racks})
    return [{"name": name, "rows": rows} for name, rows in halls.items()]


def topology_document(layout: Layout) -> dict:
    """The layout as a version-1 topology document for `telemetry.topology.do_import_topology`."""
    power = [
        {"name": name, "kind": "pdu", "capacity_w": PDU_CAPACITY_W, "racks": [layout.racks[r].name]}
        for name, r in layout.pdus
    ]
    power += [
        {"name": name, "kind": "cooling_loop", "racks": [layout.racks[r].name for r in members]}
        for name, members in layout.loops
    ]
    return {
        "version": 1,
        "sites": [{"name": "dc1", "halls": _halls_doc(layout)}],
        "switches": [_switch_doc(s) for s in layout.spines],
        "nvlink_domains": [{"name": f"nvd-{n.hostname}", "kind": "node"} for n in layout.nodes],
        "links": [list(pair) for pair in layout.links],
        "power": power,
    }
