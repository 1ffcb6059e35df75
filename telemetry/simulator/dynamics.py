"""The simulated cluster: jobs, GPUs, fabric and facility advanced together, tick by tick.

`Cluster.step(now)` moves every piece of state to `now` and returns a `Tick`: that instant's
ingest records grouped per rack (one HTTP request each) and the notable events. Everything
random comes from one `random.Random` seeded from the seed, and nothing reads the clock, so
the same seed and the same sequence of times give the same records.

One step, in order:
1. rare faults since the last tick (ECC, PCIe and NVLink errors, XIDs, maintenance reboots,
   symbol errors and link flaps), which may kill jobs and schedule reboots;
2. due reboots start, rebooted nodes come back (volatile counters from zero);
3. the scheduler ends and starts jobs; each job's activity for this instant is fixed;
4. every GPU of every reporting node advances (power, clocks, thermals, counters);
5. the fabric's rates follow the jobs' traffic and its counters advance;
6. the PDUs and cooling loops follow the racks' power;
7. the job feed (`feed.JobFeed`) adds the scheduler snapshot of the jobs that changed and the
   per-rank training steps of the jobs computing.

Scripted scenarios (`telemetry.simulator.scenarios`) are armed on the first tick, before the
scheduler fills the cluster (so they can claim idle nodes for their jobs), act on the state
after the reboots of step 2, and add their events to the finished tick. Nodes a scenario holds
get no random faults, so the scripted story is the only one their telemetry tells.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from telemetry.simulator import faults as F
from telemetry.simulator.fabric import Fabric
from telemetry.simulator.facility import NODE_DOWN_W, Facility, node_power
from telemetry.simulator.feed import JobFeed, lock_step
from telemetry.simulator.gpus import SimGpu, alphas
from telemetry.simulator.jobs import KINDS, Scheduler, make_job
from telemetry.simulator.topology import Layout, build_layout
from telemetry.simulator.truth import defect

DAY_S = 86_400.0
REBOOT_DOWN_S = (180.0, 420.0)


@dataclass
class Tick:
    """One instant's records, per rack, with what happened since the previous tick."""

    time: datetime
    batches: list[dict]  # {"rack": name, "gpus": [...], "ports": [...], "power": [...], "events": [...]}
    events: list[str] = field(default_factory=list)
    training: list[dict] = field(default_factory=list)  # POST /api/v1/training bodies from scenarios
    steps: list[dict] = field(default_factory=list)  # POST /api/v1/training bodies, per-rank step times
    jobs: dict | None = None  # POST /api/v1/jobs body: the jobs that changed, None when none did
    stats: dict = field(default_factory=dict)
    rebooted: list[str] = field(default_factory=list)  # hosts whose counters restart from zero

    @property
    def iso(self) -> str:
        return self.time.astimezone(UTC).isoformat().replace("+00:00", "Z")

    def body(self, batch: dict) -> dict:
        """The ingest request body for one rack's batch, in the API's columnar form (docs/ingest.md).

        Columns, not a record per entity: at 16,384 GPUs and 65,536 ports a tick is a third of
        the bytes, and the server validates a column at a time instead of a record at a time
        (rows form: ~0.8 s of the server's one Python thread per tick, columns: a fraction).
        """
        body = {"time": self.iso, "gpus": columns(batch["gpus"]), "migs": [], "ports": columns(batch["ports"]),
                "power": columns(batch["power"])}
        if batch.get("events"):
            body["events"] = batch["events"]
        return body

    def records(self, kind: str) -> list[dict]:
        """Every record of `kind` ("gpus", "ports" or "power") across the racks."""
        return [r for b in self.batches for r in b[kind]]


def columns(records: list[dict]) -> dict | list:
    """Records of one kind ({identity keys…, "fields": {…}}) as one object of equal-length columns.

    An identity key or field a record lacks is null on its row, which the API reads as "not
    reported", exactly as the missing key in the record form. No records: an empty list.
    """
    if not records:
        return []
    keys = list(dict.fromkeys(k for r in records for k in r if k != "fields"))
    names = list(dict.fromkeys(f for r in records for f in r["fields"]))
    out: dict = {k: [r.get(k) for r in records] for k in keys}
    out["fields"] = {f: [r["fields"].get(f) for r in records] for f in names}
    return out


class Cluster:
    """State of the whole simulated cluster between ticks."""

    def __init__(self, layout: Layout, *, seed: int = 1, interval: float = 10.0,
                 scheduling: bool = True, faults: bool = True, scenarios=None):
        self.layout, self.interval, self.faults_enabled = layout, interval, faults
        self.scenarios = scenarios  # a scenarios.ScenarioSet, or None
        self.held: set[int] = set()  # nodes a scenario holds: no random faults there
        self.rng = rng = random.Random(f"breakwater-simulator:{seed}")
        uptimes = [rng.uniform(1, 60) * DAY_S for _ in layout.nodes]
        flat = [(i, g) for i, n in enumerate(layout.nodes) for g in n.gpus]
        weak = set(rng.sample(range(len(flat)), max(1, len(flat) // 200)))
        hot = set(rng.sample(range(len(flat)), max(1, len(flat) // 250)))
        self.gpus: list[list[SimGpu]] = [[] for _ in layout.nodes]
        for k, (i, spec) in enumerate(flat):
            self.gpus[i].append(SimGpu(layout.nodes[i].hostname, spec, rng, weak=k in weak,
                                       hot=k in hot, uptime_s=uptimes[i]))
        self.hot_gpus = {flat[k][1].uuid for k in hot}  # declared as latent defects (`latent_defects`)
        self.node_index = {n.hostname: i for i, n in enumerate(layout.nodes)}
        self.scheduler = Scheduler(rng, [n.group for n in layout.nodes], held=self.held,
                                   meta=random.Random(f"breakwater-jobs:{seed}"))
        self.scheduler.enabled = scheduling
        self.feed = JobFeed(seed)
        self.fabric = Fabric(layout, rng, uptimes)
        self.facility = Facility(layout, rng)
        self.down_until: dict[int, float] = {}
        self.reboot_at: dict[int, tuple[float, str]] = {}
        self._rebooted: list[str] = []  # since the last tick
        self.last: float | None = None
        self._event_sources()

    @classmethod
    def build(cls, gpus: int = 2048, seed: int = 1, **kwargs) -> Cluster:
        return cls(build_layout(gpus, seed), seed=seed, **kwargs)

    def _event_sources(self) -> None:
        every = [(i, g) for i, gs in enumerate(self.gpus) for g in gs]

        def source(normal: float, weak: float) -> F.EventSource:
            return F.EventSource(every, [weak if g.weak else normal for _, g in every])

        self.sbe_events = source(F.SBE_PER_H, F.SBE_WEAK_PER_H)
        self.pcie_events = source(F.PCIE_REPLAY_PER_H, F.PCIE_REPLAY_WEAK_PER_H)
        self.nvlink_events = source(F.NVLINK_CRC_PER_H, F.NVLINK_CRC_WEAK_PER_H)
        self.xid_events = source(F.XID_PER_H, F.XID_WEAK_PER_H)
        nodes = range(len(self.gpus))
        self.maintenance = F.EventSource(nodes, [F.MAINTENANCE_REBOOT_PER_H] * len(nodes))

    # --- the tick -------------------------------------------------------------------------
    def step(self, now: datetime) -> Tick:
        """Advance to `now` (timezone-aware) and return that instant's records."""
        started = time.perf_counter()
        t = now.timestamp()
        first = self.last is None
        dt = 0.0 if first else max(0.0, t - self.last)
        events = self._faults(t, dt) if self.faults_enabled and dt else []
        events += self._reboots(t)
        if first:
            self.scheduler.number_from(t)
        if self.scenarios is not None:
            events += self.scenarios.arm(self, t) if first else []
            events += self.scenarios.before(t, dt)
        events += self.scheduler.step(t, warm=first)
        for job in self.scheduler.jobs.values():
            job.activity(t)
        lock_step(self)
        inlets = self.facility.inlets(t, dt)
        batches = [{"rack": r.name, "gpus": [], "ports": [], "power": [], "events": []}
                   for r in self.layout.racks]
        rack_watts, node_bps, node_cross = self._advance_gpus(t, dt, inlets, batches, first)
        self.fabric.step(dt, node_bps, node_cross)
        self.fabric.records(batches)
        it_w = self.facility.step(t, dt, rack_watts, batches)
        self.last = t
        tick = Tick(now, batches, events, rebooted=self._rebooted, jobs=self.feed.snapshot(self),
                    steps=self.feed.steps(self, t, dt))
        self._rebooted = []
        if self.scenarios is not None:
            self.scenarios.after(tick)
        tick.stats = self._stats(tick, it_w, started)
        return tick

    def _advance_gpus(self, t, dt, inlets, batches, first):
        a_gpu, a_mem = (1.0, 1.0) if first else alphas(dt)  # the first tick starts at steady state
        rnd, node_job = self.rng.random, self.scheduler.node_job
        rack_watts = [0.0] * len(self.layout.racks)
        node_bps = [0.0] * len(self.gpus)
        node_cross = [0.0] * len(self.gpus)
        for i, gpus in enumerate(self.gpus):
            spec = self.layout.nodes[i]
            if i in self.down_until:
                rack_watts[spec.rack] += NODE_DOWN_W
                continue
            job, inlet, out = node_job[i], inlets[spec.rack], batches[spec.rack]["gpus"]
            watts = idle = 0.0
            for g in gpus:
                if not g.dead:  # a GPU that fell off the bus answers nothing
                    out.append(g.tick(t, dt, a_gpu, a_mem, inlet, job, rnd() * 2 - 1))
                watts += g.power
                idle += g.idle_w
            rack_watts[spec.rack] += node_power(watts, idle, True)
            if job is not None and job.ib_bps:
                node_bps[i] = job.ib_bps * job.act
                node_cross[i] = job.cross.get(spec.group, 0.0)
        return rack_watts, node_bps, node_cross

    def _stats(self, tick: Tick, it_w: float, started: float) -> dict:
        gpus = sum(len(b["gpus"]) for b in tick.batches)
        return {
            "gpus": gpus, "ports": sum(len(b["ports"]) for b in tick.batches),
            "jobs": len(self.scheduler.jobs), "pending": len(self.scheduler.queue),
            "busy_gpus": self.scheduler.busy * 8,
            "down_nodes": len(self.down_until), "it_kw": it_w / 1000,
            "build_ms": (time.perf_counter() - started) * 1000,
        }

    def latent_defects(self, t0: float) -> list[dict]:
        """The GPUs the cluster was built defective, as ground-truth lines (`telemetry.simulator.truth`):
        weak ones draw error events at hundreds of times the normal rate; hot ones (a poor heat sink)
        run hotter under load, throttle their clocks and power sooner, and so also slow their rank."""
        out = []
        for g in (g for gpus in self.gpus for g in gpus):
            if g.weak:
                out.append(defect("weak-gpu", "gpu", g.spec.uuid, starts=t0, host=g.host, latent=True,
                                  signals=["gpu errors", "nvlink errors"],
                                  details={"why": "error-prone: SBE, PCIe replay, NVLink CRC and XID rates "
                                                  "far above a healthy GPU's"}))
            if g.spec.uuid in self.hot_gpus:
                out.append(defect("hot-gpu", "gpu", g.spec.uuid, starts=t0, host=g.host, latent=True,
                                  signals=["thermal", "power", "activity"],
                                  details={"why": "poor heat sink: hotter under load; thermal slowdown cuts its "
                                                  "clocks and power, and its rank waits less than its peers",
                                           "rth_k_per_w": round(g.rth, 4)}))
        return out

    # --- faults and reboots -----------------------------------------------------------------
    def _faults(self, t: float, dt: float) -> list[str]:
        rng, events = self.rng, []
        for i, g in self.sbe_events.sample(rng, dt):
            if self._reporting(i, g):
                g.ecc_sbe_vol += 1
                g.ecc_sbe_agg += 1
                g.remapped_rows_correctable += rng.random() < 1 / 40
        for i, g in self.pcie_events.sample(rng, dt):
            g.pcie_replay += self._reporting(i, g)
        for i, g in self.nvlink_events.sample(rng, dt):
            if self._reporting(i, g):
                g.nvlink_crc_flit_errors += rng.randrange(1, 30)
                g.nvlink_replay_errors += rng.random() < 0.3
                g.nvlink_crc_data_errors += rng.random() < 0.1
                g.nvlink_recovery_errors += rng.random() < 0.02
        for i, g in self.xid_events.sample(rng, dt):
            if self._reporting(i, g):
                events += self._xid(i, g, t)
        for i in self.maintenance.sample(rng, dt):
            # Maintenance takes an idle node (the scheduler drained it), never a running job.
            busy = self.scheduler.node_job[i] is not None
            free = i not in self.down_until and i not in self.reboot_at and i not in self.held
            if not busy and free:
                self.reboot_at[i] = (t + rng.uniform(0, dt), "maintenance")
                self.scheduler.unavailable.add(i)
        return events + self.fabric.faults(dt)

    def _reporting(self, i: int, g: SimGpu) -> bool:
        return i not in self.down_until and not g.dead and i not in self.held

    def _xid(self, i: int, g: SimGpu, t: float) -> list[str]:
        code = self.rng.choices(F.XID_CODES, F.XID_WEIGHTS)[0]
        _, needs_job, effect = F.XIDS[code]
        job = self.scheduler.node_job[i]
        if needs_job and job is None:
            return []  # application faults need an application
        g.xid = code
        if effect == "dbe":
            g.ecc_dbe_vol += 1
            g.ecc_dbe_agg += 1
            g.remapped_rows_uncorrectable += 1
            g.remap_pending = 1
        elif effect == "bus":
            g.dead = True
        events = [f"XID {code} on {g.host} GPU {g.spec.index}"]
        if job is not None:
            events.append(self.scheduler.finish(job, t, f"killed by XID {code} on {g.host}", "FAILED"))
        if effect in F.REBOOT_AFTER_S and i not in self.reboot_at:
            at = t + self.rng.uniform(*F.REBOOT_AFTER_S[effect])
            self.reboot_at[i] = (at, f"after XID {code}")
            self.scheduler.unavailable.add(i)  # drained until the reboot
        return events

    def _reboots(self, t: float) -> list[str]:
        events = []
        for i, (at, why) in sorted(self.reboot_at.items()):
            if at <= t:
                events.append(self._reboot(i, t, None, why))
        for i, until in sorted(self.down_until.items()):
            if until <= t:
                self._boot(i)
                events.append(f"{self.layout.nodes[i].hostname} back up")
        return events

    def reboot_node(self, hostname: str, now: datetime, *, down_s: float | None = None) -> str:
        """Reboot a node now: its job dies, it stops reporting for `down_s` seconds (3-7 min by
        default) and comes back with its volatile GPU and HCA counters reset."""
        return self._reboot(self.node_index[hostname], now.timestamp(), down_s, "on request")

    def _reboot(self, i: int, t: float, down_s: float | None, why: str) -> str:
        self.reboot_at.pop(i, None)
        host = self.layout.nodes[i].hostname
        if i in self.down_until:
            return f"{host} is already rebooting"
        down = self.rng.uniform(*REBOOT_DOWN_S) if down_s is None else down_s
        self.lose_node(i, t, t + down)
        self._rebooted.append(host)
        return f"{host} rebooting ({why}), down for {down:.0f} s"

    def lose_node(self, i: int, t: float, until: float = math.inf) -> str | None:
        """Node `i` stops at `t` until `until` (for good by default): its agent, GPUs and HCA ports
        report nothing, its leaf ports see the links drop, and the scheduler marks it down, so its
        job ends NODE_FAIL as Slurm ends it. Returns the job's end line, if a job was running."""
        job = self.scheduler.node_job[i]
        ended = None
        if job is not None:
            ended = self.scheduler.finish(job, t, f"lost node {self.layout.nodes[i].hostname}", "NODE_FAIL")
        self.down_until[i] = until
        self.scheduler.unavailable.add(i)
        self.fabric.node_down(i)
        return ended

    def _boot(self, i: int) -> None:
        del self.down_until[i]
        self.scheduler.unavailable.discard(i)
        inlet = self.facility.supply[self.facility.rack_loop[self.layout.nodes[i].rack]]
        for g in self.gpus[i]:
            g.reset(inlet)
        self.fabric.node_up(i)

    # --- for tests and demonstrations -----------------------------------------------------------
    def start_job(self, hostnames: list[str], kind: str, now: datetime, *,
                  minutes: float = 60) -> int:
        """Start a job of `kind` (one of jobs.KINDS) on the named idle nodes; returns its id."""
        if kind not in KINDS:
            raise ValueError(f"unknown job kind {kind!r}; one of {', '.join(KINDS)}")
        nodes = sorted(self.node_index[h] for h in hostnames)
        if any(self.scheduler.node_job[i] or i in self.down_until for i in nodes):
            raise ValueError("every node of a new job must be up and idle")
        job = make_job(self.rng, self.scheduler.new_id(), kind, nodes, now.timestamp(), minutes)
        return self.scheduler.place(job).id
