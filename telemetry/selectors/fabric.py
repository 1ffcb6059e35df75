"""Read-side queries for the fabric page: the leaf × spine matrix, the Clos graph, one port.

Where "now" comes from. Counters are stored raw, so a current rate needs two readings. Two cheap
sources exist: the last two raw samples per port, or the newest 1-minute rollup bucket, whose
``<field>_delta`` already has resets handled (`telemetry.rollups`). At ~20k ports the raw route
reads every sample of the last minutes (10-s collection: ~12 rows per port, ~250k rows); the
rollup route reads one row per port, found through the (entity, bucket) primary key. So rates
here are ``delta / 60 s`` of one bucket, the newest that is *settled*: it ended at least
`RATE_SETTLE` ago, so the 30-s rollup beat has recomputed it after its last sample. Every rate
on a page then describes the same minute, so cells compare; the price is freshness (that minute
ended 45-105 s ago), and an entity with no reading in that minute has no current rate.

Every join below is one the planner can drive from an index (primary keys, the link's one-to-one
ports, the rollup's (entity, bucket) key), so a statement stays fast even when the planner's row
estimates are wrong, as they are right after a bulk topology import.

Everything returned is JSON-able: ISO 8601 strings for times, floats or None for values.
"""

from __future__ import annotations

import heapq
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from core.db import cursor_without_jit
from core.time import iso_utc
from telemetry import health
from telemetry.fields import COUNTER, KINDS
from telemetry.health import health_fields
from telemetry.models import Link, Port, Rack, Switch
from telemetry.rollups import floor_bucket

MINUTE = timedelta(minutes=1)
# A bucket's rate is read once the rollup beat (every 30 s) has run after the bucket ended.
RATE_SETTLE = timedelta(seconds=45)

# Edge states of the graph, worst first. Thresholds, and why:
# - A link whose either end reports a state below Active (IB PortState 4) carries no traffic:
#   Down (1), or stuck in Init/Armed, which is a subnet-manager problem. "down" when all the
#   links of a switch pair are so; a pair that lost only some of its links is "errors".
PORT_STATE_ACTIVE = 4
# - Errors: any link event in the rate's minute (link downed or link error recovery, either end):
#   a link that retrained or dropped stalled its traffic, which is never normal. Or symbol plus
#   receive errors (both ends) at 10 a minute or more: the odd one on a long optical link is
#   noise, a steady stream is a cable or transceiver going bad.
LINE_ERRORS_PER_S = 10 / 60
# - Congestion: PortXmitWait ticks/s on the lower switch's uplink. A tick is a hardware clock
#   unit, so there is no universal line; a healthy uplink near line rate accrues a few 1e4
#   ticks/s of ordinary credit round trips, and a port blocked for a real share of the time
#   accrues an order of magnitude more. Judged per link (the worst one), not per bundle.
CONGESTED_WAIT_PER_S = 2e5
EDGE_STATES = ("down", "errors", "congested", "ok", "no data")

METRICS: dict[str, str] = {"utilization": "%", "congestion": "ticks/s", "errors": "errors/s"}
LINE_ERRORS = ("symbol_errors", "rcv_errors")
LINK_EVENTS = ("link_downed", "link_error_recovery")
ERROR_COUNTERS = (*LINE_ERRORS, *LINK_EVENTS)
RATE_COUNTERS = ("xmit_data_bytes", "rcv_data_bytes", "xmit_wait", *ERROR_COUNTERS)
WORST = 10

_PORT, _SWITCH, _LINK = Port._meta.db_table, Switch._meta.db_table, Link._meta.db_table
_PORT_LATEST = KINDS["port"].latest_table
_TIER = "CASE {s}.role WHEN 'leaf' THEN 0 WHEN 'spine' THEN 1 ELSE 2 END"


# --- rates "now", shared with the NVLink selector ---------------------------------------------

def rate_bucket(now: datetime) -> datetime:
    """Start of the 1-minute bucket that current rates are read from: the newest one that ended
    at least `RATE_SETTLE` before `now`."""
    return floor_bucket(now - RATE_SETTLE, MINUTE) - MINUTE


def rate_join(kind: str, fields: tuple[str, ...], entity: str, alias: str) -> str:
    """A LEFT JOIN giving `alias`.<field> per second (and `alias`.bucket, NULL when the entity
    has no reading) from the rate bucket of the entity whose id is the SQL expression `entity`.

    Takes %(rate_bucket)s (see `window_params`). Field names are checked against the registry
    before they are put into SQL; `entity` and `alias` are the caller's constants.
    """
    spec = KINDS[kind]
    bad = [f for f in fields if f not in spec.by_name or spec.by_name[f].kind != COUNTER]
    if bad:
        raise ValueError(f"not {kind} counters: {', '.join(bad)}")
    ent = spec.entity_column
    cols = ", ".join(f"{f}_delta / {MINUTE.total_seconds()} AS {f}" for f in fields)
    # LATERAL ... LIMIT 1 (at most one row anyway: the key is (entity, bucket)) keeps this a
    # probe of that key per entity. As a plain join, a planner that expects few rows in the
    # bucket would rescan all of them for every entity.
    return (
        f"LEFT JOIN LATERAL (SELECT bucket, {cols} FROM {spec.rollup_table('1m')}"
        f" WHERE {ent} = {entity} AND bucket = %(rate_bucket)s LIMIT 1) {alias} ON true"
    )


def window_params(now: datetime) -> dict:
    """Bound parameters for `rate_join` and for freshness of the last-value tables."""
    return {"rate_bucket": rate_bucket(now), **health.sql_params(now)}


def _both_ends(counters: tuple[str, ...]) -> str:
    """Sum of `counters` over both ends of a link; NULL when neither end has a rate."""
    terms = " + ".join(f"coalesce({end}.{c}, 0)" for end in ("rl", "rh") for c in counters)
    return f"CASE WHEN rl.bucket IS NOT NULL OR rh.bucket IS NOT NULL THEN {terms} END"


# 1. `sl`: every switch-to-switch link, its lower-tier end first (leaf below spine below core,
#    switch id breaking ties), so a pair is always (lower, upper) and "up" means towards the top.
# 2. `lm`: per link, traffic each way in bits/s (from the lower end, else mirrored from the upper
#    end), speed (negotiated if reported, else configured; the slower end), XmitWait of the lower
#    end's uplink, line errors and link events of both ends, and whether it is down.
# 3. One row per switch pair.
# The tier filter stays outside `sl` on purpose: inside, a planner that underestimates the
# tables (fresh after an import) evaluates it on a switch × switch cross join first.
_PAIRS_SQL = f"""
WITH sl AS MATERIALIZED (
    SELECT CASE WHEN o.lo THEN pa.id ELSE pb.id END AS lo_port,
        CASE WHEN o.lo THEN pb.id ELSE pa.id END AS hi_port,
        CASE WHEN o.lo THEN sa.id ELSE sb.id END AS lo_switch,
        CASE WHEN o.lo THEN sb.id ELSE sa.id END AS hi_switch,
        least(t.ta, t.tb) AS lo_tier, greatest(t.ta, t.tb) AS hi_tier,
        least(pa.speed_gbps, pb.speed_gbps) AS speed_gbps
    FROM {_LINK} l
    JOIN {_PORT} pa ON pa.id = l.a_id JOIN {_SWITCH} sa ON sa.id = pa.switch_id
    JOIN {_PORT} pb ON pb.id = l.b_id JOIN {_SWITCH} sb ON sb.id = pb.switch_id,
        LATERAL (SELECT {_TIER.format(s="sa")} AS ta, {_TIER.format(s="sb")} AS tb) t,
        LATERAL (SELECT (t.ta, sa.id) <= (t.tb, sb.id) AS lo) o
),
lm AS (
    SELECT sl.lo_switch, sl.hi_switch,
        coalesce(rl.xmit_data_bytes, rh.rcv_data_bytes) * 8 AS up_bps,
        coalesce(rl.rcv_data_bytes, rh.xmit_data_bytes) * 8 AS down_bps,
        coalesce(least(fl.link_speed_gbps, fh.link_speed_gbps), sl.speed_gbps) * 1e9 AS speed_bps,
        rl.xmit_wait AS wait,
        {_both_ends(LINE_ERRORS)} AS line_errors,
        {_both_ends(LINK_EVENTS)} AS events,
        fl.link_state < {PORT_STATE_ACTIVE} OR fh.link_state < {PORT_STATE_ACTIVE} AS down,
        coalesce(rl.bucket, rh.bucket, fl.time, fh.time) IS NOT NULL AS reporting
    FROM sl
    {rate_join("port", RATE_COUNTERS, "sl.lo_port", "rl")}
    {rate_join("port", RATE_COUNTERS, "sl.hi_port", "rh")}
    LEFT JOIN {_PORT_LATEST} fl ON fl.port_id = sl.lo_port AND {health.fresh_sql("fl")}
    LEFT JOIN {_PORT_LATEST} fh ON fh.port_id = sl.hi_port AND {health.fresh_sql("fh")}
    WHERE %(all_tiers)s OR sl.lo_tier = 0 AND sl.hi_tier = 1
)
SELECT lo_switch, hi_switch, count(*), count(*) FILTER (WHERE reporting), count(*) FILTER (WHERE down),
    100 * greatest(sum(up_bps), sum(down_bps))
        / NULLIF(sum(speed_bps) FILTER (WHERE up_bps IS NOT NULL OR down_bps IS NOT NULL), 0),
    sum(wait), max(wait), sum(line_errors) + sum(events), sum(line_errors), sum(events)
FROM lm
GROUP BY lo_switch, hi_switch
"""

# `util_pct` is the busier direction over the bundle's capacity: a link full one way is full,
# and an average of both ways would call it half used.
_PAIR_KEYS = ("lo", "hi", "links", "reporting", "down", "util_pct", "wait", "wait_max", "errors", "line_errors",
              "events")


def _pairs(now: datetime, *, leaf_spine_only: bool) -> list[dict]:
    with cursor_without_jit() as cur:
        cur.execute(_PAIRS_SQL, {**window_params(now), "all_tiers": not leaf_spine_only})
        return [dict(zip(_PAIR_KEYS, row, strict=True)) for row in cur.fetchall()]


# 1. Every switch with its rack; its rail is the most common rail among its own ports and, for
#    a port whose own rail is not set, the port at the other end of its cable (a leaf's HCAs).
# 2. `nodes`: distinct nodes cabled to it (a leaf's hosts).
_SWITCHES_SQL = f"""
SELECT s.id, s.name, s.role, r.name,
    mode() WITHIN GROUP (ORDER BY coalesce(p.rail, q.rail)), count(DISTINCT q.node_id)
FROM {_SWITCH} s
LEFT JOIN {Rack._meta.db_table} r ON r.id = s.rack_id
LEFT JOIN {_PORT} p ON p.switch_id = s.id
LEFT JOIN {_LINK} la ON la.a_id = p.id
LEFT JOIN {_LINK} lb ON lb.b_id = p.id
LEFT JOIN {_PORT} q ON q.id = coalesce(la.b_id, lb.a_id)
GROUP BY s.id, r.name
"""


def _switches() -> dict[int, dict]:
    """Switch id → {id, name, role, rack, rail, nodes}."""
    with connection.cursor() as cur:
        cur.execute(_SWITCHES_SQL)
        return {
            sid: {"id": sid, "name": name, "role": role, "rack": rack, "rail": rail, "nodes": nodes}
            for sid, name, role, rack, rail, nodes in cur.fetchall()
        }


def _inherit_rails(switches: dict[int, dict], pairs: list[dict]) -> None:
    """Spines, then cores, without a rail of their own take the one rail of the switches below
    them, if those all share one (a rail-optimised plane)."""
    for role in ("spine", "core"):
        below: dict[int, set] = {}
        for p in pairs:
            if switches[p["hi"]]["role"] == role:
                below.setdefault(p["hi"], set()).add(switches[p["lo"]]["rail"])
        for sid, rails in below.items():
            if switches[sid]["rail"] is None and len(rails) == 1:
                switches[sid]["rail"] = rails.pop()


def _fabric(now: datetime, *, leaf_spine_only: bool) -> tuple[list[dict], dict[int, dict]]:
    """Switch pairs with their numbers, and the switches. Each statement reads its own snapshot,
    so a pair naming a switch an import added in between is left for the next call."""
    pairs = _pairs(now, leaf_spine_only=leaf_spine_only)
    switches = _switches()
    pairs = [p for p in pairs if p["lo"] in switches and p["hi"] in switches]
    _inherit_rails(switches, pairs)
    return pairs, switches


def _order(switches: list[dict]) -> list[dict]:
    """Grouped by rail (switches without one last), then by name."""
    return sorted(switches, key=lambda s: (s["rail"] is None, s["rail"] or 0, s["name"]))


def _float(v) -> float | None:
    return None if v is None else float(v)


# --- the leaf × spine matrix ------------------------------------------------------------------

def fabric_matrix(metric: str, *, now: datetime | None = None) -> dict:
    """The leaf × spine matrix of one metric, each cell aggregating the links of that pair.

    - ``utilization`` (%): the busier direction of the pair's links, in bits/s, over their
      summed speed (only links that report traffic count towards the speed);
    - ``congestion`` (ticks/s): summed PortXmitWait rate of the leaf's uplinks to that spine;
    - ``errors`` (errors/s): summed symbol error, receive error, link downed and link error
      recovery rates of both ends of the pair's links.

    `z[i][j]` is None where leaf i and spine j share no link or no reading; `links[i][j]` counts
    the cables. `leaf_rails`/`spine_rails` run parallel to the names, for grouping by rail.
    Raises ValueError for an unknown metric.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {sorted(METRICS)}")
    now = now or timezone.now()
    pairs, switches = _fabric(now, leaf_spine_only=True)
    leaves = _order([s for s in switches.values() if s["role"] == "leaf"])
    spines = _order([s for s in switches.values() if s["role"] == "spine"])
    row = {s["id"]: i for i, s in enumerate(leaves)}
    col = {s["id"]: j for j, s in enumerate(spines)}
    z = [[None] * len(spines) for _ in leaves]
    links = [[0] * len(spines) for _ in leaves]
    key = {"utilization": "util_pct", "congestion": "wait", "errors": "errors"}[metric]
    ranked = []
    for p in pairs:
        i, j = row[p["lo"]], col[p["hi"]]
        z[i][j], links[i][j] = _float(p[key]), p["links"]
        if z[i][j] is not None:
            ranked.append((-z[i][j], i, j))
    worst = [{"leaf": leaves[i]["name"], "spine": spines[j]["name"], "rail": leaves[i]["rail"], "value": -v,
              "links": links[i][j]} for v, i, j in heapq.nsmallest(WORST, ranked)]
    return {
        "metric": metric, "unit": METRICS[metric], "generated_at": iso_utc(now),
        "rate_bucket": iso_utc(rate_bucket(now)),
        "leaves": [s["name"] for s in leaves], "spines": [s["name"] for s in spines],
        "leaf_rails": [s["rail"] for s in leaves], "spine_rails": [s["rail"] for s in spines],
        "z": z, "links": links, "worst": worst,
    }


# --- the Clos graph ---------------------------------------------------------------------------

def _edge_state(p: dict) -> str:
    if not p["reporting"]:
        return "no data"
    if p["down"] == p["links"]:
        return "down"
    if p["down"] or (p["events"] or 0) > 0 or (p["line_errors"] or 0) >= LINE_ERRORS_PER_S:
        return "errors"
    if p["wait_max"] is not None and p["wait_max"] >= CONGESTED_WAIT_PER_S:
        return "congested"
    return "ok"


def fabric_graph(*, now: datetime | None = None, timeout_ms: int | None = None) -> list[dict]:
    """dash-cytoscape elements for the switch-level Clos topology; with `timeout_ms`, the read is cancelled
    (the database raises) past that many milliseconds.

    Nodes: one per switch, ``{"data": {"id": "sw<pk>", "label", "role", "rail", "rack",
    "nodes"}}``, where `nodes` counts the hosts cabled to it (HCAs are not drawn: 16k of them
    would bury the switches). Edges: one per switch pair, all its cables aggregated,
    ``{"data": {"id", "source" (lower tier), "target", "state", "util_pct", "links",
    "links_down", "errors_per_s", "xmit_wait_per_s"}}``; `state` is one of `EDGE_STATES`,
    "no data" where no port of the pair has a current reading.
    """
    now = now or timezone.now()
    if timeout_ms is None:
        pairs, switches = _fabric(now, leaf_spine_only=False)
    else:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(f"SET LOCAL statement_timeout = {int(timeout_ms)}")
            pairs, switches = _fabric(now, leaf_spine_only=False)
    nodes = [
        {"data": {"id": f"sw{s['id']}", "label": s["name"], "role": s["role"], "rail": s["rail"],
                  "rack": s["rack"], "nodes": s["nodes"]}}
        for s in sorted(switches.values(), key=lambda s: (s["role"], s["name"]))
    ]
    edges = [
        {"data": {"id": f"sw{p['lo']}-sw{p['hi']}", "source": f"sw{p['lo']}", "target": f"sw{p['hi']}",
                  "state": _edge_state(p), "util_pct": _float(p["util_pct"]), "links": p["links"],
                  "links_down": p["down"], "errors_per_s": _float(p["errors"]),
                  "xmit_wait_per_s": _float(p["wait"])}}
        for p in sorted(pairs, key=lambda p: (p["lo"], p["hi"]))
    ]
    return nodes + edges


# --- one port ---------------------------------------------------------------------------------

def _port_info(port: Port) -> dict:
    owner = port.switch or port.node
    rack = owner.rack.name if owner.rack_id else None
    return {
        "id": port.id, "name": port.name, "owner_kind": "switch" if port.switch_id else "node",
        "owner": port.owner_name, "role": port.switch.role if port.switch_id else "hca", "rack": rack,
        "guid": port.guid or None, "lid": port.lid, "link_layer": port.link_layer,
        "speed_gbps": port.speed_gbps, "rail": port.rail,
    }


def _peer(port: Port) -> Port | None:
    link = (Link.objects.filter(Q(a_id=port.id) | Q(b_id=port.id))
            .select_related("a__switch__rack", "a__node__rack", "b__switch__rack", "b__node__rack").first())
    if link is None:
        return None
    return link.b if link.a_id == port.id else link.a


def _json_value(v):
    # Counters stay exact integers (byte counters pass 2**53); gauges come back as floats.
    return v if v is None or isinstance(v, int) else float(v)


def _port_latest(cur, port_id: int, state: health.Health) -> dict:
    spec = KINDS["port"]
    cur.execute(f"SELECT * FROM {spec.latest_table} WHERE port_id = %s", [port_id])
    row = cur.fetchone()
    values = dict(zip([d.name for d in cur.description], row, strict=True)) if row else {}
    when = values.get("time")
    return {
        "time": iso_utc(when) if when else None,
        "stale": not state.fresh,
        "fields": {
            f.name: {"value": _json_value(values.get(f.name)), "unit": f.unit, "kind": f.kind, "help": f.help}
            for f in spec.fields
        },
    }


def _port_rates(cur, port_id: int, now: datetime) -> dict:
    counters = tuple(f.name for f in KINDS["port"].fields if f.kind == COUNTER)
    cur.execute(f"SELECT r.* FROM (SELECT %(port)s::int AS id) p {rate_join('port', counters, 'p.id', 'r')}",
                {**window_params(now), "port": port_id})
    values = dict(zip([d.name for d in cur.description], cur.fetchone(), strict=True))
    units = KINDS["port"].by_name
    return {
        "bucket": iso_utc(values["bucket"]) if values["bucket"] else None,
        "fields": {c: {"value": _float(values[c]), "unit": f"{units[c].unit}/s"} for c in counters},
    }


def port_detail(port_id: int, *, now: datetime | None = None) -> dict | None:
    """One port (switch port or HCA), the port at the other end of its cable, the newest value
    of every PORT field with its unit, and the current rate of every counter.

    `utilization` is each direction's data rate in bits/s over the speed (negotiated if
    reported, else configured). None when no such port exists.
    """
    now = now or timezone.now()
    port = Port.objects.select_related("switch__rack", "node__rack").filter(pk=port_id).first()
    if port is None:
        return None
    peer = _peer(port)
    state = health.port_health([port.id], now=now)[port.id]
    with connection.cursor() as cur:
        latest = _port_latest(cur, port.id, state)
        rates = _port_rates(cur, port.id, now)
    negotiated = None if latest["stale"] else latest["fields"]["link_speed_gbps"]["value"]
    speed_bps = (negotiated or port.speed_gbps or 0) * 1e9
    util = {
        f"{way}_pct": 100.0 * rates["fields"][f"{way}_data_bytes"]["value"] * 8 / speed_bps
        if speed_bps and rates["fields"][f"{way}_data_bytes"]["value"] is not None else None
        for way in ("xmit", "rcv")
    }
    return {
        "generated_at": iso_utc(now), "port": _port_info(port), "peer": _port_info(peer) if peer else None,
        **health_fields(state),
        "latest": latest, "rates": rates, "utilization": util,
    }
