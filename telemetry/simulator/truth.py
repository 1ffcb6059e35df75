"""Ground truth for everything the simulator plants: latent defects, injected faults, observed conditions.

Scenario lines (`telemetry.simulator.scenarios`) say what a scripted story breaks. This module declares
the rest, in JSON lines of the same shape:

    {"defect", "latent", "entity_kind", "entity", "host", "starts_at", "ends_at", "signals",
     "related", "details"}

- `defect`: what it is ("hot-gpu", "marginal-cable", "sbe", "xid", "reboot", ...);
- `latent`: built into the cluster (present from the first tick, never an event) or not;
- `entity_kind` / `entity`: a GPU UUID, a port ``owner:port``, a switch, a node's hostname, a rack, a
  job ``sim-<id>``;
- `starts_at` / `ends_at`: RFC 3339 UTC; `ends_at` null while it lasts (a latent defect, an XID that
  stays in the GPU until it is reset);
- `signals`: the signal families it shows in (`SIGNALS`), or ``["any"]`` for a node that went down;
- `related`: other entities it shows on, as ``[kind, id]`` (a link's far end, a hot leaf's ports and
  the ports feeding them, the nodes of a job it killed).

Latent defects come from the cluster's construction (`latent_defects`). Injected faults are read from
the simulator's own state after every tick (`FaultRecorder`): which counters rose, which GPU took an
XID or fell off the bus, which node rebooted, which link flapped; never from what a detector saw.
Nodes a scenario holds are left out: their story is the scenario's own line. A rack drawing past its
cap is not planted (it follows the jobs' load) but is a real condition, so the recorder declares it
as observed (``"defect": "rack-over-cap"``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from operator import attrgetter
from typing import Protocol

from telemetry.simulator.topology import RACK_POWER_CAP_W


class Cluster(Protocol):
    """The simulated cluster (telemetry.simulator.dynamics.Cluster), named for type hints only:
    dynamics imports this module, so importing it back, even under TYPE_CHECKING, would make
    the two a circle."""


class Tick(Protocol):
    """One step of the simulated cluster (telemetry.simulator.dynamics.Tick); see Cluster."""

# Signal families: the telemetry fields (and detector features) a kind of fault shows in.
SIGNALS: dict[str, tuple[str, ...]] = {
    "thermal": ("gpu_temp", "memory_temp", "sm_clock", "mem_clock", "throttle_reasons", "inlet_temp"),
    "power": ("power_w", "rack_power", "energy_mj"),
    "gpu errors": ("ecc_sbe_vol", "ecc_dbe_vol", "ecc_sbe_agg", "ecc_dbe_agg", "pcie_replay", "xid", "xid_events",
                   "remapped_rows_correctable", "remapped_rows_uncorrectable", "remap_pending", "remap_failure"),
    "nvlink errors": ("nvlink_crc_flit_errors", "nvlink_crc_data_errors", "nvlink_replay_errors",
                      "nvlink_recovery_errors"),
    "port errors": ("symbol_errors", "rcv_errors", "link_downed", "link_error_recovery", "link_state",
                    "rcv_remote_phys_errors", "local_link_integrity_errors", "link_speed_gbps"),
    "congestion": ("xmit_wait", "link_util", "xmit_data_bytes", "rcv_data_bytes", "xmit_discards"),
    "activity": ("gpu_util", "sm_active", "sm_occupancy", "tensor_active", "dram_active", "fb_used",
                 "nvlink_tx_bps", "pcie_tx_bps", "step_time_s", "compute_time_s"),
    "training": ("loss", "grad_norm", "nan_count", "inf_count"),
}
ANY = "any"  # a node that went down: every signal of its GPUs and ports
# Derived features (the failure model's windows) name their family by prefix.
_PREFIXES = (
    (("sbe_", "dbe_", "retired_", "remap", "xid_", "pcie_replay"), "gpu errors"),
    (("gpu_temp", "memory_temp", "hot_hours"), "thermal"),
    (("nvlink_crc", "nvlink_replay", "nvlink_recovery"), "nvlink errors"),
    (("idle_power",), "power"),
)
_FAMILY = {f: family for family, fields in SIGNALS.items() for f in fields}

# What counts as a GPU fault in the simulator's state: a rise of these (family by index below).
_GPU_STATE = attrgetter(
    "ecc_sbe_agg", "ecc_dbe_agg", "remapped_rows_correctable", "remapped_rows_uncorrectable", "pcie_replay",
    "nvlink_crc_flit_errors", "nvlink_crc_data_errors", "nvlink_replay_errors", "nvlink_recovery_errors",
)
_GPU_DEFECTS = ("sbe", "dbe", "row-remap", "row-remap", "pcie-replay", "nvlink-crc", "nvlink-crc", "nvlink-replay",
                "nvlink-recovery")


def family_of(field: str) -> str | None:
    """The signal family of a telemetry field or detector feature; None for one no family claims."""
    if field in _FAMILY:
        return _FAMILY[field]
    return next((family for prefixes, family in _PREFIXES if field.startswith(prefixes)), None)


def iso(t: float | datetime) -> str:
    """Epoch seconds (or an aware datetime) as RFC 3339 UTC with a Z, as the ground-truth lines write times."""
    when = t if isinstance(t, datetime) else datetime.fromtimestamp(t, UTC)
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def defect(what: str, entity_kind: str, entity: str, *, starts: float | datetime, signals: Iterable[str],
           ends: float | datetime | None = None, host: str | None = None, latent: bool = False,
           related: Iterable[tuple[str, str]] = (), details: dict | None = None) -> dict:
    """One ground-truth line for a defect or fault; ValueError for a signal family nobody defined."""
    signals = sorted(set(signals))
    unknown = [s for s in signals if s not in SIGNALS and s != ANY]
    if unknown or not signals:
        raise ValueError(f"{what} on {entity}: signal families must be among {sorted(SIGNALS)} or 'any', "
                         f"got {signals}")
    return {"defect": what, "latent": latent, "entity_kind": entity_kind, "entity": entity, "host": host,
            "starts_at": iso(starts), "ends_at": None if ends is None else iso(ends), "signals": signals,
            "related": [list(r) for r in related], "details": details or {}}


def latent_defects(cluster: Cluster, t0: float) -> list[dict]:
    """Every defect the cluster was built with, from its first tick on: weak and hot GPUs (the cluster
    declares them), hot leaves and marginal cables (the fabric does)."""
    return cluster.latent_defects(t0) + cluster.fabric.latent_defects(t0)


class FaultRecorder:
    """Reads the simulator's state after every tick and declares the faults injected since the last one.

    `observe(tick)` returns the new ground-truth lines (and keeps them in `lines`). The first call only
    takes the state as it was built.
    """

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.flat = [(i, g) for i, gpus in enumerate(cluster.gpus) for g in gpus]
        self.ports = list(cluster.fabric.ports.items())
        self.rack_pdus = {name: cluster.layout.racks[r].name for name, r in cluster.layout.pdus}
        self.lines: list[dict] = []
        self._gpu_state: list | None = None
        self._port_state: list | None = None
        self._jobs: list = []  # each node's job at the last tick: an XID kills the one it had
        self._over: set[str] = set()  # racks past their cap at the last tick

    def observe(self, tick: Tick) -> list[dict]:
        t, first = tick.time, self._gpu_state is None
        new = [] if first else [*self._hosts(tick), *self._gpus(t), *self._ports(t)]
        if first:
            self._gpus(t)
            self._ports(t)
        new += self._racks(tick)
        self._jobs = [None if j is None else j.id for j in self.cluster.scheduler.node_job]
        self.lines += new
        return new

    def _hosts(self, tick: Tick) -> list[dict]:
        out, c = [], self.cluster
        for host in tick.rebooted:
            i = c.node_index[host]
            until = c.down_until.get(i)
            out.append(defect("reboot", "node", host, starts=tick.time, ends=until if until != float("inf") else None,
                              host=host, signals=[ANY], details={"why": "rebooted: counters restart from zero, "
                                                                         "GPUs come back cold"}))
        return out

    def _gpus(self, t: datetime) -> list[dict]:
        c, out = self.cluster, []
        state = [(*_GPU_STATE(g), g.xid, g.dead) for _, g in self.flat]
        if self._gpu_state is not None:
            for (i, g), before, now in zip(self.flat, self._gpu_state, state, strict=True):
                if now == before or i in c.held:
                    continue
                out += self._gpu_faults(i, g, t, before, now)
        self._gpu_state = state
        return out

    def _gpu_faults(self, i: int, g, t: datetime, before: tuple, now: tuple) -> list[dict]:
        out = []
        rose = sorted({_GPU_DEFECTS[k] for k in range(len(_GPU_DEFECTS)) if now[k] > before[k]})
        for what in rose:
            family = "nvlink errors" if what.startswith("nvlink") else "gpu errors"
            out.append(defect(what, "gpu", g.spec.uuid, starts=t, ends=t, host=g.host, signals=[family]))
        xid, dead = now[-2], now[-1]
        if (xid and xid != before[-2]) or (dead and not before[-1]):
            # The GPU holds its XID (and a dead GPU its silence) until the node is reset: no end yet.
            out.append(defect("xid", "gpu", g.spec.uuid, starts=t, host=g.host,
                              signals=[ANY] if dead else ["gpu errors"],
                              details={"xid": xid, "fell_off_bus": bool(dead)}))
            job = self._jobs[i] if i < len(self._jobs) else None
            if job is not None and job not in self.cluster.scheduler.jobs:  # it died with the XID
                out.append(self._killed(job, t, f"XID {xid} on {g.host} GPU {g.spec.index}"))
        return out

    def _killed(self, job_id: int, t: datetime, why: str) -> dict:
        """A job an XID killed: its GPUs fall idle at once, unlike a job that ends on its own schedule."""
        hosts = [self.cluster.layout.nodes[i].hostname for i, j in enumerate(self._jobs) if j == job_id]
        return defect("job-killed", "job", f"sim-{job_id}", starts=t, ends=t, host=hosts[0] if hosts else None,
                      signals=["activity", "power", "thermal"], related=[("node", h) for h in hosts],
                      details={"why": why})

    def _ports(self, t: datetime) -> list[dict]:
        out = []
        state = [p.error_signature() for _, p in self.ports]
        if self._port_state is not None:
            for (key, p), before, now in zip(self.ports, self._port_state, state, strict=True):
                if now == before:
                    continue
                what = "link-flap" if now[1] > before[1] or now[4] != before[4] else "symbol-errors"
                out.append(defect(what, "port", key, starts=t, ends=t, signals=["port errors"],
                                  related=[("port", f"{p.peer.owner}:{p.peer.name}")] if p.peer else []))
        self._port_state = state
        return out

    def _racks(self, tick: Tick) -> list[dict]:
        watts: dict[str, float] = {}
        for b in tick.batches:
            for rec in b["power"]:
                rack = self.rack_pdus.get(rec["device"])
                if rack is not None:
                    watts[rack] = watts.get(rack, 0.0) + rec["fields"]["watts"]
        over = {rack for rack, w in watts.items() if w > RACK_POWER_CAP_W}
        out = [defect("rack-over-cap", "rack", rack, starts=tick.time, signals=["power"],
                      details={"why": "observed, not planted: the jobs' load took the rack past its cap"})
               for rack in sorted(over - self._over)]
        self._over = over
        return out
