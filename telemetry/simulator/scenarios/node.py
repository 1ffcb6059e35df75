"""Node stories: a whole node goes down and stays down."""

from __future__ import annotations

from telemetry.simulator.scenarios.base import Scenario, iso


class NodeDown(Scenario):
    """A node crashes (a kernel panic, a lost PSU): from the failure on, nothing on it reports,
    neither its GPUs nor its HCA ports nor its agent; its leaf ports see the links drop, the
    scheduler marks it down and ends its job NODE_FAIL, as Slurm does. It stays down."""

    name = "node-down"
    entity_kind = "node"
    fails_after_s = 0.0

    def choose(self, taken: set[int]) -> None:
        self.node = self.pick_nodes(taken)[0]
        self.cluster.held.add(self.node)
        host = self.cluster.layout.nodes[self.node].hostname
        self.entity = self.host = host
        self.done = False
        self.details = {
            "gpu_uuids": [g.spec.uuid for g in self.cluster.gpus[self.node]],
            "hca_ports": [f"{p.owner}:{p.name}" for p in self.cluster.fabric.hca[self.node]],
            "leaf_ports": [f"{p.peer.owner}:{p.peer.name}" for p in self.cluster.fabric.hca[self.node]],
            "last_record_before": iso(self.fails_at), "scheduler_state": "down", "job_state": "NODE_FAIL",
        }
        self.occupy(self.node)

    def before(self, t: float, dt: float) -> list[str]:
        if self.done or self.elapsed(t) < 0:
            return []
        self.done = True
        ended = self.cluster.lose_node(self.node, t)
        return [f"scenario {self.name}: {self.host} down"] + ([ended] if ended else [])
