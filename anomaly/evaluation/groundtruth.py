"""What the simulator planted, and which anomalies it explains: the matching rule of a quiet run.

`FaultWatch` collects the simulator's own declarations (`telemetry.simulator.truth`): the latent
defects the cluster was built with, every fault it injected and when, and what they show in. It
never looks at what a detector saw. `FaultLog.explain` then judges each *member* of an anomaly event
(one detector's finding on one entity, `anomaly.grouping`) by three tests, all of which must hold:

1. **Entity.** The member's entity is the fault's entity or one of its related entities: a port's
   link peer and a hot leaf's ports (both ends) as the fault declares them; a node's GPUs, HCA ports
   and the leaf ports cabled to them; a job's ranks and its nodes' GPUs. A rank counts as its GPU
   (rank = node position in the job x 8 + GPU index, as the simulator numbers them), a GPU as its node.
2. **Time.** The member was first flagged between the fault's start minus `WARNING` and its end
   plus `AFTER` (`AFTER_BY_SIGNAL` for error counters); a latent defect lasts the whole run, a fault
   with no end yet (an XID the GPU keeps until it is reset) until the run's end.
3. **Signal.** One of the member's signal families (`telemetry.simulator.truth.SIGNALS`) is one the fault
   shows in (a node that went down shows in all). A member's families are those of its contributions that
   are beyond the detectors' threshold (`EVIDENCE_SIGMA`, 6σ) or not finite: what it was flagged for;
   when none is (a straggler's ratio, a failure risk's precursors), the family of its leading one.

An event is a true positive when every member is explained; one unexplained member makes it false
(grouping must not launder a false alarm inside a true one). Precision = true events / events.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from anomaly.grouping import EVIDENCE_SIGMA
from telemetry.models import Gpu, Job, Port, Rack
from telemetry.simulator.truth import ANY, FaultRecorder, family_of, latent_defects

# A fault is drawn in the interval before the tick that reports it (up to a minute in the quiet run),
# and an anomaly is timed by its scoring minute, not by its sample: a member flagged up to five minutes
# before the declared start is taken as the fault's. Nothing earlier: the simulator's random faults have
# no precursors, so an earlier "warning" would be chance.
WARNING = timedelta(minutes=5)
# How long after a fault ends its detectors may still show it: the minute detectors read the last two
# complete minutes a minute late, own-history models need a few passes to see a GPU back in its regime.
AFTER = timedelta(minutes=10)
# Error counters stay in the failure model's and the XID feature's last-hour windows for an hour.
AFTER_BY_SIGNAL = {"gpu errors": timedelta(hours=1), "nvlink errors": timedelta(hours=1)}


@dataclass(frozen=True)
class Seen:
    """One member of an anomaly event in the simulator's terms: which detector flagged which entity, when."""

    kind: str  # the detector (AnomalyKind value)
    entity_kind: str
    entity: object  # UUID, owner:port, rack name, sim-<id>, or (sim-<id>, rank)
    started_at: datetime  # the member's first minute
    pk: int = 0  # the event it belongs to
    summary: str = ""
    signals: tuple[tuple[str, float], ...] = ()  # (telemetry field, deviation in σ), leading first

    @property
    def families(self) -> set[str]:
        """What it was flagged for: the families of its signals beyond the threshold, else of its leading one."""
        strong = [f for f, d in self.signals if d != d or abs(d) >= EVIDENCE_SIGMA]
        return {family_of(f) for f in strong or [f for f, _ in self.signals[:1]]} - {None}


def canonical_entities(rows: Iterable) -> list[Seen]:
    """Every member of the anomaly events `rows`, entities as the simulator names them (database ids
    looked up once). An event without members (written before grouping) is its own one member."""
    rows = list(rows)
    members = [(a, m) for a in rows for m in (a.members or [_as_member(a)])]
    ids = defaultdict(set)
    for _, m in members:
        if str(m["entity_id"]).isdigit():
            ids[m["entity_kind"]].add(int(m["entity_id"]))
    names = {
        "gpu": dict(Gpu.objects.filter(pk__in=ids["gpu"]).values_list("pk", "uuid")),
        "rack": dict(Rack.objects.filter(pk__in=ids["rack"]).values_list("pk", "name")),
        "job": dict(Job.objects.filter(pk__in=ids["job"]).values_list("pk", "external_id")),
        "port": {p.pk: f"{p.switch.name if p.switch_id else p.node.hostname}:{p.name}"
                 for p in Port.objects.filter(pk__in=ids["port"]).select_related("switch", "node")},
    }
    return [Seen(m["kind"], m["entity_kind"], _canonical(m["entity_kind"], str(m["entity_id"]), names),
                 _when(m["first_seen"]), a.pk, m.get("summary") or a.summary,
                 tuple((f, float("nan") if d is None else float(d)) for f, d in m.get("signals") or ()))
            for a, m in members]


def _as_member(a) -> dict:
    return {"kind": a.kind, "entity_kind": a.entity_kind, "entity_id": a.entity_id, "first_seen": a.started_at,
            "summary": a.summary,
            "signals": [(c.get("field", ""), c.get("deviation")) for c in a.contributions or ()]}


def _when(t) -> datetime:
    return t if isinstance(t, datetime) else datetime.fromisoformat(t)


def _canonical(kind: str, raw: str, names: dict) -> object:
    if kind == "rank":
        job, _, rank = raw.rpartition("#")
        return (_canonical("job", job, names), int(rank) if rank.isdigit() else rank)
    if raw.isdigit() and kind in names:
        return names[kind].get(int(raw), raw)
    if kind == "job":
        return raw.split(":", 1)[1] if raw.startswith(("slurm:", "k8s:")) else raw
    return raw


# --- the fault log --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fault:
    """One declared defect or fault, ready to match: what, when, in which signals, on which entities."""

    what: str
    latent: bool
    starts: datetime
    ends: datetime | None  # None: lasts (latent, or no end yet)
    signals: frozenset[str]
    targets: frozenset[tuple[str, object]]

    def covers(self, s: Seen) -> bool:
        """The time and signal tests (the entity test is the index's)."""
        shared = (s.families or {ANY}) if ANY in self.signals else s.families & self.signals
        if not shared:
            return False
        after = max(AFTER_BY_SIGNAL.get(family, AFTER) for family in shared)
        return self.starts - WARNING <= s.started_at and (self.ends is None or s.started_at <= self.ends + after)

    @property
    def label(self) -> str:
        return f"latent {self.what}" if self.latent else self.what


@dataclass
class FaultLog:
    """The simulator's ground-truth lines of one run, and the maps the entity test needs."""

    declared: list[dict] = field(default_factory=list)  # telemetry.simulator.truth lines
    events: list[tuple[datetime, str]] = field(default_factory=list)  # Tick.events, as printed
    gpu_at: dict[tuple[str, int], str] = field(default_factory=dict)  # (host, index) -> UUID
    gpu_host: dict[str, str] = field(default_factory=dict)  # UUID -> host
    job_hosts: dict[str, list[str]] = field(default_factory=dict)  # sim-<id> -> hosts, in rank order
    host_ports: dict[str, list[str]] = field(default_factory=dict)  # host -> its HCA ports and their leaf ends
    _index: dict = field(default_factory=dict, repr=False)
    _indexed: int = -1

    def count(self, *, latent: bool) -> Counter:
        """Declared lines per kind of defect, latent or injected."""
        return Counter(d["defect"] for d in self.declared if d["latent"] == latent)

    def explain(self, s: Seen, *, latent: bool = True) -> Fault | None:
        """The declared fault that explains this member (the module's three tests), or None; with
        `latent=False`, only a fault injected during the run counts."""
        if self._indexed != len(self.declared):
            self._build()
        for alias in self.aliases(s):
            for fault in self._index.get(alias, ()):
                if (latent or not fault.latent) and fault.covers(s):
                    return fault
        return None

    def aliases(self, s: Seen) -> list[tuple[str, object]]:
        """The entity and what it counts as: a rank its GPU and job, a GPU its node, an HCA port its node."""
        kind, entity = s.entity_kind, s.entity
        if kind == "rank":
            job, rank = entity
            hosts = self.job_hosts.get(job, [])
            gpu = self.gpu_at.get((hosts[rank // 8], rank % 8)) if isinstance(rank, int) and rank // 8 < len(
                hosts) else None
            return [("rank", entity), ("job", job)] + (self._gpu(gpu) if gpu else [])
        if kind == "gpu":
            return self._gpu(entity)
        if kind == "port":
            owner = str(entity).split(":", 1)[0]
            return [("port", entity)] + ([("node", owner)] if owner in self.host_ports else [])
        return [(kind, entity)]

    def _gpu(self, uuid: str) -> list[tuple[str, object]]:
        host = self.gpu_host.get(uuid)
        return [("gpu", uuid)] + ([("node", host)] if host else [])

    def _build(self) -> None:
        index: dict[tuple[str, object], list[Fault]] = defaultdict(list)
        for d in self.declared:
            fault = self._fault(d)
            for target in fault.targets:
                index[target].append(fault)
        self._index, self._indexed = dict(index), len(self.declared)

    def _fault(self, d: dict) -> Fault:
        kind, entity = d["entity_kind"], d["entity"]
        targets = {(kind, entity)} | {(k, i) for k, i in d.get("related", ())}
        if kind == "node":
            targets |= {("port", p) for p in self.host_ports.get(entity, ())}
        ends = datetime.fromisoformat(d["ends_at"]) if d.get("ends_at") else None
        return Fault(d["defect"], bool(d["latent"]), datetime.fromisoformat(d["starts_at"]), ends,
                     frozenset(d["signals"]), frozenset(targets))


class FaultWatch:
    """Fills a `FaultLog` from the simulator's own declarations, tick by tick (`observe` after each step)."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.recorder = FaultRecorder(cluster)
        flat = [g for gpus in cluster.gpus for g in gpus]
        fabric = cluster.fabric
        ports = {cluster.layout.nodes[i].hostname: [k for p in hcas for k in (f"{p.owner}:{p.name}", _peer(p)) if k]
                 for i, hcas in enumerate(fabric.hca)}
        self.log = FaultLog(gpu_at={(g.host, g.spec.index): g.spec.uuid for g in flat},
                            gpu_host={g.spec.uuid: g.host for g in flat}, host_ports=ports)

    def observe(self, tick) -> None:
        log = self.log
        if not log.declared and not self.recorder.lines:
            log.declared += latent_defects(self.cluster, tick.time.timestamp())
        log.events.extend((tick.time, line) for line in tick.events)
        for job in (tick.jobs or {}).get("jobs", []):
            if job["nodes"]:  # a pending job lists none yet
                log.job_hosts[job["job_id"]] = list(job["nodes"])
        log.declared += self.recorder.observe(tick)


def _peer(p) -> str:
    return f"{p.peer.owner}:{p.peer.name}" if p.peer else ""


# --- precision -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Precision:
    """The anomaly events of a scenario-free run held against everything the simulator declared."""

    events: int
    true_events: int
    strict_true_events: int  # every member explained by a fault injected during the run, not a latent one
    members: int
    explained: dict[str, int]  # fault label -> members it explains
    unexplained: list[Seen]  # members nothing explains

    @property
    def precision(self) -> float | None:
        """True events / events; None when there were none."""
        return self.true_events / self.events if self.events else None

    @property
    def strict_precision(self) -> float | None:
        """The same, counting only faults that happened during the run (no latent defects)."""
        return self.strict_true_events / self.events if self.events else None

    @property
    def member_precision(self) -> float | None:
        """Explained members / members: how much of what the events bundle is real."""
        return sum(self.explained.values()) / self.members if self.members else None


def quiet_precision(seen: list[Seen], log: FaultLog) -> Precision:
    """Judge every member; an event is true when all of its members are explained (see the module)."""
    by_event: dict[int, list[tuple[Seen, Fault | None, bool]]] = defaultdict(list)
    for s in seen:
        fault = log.explain(s)
        injected = fault is not None and (not fault.latent or log.explain(s, latent=False) is not None)
        by_event[s.pk].append((s, fault, injected))
    explained: Counter = Counter()
    unexplained = []
    for s, fault, _ in (judged for pairs in by_event.values() for judged in pairs):
        if fault is None:
            unexplained.append(s)
        else:
            explained[fault.label] += 1
    true = sum(all(f is not None for _, f, _ in pairs) for pairs in by_event.values())
    strict = sum(all(injected for _, _, injected in pairs) for pairs in by_event.values())
    return Precision(len(by_event), true, strict, len(seen), dict(explained), unexplained)
