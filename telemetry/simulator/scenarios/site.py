"""Facility stories: a row's cooling loop failing, and a rack drawing past its power cap.

Both work through the facility's hooks (`Facility.loop_fault`, `Facility.rack_floor_w`), so
the consequences follow from the existing physics: warmer coolant warms every GPU in the row
with its usual lag, and the GPUs' own thermal slowdown sets the throttle bits and drops clocks.
"""

from __future__ import annotations

from telemetry.simulator.scenarios.base import Scenario, ScenarioError, iso
from telemetry.simulator.topology import RACK_POWER_CAP_W

MINUTE = 60.0


class CoolingFailure(Scenario):
    """A row's CDU loses pumps: the loop's flow falls to a quarter within minutes and the
    supply temperature climbs, so that row's GPUs heat up past their slowdown temperatures."""

    name = "cooling-failure"
    entity_kind = "cooling_loop"
    FLOW_DROP_S, FLOW_LEFT = 3 * MINUTE, 0.25
    RISE_S, RISE_K = 15 * MINUTE, 35.0
    FAIL_RISE_K = 20.0  # where a busy GPU's temperature passes the hardware slowdown
    fails_after_s = RISE_S * FAIL_RISE_K / RISE_K

    def choose(self, taken: set[int]) -> None:
        loops, entity = self.cluster.layout.loops, self.spec.entity
        names = [name for name, _ in loops]
        if entity:
            wanted = entity if entity.startswith("loop-") else f"loop-{entity}"
            if wanted not in names:
                raise ScenarioError(f"{self.name}: no cooling loop {entity}")
            self.loop = names.index(wanted)
        else:
            self.loop = self.rng.randrange(len(loops))
        racks = loops[self.loop][1]
        layout = self.cluster.layout
        self.entity = names[self.loop]
        self.details = {
            "row": layout.racks[racks[0]].row, "racks": [layout.racks[r].name for r in racks],
            "flow_share_left": self.FLOW_LEFT, "flow_low_at": iso(self.at(self.FLOW_DROP_S)),
            "supply_rise_k": self.RISE_K, "supply_peak_at": iso(self.at(self.RISE_S)),
        }

    def before(self, t: float, dt: float) -> list[str]:
        s = self.elapsed(t)
        if s < 0:
            return []
        share = 1 - (1 - self.FLOW_LEFT) * min(1.0, s / self.FLOW_DROP_S)
        self.cluster.facility.loop_fault[self.loop] = (share, self.RISE_K * min(1.0, s / self.RISE_S))
        return []


class RackOverCap(Scenario):
    """An unmetered load on one rack's feeds (GPUs with their power limits raised, a test rig)
    lifts its draw from just under the cap to well over it."""

    name = "rack-over-cap"
    entity_kind = "rack"
    RAMP_S = 10 * MINUTE
    FROM, TO = 0.92, 1.08  # shares of the cap
    fails_after_s = RAMP_S * (1.0 - FROM) / (TO - FROM)

    def choose(self, taken: set[int]) -> None:
        racks, entity = self.cluster.layout.racks, self.spec.entity
        names = [r.name for r in racks]
        if entity and entity not in names:
            raise ScenarioError(f"{self.name}: no rack {entity}")
        self.rack = names.index(entity) if entity else self.rng.randrange(len(racks))
        self.entity = names[self.rack]
        pdus = [name for name, r in self.cluster.layout.pdus if r == self.rack]
        self.details = {"cap_w": RACK_POWER_CAP_W, "peak_w": RACK_POWER_CAP_W * self.TO, "pdus": pdus,
                        "peak_at": iso(self.at(self.RAMP_S))}

    def before(self, t: float, dt: float) -> list[str]:
        s = self.elapsed(t)
        if s < 0:
            return []
        share = self.FROM + (self.TO - self.FROM) * min(1.0, s / self.RAMP_S)
        self.cluster.facility.rack_floor_w[self.rack] = RACK_POWER_CAP_W * share
        return []
