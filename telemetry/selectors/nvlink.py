"""Read-side queries for the NVLink page: every NVLink domain, its GPUs and their link health.

Two statements whatever the cluster size: the domains (a few thousand rows at most), and one
pass over the GPU inventory joined to each GPU's row in the settled 1-minute rollup bucket that
every rate on the page shares (error and bandwidth counter rates, resets handled; see
`telemetry.selectors.fabric` for why rates "now" come from there) and to its fresh last-value
row (the NVLink throughput gauges).

A GPU whose node belongs to no domain is listed under an *implicit* domain named after its
node, of kind "node": an HGX/DGX baseboard's NVSwitches join exactly its own GPUs, so that is
the domain the topology file left out.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.utils import timezone

from core.db import cursor_without_jit
from telemetry import health
from telemetry.fields import KINDS
from telemetry.models import Gpu, Node, NvlinkDomain, Rack
from telemetry.selectors.fabric import rate_join, window_params

ERROR_COUNTERS = (
    "nvlink_crc_flit_errors", "nvlink_crc_data_errors", "nvlink_replay_errors", "nvlink_recovery_errors",
)
RATE_COUNTERS = (*ERROR_COUNTERS, "nvlink_bandwidth")
GAUGES = ("nvlink_tx_bps", "nvlink_rx_bps")
# A GPU (and its domain) is in "errors" when, in the rate's minute, one of its links went through
# recovery (it retrained, stalling traffic: never normal), or its CRC and replay errors reached
# 10 a minute: links retry a corrupted flit on their own, so the odd one is noise, while a
# steady stream means a link that is degrading.
CRC_REPLAY_PER_S = 10 / 60
DOMAIN_STATES = ("errors", "ok", "no data")

_SPEC = KINDS["gpu"]
UNITS: dict[str, str] = {
    **{c: f"{_SPEC.by_name[c].unit}/s" for c in RATE_COUNTERS},
    **{g: _SPEC.by_name[g].unit for g in GAUGES},
    "errors_per_s": "errors/s",
}

_GPUS_SQL = f"""
SELECT n.nvlink_domain_id, n.hostname, g.uuid, g.index,
    {", ".join(f"r.{c}" for c in RATE_COUNTERS)}, {", ".join(f"l.{c}::float8" for c in GAUGES)}
FROM {Gpu._meta.db_table} g
JOIN {Node._meta.db_table} n ON n.id = g.node_id
{rate_join("gpu", RATE_COUNTERS, "g.id", "r")}
LEFT JOIN {_SPEC.latest_table} l ON l.gpu_id = g.id AND {health.FRESH_SQL}
ORDER BY n.hostname, g.index, g.uuid
"""

_DOMAINS_SQL = f"""
SELECT d.id, d.name, d.kind, r.name
FROM {NvlinkDomain._meta.db_table} d LEFT JOIN {Rack._meta.db_table} r ON r.id = d.rack_id
ORDER BY d.name
"""


def _gpu(row: tuple) -> tuple[int | None, dict]:
    domain_id, host, uuid, index, *values = row
    gpu = {"uuid": uuid, "host": host, "index": index}
    gpu.update({k: None if v is None else float(v) for k, v in zip((*RATE_COUNTERS, *GAUGES), values,
                                                                   strict=True)})
    errors = [gpu[c] for c in ERROR_COUNTERS if gpu[c] is not None]
    gpu["errors_per_s"] = sum(errors) if errors else None
    crc_replay = sum(gpu[c] or 0 for c in ERROR_COUNTERS if c != "nvlink_recovery_errors")
    if all(gpu[k] is None for k in (*RATE_COUNTERS, *GAUGES)):
        gpu["state"] = "no data"
    elif (gpu["nvlink_recovery_errors"] or 0) > 0 or crc_replay >= CRC_REPLAY_PER_S:
        gpu["state"] = "errors"
    else:
        gpu["state"] = "ok"
    return domain_id, gpu


def _sum(gpus: list[dict], key: str) -> float | None:
    values = [g[key] for g in gpus if g[key] is not None]
    return sum(values) if values else None


def _domain(base: dict, gpus: list[dict]) -> dict:
    states = {g["state"] for g in gpus}
    state = "errors" if "errors" in states else "ok" if "ok" in states else "no data"
    totals = {
        "gpus": len(gpus), "gpus_reporting": sum(g["state"] != "no data" for g in gpus),
        "gpus_with_errors": sum(g["state"] == "errors" for g in gpus),
        **{k: _sum(gpus, k) for k in ("errors_per_s", *RATE_COUNTERS, *GAUGES)},
    }
    return {**base, "state": state, "totals": totals, "gpus": gpus}


def nvlink_domains(now: datetime | None = None) -> dict:
    """Every NVLink domain with its GPUs, their NVLink error and bandwidth rates, and a state.

    Returns ``{"generated_at", "units": {field: unit}, "by_state": {state: domains},
    "domains": [{"id" (None when implicit), "name", "kind" ("node" | "rack"), "implicit",
    "rack", "state" ("errors" | "ok" | "no data"), "totals": {gpus, gpus_reporting,
    gpus_with_errors, errors_per_s, <each rate and gauge> summed}, "gpus": [{uuid, host, index,
    nvlink_crc_flit_errors, nvlink_crc_data_errors, nvlink_replay_errors,
    nvlink_recovery_errors, nvlink_bandwidth (per second), nvlink_tx_bps, nvlink_rx_bps,
    errors_per_s, state}]}]}``. Declared domains come first by name, then implicit ones by host.
    """
    now = now or timezone.now()
    with cursor_without_jit() as cur:
        cur.execute(_DOMAINS_SQL)
        declared = cur.fetchall()
        cur.execute(_GPUS_SQL, window_params(now))
        rows = cur.fetchall()
    members: dict[int, list[dict]] = {}
    implicit: dict[str, list[dict]] = {}
    for row in rows:
        domain_id, gpu = _gpu(row)
        if domain_id is None:
            implicit.setdefault(gpu["host"], []).append(gpu)
        else:
            members.setdefault(domain_id, []).append(gpu)
    domains = [
        _domain({"id": pk, "name": name, "kind": kind, "implicit": False, "rack": rack}, members.get(pk, []))
        for pk, name, kind, rack in declared
    ]
    domains += [
        _domain({"id": None, "name": host, "kind": NvlinkDomain.Kind.NODE.value, "implicit": True, "rack": None},
                gpus)
        for host, gpus in implicit.items()
    ]
    by_state = {s: sum(d["state"] == s for d in domains) for s in DOMAIN_STATES}
    return {"generated_at": now.astimezone(UTC).isoformat(), "units": UNITS, "by_state": by_state,
            "domains": domains}
