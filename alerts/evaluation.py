"""Rule evaluation: every rule kind is one set-based query over the whole fleet, never a loop over entities.

A rule's query returns the entities for which its condition holds now ("hits"): inventory ids (or job keys)
with a value. The few hits are then named in one query per entity kind (GPU UUID, node, rack, port), turned
into `Observation`s (labels: alertname, severity, the rule's labels, the entity's labels and `entity`, plus
`tenant=<slug>` when the entity is a job or a GPU/node that one tenant's jobs hold: `tenancy.selectors.tenants_for`)
and handed to the lifecycle, which fires, merges and resolves.

Kinds and where they read:
- threshold: a field of a last-value table (`telemetry_*_sample_latest`), fresh rows only (`telemetry.health`);
  per GPU, node (its worst GPU), rack (its worst GPU, the worst power device feeding it, or its draw
  `draw_w` / `pct_of_cap` from the power selector) or port;
- rate: a counter's increase over `window_seconds` in the raw hypertable, per minute (a drop is a counter
  restart: the new value counts from zero), per GPU, node, rack or port;
- xid: open XID fault events whose code, or whose catalogue action, the rule names; value = the code;
- anomaly / risk: the anomaly app's current `EntityScore` (anomaly_score / failure_risk);
- job: straggling ranks and diverging jobs the detectors' latest pass found (members of open anomaly
  events), one alert per job;
- node_down: nodes that have reported but whose newest GPU sample is older than `threshold` seconds.
"""

from __future__ import annotations

import logging
import operator
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import Q

from alerts.actions import clear_evaluation_flag, record_evaluation
from alerts.lifecycle import Observation, apply_observations, do_hold_pending, do_resolve_orphans
from alerts.locks import lock_lifecycle
from alerts.models import AlertState, EntityKind, Rule, RuleKind, RulePending
from anomaly.selectors import current_members
from telemetry import health
from telemetry.fields import COUNTER, KINDS
from telemetry.models import Gpu, GpuEvent, GpuEventKind, Node, NodeState, Port, PowerDevice, Rack, Switch
from telemetry.selectors.power import power_overview
from telemetry.xid import describe, effective_action
from tenancy.selectors import tenants_for

logger = logging.getLogger(__name__)

OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
RACK_POWER_METRICS = ("draw_w", "pct_of_cap")  # from telemetry.selectors.power, not a stored field
MAX_NARROW_RATE = 2000  # past this many moved counters, one scan of the window beats per-entity index probes
GPU, NODE, RACK, PORT, SWITCH = (m._meta.db_table for m in (Gpu, Node, Rack, Port, Switch))
FEEDS = PowerDevice.racks.through._meta.db_table


class RuleError(ValueError):
    """A rule that cannot be evaluated as configured (unknown field, unsupported entity)."""


@dataclass
class Hit:
    """An entity for which a rule's condition holds: kind, inventory id (a job key for jobs), value, extras."""

    kind: str
    ref: int | str
    value: float | None
    labels: dict = field(default_factory=dict)
    annotations: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Entity:
    """How an alert names its entity: the key stored on the alert, a display name and the entity labels."""

    key: str
    display: str
    labels: dict


# --- Values: (id, v) rows of one source kind -----------------------------------------------------------

def _field(rule: Rule, source: str, *, counter: bool = False) -> str:
    """The rule's metric, checked against the field registry (it is put into SQL)."""
    spec = KINDS[source].by_name.get(rule.metric)
    if spec is None:
        raise RuleError(f"{rule.metric!r} is not a {source} field")
    if counter and spec.kind != COUNTER:
        raise RuleError(f"{rule.metric!r} is a {spec.kind}, not a counter; use a threshold rule")
    return spec.name


def _source(rule: Rule) -> str:
    """Which wide table holds the rule's metric for its entity."""
    if rule.entity == EntityKind.PORT:
        return "port"
    if rule.entity == EntityKind.RACK and rule.metric in KINDS["power"].by_name:
        return "power"
    return "gpu"


def _latest_sql(source: str, metric: str) -> str:
    kind = KINDS[source]
    return (f"SELECT l.{kind.entity_column} AS id, l.{metric}::float8 AS v FROM {kind.latest_table} l "
            f"WHERE {health.FRESH_SQL} AND l.{metric} IS NOT NULL")


def _rate_sql(source: str, metric: str, *, only_ids: bool) -> str:
    """Increase per minute over the window; a drop is a restart, after which the new value is the increase."""
    kind, ent = KINDS[source], KINDS[source].entity_column
    only = f"{ent} = ANY(%(ids)s) AND " if only_ids else ""
    return f"""
        SELECT id, sum(CASE WHEN d < 0 THEN m ELSE d END)::float8 * 60 / %(window)s AS v
        FROM (SELECT {ent} AS id, {metric}::float8 AS m,
                     {metric} - lag({metric}) OVER (PARTITION BY {ent} ORDER BY time) AS d
              FROM {kind.table}
              WHERE {only}time > %(since)s AND time <= %(now)s AND {metric} IS NOT NULL) s
        WHERE d IS NOT NULL GROUP BY id"""


def _moved_counters(source: str, metric: str, since: datetime) -> list[int]:
    """Entities whose counter may have moved in the window: the last value differs from the value just before
    the window (the 1-minute rollup's `_last` of the minute before it). An entity without that value (a young
    site, one younger than the window, or one silent in that minute) moved when any rolled-up minute since shows
    a step, or its last value differs from the newest rolled-up one, or nothing of it is rolled up yet.

    Reading the raw window costs a sort of every sample of the fleet (~330k rows for 5 min at 16k GPUs);
    this reads one row per entity, and the exact increase is then taken from raw for these few only. A
    counter that restarted and climbed back to exactly its old value is the one case it misses.

    Without the second test, every entity of a site younger than the window counted as moved: the rule then
    read the whole raw window, growing with the site's age, until the site was a window old (a 10-minute DBE
    rule at 16k GPUs: 1.6 s an evaluation, a seventh of the database's time in the soak's first 11 minutes).
    The minutes' steps are a superset of the window's (the first one steps from before it), so nothing that
    moved in the window is left out.
    """
    kind, ent = KINDS[source], KINDS[source].entity_column
    rollup = kind.rollup_table("1m")
    before = since.replace(second=0, microsecond=0) - timedelta(minutes=1)
    with connection.cursor() as cur:
        cur.execute(f"""SELECT l.{ent} FROM {kind.latest_table} l
                        LEFT JOIN {rollup} r ON r.{ent} = l.{ent} AND r.bucket = %(before)s
                        WHERE l.time > %(since)s AND l.{metric} IS NOT NULL
                          AND CASE WHEN r.{metric}_last IS NOT NULL THEN l.{metric} <> r.{metric}_last
                                   ELSE NOT EXISTS (
                                       SELECT FROM {rollup} m WHERE m.{ent} = l.{ent} AND m.bucket > %(before)s
                                       HAVING count(m.{metric}_last) > 0 AND coalesce(sum(m.{metric}_delta), 0) = 0
                                          AND last(m.{metric}_last, m.bucket)
                                              FILTER (WHERE m.{metric}_last IS NOT NULL) = l.{metric})
                              END""", {"before": before, "since": since})
        return [row[0] for row in cur.fetchall()]


def _score_sql(column: str, entity: str) -> tuple[str, str]:
    """(source kind, SQL) of current scores, keyed by inventory id (or job key)."""
    base = f"FROM anomaly_entity_score s {{join}} WHERE s.entity_kind = '{{kind}}' AND s.{column} IS NOT NULL"
    if entity in (EntityKind.GPU, EntityKind.NODE):
        join = f"JOIN {GPU} g ON g.uuid = s.entity_id"
        return "gpu", f"SELECT g.id AS id, s.{column} AS v " + base.format(join=join, kind="gpu")
    if entity == EntityKind.RACK:
        join = f"JOIN {RACK} r ON r.name = s.entity_id"
        return "rack", f"SELECT r.id AS id, s.{column} AS v " + base.format(join=join, kind="rack")
    if entity == EntityKind.PORT:
        join = f"JOIN {PORT} p ON p.id::text = s.entity_id"
        return "port", f"SELECT p.id AS id, s.{column} AS v " + base.format(join=join, kind="port")
    if entity == EntityKind.JOB:
        return "job", f"SELECT s.entity_id AS id, s.{column} AS v " + base.format(join="", kind="job")
    raise RuleError(f"scores are not kept for {entity} entities")


# Rolling a source's values up to the rule's entity: (key column, joins); None = the source is the entity.
_GROUPS: dict[tuple[str, str], tuple[str, str] | None] = {
    ("gpu", "gpu"): None,
    ("gpu", "node"): ("g.node_id", f"JOIN {GPU} g ON g.id = x.id"),
    ("gpu", "rack"): ("n.rack_id", f"JOIN {GPU} g ON g.id = x.id "
                                   f"JOIN {NODE} n ON n.id = g.node_id AND n.rack_id IS NOT NULL"),
    ("port", "port"): None,
    ("rack", "rack"): None,
    ("power", "rack"): ("f.rack_id", f"JOIN {FEEDS} f ON f.powerdevice_id = x.id"),
    ("job", "job"): None,
}


def _matching(rule: Rule, source: str, values_sql: str, params: dict) -> list[Hit]:
    """Entities whose value (a node's or rack's worst member's) compares true with the threshold."""
    if rule.threshold is None:
        raise RuleError(f"a {rule.kind} rule needs a threshold")
    if rule.op not in OPS or (source, rule.entity) not in _GROUPS:
        raise RuleError(f"op {rule.op!r} on {rule.entity} is not supported for this {source} metric")
    group = _GROUPS[(source, rule.entity)]
    if group is None:
        sql = f"SELECT x.id, x.v FROM ({values_sql}) x WHERE x.v {rule.op} %(thr)s"
    else:
        key, joins = group
        agg = "max" if rule.op in (">", ">=") else "min"  # the worst member decides
        sql = (f"SELECT {key}, {agg}(x.v) FROM ({values_sql}) x {joins} GROUP BY {key} "
               f"HAVING {agg}(x.v) {rule.op} %(thr)s")
    with connection.cursor() as cur:
        cur.execute(sql, {**params, "thr": rule.threshold})
        return [Hit(rule.entity, ref, float(v)) for ref, v in cur.fetchall()]


# --- One function per rule kind -------------------------------------------------------------------------

def _threshold(rule: Rule, now: datetime) -> list[Hit]:
    if rule.entity == EntityKind.RACK and rule.metric in RACK_POWER_METRICS:
        return _rack_power(rule, now)
    source = _source(rule)
    sql = _latest_sql(source, _field(rule, source))
    return _matching(rule, source, sql, health.sql_params(now))


def _rack_power(rule: Rule, now: datetime) -> list[Hit]:
    if rule.threshold is None or rule.op not in OPS:
        raise RuleError("a rack power rule needs an op and a threshold")
    compare = OPS[rule.op]
    return [Hit(EntityKind.RACK, r["id"], float(r[rule.metric]),
                annotations={"draw_source": r["source"] or ""})
            for r in power_overview(now=now)["racks"]
            if r[rule.metric] is not None and compare(r[rule.metric], rule.threshold)]


def _rate(rule: Rule, now: datetime) -> list[Hit]:
    source = _source(rule)
    metric = _field(rule, source, counter=True)
    window = max(int(rule.window_seconds), 1)
    since = now - timedelta(seconds=window)
    params = {"since": since, "now": now, "window": window}
    # Only entities whose counter moved can exceed a threshold a still counter (rate 0) does not meet.
    narrow = rule.op in OPS and rule.threshold is not None and not OPS[rule.op](0.0, rule.threshold)
    if narrow:
        params["ids"] = _moved_counters(source, metric, since)
        narrow = len(params["ids"]) <= MAX_NARROW_RATE
    hits = _matching(rule, source, _rate_sql(source, metric, only_ids=narrow), params)
    for h in hits:
        h.annotations["window_seconds"] = str(window)
    return hits


def _xid(rule: Rule, now: datetime) -> list[Hit]:
    codes, actions = {int(c) for c in rule.xid_codes or []}, set(rule.xid_actions or [])
    if not codes and not actions:
        raise RuleError("an xid rule needs XID codes or catalogue action classes")
    rows = (GpuEvent.objects.filter(kind=GpuEventKind.XID, cleared_at__isnull=True)
            .values_list("gpu_id", "gpu__node_id", "code", "message", "count", "first_seen"))
    hits: dict[tuple, Hit] = {}
    for gpu_id, node_id, code, message, count, first_seen in rows:
        action = effective_action(code, message)
        if code not in codes and action not in actions:
            continue
        ref = node_id if rule.entity == EntityKind.NODE else gpu_id
        kind = EntityKind.NODE if rule.entity == EntityKind.NODE else EntityKind.GPU
        hits.setdefault((ref, code), Hit(kind, ref, float(code), labels={"xid": str(code)}, annotations={
            "xid_name": describe(code).name, "action": action, "count": str(count),
            "first_seen": first_seen.isoformat(), "message": message[:500]}))
    return list(hits.values())


def _scores(rule: Rule, now: datetime) -> list[Hit]:
    column = "anomaly_score" if rule.kind == RuleKind.ANOMALY else "failure_risk"
    source, sql = _score_sql(column, rule.entity)
    return _matching(rule, source, sql, {})


def _job(rule: Rule, now: datetime) -> list[Hit]:
    """One hit per job with a rank straggling (or the job diverging) as of the detectors' latest pass.

    Anomaly events are grouped by cause (`anomaly.grouping`): a straggling rank is a member of its
    host's event, which stays open a while after the rank recovers. So the rule reads the members,
    and only those the latest pass found: an alert resolves when the rank catches up, not an hour later.
    """
    if rule.metric not in ("straggler", "divergence"):
        raise RuleError(f"a job rule watches 'straggler' or 'divergence', not {rule.metric!r}")
    compare = OPS.get(rule.op, operator.ge)
    firing = current_members(rule.metric)
    jobs: dict[str, Hit] = {}
    for m in firing:
        if rule.threshold is not None and not compare(m["last_score"], rule.threshold):
            continue
        key, _, rank = m["entity_id"].partition("#")
        hit = jobs.setdefault(key, Hit(EntityKind.JOB, key, float(m["last_score"]),
                                       annotations={"detail": m.get("summary", ""), "ranks": "", "hosts": ""}))
        for name, item in (("ranks", rank), ("hosts", m.get("host", ""))):
            listed = hit.annotations[name].split(", ") if hit.annotations[name] else []
            if item and item not in listed:
                hit.annotations[name] = ", ".join([*listed, item])
    return list(jobs.values())


def _node_down(rule: Rule, now: datetime) -> list[Hit]:
    """Hardware that stopped reporting, by the health model's rule (two of its own collection intervals
    plus the push delay; `telemetry.health`): for entity "node", a node whose every GPU has no data or
    that the scheduler reports down; for entity "gpu", a silent GPU on a node that still reports. A
    threshold, when set, is a minimum age in seconds on top. Never-reported hardware is not "down"."""
    rows, details = _pass_read("gpu_states", _gpu_states_and_silent, now)
    by_node: dict[int, list] = {}
    for gpu_id, node_id, _, state, _ in rows:
        by_node.setdefault(node_id, []).append((gpu_id, details.get(gpu_id) or health.Health(
            state, state, "", None, None, True)))
    silent_nodes = {n for n, gpus in by_node.items()
                    if all(h.state == "stale" for _, h in gpus) and any(h.age_s is not None for _, h in gpus)}
    def old_enough(age: float) -> bool:
        return rule.threshold is None or age >= rule.threshold

    hits = []
    if rule.entity == EntityKind.GPU:
        for node_id, gpus in by_node.items():
            if node_id in silent_nodes:
                continue
            hits += [Hit(EntityKind.GPU, gpu_id, round(h.age_s), annotations={"detail": h.detail})
                     for gpu_id, h in gpus if h.state == "stale" and h.age_s is not None and old_enough(h.age_s)]
        return hits
    down = set(Node.objects.filter(state=NodeState.DOWN).values_list("id", flat=True))
    for node_id in silent_nodes | down:
        ages = [h.age_s for _, h in by_node.get(node_id, []) if h.age_s is not None]
        age = min(ages) if ages else None
        if node_id in down or (age is not None and old_enough(age)):
            detail = "down in the scheduler" if node_id in down else health.age_text(age)
            hits.append(Hit(EntityKind.NODE, node_id, None if age is None else round(age),
                            annotations={"detail": detail}))
    return hits


def _gpu_states_and_silent(now: datetime) -> tuple[list[tuple], dict[int, health.Health]]:
    rows = health.gpu_states(now=now)  # one cheap pass; the details only for the silent GPUs
    return rows, health.gpu_health([r[0] for r in rows if r[3] == "stale"], now=now)


# Reads that several rules of one pass share, made once per pass: both default node-down rules read every
# GPU's state (78 ms at 16k GPUs under load, on every ingest-triggered evaluation). Set by run_evaluation.
_pass_reads: ContextVar[dict | None] = ContextVar("alerts_pass_reads", default=None)


def _pass_read(key: str, read, now: datetime):
    reads = _pass_reads.get()
    if reads is None:
        return read(now)
    if key not in reads:
        reads[key] = read(now)
    return reads[key]


EVALUATORS = {
    RuleKind.THRESHOLD: _threshold, RuleKind.RATE: _rate, RuleKind.XID: _xid, RuleKind.ANOMALY: _scores,
    RuleKind.RISK: _scores, RuleKind.JOB: _job, RuleKind.NODE_DOWN: _node_down,
}


# --- Naming the entities: one query per kind, for the hits only ---------------------------------------

_ENTITY_SQL = {
    EntityKind.GPU: f"""SELECT g.id, g.uuid, g.index, n.hostname, r.name FROM {GPU} g
                        JOIN {NODE} n ON n.id = g.node_id LEFT JOIN {RACK} r ON r.id = n.rack_id
                        WHERE g.id = ANY(%s)""",
    EntityKind.NODE: f"""SELECT n.id, n.hostname, r.name FROM {NODE} n LEFT JOIN {RACK} r ON r.id = n.rack_id
                         WHERE n.id = ANY(%s)""",
    EntityKind.RACK: f"SELECT r.id, r.name FROM {RACK} r WHERE r.id = ANY(%s)",
    EntityKind.PORT: f"""SELECT p.id, p.name, s.name, n.hostname, r.name FROM {PORT} p
                         LEFT JOIN {SWITCH} s ON s.id = p.switch_id LEFT JOIN {NODE} n ON n.id = p.node_id
                         LEFT JOIN {RACK} r ON r.id = coalesce(n.rack_id, s.rack_id)
                         WHERE p.id = ANY(%s)""",
}


def _entity(kind: str, row: tuple) -> Entity:
    if kind == EntityKind.GPU:
        _, uuid, index, host, rack = row
        display = f"{host} GPU {index}" if index is not None else f"{uuid} on {host}"
        return Entity(uuid, display, _present(gpu=uuid, node=host, rack=rack))
    if kind == EntityKind.NODE:
        _, host, rack = row
        return Entity(host, host, _present(node=host, rack=rack))
    if kind == EntityKind.RACK:
        return Entity(row[1], f"rack {row[1]}", {"rack": row[1]})
    port_id, name, switch, host, rack = row
    label = f"{switch or host}:{name}"
    return Entity(str(port_id), label, _present(port=label, switch=switch, node=host, rack=rack))


def _present(**labels) -> dict[str, str]:
    return {k: str(v) for k, v in labels.items() if v not in (None, "")}


def name_entities(hits: list[Hit]) -> dict[tuple[str, int | str], Entity]:
    """(kind, ref) -> Entity for every hit; a hit whose inventory row vanished meanwhile is left out."""
    out: dict[tuple[str, int | str], Entity] = {}
    by_kind: dict[str, set] = {}
    for h in hits:
        by_kind.setdefault(h.kind, set()).add(h.ref)
    for kind, refs in by_kind.items():
        if kind == EntityKind.JOB:
            out.update({(kind, key): Entity(key, key, {"job": key}) for key in refs})
            continue
        with connection.cursor() as cur:
            cur.execute(_ENTITY_SQL[kind], [list(refs)])
            out.update({(kind, row[0]): _entity(kind, row) for row in cur.fetchall()})
    return out


# --- Observations ----------------------------------------------------------------------------------------

class _Template(dict):
    def __missing__(self, key: str) -> str:
        raise KeyError(key)


def _default_summary(rule: Rule, display: str, hit: Hit) -> str:
    v, thr, ann = hit.value, rule.threshold, hit.annotations
    if rule.kind == RuleKind.XID:
        return f"XID {v:.0f} ({ann['xid_name']}) on {display}; recommended: {ann['action'].replace('_', ' ')}"
    if rule.kind == RuleKind.NODE_DOWN:
        return f"{display} has not reported for {v:.0f} s" if v is not None else f"{display}: {ann['detail']}"
    if rule.kind == RuleKind.JOB:
        return f"job {display}: {ann.get('detail') or rule.metric}"
    what = {RuleKind.ANOMALY: "anomaly score", RuleKind.RISK: "failure risk"}.get(rule.kind, rule.metric)
    unit = "/min" if rule.kind == RuleKind.RATE else ""
    return f"{what} {v:.4g}{unit} {rule.op} {thr:g}{unit} on {display}"


def _summary(rule: Rule, display: str, hit: Hit, labels: dict) -> str:
    """The rule's template ({entity}, {value}, {threshold}, {metric}, any label or annotation) or a default."""
    if rule.summary:
        ctx = _Template({**hit.annotations, **labels}, entity=display, value=hit.value, threshold=rule.threshold,
                        metric=rule.metric)
        try:
            return rule.summary.format_map(ctx)[:300]
        except (KeyError, IndexError, ValueError, TypeError, AttributeError) as exc:
            logger.debug("rule %s: summary template failed (%s); using the default", rule.name, exc)
    return _default_summary(rule, display, hit)[:300]


def _observation(rule: Rule, hit: Hit, entity: Entity, tenant: str | None = None) -> Observation:
    labels = {**{str(k): str(v) for k, v in (rule.labels or {}).items()}, **entity.labels, **hit.labels,
              "alertname": rule.name, "severity": rule.severity, "entity": hit.kind}
    if tenant:
        labels["tenant"] = tenant
    annotations = {**hit.annotations, "summary": _summary(rule, entity.display, hit, labels)}
    if hit.value is not None:
        annotations["value"] = f"{hit.value:.6g}"
    annotations.pop("detail", None)
    return Observation(labels, annotations, hit.kind, entity.key, hit.value)


def observe(rule: Rule, now: datetime) -> list[Observation]:
    """The observations of one rule now (before its for_seconds hold). Raises RuleError for a bad rule."""
    if rule.kind not in EVALUATORS:
        raise RuleError(f"unknown rule kind {rule.kind!r}")
    hits = EVALUATORS[rule.kind](rule, now)
    names = name_entities(hits)
    tenants = hit_tenants(hits, now)
    return [_observation(rule, h, names[(h.kind, h.ref)], tenants.get((h.kind, h.ref)))
            for h in hits if (h.kind, h.ref) in names]


def hit_tenants(hits: list[Hit], now: datetime) -> dict[tuple[str, int | str], str]:
    """(kind, ref) -> tenant slug, for hits on a job (through its account) or on a GPU or node that exactly one
    tenant's jobs hold now: the alert then carries `tenant=<slug>`, which is how the tenant's portal sees it.
    One query per entity kind among the hits (a rule watches one kind: one query per evaluation)."""
    by_kind: dict[str, set] = {}
    for h in hits:
        if h.kind in (EntityKind.JOB, EntityKind.GPU, EntityKind.NODE):
            by_kind.setdefault(h.kind, set()).add(h.ref)
    return {(kind, ref): slug for kind, refs in by_kind.items()
            for ref, slug in tenants_for(kind, refs, now).items()}


def rule_problem(rule: Rule, now: datetime) -> str | None:
    """Why a rule cannot be evaluated as configured (for the rule form and API), or None."""
    try:
        with transaction.atomic():
            EVALUATORS[rule.kind](rule, now)
            transaction.set_rollback(True)
        if rule.summary:
            rule.summary.format_map(_Template(dict.fromkeys(rule.labels or {}, ""), entity="node-a GPU 0",
                                              value=1.0, threshold=rule.threshold or 0.0, metric=rule.metric))
    except KeyError as exc:
        return f"unknown name {exc} (the summary may use entity, value, threshold, metric and the rule's labels)"
    except (ValueError, TypeError, IndexError, AttributeError) as exc:
        return str(exc)
    return None


class RuleReplay:
    """Which alerts a set of rules would fire over a replayed timeline, touching no alert state.

    For evaluations that play history through the pipeline (``scenario_eval``'s quiet hour): call it
    at each evaluation time in order. Each rule is observed by the same code as a live pass (`observe`);
    an entity observed continuously for the rule's `for_seconds` fires once, and fires again only after
    an evaluation without it (resolved). Nothing is stored, routed or sent, so rules need not be saved.
    """

    def __init__(self, rules: list[Rule]):
        self.rules = rules
        self.since: dict[tuple[str, str], datetime] = {}  # (rule name, fingerprint) -> first observed
        self.firing: set[tuple[str, str]] = set()
        self.fired: list[dict] = []  # {at, rule, severity, kind, entity, summary}, in firing order

    def __call__(self, now: datetime) -> int:
        """Evaluate every rule at `now`; returns how many alerts fired."""
        seen, before = set(), len(self.fired)
        for rule in self.rules:
            for o in observe(rule, now):
                key = (rule.name, o.fingerprint)
                seen.add(key)
                since = self.since.setdefault(key, now)
                if key not in self.firing and (now - since).total_seconds() >= rule.for_seconds:
                    self.firing.add(key)
                    self.fired.append({"at": now, "rule": rule.name, "severity": rule.severity, "kind": rule.kind,
                                       "entity": o.entity_key, "summary": o.annotations.get("summary", "")})
        for key in set(self.since) - seen:
            del self.since[key]
            self.firing.discard(key)
        return len(self.fired) - before


# --- The evaluation pass ---------------------------------------------------------------------------------

def _evaluate_rule(rule: Rule, now: datetime, counts: dict) -> None:
    """One rule in a savepoint: a broken rule is logged and skipped, the others still run."""
    try:
        with transaction.atomic():
            observations = do_hold_pending(rule, observe(rule, now), now) if rule.enabled else []
            out = apply_observations(rule, observations, now)
    except RuleError as exc:
        counts["errors"] += 1
        logger.warning("alert rule %s skipped: %s", rule.name, exc)
        return
    except Exception:
        counts["errors"] += 1
        logger.exception("alert rule %s failed", rule.name)
        return
    counts["rules"] += rule.enabled
    counts["fired"] += len(out.fired)
    counts["resolved"] += len(out.resolved)


# A counter-rate rule is re-evaluated at most every max(RATE_EVERY_MIN_S, its window / RATE_EVERY_SHARE).
# Evaluations follow ingest commits (~40 a minute at 16k GPUs), and each rate rule costs a join of the
# last-value table with a minute of rollups (190 ms for 65k fabric ports under load): the four default
# rate rules were ~17 s of the database's every minute in the 16k soak. A rate over 300 s moves by at most
# a thirtieth of its value in 10 s, so reading it again sooner cannot change what fires; threshold, XID,
# score and node-down rules still run on every evaluation. Per process; an edited rule runs at once.
RATE_EVERY_MIN_S = 10.0
RATE_EVERY_SHARE = 30
_rate_evaluated: dict[int, tuple[datetime, datetime]] = {}  # rule id -> (its updated_at, evaluation time)


def _rate_not_due(rule: Rule, now: datetime) -> bool:
    if rule.kind != RuleKind.RATE or not rule.enabled:
        return False
    seen = _rate_evaluated.get(rule.pk)
    if seen is None or seen[0] != rule.updated_at:
        return False
    every = max(RATE_EVERY_MIN_S, rule.window_seconds / RATE_EVERY_SHARE)
    return timedelta(0) <= now - seen[1] < timedelta(seconds=every)


class EvaluationBusy(Exception):
    """Another evaluation holds the lifecycle lock (run_evaluation with wait=False)."""


def run_evaluation(now: datetime, *, wait: bool = True) -> dict:
    """Evaluate every enabled rule (and resolve the alerts of disabled or deleted ones), one evaluator at a
    time. Returns {rules, fired, resolved, errors, ms}.

    With wait=False, raises EvaluationBusy instead of waiting for a running evaluation: a Celery
    worker slot blocked on that lock is a slot that rollups and deliveries cannot use.
    """
    t0, started = time.perf_counter(), time.time()
    counts = {"rules": 0, "fired": 0, "resolved": 0, "errors": 0}
    reads = _pass_reads.set({})
    try:
        _run_pass(now, wait, counts)
    finally:
        _pass_reads.reset(reads)
    counts["ms"] = round((time.perf_counter() - t0) * 1000, 1)
    record_evaluation(started, counts["ms"] / 1000)
    logger.info("alert rules evaluated: %s", counts)
    return counts


def _run_pass(now: datetime, wait: bool, counts: dict) -> None:
    with transaction.atomic():
        if not lock_lifecycle(wait=wait):
            raise EvaluationBusy
        # Cleared once we hold the lock and before reading: a commit from now on queues the next run
        # (alerts.actions); one that came earlier is read by this run.
        clear_evaluation_flag()
        open_states = [AlertState.FIRING, AlertState.ACKNOWLEDGED]
        rules = Rule.objects.filter(Q(enabled=True) | Q(alerts__state__in=open_states)).distinct()
        for rule in rules:
            if _rate_not_due(rule, now):
                counts["not_due"] = counts.get("not_due", 0) + 1  # its alerts stay as they are
                continue
            _evaluate_rule(rule, now, counts)
            if rule.kind == RuleKind.RATE:
                _rate_evaluated[rule.pk] = (rule.updated_at, now)
        counts["resolved"] += len(do_resolve_orphans(now))
        # A hold is only meaningful while its rule is evaluated: re-enabled, a rule starts its holds afresh.
        RulePending.objects.filter(Q(rule__enabled=False) | Q(rule__for_seconds=0)).delete()
