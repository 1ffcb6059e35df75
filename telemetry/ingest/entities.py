"""Resolve the natural keys in telemetry (GPU UUID, hostname, port name…) to inventory ids.

A GPU or node first seen in telemetry is registered on the spot, unplaced (no rack) until a
topology import places it. Lookups are cached per process; ids created inside an ingest
transaction enter the cache only after it commits, so a rolled-back batch can never leave a
cached id that points at nothing.
"""

from __future__ import annotations

from django.db import connection, transaction

from telemetry.actions import EventIn
from telemetry.ingest.schema import Batch, Frame

_CACHE: dict[str, dict] = {"node": {}, "gpu": {}, "mig": {}, "port": {}, "switch": {}, "power": {}}
_GENERATION: list = [None]  # inventory generation the cache was filled under


def clear_cache() -> None:
    """Forget every cached id (after inventory deletions, and between tests)."""
    for c in _CACHE.values():
        c.clear()


def check_generation() -> None:
    """Drop the cache if inventory rows were deleted anywhere since it was filled (migration 0004)."""
    with connection.cursor() as cur:
        cur.execute("SELECT last_value, is_called FROM telemetry_inventory_generation")
        generation = cur.fetchone()
    if generation != _GENERATION[0]:
        clear_cache()
        _GENERATION[0] = generation


def _row(frame: Frame, i: int) -> dict:
    return {k: col[i] for k, col in frame.ident.items() if col[i] is not None}


class Resolver:
    """Resolves one batch's entities inside the caller's transaction."""

    def __init__(self) -> None:
        self.pending: dict[str, dict] = {k: {} for k in _CACHE}
        self.registered: dict[str, int] = {}

    def get(self, kind: str, key):
        found = _CACHE[kind].get(key)
        return found if found is not None else self.pending[kind].get(key)

    def _ids(self, kind: str, keys: list) -> list:
        cached = list(map(_CACHE[kind].get, keys))
        if None in cached:
            cached = [self.get(kind, k) for k in keys]
        return cached

    def publish_on_commit(self) -> None:
        pending = self.pending

        def merge() -> None:
            for kind, mapping in pending.items():
                _CACHE[kind].update(mapping)

        transaction.on_commit(merge)

    def _count(self, kind: str, n: int) -> None:
        if n:
            self.registered[kind] = self.registered.get(kind, 0) + n

    # --- nodes and GPUs -------------------------------------------------------------------
    def nodes(self, hostnames: set[str]) -> None:
        missing = [h for h in hostnames if self.get("node", h) is None]
        if not missing:
            return
        with connection.cursor() as cur:
            cur.execute(
                "INSERT INTO telemetry_node (hostname, u_height, system_model, state, first_seen) "
                "SELECT h, 4, '', 'active', now() FROM unnest(%s::text[]) AS h "
                "ON CONFLICT (hostname) DO NOTHING RETURNING id",
                [missing],
            )
            self._count("node", len(cur.fetchall()))
            cur.execute("SELECT hostname, id FROM telemetry_node WHERE hostname = ANY(%s)", [missing])
            self.pending["node"].update(cur.fetchall())

    def gpu_ids(self, frame: Frame, uuid_key: str = "uuid", index_key: str = "index") -> list:
        uuids = frame.ident[uuid_key]
        ids = self._ids("gpu", uuids)
        if None not in ids:
            return ids
        first: dict[str, int] = {}
        for i, (u, gid) in enumerate(zip(uuids, ids, strict=True)):
            if gid is None and u not in first:
                first[u] = i
        with connection.cursor() as cur:
            cur.execute("SELECT uuid, id FROM telemetry_gpu WHERE uuid = ANY(%s)", [list(first)])
            self.pending["gpu"].update(cur.fetchall())
        new = [_row(frame, i) for u, i in first.items() if self.get("gpu", u) is None]
        if new:
            self._register_gpus(new, uuid_key, index_key, mig=frame.kind == "mig")
        return self._ids("gpu", uuids)

    def _register_gpus(self, new: list[dict], uuid_key: str, index_key: str, *, mig: bool) -> None:
        self.nodes({r["host"] for r in new})
        cols = [
            [r[uuid_key] for r in new], [self.get("node", r["host"]) for r in new],
            [r.get(index_key) for r in new], [r.get("model", "") for r in new],
            [r.get("serial", "") for r in new], [r.get("pci_bus_id", "") for r in new],
            [r.get("driver", "") for r in new], [mig] * len(new),
        ]
        with connection.cursor() as cur:
            cur.execute(
                "INSERT INTO telemetry_gpu "
                "(uuid, node_id, index, model, serial, pci_bus_id, driver, mig_mode, first_seen) "
                "SELECT u, n, i, m, s, p, d, mm, now() FROM unnest(%s::text[], %s::bigint[], %s::int[], "
                "%s::text[], %s::text[], %s::text[], %s::text[], %s::bool[]) AS t(u, n, i, m, s, p, d, mm) "
                "ON CONFLICT (uuid) DO NOTHING RETURNING id",
                cols,
            )
            self._count("gpu", len(cur.fetchall()))
            cur.execute("SELECT uuid, id FROM telemetry_gpu WHERE uuid = ANY(%s)", [cols[0]])
            self.pending["gpu"].update(cur.fetchall())

    # --- MIG instances --------------------------------------------------------------------
    def mig_ids(self, frame: Frame) -> list:
        gpu_ids = self.gpu_ids(frame, uuid_key="gpu_uuid", index_key="gpu_index")
        ci = frame.ident.get("ci_id") or [None] * frame.n
        keys = [(g, gi, c or 0) for g, gi, c in zip(gpu_ids, frame.ident["gi_id"], ci, strict=True)]
        ids = self._ids("mig", keys)
        if None in ids:
            profiles = frame.ident.get("profile") or [""] * frame.n
            want = {k: (p or "") for k, p, i in zip(keys, profiles, ids, strict=True) if i is None}
            self._register_migs(want)
            ids = self._ids("mig", keys)
        return ids

    def _register_migs(self, want: dict) -> None:
        gpu_ids, gis, cis = (list(c) for c in zip(*want, strict=True))
        with connection.cursor() as cur:
            cur.execute(
                "INSERT INTO telemetry_miginstance (gpu_id, gi_id, ci_id, profile) "
                "SELECT * FROM unnest(%s::bigint[], %s::int[], %s::int[], %s::text[]) "
                "ON CONFLICT (gpu_id, gi_id, ci_id) DO NOTHING RETURNING id",
                [gpu_ids, gis, cis, list(want.values())],
            )
            self._count("mig", len(cur.fetchall()))
            # A GPU reporting MIG instances is in MIG mode, whatever it was registered as.
            cur.execute("UPDATE telemetry_gpu SET mig_mode = true WHERE id = ANY(%s) AND NOT mig_mode", [gpu_ids])
            cur.execute("SELECT gpu_id, gi_id, ci_id, id FROM telemetry_miginstance WHERE gpu_id = ANY(%s)", [gpu_ids])
            self.pending["mig"].update({(g, gi, ci): i for g, gi, ci, i in cur.fetchall()})

    # --- fabric ports and power devices ---------------------------------------------------
    def port_ids(self, frame: Frame, batch: Batch) -> tuple[Frame, list]:
        """Resolve ports; rows naming an unknown switch are rejected (switches are not guessed)."""
        hosts = frame.ident.get("host") or [None] * frame.n
        switches = frame.ident.get("switch") or [None] * frame.n
        self.nodes({h for h in hosts if h})
        self._lookup_names("switch", "telemetry_switch", "name", {s for s in switches if s})
        owners = [
            ("node", self.get("node", h)) if h else ("switch", self.get("switch", s))
            for h, s in zip(hosts, switches, strict=True)
        ]
        keep = [i for i, o in enumerate(owners) if o[1] is not None]
        for i in sorted(set(range(frame.n)) - set(keep)):
            name = switches[i]
            batch.reject(
                f"port {name}:{frame.ident['port'][i]}", f"unknown switch {name!r}", frame.take([i]).sample_count
            )
        if len(keep) < frame.n:
            frame, owners = frame.take(keep), [owners[i] for i in keep]
        keys = [o + (p,) for o, p in zip(owners, frame.ident["port"], strict=True)]
        ids = self._ids("port", keys)
        if None in ids:
            layers = frame.ident.get("link_layer") or ["infiniband"] * frame.n
            self._register_ports({k: ll for k, ll, i in zip(keys, layers, ids, strict=True) if i is None})
            ids = self._ids("port", keys)
        return frame, ids

    def _register_ports(self, want: dict) -> None:
        keys = list(want)
        node_ids = [oid if kind == "node" else None for kind, oid, _ in keys]
        switch_ids = [oid if kind == "switch" else None for kind, oid, _ in keys]
        layers = [want[k] if want[k] in ("infiniband", "ethernet") else "infiniband" for k in keys]
        with connection.cursor() as cur:
            cur.execute(
                "INSERT INTO telemetry_port (node_id, switch_id, name, guid, link_layer) "
                "SELECT n, s, nm, '', ll FROM unnest(%s::bigint[], %s::bigint[], %s::text[], %s::text[]) "
                "AS t(n, s, nm, ll) "
                "ON CONFLICT DO NOTHING RETURNING id",
                [node_ids, switch_ids, [k[2] for k in keys], layers],
            )
            self._count("port", len(cur.fetchall()))
            cur.execute(
                "SELECT node_id, switch_id, name, id FROM telemetry_port "
                "WHERE node_id = ANY(%s) OR switch_id = ANY(%s)",
                [[i for i in node_ids if i], [i for i in switch_ids if i]],
            )
            self.pending["port"].update(
                {(("node", n) if n else ("switch", s)) + (name,): i for n, s, name, i in cur.fetchall()}
            )

    def power_ids(self, frame: Frame, batch: Batch) -> tuple[Frame, list]:
        """Resolve power devices. An unknown device reported by a node's BMC (the record names its
        host) is registered and linked to that node; any other unknown device is rejected (facility
        devices come from the topology, so a typo cannot invent a PDU)."""
        names = frame.ident["device"]
        self._lookup_names("power", "telemetry_powerdevice", "name", set(names))
        hosts = frame.ident.get("host") or [None] * frame.n
        kinds = frame.ident.get("device_kind") or [None] * frame.n
        new = {n: (h, k) for n, h, k in zip(names, hosts, kinds, strict=True) if h and self.get("power", n) is None}
        if new:
            self._register_node_power(new)
        ids = self._ids("power", names)
        keep = [i for i, x in enumerate(ids) if x is not None]
        for i in sorted(set(range(frame.n)) - set(keep)):
            batch.reject(f"power {names[i]}", f"unknown power device {names[i]!r}", frame.take([i]).sample_count)
        if len(keep) < frame.n:
            frame, ids = frame.take(keep), [ids[i] for i in keep]
        return frame, ids

    def _register_node_power(self, new: dict[str, tuple[str, str | None]]) -> None:
        valid = {"psu", "pdu", "power_shelf", "cooling_loop"}
        self.nodes({host for host, _ in new.values()})
        names = list(new)
        with connection.cursor() as cur:
            cur.execute(
                "INSERT INTO telemetry_powerdevice (name, kind) SELECT * FROM unnest(%s::text[], %s::text[]) "
                "ON CONFLICT (name) DO NOTHING RETURNING id",
                [names, [k if k in valid else "psu" for _, k in new.values()]],
            )
            self._count("power", len(cur.fetchall()))
            cur.execute("SELECT name, id FROM telemetry_powerdevice WHERE name = ANY(%s)", [names])
            self.pending["power"].update(cur.fetchall())
            cur.execute(
                "INSERT INTO telemetry_powerdevice_nodes (powerdevice_id, node_id) "
                "SELECT * FROM unnest(%s::bigint[], %s::bigint[]) ON CONFLICT DO NOTHING",
                [[self.get("power", n) for n in names], [self.get("node", new[n][0]) for n in names]],
            )

    def _lookup_names(self, kind: str, table: str, column: str, names: set[str]) -> None:
        missing = [n for n in names if self.get(kind, n) is None]
        if missing:
            with connection.cursor() as cur:
                cur.execute(f"SELECT {column}, id FROM {table} WHERE {column} = ANY(%s)", [missing])
                self.pending[kind].update(cur.fetchall())


def _bus_key(bus_id: str) -> str:
    """PCI bus ids compare without the domain's width or the letters' case ("0000:9b:00" = "00000000:9B:00.0").

    Anything that is not a bus id is returned as it is: it then matches no GPU, and the event is
    rejected by name instead of failing the batch.
    """
    text = bus_id.strip().lower()
    domain, rest = text.split(":", 1) if text.count(":") == 2 else ("0", text)
    try:
        domain = f"{int(domain, 16):x}"
    except ValueError:
        return text
    return f"{domain}:{rest if '.' in rest else rest + '.0'}"


def resolve_events(self: Resolver, batch: Batch) -> list:
    """Fault events with their GPU ids; an event for a GPU nobody knows is rejected and counted."""
    by_uuid = [e for e in batch.events if e["gpu_uuid"]]
    if by_uuid:
        frame = Frame("gpu", len(by_uuid), {"host": [e["host"] for e in by_uuid],
                                            "uuid": [e["gpu_uuid"] for e in by_uuid]}, [], {})
        self.gpu_ids(frame)
    bus = _bus_index({e["host"] for e in batch.events if not e["gpu_uuid"]})
    out = []
    for e in batch.events:
        gpu_id = self.get("gpu", e["gpu_uuid"]) if e["gpu_uuid"] else bus.get((e["host"], _bus_key(e["pci_bus_id"])))
        if gpu_id is None:
            batch.reject(e["where"], f"no GPU with PCI bus id {e['pci_bus_id']!r} on host {e['host']!r}", 1)
            continue
        out.append(EventIn(gpu_id, e["kind"], e["time"], code=e["code"], message=e["message"],
                           source=e["source"], count=e["count"]))
    return out


def _bus_index(hosts: set[str]) -> dict:
    if not hosts:
        return {}
    with connection.cursor() as cur:
        cur.execute(
            "SELECT n.hostname, g.pci_bus_id, g.id FROM telemetry_gpu g JOIN telemetry_node n ON n.id = g.node_id "
            "WHERE n.hostname = ANY(%s) AND g.pci_bus_id <> ''", [list(hosts)],
        )
        return {(host, _bus_key(bus)): gid for host, bus, gid in cur.fetchall()}

