"""GPU hardware stories: failing HBM, a degrading NVLink, a GPU that falls off the bus, a GPU
that goes silent.

All of them hold the GPU's node (no random faults there) and speak through the same fields
and events a real node would: NVML counters in the GPU record, and for XID 79, which NVML can
no longer read once the GPU is gone, a kernel-log event in the batch's "events".
"""

from __future__ import annotations

import math

from telemetry.simulator.faults import poisson
from telemetry.simulator.scenarios.base import Scenario, iso

MINUTE = 60.0
XID79_MESSAGE = "NVRM: Xid (PCI:{bus}): 79, pid=0, GPU has fallen off the bus."


def kmsg_xid79(g, t: float) -> dict:
    """The event an agent sends after reading XID 79 from the kernel log."""
    return {"host": g.host, "gpu_uuid": g.spec.uuid, "kind": "xid", "code": 79, "time": iso(t),
            "message": XID79_MESSAGE.format(bus=g.spec.pci_bus_id), "source": "kmsg"}


class _GpuScenario(Scenario):
    """A story on one GPU; `stage` counts the one-off steps already taken."""

    entity_kind = "gpu"

    def choose(self, taken: set[int]) -> None:
        self.node, self.gpu = self.hold_gpu(taken)
        self.stage = 0
        self.pending: list[dict] = []  # events for this tick's batch

    def fall_off_bus(self, t: float, why: str) -> list[str]:
        """The GPU stops answering: no more records, one kernel-log event, its job dies."""
        self.gpu.dead = True
        self.pending.append(kmsg_xid79(self.gpu, t))
        lines = [f"scenario {self.name}: XID 79 on {self.host} GPU {self.gpu.spec.index}"]
        return lines + self.kill_job(self.node, t, why)

    def after(self, tick) -> None:
        if self.pending:
            tick.batches[self.rack_of(self.node)]["events"].extend(self.pending)
            self.pending = []


class GpuDegrading(_GpuScenario):
    """Failing HBM over three hours, the way real degradation shows itself hours ahead:
    single-bit errors climb from the start, correctable rows are remapped from the first hour,
    at two hours a row cannot be remapped, a double-bit error raises XID 48 at 2 h 15, and
    at three hours the GPU falls off the bus. A failure model that watches the SBE trend and
    the remaps can therefore warn two hours before the first uncorrectable error."""

    name = "gpu-degrading"
    REMAP_AT, REMAP_EVERY = 60 * MINUTE, 10 * MINUTE
    UNCORRECTABLE_AT, DBE_AT = 120 * MINUTE, 135 * MINUTE
    fails_after_s = 180 * MINUTE
    SBE_PER_MIN = (0.5, 20.0)  # at the start, and by the double-bit error

    def choose(self, taken: set[int]) -> None:
        super().choose(taken)
        self.base_remaps = self.gpu.remapped_rows_correctable
        self.details.update({
            "stages": {name: iso(self.at(s)) for name, s in (
                ("sbe", 0.0), ("remap_correctable", self.REMAP_AT),
                ("remap_uncorrectable", self.UNCORRECTABLE_AT), ("xid48_dbe", self.DBE_AT),
                ("xid79", self.fails_after_s))},
            "sbe_per_min": list(self.SBE_PER_MIN),
        })

    def before(self, t: float, dt: float) -> list[str]:
        s, g = self.elapsed(t), self.gpu
        if s < 0 or g.dead:
            return []
        lo, hi = self.SBE_PER_MIN
        rate = (lo + (hi - lo) * min(1.0, s / self.DBE_AT)) / MINUTE  # errors grow as the die wears
        sbe = poisson(self.rng, rate * dt * self.speed)
        g.ecc_sbe_vol += sbe
        g.ecc_sbe_agg += sbe
        if s >= self.REMAP_AT:
            done = 1 + int((min(s, self.DBE_AT) - self.REMAP_AT) // self.REMAP_EVERY)
            g.remapped_rows_correctable = max(g.remapped_rows_correctable, self.base_remaps + done)
        return self._stages(s, t)

    def _stages(self, s: float, t: float) -> list[str]:
        g, events = self.gpu, []
        if self.stage < 1 and s >= self.UNCORRECTABLE_AT:
            self.stage = 1
            g.remapped_rows_uncorrectable += 1
            g.remap_pending = 1  # the spare row takes effect at the next GPU reset
        if self.stage < 2 and s >= self.DBE_AT:
            self.stage = 2
            g.ecc_dbe_vol += 1
            g.ecc_dbe_agg += 1
            g.xid = 48
            events += [f"scenario {self.name}: XID 48 on {self.host} GPU {g.spec.index}"]
            events += self.kill_job(self.node, t, f"killed by XID 48 on {self.host}")
        if self.stage < 3 and s >= self.fails_after_s:
            self.stage = 3
            events += self.fall_off_bus(t, f"killed by XID 79 on {self.host}")
        return events


class NvlinkCrc(_GpuScenario):
    """A marginal NVLink: CRC flit errors (and a few data and replay errors) at a rate that
    doubles every few minutes; once it needs recovery the link is counted as failed."""

    name = "nvlink-crc"
    FLITS_PER_S = 0.5
    DOUBLING_S = 5 * MINUTE
    fails_after_s = 30 * MINUTE

    def choose(self, taken: set[int]) -> None:
        super().choose(taken)
        self.details.update({"flit_errors_per_s_at_start": self.FLITS_PER_S,
                             "doubling_s": self.DOUBLING_S})

    def rate(self, s: float) -> float:
        """CRC flit errors per scenario second at scenario second `s`."""
        return self.FLITS_PER_S * 2 ** (s / self.DOUBLING_S)

    def before(self, t: float, dt: float) -> list[str]:
        s, g = self.elapsed(t), self.gpu
        if s < 0 or g.dead:
            return []
        # The expected count is the integral of the exponential rate over the tick.
        ds = dt * self.speed
        lam = (self.rate(s) - self.rate(max(0.0, s - ds))) * self.DOUBLING_S / math.log(2)
        flits = poisson(self.rng, max(0.0, lam))
        g.nvlink_crc_flit_errors += flits
        g.nvlink_crc_data_errors += poisson(self.rng, flits * 0.05)
        g.nvlink_replay_errors += poisson(self.rng, flits * 0.02)
        if s >= self.fails_after_s:
            g.nvlink_recovery_errors += max(1, poisson(self.rng, ds / MINUTE))
            if self.stage == 0:
                self.stage = 1
                return [f"scenario {self.name}: NVLink on {self.host} GPU {g.spec.index} needs recovery"]
        return []


class FallenOffBus(_GpuScenario):
    """PCIe replays creep up for a few minutes, then the GPU drops off the bus without a word
    from NVML: its records stop and the kernel log reports XID 79."""

    name = "fallen-off-bus"
    fails_after_s = 5 * MINUTE
    REPLAYS_PER_S = 0.2

    def choose(self, taken: set[int]) -> None:
        super().choose(taken)
        self.details.update({"last_record_before": iso(self.fails_at), "event_source": "kmsg"})
        self.occupy(self.node)

    def before(self, t: float, dt: float) -> list[str]:
        s, g = self.elapsed(t), self.gpu
        if s < 0 or g.dead:
            return []
        g.pcie_replay += poisson(self.rng, self.REPLAYS_PER_S * dt * self.speed)
        if s >= self.fails_after_s:
            return self.fall_off_bus(t, f"killed by XID 79 on {self.host}")
        return []


class GpuSilent(_GpuScenario):
    """The GPU simply stops reporting: its records stop, and nothing says why. No XID, no
    kernel-log line, no event; its node, its peers and its job carry on (the way a wedged
    DCGM field watch or an exporter that lost one device looks from outside)."""

    name = "gpu-silent"
    fails_after_s = 0.0

    def choose(self, taken: set[int]) -> None:
        super().choose(taken)
        self.details.update({"last_record_before": iso(self.fails_at), "event": None})
        self.occupy(self.node)

    def before(self, t: float, dt: float) -> list[str]:
        g = self.gpu
        if self.elapsed(t) < 0 or g.dead:
            return []
        g.dead = True  # answers nothing from now on; the job on the node is not told
        return [f"scenario {self.name}: {self.host} GPU {g.spec.index} stopped reporting"]
