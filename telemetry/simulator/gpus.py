"""One simulated H100 SXM: power, clocks and thermals from its job, and its counters.

Physics in brief: power follows the job's intensity (idle ~70 W, busy 550-700 W, capped at
the 700 W limit); GPU and HBM temperatures approach ``coolant inlet + R_th * power`` with a
first-order lag (time constants ~80 s and ~120 s); above the slowdown temperature the clocks
drop and the throttle bits say why. Counters are cumulative since boot; `reset` is a reboot.
"""

from __future__ import annotations

import math
import random

from telemetry.simulator.jobs import Job
from telemetry.simulator.topology import GPU_MODEL, GpuSpec

FB_TOTAL_MIB = 81_559
FB_RESERVED_MIB = 527
FB_USABLE_MIB = FB_TOTAL_MIB - FB_RESERVED_MIB
IDLE_SM_MHZ = 345
MAX_SM_MHZ = 1980
MEM_MHZ = 2619
POWER_LIMIT_W = 700.0
TAU_GPU_S = 80.0
TAU_MEM_S = 120.0
SLOWDOWN_C = 85.0  # software thermal slowdown
HW_SLOWDOWN_C = 90.0
HBM_SLOWDOWN_C = 95.0

# nvmlClocksEventReasons bits.
REASON_IDLE = 0x1
REASON_SW_POWER_CAP = 0x4
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80
# Why a GPU computes slower than its peers (`SimGpu.slow_cause`), and what that shows in its telemetry:
# thermal and power hold its clocks down with the matching throttle bit; "hidden" shows nothing but
# the time it takes (a degraded clock domain or HBM stack that no counter reports).
SLOW_CAUSES = ("thermal", "power", "hidden")

# Counters that survive a reboot (InfoROM): everything else starts again from zero.
PERSISTENT = (
    "ecc_sbe_agg", "ecc_dbe_agg", "remapped_rows_correctable", "remapped_rows_uncorrectable",
)
VOLATILE = (
    "energy_mj", "ecc_sbe_vol", "ecc_dbe_vol", "nvlink_crc_flit_errors", "nvlink_crc_data_errors",
    "nvlink_replay_errors", "nvlink_recovery_errors", "nvlink_bandwidth", "pcie_replay",
)
COUNTERS = VOLATILE + PERSISTENT


def alphas(dt: float) -> tuple[float, float]:
    """The share of the way to the thermal target that GPU and HBM cover in `dt` seconds."""
    return 1 - math.exp(-dt / TAU_GPU_S), 1 - math.exp(-dt / TAU_MEM_S)


class SimGpu:
    """State of one GPU between ticks."""

    __slots__ = (
        "host", "spec", "idle_w", "eff", "rth", "rth_mem", "weak", "temp", "mem_temp", "power",
        "dead", "xid", "fb_used", "remap_pending", "remap_failure", "pace", "slow_cause", "speed", "share",
        *COUNTERS,
    )

    def __init__(self, host: str, spec: GpuSpec, rng: random.Random, *, weak: bool, hot: bool,
                 uptime_s: float):
        self.host, self.spec, self.weak = host, spec, weak
        self.idle_w = rng.uniform(64, 76)
        self.eff = rng.uniform(0.96, 1.04)  # silicon lottery: the same work, a little more power
        # A poorly seated heat sink or a blocked cold plate runs hot under load.
        self.rth = rng.uniform(0.074, 0.084) if hot else rng.uniform(0.052, 0.064)
        self.rth_mem = rng.uniform(0.058, 0.068)
        self.dead = False
        self.xid = self.fb_used = self.remap_pending = self.remap_failure = 0
        self.pace = 1.0  # share of its normal compute speed it keeps; a straggler scenario lowers it
        self.slow_cause = "hidden"  # what a pace under 1 shows in the telemetry (SLOW_CAUSES)
        # Its compute speed at the last tick (pace times the clock it ran at, 1 = full clocks), which
        # sets its share of a synchronous step; and the share of its job's nominal activity it shows
        # (`feed.lock_step`: above 1 for a slow rank, below for peers waiting on it). 1 outside gangs.
        self.speed = self.share = 1.0
        self.power = self.idle_w
        self.temp = self.mem_temp = 30.0
        self.energy_mj = int(uptime_s * rng.uniform(250, 450) * 1000)
        self.ecc_sbe_vol = rng.randrange(0, 3) + (rng.randrange(10, 60) if weak else 0)
        self.ecc_sbe_agg = self.ecc_sbe_vol + rng.randrange(0, 5)
        self.ecc_sbe_agg += rng.randrange(100, 900) if weak else 0
        self.ecc_dbe_vol = 0
        self.ecc_dbe_agg = 1 if weak and rng.random() < 0.3 else 0
        self.remapped_rows_correctable = self.ecc_sbe_agg // 60
        self.remapped_rows_uncorrectable = self.ecc_dbe_agg
        self.nvlink_crc_flit_errors = rng.randrange(0, 4)
        self.nvlink_crc_data_errors = self.nvlink_replay_errors = self.nvlink_recovery_errors = 0
        self.nvlink_bandwidth = int(uptime_s * rng.uniform(2e7, 8e7))  # KiB
        self.pcie_replay = rng.randrange(0, 2) + (rng.randrange(5, 50) if weak else 0)

    def settle(self, inlet: float) -> None:
        """Jump to the thermal steady state for the current power (a cluster already running)."""
        self.temp = inlet + self.rth * self.power
        self.mem_temp = inlet + 4 + self.rth_mem * self.power

    def reset(self, inlet: float) -> None:
        """A reboot: volatile counters and pending state clear, the GPU starts cool."""
        for name in VOLATILE:
            setattr(self, name, 0)
        self.dead = False
        self.xid = self.remap_pending = self.fb_used = 0
        self.power = self.idle_w
        self.temp, self.mem_temp = inlet + 3, inlet + 5

    def tick(self, t: float, dt: float, a_gpu: float, a_mem: float, inlet: float,
             job: Job | None, noise: float) -> dict:
        """Advance `dt` seconds and return this GPU's ingest record."""
        if job is None:
            power, clock, reasons = self.idle_w + noise, IDLE_SM_MHZ, REASON_IDLE
            self.fb_used = 0
        else:
            power, clock, reasons = self._busy(t, job, noise)
        if self.temp > SLOWDOWN_C or self.mem_temp > HBM_SLOWDOWN_C:
            # Thermal slowdown: clocks and with them power fall until the temperature holds.
            over = max(self.temp - SLOWDOWN_C, self.mem_temp - HBM_SLOWDOWN_C, 0.0)
            scale = max(0.6, 1 - 0.05 * over)
            clock, power = int(clock * scale), self.idle_w + (power - self.idle_w) * scale
            reasons |= REASON_HW_THERMAL if self.temp > HW_SLOWDOWN_C else REASON_SW_THERMAL
        # Work per second follows the SM clock: power capping and thermal slowdown slow a rank down
        # as surely as a fault does.
        self.speed = self.pace * clock / MAX_SM_MHZ if job is not None else 1.0
        if job is not None and self.pace < 1.0 and self.slow_cause != "hidden":
            # A slow GPU whose cause shows: its clocks held down, with the throttle bit that says why.
            clock = int(clock * self.pace)
            if self.slow_cause == "power":
                power, reasons = self.idle_w + (power - self.idle_w) * self.pace, reasons | REASON_HW_POWER_BRAKE
            else:
                reasons |= REASON_SW_THERMAL
        self.energy_mj += int((self.power + power) * 500 * dt)  # trapezoid, W·s -> mJ
        self.power = power
        self.temp += (inlet + self.rth * power - self.temp) * a_gpu
        self.mem_temp += (inlet + 4 + self.rth_mem * power - self.mem_temp) * a_mem
        return self._record(power, clock, reasons, job, dt, noise)

    def _busy(self, t: float, job: Job, noise: float) -> tuple[float, int, int]:
        act = job.act * self.share
        demand = self.idle_w + (POWER_LIMIT_W - self.idle_w) * job.power * act * self.eff
        demand *= 1 + 0.015 * noise
        clock, reasons = MAX_SM_MHZ, 0
        if demand > POWER_LIMIT_W:
            # At the cap the clocks back off roughly with the square root of the excess, and the
            # power controller hovers just under the limit.
            clock = int(MAX_SM_MHZ * math.sqrt(POWER_LIMIT_W / demand))
            demand, reasons = POWER_LIMIT_W - 4 * abs(noise), REASON_SW_POWER_CAP
        # Memory fills while the job loads its model, then holds.
        fill = min(1.0, (t - job.start) / job.warmup) if job.warmup else 1.0
        self.fb_used = int(job.mem * FB_USABLE_MIB * fill * (1 + 0.002 * noise))
        return demand, clock, reasons

    def _record(self, power: float, clock: int, reasons: int, job: Job | None, dt: float,
                noise: float) -> dict:
        if job is None:
            util = sm = tensor = dram = fp64 = nvl = 0.0
            pcie_tx, pcie_rx = 2.0e5, 4.5e5
        else:
            act = job.act * self.share * (1 + 0.01 * noise)
            # Utilisation counts any kernel running, a collective's waiting kernel too: it stays
            # high on a rank that waits for a slow peer. SM and tensor activity do not.
            util = job.util * job.act * (1 + 0.01 * noise)
            sm, tensor, dram = job.sm * act, job.tensor * act, job.dram * act
            fp64, nvl = job.fp64 * act, job.nvlink_bps * act
            pcie_tx, pcie_rx = job.pcie_bps * 0.3 * act, job.pcie_bps * act
        self.nvlink_bandwidth += int(2 * nvl * dt / 1024)
        fb = self.fb_used
        spec = self.spec
        return {"host": self.host, "uuid": spec.uuid, "index": spec.index, "model": GPU_MODEL,
                "fields": {
            "gpu_util": round(min(util, 100.0), 1), "mem_copy_util": round(dram * 80, 1),
            "enc_util": 0.0, "dec_util": 0.0, "sm_clock": clock, "mem_clock": MEM_MHZ,
            "fb_used": fb, "fb_free": FB_USABLE_MIB - fb, "fb_reserved": FB_RESERVED_MIB,
            "gpu_temp": round(self.temp, 1), "memory_temp": round(self.mem_temp, 1),
            "power_w": round(power, 2), "power_limit_w": POWER_LIMIT_W, "energy_mj": self.energy_mj,
            "ecc_sbe_vol": self.ecc_sbe_vol, "ecc_dbe_vol": self.ecc_dbe_vol,
            "ecc_sbe_agg": self.ecc_sbe_agg, "ecc_dbe_agg": self.ecc_dbe_agg, "xid": self.xid,
            "nvlink_crc_flit_errors": self.nvlink_crc_flit_errors,
            "nvlink_crc_data_errors": self.nvlink_crc_data_errors,
            "nvlink_replay_errors": self.nvlink_replay_errors,
            "nvlink_recovery_errors": self.nvlink_recovery_errors,
            "nvlink_bandwidth": self.nvlink_bandwidth,
            "nvlink_tx_bps": round(nvl), "nvlink_rx_bps": round(nvl * (1 - 0.01 * noise)),
            "pcie_replay": self.pcie_replay,
            "pcie_tx_bps": round(pcie_tx), "pcie_rx_bps": round(pcie_rx),
            "throttle_reasons": reasons,
            "remapped_rows_correctable": self.remapped_rows_correctable,
            "remapped_rows_uncorrectable": self.remapped_rows_uncorrectable,
            "row_remap_failure": self.remap_failure, "row_remap_pending": self.remap_pending,
            "gr_engine_active": round(min(sm * 1.08, 1.0), 3), "sm_active": round(sm, 3),
            "sm_occupancy": round(sm * 0.45, 3), "tensor_active": round(tensor, 3),
            "dram_active": round(dram, 3), "fp64_active": round(fp64, 3),
            "fp32_active": round(sm * 0.12, 3), "fp16_active": round(tensor * 0.08, 3),
        }}
