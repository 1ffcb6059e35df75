"""Rack power through the A/B PDUs and one liquid cooling loop per row.

The loop's supply temperature is the coolant inlet every GPU in the row sees (plus a small
per-rack offset, more for a few badly balanced racks), so a warm afternoon warms the GPUs.
The loop's pumps raise the flow with the heat load to hold a ~10 K rise, and the facility
power the loop reports makes PUE (facility / IT) come out between ~1.2 and ~1.4.
"""

from __future__ import annotations

import math
import random

from telemetry.simulator.jobs import diurnal
from telemetry.simulator.topology import RACK_POWER_CAP_W, Layout

NODE_BASE_W = 1500.0  # CPUs, DRAM, NICs, NVSwitches and fans of an idle HGX node
NODE_FAN_SHARE = 0.30  # fans and CPUs ramp too: extra node watts per GPU watt above idle
NODE_DOWN_W = 60.0  # BMC and standby rails while the node reboots
LEAF_W = 650.0
PDU_SELF_W = 30.0
SUPPLY_SETPOINT_C = 30.0
LIQUID_SHARE = 0.8  # share of the rack heat the cold plates take; the rest goes to room air
DESIGN_RISE_K = 10.0
WATER_J_PER_L_K = 4180.0
TAU_SUPPLY_S = 600.0
TAU_FLOW_S = 60.0
HOT_RACK_EXTRA_C = 4.0


def node_power(gpu_watts: float, gpu_idle_watts: float, up: bool) -> float:
    """Wall power of one node from its GPUs' draw."""
    if not up:
        return NODE_DOWN_W
    return NODE_BASE_W + gpu_watts + NODE_FAN_SHARE * max(0.0, gpu_watts - gpu_idle_watts)


class Facility:
    """PDU and cooling-loop state between ticks."""

    def __init__(self, layout: Layout, rng: random.Random):
        self.rng = rng
        self.pdus = layout.pdus
        self.loops = layout.loops
        self.rack_loop = [0] * len(layout.racks)
        for k, (_, members) in enumerate(layout.loops):
            for r in members:
                self.rack_loop[r] = k
        hot = set(rng.sample(range(len(layout.racks)), max(1, len(layout.racks) // 24)))
        # Racks further down the row get slightly warmer water.
        self.rack_offset = [
            0.12 * (rack.position - 1) + (HOT_RACK_EXTRA_C if i in hot else 0.0)
            for i, rack in enumerate(layout.racks)
        ]
        self.leaf_watts = [LEAF_W * len(r.switches) for r in layout.racks]
        self.loop_offset = [rng.uniform(-0.4, 0.4) for _ in layout.loops]
        self.supply = [SUPPLY_SETPOINT_C + o for o in self.loop_offset]
        self.flow = [600.0 for _ in layout.loops]
        # Each CDU is tuned a little differently around the design rise.
        self.design_rise = [DESIGN_RISE_K + rng.uniform(-1.5, 1.5) for _ in layout.loops]
        # A/B feeds never split a rack's load exactly in half.
        imbalance = [rng.uniform(-0.03, 0.03) for _ in layout.racks]
        self.pdu_share = [0.5 + (imbalance[r] if name.endswith("-a") else -imbalance[r])
                          for name, r in layout.pdus]
        self.pdu_energy = [rng.uniform(1e10, 1e12) for _ in layout.pdus]
        self.settled = False
        # Set by scenarios: loop -> (share of the flow its pumps still move, extra supply kelvin),
        # and rack -> watts its draw is lifted to (an unmetered load on the rack's feeds).
        self.loop_fault: dict[int, tuple[float, float]] = {}
        self.rack_floor_w: dict[int, float] = {}

    def inlets(self, t: float, dt: float) -> list[float]:
        """Advance the loops' supply temperature and return each rack's coolant inlet."""
        outdoor = diurnal(t)
        a = 1.0 if not self.settled else 1 - math.exp(-dt / TAU_SUPPLY_S)
        for k in range(len(self.loops)):
            target = SUPPLY_SETPOINT_C + 1.5 * outdoor + self.loop_offset[k]
            self.supply[k] += (target - self.supply[k]) * a + self.rng.uniform(-0.03, 0.03)
        supply = [s + self.loop_fault.get(k, (1.0, 0.0))[1] for k, s in enumerate(self.supply)]
        return [supply[self.rack_loop[i]] + off for i, off in enumerate(self.rack_offset)]

    def step(self, t: float, dt: float, node_watts: list[float], batches: list[dict]) -> float:
        """PDU and loop records for this tick; returns the cluster's IT power in watts."""
        rack_it = [n + leaf for n, leaf in zip(node_watts, self.leaf_watts, strict=True)]
        for r, floor in self.rack_floor_w.items():
            rack_it[r] = max(rack_it[r], floor + self.rng.uniform(-150, 150))
        for k, (name, r) in enumerate(self.pdus):
            watts = rack_it[r] * self.pdu_share[k] + PDU_SELF_W + self.rng.uniform(-8, 8)
            self.pdu_energy[k] += watts * dt
            inlet = 22.0 + 1.2 * diurnal(t) + self.rack_offset[r] * 0.3
            air_kw = rack_it[r] * (1 - LIQUID_SHARE) / 1000
            batches[r]["power"].append({"device": name, "fields": {
                "watts": round(watts, 1), "energy_j": round(self.pdu_energy[k], 1),
                "inlet_temp": round(inlet, 1), "outlet_temp": round(inlet + 3 + 0.9 * air_kw, 1),
            }})
        for k, (name, members) in enumerate(self.loops):
            fields = self._loop(t, dt, k, sum(rack_it[r] for r in members), len(members))
            batches[members[0]]["power"].append({"device": name, "fields": fields})
        self.settled = True
        return sum(rack_it)

    def _loop(self, t: float, dt: float, k: int, it_w: float, racks: int) -> dict:
        heat = it_w * LIQUID_SHARE
        want = min(3000.0, max(150.0, heat / (WATER_J_PER_L_K * self.design_rise[k]) * 60))
        a = 1.0 if not self.settled else 1 - math.exp(-dt / TAU_FLOW_S)
        self.flow[k] += (want - self.flow[k]) * a + self.rng.uniform(-2.0, 2.0)
        share, extra_k = self.loop_fault.get(k, (1.0, 0.0))
        flow, supply = self.flow[k] * share, self.supply[k] + extra_k  # a failed pump or CDU
        rise = heat / (flow / 60 * WATER_J_PER_L_K)
        load = min(1.0, it_w / (racks * RACK_POWER_CAP_W))
        # Chillers work harder on a hot afternoon and less efficiently at part load.
        pue = 1.18 + 0.12 * diurnal(t) + 0.08 * (1 - load)
        return {
            "coolant_supply_temp": round(supply, 2),
            "coolant_return_temp": round(supply + rise, 2),
            "flow_lpm": round(flow, 1),
            "watts": round(800 + 2.5 * flow, 1),  # CDU pumps
            "facility_watts": round(it_w * pue, 1),
        }
