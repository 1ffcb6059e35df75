"""The one health model: every GPU, node, port and rack has one state, derived here and nowhere else.

States, worst first for an operator's eye (docs/health.md says the same for operators):

- ``failed``: the hardware is gone or must not run work: an open fault event that needs a reset
  or an RMA (XID 79 "fallen off the bus", a double-bit ECC error, a row-remap failure, the XIDs
  in `RESET_OR_RMA_XIDS`), a volatile DBE count or row-remap failure in its newest values, or a
  node the scheduler reports down. A port is failed when its link is not Active.
- ``stale``: no data. The newest sample is older than two of the source's own collection
  intervals (learned by ingest, `interval_s` of the last-value row) plus `STALE_GRACE`, or the
  entity never reported. `STALE_AFTER` caps the wait for slow sources and is the interval
  assumed before a source's second sample. A stale entity's last values are never shown as
  current: pages show its age instead ("no data for 2 min").
- ``draining``: its node is drained in the scheduler but jobs still run there; ``drained``: drained
  and empty.
- ``degraded``: still working, but protecting itself or running below spec: hardware/thermal
  throttling, temperatures at the slowdown line, a pending row remap, an open NVLink error event;
  a port negotiated below its rated speed.
- ``ok``: none of the above.

A failed GPU stays failed while its node is drained: draining is what the operator did about it,
failed is what the hardware is. The rules are one ordered table per entity kind (`GPU_RULES`,
`PORT_RULES`), compiled into one SQL statement each, which gives both the state and the rule that
decided it (the reason). Every page, count, heatmap, search result, risk figure and API response
reads these functions, so no two of them can disagree.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

from core.db import fetch_binary
from telemetry.fields import KINDS
from telemetry.models import Allocation, Gpu, GpuEvent, HealthState, Node, NodeState, Port
from telemetry.xid import describe

# XIDs whose documented recovery is a GPU reset, a node reboot or an RMA (NVIDIA "XID Errors"
# catalogue): 48 DBE, 63/64 row-remap (page retirement) event/failure, 74 NVLink error,
# 79 fallen off the bus, 94/95 contained/uncontained ECC, 119 GSP timeout. Other XIDs are
# usually application faults and say nothing about the hardware.
RESET_OR_RMA_XIDS: tuple[int, ...] = (48, 63, 64, 74, 79, 94, 95, 119)
# Event kinds that are a hardware failure whatever their code, and those that only degrade.
FAILING_EVENT_KINDS: tuple[str, ...] = ("fallen_off_bus", "ecc_dbe", "row_remap_failure")
DEGRADING_EVENT_KINDS: tuple[str, ...] = ("nvlink_errors",)

# clocks_event_reasons bits that mean the hardware is protecting itself, not that the GPU is
# idle or capped by policy (nvml.h nvmlClocksEventReason*): HW slowdown, SW thermal, HW thermal
# and HW power brake. Idle (0x1), app clocks (0x2) and SW power cap (0x4) are normal operation.
HW_SLOWDOWN = 0x8
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
DEGRADING_THROTTLE_MASK = HW_SLOWDOWN | SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN | HW_POWER_BRAKE_SLOWDOWN

# Temperatures (°C) at which a datacenter GPU is already slowing down or close to it.
GPU_TEMP_DEGRADED_C = 87
MEMORY_TEMP_DEGRADED_C = 95

# IB PortState: 4 is Active; Down (1), Init (2) and Armed (3) carry no traffic.
PORT_STATE_ACTIVE = 4

# Worst first: the order pages sort by, and the order a node or rack takes its GPUs' worst state in.
ORDER: tuple[str, ...] = ("failed", "stale", "degraded", "draining", "drained", "ok")
RANK = {state: i for i, state in enumerate(ORDER)}


def stale_grace() -> timedelta:
    return settings.STALE_GRACE


# The same limit in SQL, for a last-value row aliased `l`.
_LIMIT_SQL = (
    "least(2 * coalesce(nullif(l.interval_s, 0), %(stale_cap_s)s) + %(stale_grace_s)s, %(stale_cap_s)s)"
)
_AGE_SQL = "extract(epoch FROM %(now)s - l.time)"
_STALE_SQL = f"(l.time IS NULL OR {_AGE_SQL} > {_LIMIT_SQL})"
# For other read paths over a last-value table aliased `l` (with `sql_params`): rows that are current.
FRESH_SQL = f"NOT {_STALE_SQL}"


def fresh_sql(alias: str) -> str:
    """`FRESH_SQL` for a last-value table aliased `alias` (a caller's constant, never input)."""
    assert alias.isidentifier()
    return f"({alias}.time IS NOT NULL AND NOT {_STALE_SQL.replace('l.', alias + '.')})"


@dataclass(frozen=True)
class Rule:
    """One row of a rule table: the first whose SQL condition holds decides state and reason."""

    state: str
    reason: str
    sql: str


GPU_RULES: tuple[Rule, ...] = (
    Rule("failed", "node_down", "n.state = 'down'"),
    Rule("failed", "fault_event", "ev.gpu_id IS NOT NULL"),
    Rule("failed", "ecc_dbe", "l.ecc_dbe_vol > 0"),
    Rule("failed", "row_remap_failure", "l.row_remap_failure = 1"),
    Rule("draining", "drain", "n.state = 'drained' AND busy.node_id IS NOT NULL"),
    Rule("drained", "drain", "n.state = 'drained'"),
    Rule("stale", "no_data", _STALE_SQL),
    Rule("degraded", "throttle", "(l.throttle_reasons & %(throttle_mask)s) <> 0"),
    Rule("degraded", "gpu_temp", "l.gpu_temp >= %(gpu_temp)s"),
    Rule("degraded", "memory_temp", "l.memory_temp >= %(memory_temp)s"),
    Rule("degraded", "row_remap_pending", "l.row_remap_pending = 1"),
    Rule("degraded", "nvlink_errors", "dv.gpu_id IS NOT NULL"),
)

PORT_RULES: tuple[Rule, ...] = (
    Rule("failed", "node_down", "n.state = 'down'"),
    Rule("stale", "no_data", _STALE_SQL),
    Rule("failed", "link_down", f"l.link_state IS NOT NULL AND l.link_state < {PORT_STATE_ACTIVE}"),
    Rule("degraded", "slow_link", "l.link_speed_gbps > 0 AND p.speed_gbps > 0 AND l.link_speed_gbps < p.speed_gbps"),
)


def _case(rules: Iterable[Rule], column: str) -> str:
    arms = " ".join(f"WHEN {r.sql} THEN '{getattr(r, column)}'" for r in rules)
    return f"CASE {arms} ELSE 'ok' END"


_EVENTS = GpuEvent._meta.db_table
_GPU_LATEST = KINDS["gpu"].latest_table
_PORT_LATEST = KINDS["port"].latest_table

# Open events, one row per GPU (its oldest open failing event: the one that failed it). The
# partial index gpu_event_open_idx holds exactly the open rows, so this stays small at any size.
_GPU_FROM = f"""
WITH ev AS (
    SELECT DISTINCT ON (gpu_id) gpu_id, kind, code, first_seen FROM {_EVENTS}
    WHERE cleared_at IS NULL
      AND (kind = ANY(%(failing_kinds)s) OR (kind = 'xid' AND code = ANY(%(rma_xids)s)))
    ORDER BY gpu_id, first_seen
), dv AS (
    SELECT DISTINCT ON (gpu_id) gpu_id, first_seen FROM {_EVENTS}
    WHERE cleared_at IS NULL AND kind = ANY(%(degrading_kinds)s)
    ORDER BY gpu_id, first_seen
), busy AS (
    SELECT DISTINCT node_id FROM {Allocation._meta.db_table} WHERE "end" IS NULL
)
SELECT {{columns}}
FROM {Gpu._meta.db_table} g
JOIN {Node._meta.db_table} n ON n.id = g.node_id
LEFT JOIN {_GPU_LATEST} l ON l.gpu_id = g.id
LEFT JOIN ev ON ev.gpu_id = g.id
LEFT JOIN dv ON dv.gpu_id = g.id
LEFT JOIN busy ON busy.node_id = g.node_id
WHERE %(all)s OR g.id = ANY(%(ids)s)
"""
GPU_STATE_SQL = _case(GPU_RULES, "state")
_GPU_SQL = _GPU_FROM.format(columns=f"""g.id, g.node_id, n.rack_id, {GPU_STATE_SQL} AS state,
       {_case(GPU_RULES, "reason")} AS reason, l.time, {_AGE_SQL} AS age_s, {_LIMIT_SQL} AS limit_s,
       ev.kind, ev.code, ev.first_seen, l.gpu_temp, l.memory_temp""")
# Fleet-wide: the state, and whether the newest values may count as current (load and power).
_GPU_STATES_COLUMNS = f"g.id, g.node_id, n.rack_id, {GPU_STATE_SQL}, NOT {_STALE_SQL}"

_PORT_SQL = f"""
SELECT p.id, p.node_id, p.switch_id,
       {_case(PORT_RULES, "state")} AS state,
       {_case(PORT_RULES, "reason")} AS reason,
       l.time, {_AGE_SQL} AS age_s, {_LIMIT_SQL} AS limit_s,
       l.link_state, l.link_speed_gbps, p.speed_gbps
FROM {Port._meta.db_table} p
LEFT JOIN {Node._meta.db_table} n ON n.id = p.node_id
LEFT JOIN {_PORT_LATEST} l ON l.port_id = p.id
WHERE %(all)s OR p.id = ANY(%(ids)s)
"""


def sql_params(now: datetime, ids: Iterable[int] | None = None) -> dict:
    id_list = None if ids is None else sorted({i for i in ids if i is not None})
    return {
        "now": now, "all": id_list is None, "ids": id_list or [],
        "stale_cap_s": settings.STALE_AFTER.total_seconds(),
        "stale_grace_s": stale_grace().total_seconds(),
        "failing_kinds": list(FAILING_EVENT_KINDS), "degrading_kinds": list(DEGRADING_EVENT_KINDS),
        "rma_xids": list(RESET_OR_RMA_XIDS), "throttle_mask": DEGRADING_THROTTLE_MASK,
        "gpu_temp": GPU_TEMP_DEGRADED_C, "memory_temp": MEMORY_TEMP_DEGRADED_C,
    }


@dataclass(frozen=True)
class Health:
    """One entity's state, the rule that decided it, and how old its newest data is."""

    state: str
    reason: str
    detail: str  # the reason in an operator's words
    since: datetime | None  # when the failing event began, or the last sample of a stale entity
    age_s: float | None  # age of the newest sample, None when it never reported
    fresh: bool  # whether its newest values may be shown as current

    @property
    def label(self) -> str:
        return HealthState(self.state).label

    @property
    def colour(self) -> str:
        return HealthState.colour(self.state)

    def as_dict(self) -> dict:
        return {
            "state": self.state, "label": self.label, "colour": self.colour, "reason": self.reason,
            "detail": self.detail, "since": self.since and self.since.astimezone(UTC).isoformat(),
            "age_s": None if self.age_s is None else round(self.age_s, 1), "fresh": self.fresh,
        }


def health_fields(h: Health) -> dict:
    """The health keys every page row carries (what `{% health_badge %}` reads)."""
    return {"health": h.state, "health_colour": h.colour, "health_label": h.label, "health_detail": h.detail,
            "health_age_s": None if h.age_s is None else round(h.age_s, 1), "fresh": h.fresh}


# A GPU nobody has reported (a rank that names no known GPU).
UNKNOWN = Health("stale", "no_data", "no data yet", None, None, False)


def age_text(age_s: float | None) -> str:
    """How long there has been no data, as a page says it: "no data for 2 min"."""
    if age_s is None:
        return "no data yet"
    s = max(0, int(age_s))
    if s < 120:
        return f"no data for {s} s"
    if s < 7200:
        return f"no data for {s // 60} min"
    if s < 172800:
        return f"no data for {s // 3600} h"
    return f"no data for {s // 86400} d"


def _gpu_detail(reason: str, row: dict) -> str:
    if reason == "fault_event":
        kind, code = row["kind"], row["code"]
        if kind == "xid":
            return f"XID {code}: {describe(code).name}"
        return {"fallen_off_bus": "XID 79: GPU has fallen off the bus", "ecc_dbe": "Double-bit ECC error",
                "row_remap_failure": "Row remapping failure"}.get(kind, kind)
    if reason == "no_data":
        return age_text(row["age_s"])
    if reason == "gpu_temp":
        return f"GPU at {row['gpu_temp']:.0f} °C"
    if reason == "memory_temp":
        return f"memory at {row['memory_temp']:.0f} °C"
    return REASONS.get(reason, reason)


REASONS = {
    "ok": "", "node_down": "node down (scheduler)", "ecc_dbe": "double-bit ECC errors since the last reset",
    "row_remap_failure": "row remapping failed", "drain": "node drained", "throttle": "hardware/thermal throttling",
    "row_remap_pending": "row remap pending (reset needed)", "nvlink_errors": "NVLink errors",
    "link_down": "link not active", "slow_link": "link below its rated speed", "no_data": "no data",
}


def _health(row: dict, detail: str) -> Health:
    stale_now = row["time"] is None or (row["age_s"] is not None and row["age_s"] > row["limit_s"])
    since = row.get("first_seen") if row["reason"] == "fault_event" else (row["time"] if stale_now else None)
    return Health(row["state"], row["reason"], detail, since, row["age_s"], not stale_now)


def _rows(sql: str, params: dict) -> list[dict]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        names = [d.name for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def gpu_health(gpu_ids: Iterable[int] | None = None, *, now: datetime | None = None) -> dict[int, Health]:
    """{gpu_id: Health} for the given GPUs (every GPU when None)."""
    now = now or timezone.now()
    out = {}
    for row in _rows(_GPU_SQL, sql_params(now, gpu_ids)):
        row["age_s"] = None if row["age_s"] is None else float(row["age_s"])
        out[row["id"]] = _health(row, _gpu_detail(row["reason"], row))
    return out


def gpu_states(*, now: datetime | None = None, fields: tuple[str, ...] = ()) -> list[tuple]:
    """(gpu_id, node_id, rack_id, state, fresh, *newest value of each of `fields`) for every GPU: the shape
    fleet-wide reads need. The values come from the same last-value row the state was decided on, so a
    page that shows both (the heatmap's metrics) reads them in one statement."""
    now = now or timezone.now()
    unknown = [f for f in fields if f not in KINDS["gpu"].by_name]
    if unknown:
        raise ValueError(f"unknown gpu field(s): {', '.join(unknown)}")
    columns = "".join(f", l.{f}" for f in fields)  # names checked above
    return fetch_binary(_GPU_FROM.format(columns=_GPU_STATES_COLUMNS + columns), sql_params(now, None))


# Only the ports that are not OK, filtered in the database: at 65k ports, building a Health for every port
# to keep the few that are not OK cost ~1 s of Python, every 2 s in the live pages' health check.
_PORT_NOT_OK_SQL = f"SELECT * FROM ({_PORT_SQL}) s WHERE s.state <> 'ok'"


def port_health(port_ids: Iterable[int] | None = None, *, now: datetime | None = None,
                not_ok: bool = False) -> dict[int, Health]:
    """{port_id: Health} for the given ports (every port when None); with `not_ok`, only those whose state
    is not OK."""
    now = now or timezone.now()
    out = {}
    for row in _rows(_PORT_NOT_OK_SQL if not_ok else _PORT_SQL, sql_params(now, port_ids)):
        row["age_s"] = None if row["age_s"] is None else float(row["age_s"])
        reason = row["reason"]
        if reason == "no_data":
            detail = age_text(row["age_s"])
        elif reason == "slow_link":
            detail = f"link at {row['link_speed_gbps']:g} of {row['speed_gbps']:g} Gb/s"
        else:
            detail = REASONS.get(reason, reason)
        out[row["id"]] = _health(row, detail)
    return out


def worst(states: Iterable[str]) -> str:
    """The most severe of several states; ok when there are none."""
    return min(states, key=RANK.__getitem__, default="ok")


def node_state_from(node_state: str, has_jobs: bool, gpu_states_: Iterable[str]) -> str:
    """A node's state: the scheduler's down/drain first, else its worst GPU."""
    if node_state == NodeState.DOWN.value:
        return "failed"
    if node_state == NodeState.DRAINED.value:
        return "draining" if has_jobs else "drained"
    return worst(gpu_states_)


def node_health(node_ids: Iterable[int] | None = None, *, now: datetime | None = None) -> dict[int, Health]:
    """{node_id: Health}: the node's own scheduler state, else the worst of its GPUs (with that
    GPU's reason, naming it)."""
    now = now or timezone.now()
    nodes = Node.objects.all() if node_ids is None else Node.objects.filter(id__in=list(node_ids))
    nodes = {n.id: n for n in nodes.only("id", "state")}
    gpus = Gpu.objects.filter(node_id__in=list(nodes)).values_list("id", "node_id", "index")
    index = {g: (node, i) for g, node, i in gpus}
    health = gpu_health(list(index), now=now) if index else {}
    busy = set(Allocation.objects.filter(node_id__in=list(nodes), end__isnull=True).values_list("node_id", flat=True))
    by_node: dict[int, list[tuple[int, Health]]] = {n: [] for n in nodes}
    for gpu_id, h in health.items():
        node_id, i = index[gpu_id]
        by_node[node_id].append((i, h))
    out = {}
    for node_id, node in nodes.items():
        members = sorted(by_node[node_id], key=lambda p: (RANK[p[1].state], p[0]))
        state = node_state_from(node.state, node_id in busy, (h.state for _, h in members))
        ages = [h.age_s for _, h in members if h.age_s is not None]
        age = min(ages) if ages else None
        if node.state == NodeState.DOWN.value:
            out[node_id] = Health("failed", "node_down", REASONS["node_down"], None, age, False)
        elif node.state == NodeState.DRAINED.value:
            out[node_id] = Health(state, "drain", "node drained, jobs still running" if state == "draining"
                                  else REASONS["drain"], None, age, bool(members) and members[-1][1].fresh)
        elif not members or state == "ok":
            out[node_id] = Health("ok", "ok", "", None, age, True)
        else:
            i, h = members[0]
            n_same = sum(1 for _, m in members if m.state == state)
            if state == "stale" and n_same == len(members):
                detail = age_text(h.age_s)
            else:
                detail = f"GPU {i}: {h.detail}" + (f" (+{n_same - 1} more)" if n_same > 1 else "")
            out[node_id] = Health(state, h.reason, detail, h.since, age, h.fresh)
    return out


def rack_state_from(node_states: Iterable[str]) -> str:
    """A rack's state: failed or stale only when every node is, ok when every node is ok (or
    drained on purpose), degraded when some nodes are not."""
    states = list(node_states)
    if not states:
        return "ok"
    for whole in ("failed", "stale"):
        if all(s == whole for s in states):
            return whole
    return "ok" if all(s in ("ok", "drained") for s in states) else "degraded"


# Fleet-wide counts, counted by PostgreSQL: at 16k GPUs the fleet summary runs after every ingest slot,
# and bringing every GPU's row into Python cost more than the rules themselves. The node and rack rules
# here are `node_state_from` and `rack_state_from` in SQL; test_health checks the two agree.
_FLEET_COUNTS_SQL = f"""
WITH gs AS ({_GPU_FROM.format(columns=f"g.id, g.node_id, {GPU_STATE_SQL} AS state")}),
ns AS (
    SELECT n.id, n.rack_id, CASE
        WHEN n.state = 'down' THEN 'failed'
        WHEN n.state = 'drained' THEN CASE WHEN EXISTS (
            SELECT 1 FROM {Allocation._meta.db_table} a WHERE a.node_id = n.id AND a."end" IS NULL)
            THEN 'draining' ELSE 'drained' END
        ELSE coalesce((%(order)s::text[])[min(array_position(%(order)s::text[], gs.state))], 'ok')
    END AS state
    FROM {Node._meta.db_table} n LEFT JOIN gs ON gs.node_id = n.id
    GROUP BY n.id
),
rs AS (
    SELECT CASE
        WHEN bool_and(state = 'failed') THEN 'failed'
        WHEN bool_and(state = 'stale') THEN 'stale'
        WHEN bool_and(state IN ('ok', 'drained')) THEN 'ok'
        ELSE 'degraded' END AS state
    FROM ns WHERE rack_id IS NOT NULL GROUP BY rack_id
)
SELECT (SELECT json_object_agg(state, n) FROM (SELECT state, count(*) n FROM gs GROUP BY state) c),
       (SELECT json_object_agg(state, n) FROM (SELECT state, count(*) n FROM ns GROUP BY state) c),
       (SELECT json_object_agg(state, n) FROM (SELECT state, count(*) n FROM rs GROUP BY state) c),
       (SELECT coalesce(array_agg(id ORDER BY id), '{{}}') FROM gs WHERE state = 'failed')
"""


def fleet_counts(*, now: datetime | None = None) -> dict:
    """GPU, node and rack counts per state for the whole fleet (one statement), and the failed GPUs."""
    now = now or timezone.now()
    with connection.cursor() as cur:
        cur.execute(_FLEET_COUNTS_SQL, {**sql_params(now, None), "order": list(ORDER)})
        gpus, nodes, racks, failed = cur.fetchone()
    return {
        "failed_gpu_ids": tuple(failed),
        "gpus": Counter(gpus or {}),
        "nodes": Counter(nodes or {}),
        "racks": Counter(racks or {}),
    }


def states_display(counts: Counter) -> dict:
    """Every state in display order with its label, colour and count, zeros included."""
    return {
        "total": sum(counts.values()),
        "by_health": {s: {"label": HealthState(s).label, "colour": HealthState.colour(s), "count": counts.get(s, 0)}
                      for s in ORDER},
    }
