"""Rare events drawn as Poisson processes: one draw per event kind per tick, not one per entity.

Drawing a random number for each of 16,384 GPUs and 65,536 ports for every rare event would
cost more than building the records. Instead each event kind keeps the cumulative per-member
rates once; a tick draws how many events happened cluster-wide (Poisson) and then which
members they struck (weighted choice), so weak members are struck more often.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from itertools import accumulate

# Per-member rates, events per hour.
SBE_PER_H = 1 / 5000
SBE_WEAK_PER_H = 3.0
PCIE_REPLAY_PER_H = 1 / 2000
PCIE_REPLAY_WEAK_PER_H = 4.0
NVLINK_CRC_PER_H = 1 / 1000
NVLINK_CRC_WEAK_PER_H = 1.0
XID_PER_H = 1 / 20_000
XID_WEAK_PER_H = 1 / 500
MAINTENANCE_REBOOT_PER_H = 1 / (21 * 24)  # a node rebooted for maintenance every three weeks
SYMBOL_PER_H = 1 / 50_000
SYMBOL_MARGINAL_PER_H = 12.0
FLAP_MARGINAL_PER_H = 1 / 6

# XID code -> (share of XIDs, needs a busy GPU, what follows).
#   13 graphics engine exception, 31 MMU fault, 43 GPU stopped processing: the job dies.
#   48 double-bit ECC, 94 contained ECC: the job dies, a row remap waits for a reset.
#   79 fallen off the bus: the GPU stops answering until the node is rebooted.
XIDS: dict[int, tuple[float, bool, str]] = {
    13: (0.30, True, "job"),
    31: (0.25, True, "job"),
    43: (0.10, True, "job"),
    48: (0.10, False, "dbe"),
    94: (0.10, False, "dbe"),
    79: (0.15, False, "bus"),
}
XID_CODES = tuple(XIDS)
XID_WEIGHTS = tuple(v[0] for v in XIDS.values())
# Seconds from the XID until remediation reboots the node, by consequence.
REBOOT_AFTER_S = {"dbe": (600, 1800), "bus": (120, 600)}


def poisson(rng: random.Random, lam: float) -> int:
    """A Poisson draw; Knuth's method for small means, a normal approximation for large ones."""
    if lam <= 0:
        return 0
    if lam > 30:
        return max(0, int(rng.gauss(lam, math.sqrt(lam)) + 0.5))
    limit, k, p = math.exp(-lam), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


class EventSource:
    """Events that strike the members of a population at per-member rates (per hour)."""

    def __init__(self, members: Sequence, rates_per_h: Sequence[float]):
        self.members = list(members)
        self.cum = list(accumulate(rates_per_h))
        self.total_per_h = self.cum[-1] if self.cum else 0.0

    def sample(self, rng: random.Random, dt: float) -> list:
        k = poisson(rng, self.total_per_h * dt / 3600)
        return rng.choices(self.members, cum_weights=self.cum, k=k) if k else []

