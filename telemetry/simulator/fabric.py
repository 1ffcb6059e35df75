"""InfiniBand port counters for HCAs, leaves and spines, driven by the jobs' traffic.

Traffic flows the way a rail-optimised fabric carries it: a node in a multi-node job sends on
all eight rails; its leaf forwards the share bound for nodes outside the group up to the
spines of that rail. So a leaf's downlinks mirror its HCAs and its uplinks carry what crosses
the group. Congestion shows as ``xmit_wait`` growing with the square of link utilisation, far
faster on a few *hot* leaves (a bad spine cable, an unlucky routing table); a few *marginal*
cables collect symbol errors and the odd link flap.
"""

from __future__ import annotations

import random

from telemetry.simulator.faults import (
    FLAP_MARGINAL_PER_H,
    SYMBOL_MARGINAL_PER_H,
    SYMBOL_PER_H,
    EventSource,
)
from telemetry.simulator.topology import PORT_SPEED_GBPS, Layout
from telemetry.simulator.truth import defect

PORT_COUNTERS = (
    "xmit_data_bytes", "rcv_data_bytes", "xmit_pkts", "rcv_pkts", "xmit_wait", "symbol_errors",
    "link_downed", "link_error_recovery", "rcv_errors", "rcv_remote_phys_errors", "xmit_discards",
    "local_link_integrity_errors", "buffer_overrun_errors",
)
XMIT, RCV, XPKT, RPKT, WAIT, SYMBOL, DOWNED, RECOVERY, RCV_ERR = range(9)
INTEGRITY = PORT_COUNTERS.index("local_link_integrity_errors")
LINE_BPS = PORT_SPEED_GBPS * 1e9 / 8
AVG_PACKET_B = 2800  # 4 KiB MTU data packets mixed with small acks
WAIT_PER_S = 4e4  # PortXmitWait ticks per second on a healthy, fully loaded port
HOT_WAIT = 40.0
IDLE_BPS = 2e4  # subnet management and monitoring traffic on an idle link
STATE_ACTIVE, STATE_DOWN = 4, 1


class SimPort:
    """One port's counters and this tick's rates (bytes per second each way)."""

    __slots__ = ("key", "owner", "name", "rack", "peer", "node", "c", "tx", "rx", "bias", "hot",
                 "marginal", "state", "silent", "speed_gbps")

    def __init__(self, key: str, owner: str, name: str, rack: int, bias: float,
                 counters: list[int]):
        self.key, self.owner, self.name, self.rack = key, owner, name, rack
        self.peer: SimPort | None = None
        self.node = -1  # node index, for HCA ports
        self.c = counters
        self.tx = self.rx = 0.0
        self.bias = bias  # adaptive routing never splits traffic perfectly evenly
        self.hot = 1.0
        self.marginal = False
        self.state = STATE_ACTIVE
        self.silent = False  # a host port whose node is down: nobody runs perfquery on it
        self.speed_gbps = PORT_SPEED_GBPS  # what the link negotiated; a degraded link trains lower

    def error_signature(self) -> tuple:
        """What the ground truth watches for a new port defect: the error counters and the link state."""
        return self.c[SYMBOL], self.c[DOWNED], self.c[RECOVERY], self.c[RCV_ERR], self.state

    def record(self) -> dict:
        fields = dict(zip(PORT_COUNTERS, self.c, strict=True))
        fields["link_speed_gbps"] = self.speed_gbps
        fields["link_state"] = self.state
        return {self.key: self.owner, "port": self.name, "fields": fields}


def _counters(rng: random.Random, uptime_s: float, mean_bps: float) -> list[int]:
    """Plausible since-boot counter values for a port that has carried `mean_bps` on average."""
    sent = int(uptime_s * mean_bps * rng.uniform(0.7, 1.3))
    got = int(sent * rng.uniform(0.97, 1.03))
    c = [sent, got, sent // AVG_PACKET_B, got // AVG_PACKET_B, int(uptime_s * rng.uniform(50, 500))]
    return c + [0] * (len(PORT_COUNTERS) - len(c))


class Fabric:
    """Every linked port of the cluster and the traffic model that drives them."""

    def __init__(self, layout: Layout, rng: random.Random, uptimes: list[float]):
        self.rng = rng
        self.racks = len(layout.racks)
        self.ports: dict[str, SimPort] = {}
        self._switch_rack = self._switch_racks(layout)
        self.hca: list[list[SimPort]] = []
        for i, node in enumerate(layout.nodes):
            ports = [self._port("host", node.hostname, h.name, node.rack, uptimes[i])
                     for h in node.hcas]
            for p in ports:
                p.node = i
            self.hca.append(ports)
        self.leaf_down: dict[str, list[SimPort]] = {s.name: [] for s in layout.leaves}
        self.leaf_up: dict[str, list[SimPort]] = {s.name: [] for s in layout.leaves}
        self.spine_ports: list[SimPort] = []
        for a, b in layout.links:
            self._link(a, b, uptimes)
        self._mark_hot_and_marginal(layout)

    @staticmethod
    def _switch_racks(layout: Layout) -> dict[str, int]:
        # Spines live outside the racks; their ports ride along with some rack's request.
        out = {s.name: s.rack for s in layout.leaves}
        out.update({s.name: i % len(layout.racks) for i, s in enumerate(layout.spines)})
        return out

    def _port(self, key: str, owner: str, name: str, rack: int, uptime: float) -> SimPort:
        p = SimPort(key, owner, name, rack, self.rng.uniform(0.97, 1.03),
                    _counters(self.rng, uptime, self.rng.uniform(2e9, 1.2e10)))
        self.ports[f"{owner}:{name}"] = p
        return p

    def _switch_port(self, endpoint: str, uptime: float) -> SimPort:
        owner, name = endpoint.split(":", 1)
        return self._port("switch", owner, name, self._switch_rack[owner], uptime)

    def _link(self, a: str, b: str, uptimes: list[float]) -> None:
        near = self.ports.get(a)
        if near is not None:  # HCA -> leaf downlink
            far = self._switch_port(b, uptimes[near.node])
            self.leaf_down[b.split(":", 1)[0]].append(far)
        else:  # leaf uplink -> spine
            near = self._switch_port(a, uptimes[0])
            self.leaf_up[near.owner].append(near)
            far = self._switch_port(b, uptimes[0])
            self.spine_ports.append(far)
        near.peer, far.peer = far, near

    def _mark_hot_and_marginal(self, layout: Layout) -> None:
        leaves = [s.name for s in layout.leaves]
        self.hot_leaves = self.rng.sample(leaves, max(1, len(leaves) // 20))
        for name in self.hot_leaves:
            for p in self.leaf_down[name] + self.leaf_up[name]:
                p.hot = HOT_WAIT
                p.peer.hot = HOT_WAIT / 2  # credits back up into the HCAs and spines feeding it
        downs = [p for ports in self.leaf_down.values() for p in ports]
        for p in self.rng.sample(downs, max(1, len(downs) // 300)):
            p.marginal = p.peer.marginal = True
        every = list(self.ports.values())
        self.symbol_events = EventSource(
            every, [SYMBOL_MARGINAL_PER_H if p.marginal else SYMBOL_PER_H for p in every]
        )
        marginal = [p for ports in self.leaf_down.values() for p in ports if p.marginal]  # one end
        self.flap_events = EventSource(marginal, [FLAP_MARGINAL_PER_H] * len(marginal))

    def latent_defects(self, t0: float) -> list[dict]:
        """The fabric's built-in defects as ground-truth lines (`telemetry.simulator.truth`): hot leaves,
        congested on every port and backing up into the HCAs and spine ports cabled to them, and
        marginal cables, which collect symbol errors and flap now and then at both ends."""
        out = []
        for name in self.hot_leaves:
            ports = self.leaf_down[name] + self.leaf_up[name]
            related = [("port", f"{p.owner}:{p.name}") for p in ports] + [
                ("port", f"{p.peer.owner}:{p.peer.name}") for p in ports if p.peer]
            out.append(defect("hot-leaf", "switch", name, starts=t0, latent=True, signals=["congestion"],
                              related=related, details={"why": "congests far sooner than its peers (a bad spine "
                                                                "cable, an unlucky routing table)",
                                                         "wait_factor": HOT_WAIT}))
        for p in (p for downs in self.leaf_down.values() for p in downs if p.marginal):
            out.append(defect("marginal-cable", "port", f"{p.owner}:{p.name}", starts=t0, latent=True,
                              host=p.peer.owner, signals=["port errors"],
                              related=[("port", f"{p.peer.owner}:{p.peer.name}")],
                              details={"why": "symbol errors and the odd link flap at both ends",
                                       "symbol_events_per_h": SYMBOL_MARGINAL_PER_H,
                                       "flaps_per_h": FLAP_MARGINAL_PER_H}))
        return out

    def node_down(self, i: int) -> None:
        """A node went down: its agent stops reporting, its leaf ports see the link drop."""
        for p in self.hca[i]:
            p.state = p.peer.state = STATE_DOWN
            p.silent = True
            p.peer.c[DOWNED] += 1

    def node_up(self, i: int) -> None:
        """A node came back: its HCA counters start from zero, the links train up again."""
        for p in self.hca[i]:
            p.c = [0] * len(PORT_COUNTERS)
            p.state = p.peer.state = STATE_ACTIVE
            p.silent = False

    def faults(self, dt: float) -> list[str]:
        events = []
        for p in self.symbol_events.sample(self.rng, dt):
            p.c[SYMBOL] += self.rng.randrange(1, 20)
            p.c[RCV_ERR] += self.rng.randrange(0, 2)
        for p in self.flap_events.sample(self.rng, dt):
            for q in (p, p.peer):
                q.c[DOWNED] += 1
                q.c[RECOVERY] += 1
                q.c[SYMBOL] += self.rng.randrange(5, 200)
            events.append(f"link flap {p.owner}:{p.name} <-> {p.peer.owner}:{p.peer.name}")
        return events

    def step(self, dt: float, node_bps: list[float], node_cross: list[float]) -> None:
        """Set every port's rates for this tick and advance its counters by `dt` seconds."""
        for i, ports in enumerate(self.hca):
            r = node_bps[i]
            for p in ports:
                p.tx, p.rx = r * p.bias, r * (2 - p.bias)
        for leaf, downs in self.leaf_down.items():
            crossing = 0.0
            for p in downs:
                h = p.peer
                p.tx, p.rx = h.rx, h.tx
                crossing += h.tx * node_cross[h.node]
            ups = self.leaf_up[leaf]
            per = crossing / len(ups) if ups else 0.0
            for p in ups:
                p.tx, p.rx = per * p.bias, per * (2 - p.bias)
        for p in self.spine_ports:
            p.tx, p.rx = p.peer.rx, p.peer.tx
        for p in self.ports.values():
            _advance(p, dt)

    def records(self, batches: list[dict]) -> None:
        """Append every reporting port's record to its rack's batch."""
        for p in self.ports.values():
            if p.silent:
                continue  # a flapping link still reports (state 1); a node that is down does not
            batches[p.rack]["ports"].append(p.record())


def _advance(p: SimPort, dt: float) -> None:
    if p.state != STATE_ACTIVE:
        return
    c, sent, got = p.c, (p.tx + IDLE_BPS) * dt, (p.rx + IDLE_BPS) * dt
    c[XMIT] += int(sent)
    c[RCV] += int(got)
    c[XPKT] += int(sent / AVG_PACKET_B)
    c[RPKT] += int(got / AVG_PACKET_B)
    # A link that trained at a lower rate fills, and so waits, sooner for the same traffic.
    u = p.tx / (LINE_BPS * p.speed_gbps / PORT_SPEED_GBPS)
    if u > 0.2:
        c[WAIT] += int(dt * WAIT_PER_S * u * u * p.hot)
