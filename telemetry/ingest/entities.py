"""Resolve the natural keys in telemetry (GPU UUID, hostname, port name…) to inventory ids.

A GPU or node first seen in telemetry is registered on the spot, unplaced (no rack) until a
topology import places it. Lookups are cached per process; ids created inside an ingest
transaction enter the cache only after it commits, so a rolled-back batch can never leave a
cached id that points at nothing.
"""

from __future__ import annotations

from django.db import connection, transaction

from telemetry.ingest.schema import Batch, Record

_CACHE: dict[str, dict] = {"node": {}, "gpu": {}, "mig": {}, "port": {}, "switch": {}, "power": {}}


def clear_cache() -> None:
    """Forget every cached id (after inventory deletions, and between tests)."""
    for c in _CACHE.values():
        c.clear()


class Resolver:
    """Resolves one batch's entities inside the caller's transaction."""

    def __init__(self) -> None:
        self.pending: dict[str, dict] = {k: {} for k in _CACHE}
        self.registered: dict[str, int] = {}

    def get(self, kind: str, key):
        found = _CACHE[kind].get(key)
        return found if found is not None else self.pending[kind].get(key)

    def _remember(self, kind: str, mapping: dict) -> None:
        self.pending[kind].update(mapping)

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
            self._remember("node", dict(cur.fetchall()))

    def gpus(self, records: list[Record], uuid_key: str = "uuid", index_key: str = "index") -> None:
        first: dict[str, Record] = {}
        for r in records:
            u = r.ident[uuid_key]
            if u not in first and self.get("gpu", u) is None:
                first[u] = r
        if not first:
            return
        with connection.cursor() as cur:
            cur.execute("SELECT uuid, id FROM telemetry_gpu WHERE uuid = ANY(%s)", [list(first)])
            self._remember("gpu", dict(cur.fetchall()))
        new = [r for u, r in first.items() if self.get("gpu", u) is None]
        if new:
            self._register_gpus(new, uuid_key, index_key)

    def _register_gpus(self, new: list[Record], uuid_key: str, index_key: str) -> None:
        self.nodes({r.ident["host"] for r in new})
        rows = [
            (
                r.ident[uuid_key], self.get("node", r.ident["host"]), r.ident.get(index_key),
                r.ident.get("model", ""), r.ident.get("serial", ""), r.ident.get("pci_bus_id", ""),
                r.ident.get("driver", ""), r.kind == "mig",
            )
            for r in new
        ]
        cols = list(zip(*rows, strict=True))
        with connection.cursor() as cur:
            cur.execute(
                "INSERT INTO telemetry_gpu (uuid, node_id, index, model, serial, pci_bus_id, driver, mig_mode, first_seen) "
                "SELECT u, n, i, m, s, p, d, mm, now() FROM unnest(%s::text[], %s::bigint[], %s::int[], "
                "%s::text[], %s::text[], %s::text[], %s::text[], %s::bool[]) AS t(u, n, i, m, s, p, d, mm) "
                "ON CONFLICT (uuid) DO NOTHING RETURNING id",
                [list(c) for c in cols],
            )
            self._count("gpu", len(cur.fetchall()))
            cur.execute("SELECT uuid, id FROM telemetry_gpu WHERE uuid = ANY(%s)", [list(cols[0])])
            self._remember("gpu", dict(cur.fetchall()))

    # --- MIG instances --------------------------------------------------------------------
    def migs(self, records: list[Record]) -> None:
        self.gpus(records, uuid_key="gpu_uuid", index_key="gpu_index")
        keys = {}
        for r in records:
            key = (self.get("gpu", r.ident["gpu_uuid"]), r.ident["gi_id"], r.ident.get("ci_id", 0))
            if self.get("mig", key) is None:
                keys.setdefault(key, r.ident.get("profile", ""))
        if not keys:
            return
        gpu_ids, gis, cis = (list(c) for c in zip(*keys, strict=True))
        with connection.cursor() as cur:
            cur.execute(
                "INSERT INTO telemetry_miginstance (gpu_id, gi_id, ci_id, profile) "
                "SELECT * FROM unnest(%s::bigint[], %s::int[], %s::int[], %s::text[]) "
                "ON CONFLICT (gpu_id, gi_id, ci_id) DO NOTHING RETURNING id",
                [gpu_ids, gis, cis, list(keys.values())],
            )
            self._count("mig", len(cur.fetchall()))
            # A GPU reporting MIG instances is in MIG mode, whatever it was registered as.
            cur.execute("UPDATE telemetry_gpu SET mig_mode = true WHERE id = ANY(%s) AND NOT mig_mode", [gpu_ids])
            cur.execute(
                "SELECT gpu_id, gi_id, ci_id, id FROM telemetry_miginstance WHERE gpu_id = ANY(%s)", [gpu_ids]
            )
            self._remember("mig", {(g, gi, ci): i for g, gi, ci, i in cur.fetchall()})

    def mig_key(self, r: Record):
        return (self.get("gpu", r.ident["gpu_uuid"]), r.ident["gi_id"], r.ident.get("ci_id", 0))

    # --- fabric ports and power devices ---------------------------------------------------
    def ports(self, records: list[Record], batch: Batch) -> list[Record]:
        """Resolve ports; records naming an unknown switch are rejected (switches are not guessed)."""
        self.nodes({r.ident["host"] for r in records if "host" in r.ident})
        self._lookup_names("switch", "telemetry_switch", "name", {r.ident["switch"] for r in records if "switch" in r.ident})
        kept, want = [], {}
        for r in records:
            owner = self.port_owner(r)
            if owner[1] is None:
                batch.reject(f"port {r.ident['switch']}:{r.ident['port']}", f"unknown switch {r.ident['switch']!r}", len(r.values) + len(r.extra))
                continue
            kept.append(r)
            key = owner + (r.ident["port"],)
            if self.get("port", key) is None:
                want[key] = r.ident.get("link_layer", "infiniband")
        if want:
            self._register_ports(want)
        return kept

    def port_owner(self, r: Record) -> tuple[str, int | None]:
        if "host" in r.ident:
            return ("node", self.get("node", r.ident["host"]))
        return ("switch", self.get("switch", r.ident["switch"]))

    def _register_ports(self, want: dict) -> None:
        keys = list(want)
        node_ids = [oid if kind == "node" else None for kind, oid, _ in keys]
        switch_ids = [oid if kind == "switch" else None for kind, oid, _ in keys]
        names = [name for _, _, name in keys]
        layers = [want[k] if want[k] in ("infiniband", "ethernet") else "infiniband" for k in keys]
        with connection.cursor() as cur:
            cur.execute(
                "INSERT INTO telemetry_port (node_id, switch_id, name, guid, link_layer) "
                "SELECT n, s, nm, '', ll FROM unnest(%s::bigint[], %s::bigint[], %s::text[], %s::text[]) AS t(n, s, nm, ll) "
                "ON CONFLICT DO NOTHING RETURNING id",
                [node_ids, switch_ids, names, layers],
            )
            self._count("port", len(cur.fetchall()))
            cur.execute(
                "SELECT node_id, switch_id, name, id FROM telemetry_port WHERE node_id = ANY(%s) OR switch_id = ANY(%s)",
                [[i for i in node_ids if i], [i for i in switch_ids if i]],
            )
            self._remember(
                "port",
                {(("node", n) if n else ("switch", s)) + (name,): i for n, s, name, i in cur.fetchall()},
            )

    def power(self, records: list[Record], batch: Batch) -> list[Record]:
        """Resolve power devices; unknown devices are rejected (import them with the topology)."""
        self._lookup_names("power", "telemetry_powerdevice", "name", {r.ident["device"] for r in records})
        kept = []
        for r in records:
            if self.get("power", r.ident["device"]) is None:
                batch.reject(f"power {r.ident['device']}", f"unknown power device {r.ident['device']!r}", len(r.values) + len(r.extra))
            else:
                kept.append(r)
        return kept

    def _lookup_names(self, kind: str, table: str, column: str, names: set[str]) -> None:
        missing = [n for n in names if self.get(kind, n) is None]
        if missing:
            with connection.cursor() as cur:
                cur.execute(f"SELECT {column}, id FROM {table} WHERE {column} = ANY(%s)", [missing])
                self._remember(kind, dict(cur.fetchall()))
