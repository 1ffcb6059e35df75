"""InfiniBand stories: a flapping HCA-to-leaf link, a degraded one and a congested leaf uplink."""

from __future__ import annotations

from telemetry.simulator.fabric import (
    DOWNED,
    INTEGRITY,
    RCV_ERR,
    RECOVERY,
    STATE_ACTIVE,
    STATE_DOWN,
    SYMBOL,
    WAIT,
    WAIT_PER_S,
    SimPort,
)
from telemetry.simulator.faults import poisson
from telemetry.simulator.scenarios.base import Scenario, ScenarioError, iso

MINUTE = 60.0


def hca_port(scenario: Scenario, taken: set[int]) -> SimPort:
    """The HCA port the spec names (by either end of its link), else one on a seeded free node."""
    ports = scenario.cluster.fabric.ports
    entity = scenario.spec.entity
    if entity and ":" in entity:
        p = ports.get(entity)
        if p is not None and p.key != "host" and p.peer.key == "host":
            p = p.peer  # named by its leaf end
        if p is None or p.key != "host":
            raise ScenarioError(f"{scenario.name}: {entity} is not an HCA port or its leaf port")
        taken.add(p.node)
        return p
    i = scenario.pick_nodes(taken)[0]
    return scenario.cluster.fabric.hca[i][scenario.rng.randrange(len(scenario.cluster.fabric.hca[i]))]


class IbLinkFlap(Scenario):
    """One HCA's link to its leaf drops and retrains a few times: link_state 4 -> 1 -> 4 on
    both ends, link_downed and link_error_recovery count each flap, symbol errors burst.
    A flap shows down for at least one tick, however compressed the timeline."""

    name = "ib-link-flap"
    entity_kind = "port"
    FLAPS_S = (0.0, 4 * MINUTE, 9 * MINUTE, 15 * MINUTE)
    DOWN_S = 20.0
    fails_after_s = 0.0  # the first drop is the failure: the job on the node loses its rail

    def choose(self, taken: set[int]) -> None:
        self.port = hca_port(self, taken)
        self.cluster.held.add(self.port.node)
        self.entity, self.host = f"{self.port.owner}:{self.port.name}", self.port.owner
        self.flaps = self.down_since = 0
        self.details = {"peer": f"{self.port.peer.owner}:{self.port.peer.name}",
                        "flaps_at": [iso(self.at(s)) for s in self.FLAPS_S],
                        "down_s": self.DOWN_S / self.speed}

    def before(self, t: float, dt: float) -> list[str]:
        s, p = self.elapsed(t), self.port
        if p.silent:
            return []  # the node itself is down: nothing to flap
        if p.state == STATE_DOWN and t > self.down_since and s >= self.FLAPS_S[self.flaps - 1] + self.DOWN_S:
            p.state = p.peer.state = STATE_ACTIVE
            return [f"scenario {self.name}: {self.entity} up again"]
        if p.state == STATE_ACTIVE and self.flaps < len(self.FLAPS_S) and s >= self.FLAPS_S[self.flaps]:
            self.flaps += 1
            self.down_since = t
            for q in (p, p.peer):
                q.state = STATE_DOWN
                q.c[DOWNED] += 1
                q.c[RECOVERY] += 1
                q.c[SYMBOL] += self.rng.randrange(20, 300)
            return [f"scenario {self.name}: {self.entity} down (flap {self.flaps})"]
        return []


class CongestedUplink(Scenario):
    """One leaf's uplinks back up (a failed spine link squeezes the leaf's traffic onto fewer
    paths): PortXmitWait grows on its uplinks, ramping to many times a busy port's, and credits
    back up into its downlinks, which wait a good share of that."""

    name = "congested-uplink"
    entity_kind = "port"
    RAMP_S = 20 * MINUTE
    UPLINK_WAIT = 25.0  # times WAIT_PER_S at full congestion
    DOWNLINK_SHARE = 0.4

    def choose(self, taken: set[int]) -> None:
        fabric, entity = self.cluster.fabric, self.spec.entity
        leaf = entity.split(":")[0] if entity else self.rng.choice(sorted(fabric.leaf_up))
        if not fabric.leaf_up.get(leaf):
            raise ScenarioError(f"{self.name}: {leaf} is not a leaf with uplinks")
        self.ups, self.downs = fabric.leaf_up[leaf], fabric.leaf_down[leaf]
        self.entity = f"{leaf}:{self.ups[0].name}"
        self.details = {"leaf": leaf, "uplinks": [f"{leaf}:{p.name}" for p in self.ups],
                        "downlinks": [f"{leaf}:{p.name}" for p in self.downs],
                        "full_at": iso(self.at(self.RAMP_S)),
                        "xmit_wait_per_s_at_full": WAIT_PER_S * self.UPLINK_WAIT}

    def before(self, t: float, dt: float) -> list[str]:
        s = self.elapsed(t)
        if s <= 0 or not dt:
            return []
        level = min(1.0, s / self.RAMP_S)
        wait = dt * WAIT_PER_S * self.UPLINK_WAIT * level
        for p in self.ups:
            p.c[WAIT] += int(wait * self.rng.uniform(0.85, 1.15))
        for p in self.downs:
            p.c[WAIT] += int(wait * self.DOWNLINK_SHARE * self.rng.uniform(0.7, 1.3))
        return []


class PortDegraded(Scenario):
    """One HCA's link to its leaf degrades without going down, as a failing cable or transceiver
    does: both ends retrain at a lower rate (400 -> 200 Gb/s), symbol errors arrive steadily and
    grow, with some receive and local link-integrity errors. The link stays up (state 4)."""

    name = "port-degraded"
    entity_kind = "port"
    SPEED_GBPS = 200
    SYMBOL_PER_S = (2.0, 20.0)  # at the start and after RAMP_S, per scenario second
    RAMP_S = 10 * MINUTE
    RCV_ERR_SHARE, INTEGRITY_SHARE = 0.05, 0.01
    fails_after_s = 0.0  # the drop in rate is the failure: the rail carries half of what it did

    def choose(self, taken: set[int]) -> None:
        self.port = hca_port(self, taken)
        self.cluster.held.add(self.port.node)
        self.entity, self.host = f"{self.port.owner}:{self.port.name}", self.port.owner
        self.details = {"peer": f"{self.port.peer.owner}:{self.port.peer.name}",
                        "speed_gbps": {"before": self.port.speed_gbps, "after": self.SPEED_GBPS},
                        "symbol_errors_per_s": list(self.SYMBOL_PER_S), "ramp_s": self.RAMP_S / self.speed,
                        "link_state": STATE_ACTIVE}
        self.occupy(self.port.node)

    def before(self, t: float, dt: float) -> list[str]:
        s, p = self.elapsed(t), self.port
        if s < 0 or p.silent:
            return []
        lines = []
        if p.speed_gbps != self.SPEED_GBPS:
            p.speed_gbps = p.peer.speed_gbps = self.SPEED_GBPS
            lines.append(f"scenario {self.name}: {self.entity} retrained at {self.SPEED_GBPS} Gb/s")
        lo, hi = self.SYMBOL_PER_S
        rate = lo + (hi - lo) * min(1.0, s / self.RAMP_S)
        for q in (p, p.peer):
            symbols = poisson(self.rng, rate * dt * self.speed)
            q.c[SYMBOL] += symbols
            q.c[RCV_ERR] += poisson(self.rng, symbols * self.RCV_ERR_SHARE)
            q.c[INTEGRITY] += poisson(self.rng, symbols * self.INTEGRITY_SHARE)
        return lines
