"""Guard rails: may this action run now? Decided under one lock per action kind, at request and again before
execution (an approval can come hours after the request, and the fleet moves meanwhile).

1. `lock_kind(kind)` takes a transaction-scoped advisory lock, so a burst of concurrent requests of one kind is
   decided one at a time, each seeing the rows the previous ones committed: a cap cannot be overrun by a race.
2. `blocked_reason()` then checks, and the first block wins:
   a. maintenance: the target's node is drained or down (a resume is exempt: it is how a node comes back), or an
      active maintenance window (Silence of kind maintenance) matches the target's labels {node, gpu, job};
   b. every enabled GuardRail of the action's kind: blast-radius caps (cluster, nvlink_domain, leaf, rack) and
      the cooldown per target (scope "target").
3. Counted are the actions let through within the rail's window, by `decided_at`: approved, running, succeeded
   or failed (a failed drain may have half-drained a node). A shadow request also counts earlier shadowed actions
   that passed, so a dry run of a burst shows exactly what auto mode would have let through.
4. A cap is a number of targets: `max_count`, and `max_fraction` of the scope's size rounded down but never below
   one, so a one-node NVLink domain or a small cluster can still lose its one faulty node. For nvlink_domain, leaf
   and rack, nodes already drained or down count against a drain cap whether or not Breakwater drained them.
5. `budgets()` gives those same cap numbers per scope (used, cap, left after), which the confirmation's impact
   preview shows (alerts.remediation.impact): what blocks an action and what the operator reads are one count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Q, QuerySet

from alerts.matching import matches
from alerts.models import (
    TARGET_KIND,
    ActionKind,
    ActionState,
    GuardRail,
    GuardScope,
    RemediationAction,
    Silence,
    SilenceKind,
)
from telemetry.models import Gpu, Node, NodeState, Switch

LOCK_NAMESPACE = 0x6277_0006  # pg_advisory_xact_lock(namespace, kind number): one decision per kind at a time
KIND_NUMBER = {kind: i for i, kind in enumerate(ActionKind.values)}
LET_THROUGH = (ActionState.APPROVED, ActionState.RUNNING, ActionState.SUCCEEDED, ActionState.FAILED)
DOWN_STATES = (NodeState.DRAINED, NodeState.DOWN)
PLURAL = {"drain": "drains", "resume": "resumes", "requeue": "requeues", "power_cap": "power caps",
          "power_uncap": "power uncaps", "gpu_reset": "GPU resets", "ticket": "tickets"}
# Cheapest and most telling first: a cluster cap explains a burst better than its leaf does.
SCOPE_ORDER = [GuardScope.TARGET, GuardScope.CLUSTER, GuardScope.NVLINK_DOMAIN, GuardScope.LEAF, GuardScope.RACK]


@dataclass(frozen=True)
class Target:
    """What an action touches: a node, a GPU (and its node) or a job, with what the inventory knows of it."""

    kind: str
    key: str
    node: Node | None = None
    gpu: Gpu | None = None

    @property
    def labels(self) -> dict[str, str]:
        """The labels a maintenance window's matchers are tried against."""
        if self.kind == "job":
            return {"job": self.key}
        labels = {"node": self.node.hostname if self.node else self.key}
        if self.kind == "gpu":
            labels["gpu"] = self.key
        return labels


def resolve_target(action_kind: str, key: str) -> Target:
    """The target of an action of `action_kind`; node and GPU are None where the inventory does not know them."""
    kind = TARGET_KIND[action_kind]
    if kind == "node":
        return Target(kind, key, node=Node.objects.filter(hostname=key).first())
    if kind == "gpu":
        gpu = Gpu.objects.select_related("node").filter(uuid=key).first()
        return Target(kind, key, node=gpu.node if gpu else None, gpu=gpu)
    return Target(kind, key)


def lock_kind(kind: str) -> None:
    """Serialise guard-rail decisions for one action kind until the transaction ends."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", [LOCK_NAMESPACE, KIND_NUMBER[kind]])


def blocked_reason(kind: str, target: Target, *, now: datetime, exclude_id: int | None = None,
                   shadow: bool = False) -> str:
    """The first guard rail that blocks `kind` on `target` now, as a sentence with the numbers; "" if none.
    Call it after `lock_kind(kind)`, in the transaction that records the decision."""
    reason = maintenance_reason(kind, target, now)
    if reason:
        return reason
    rails = sorted(GuardRail.objects.filter(action=kind, enabled=True), key=lambda r: SCOPE_ORDER.index(r.scope))
    for rail in rails:
        counted = _counted(kind, now - timedelta(seconds=rail.window_s), exclude_id=exclude_id, shadow=shadow)
        reason = _CHECKS[rail.scope](rail, target, counted, now)
        if reason:
            return reason
    return ""


def maintenance_reason(kind: str, target: Target, now: datetime) -> str:
    """Why the target is in maintenance (its node drained or down, or a maintenance window), or ""."""
    node = target.node
    if node is not None and kind != ActionKind.RESUME and node.state in DOWN_STATES:
        return f"maintenance: node {node.hostname} is already {node.state}"
    windows = Silence.objects.filter(kind=SilenceKind.MAINTENANCE, starts_at__lte=now, ends_at__gt=now).filter(
        Q(expired_at__isnull=True) | Q(expired_at__gt=now))
    for window in windows:
        if matches(target.labels, window.matchers):
            note = f": {window.comment}" if window.comment else ""
            return (f"maintenance: window #{window.pk} until {window.ends_at:%Y-%m-%d %H:%M} UTC covers "
                    f"{target.key}{note}")
    return ""


def _counted(kind: str, since: datetime, *, exclude_id: int | None, shadow: bool) -> QuerySet:
    let_through = Q(state__in=LET_THROUGH)
    if shadow:
        let_through |= Q(state=ActionState.SHADOWED, blocked_reason="")
    qs = RemediationAction.objects.filter(let_through, kind=kind, decided_at__gte=since)
    return qs.exclude(pk=exclude_id) if exclude_id else qs


def _cap(rail: GuardRail, size: int | None) -> tuple[int | None, str]:
    """The cap in targets and, when the fraction set it, how it was computed."""
    caps = []
    if rail.max_count is not None:
        caps.append((rail.max_count, ""))
    if rail.max_fraction is not None and size:
        caps.append((max(1, math.floor(rail.max_fraction * size + 1e-9)), f"{rail.max_fraction * 100:g}% of {size}"))
    return min(caps, key=lambda c: c[0]) if caps else (None, "")


def _window(seconds: int) -> str:
    if seconds % 3600 == 0:
        hours = seconds // 3600
        return "the last hour" if hours == 1 else f"the last {hours} hours"
    if seconds % 60 == 0:
        return f"the last {seconds // 60} min"
    return f"the last {seconds} s"


def _duration(delta: timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    if seconds >= 3600:
        return f"{seconds / 3600:g} h" if seconds % 360 == 0 else f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 60} min" if seconds >= 60 else f"{seconds} s"


def _target_cooldown(rail: GuardRail, target: Target, counted: QuerySet, now: datetime) -> str:
    prior = counted.filter(target_key=target.key).order_by("-decided_at").first()
    if prior is None:
        return ""
    return (f"target cooldown: {prior.kind} of {target.key} already {prior.state} {_duration(now - prior.decided_at)}"
            f" ago (#{prior.pk}); no second one within {_duration(timedelta(seconds=rail.window_s))}")


def _cluster_size(kind: str) -> tuple[int | None, str]:
    target_kind = TARGET_KIND[kind]
    if target_kind == "node":
        return Node.objects.count(), "nodes"
    if target_kind == "gpu":
        return Gpu.objects.count(), "GPUs"
    return None, ""


@dataclass(frozen=True)
class Budget:
    """One blast-radius cap as it stands for one target: `used` targets already let through in the window (the
    target itself not counted), of at most `cap`; `group` names the NVLink domain, leaf or rack ("" for the
    cluster). The same numbers block an action (`exhausted`) and fill the confirmation's impact preview."""

    rail: GuardRail
    group: str
    size: int | None
    unit: str
    used: int
    cap: int
    how: str

    @property
    def left_after(self) -> int:
        """What remains once this action is let through; negative when it would overrun the cap."""
        return self.cap - self.used - 1

    @property
    def exhausted(self) -> bool:
        return self.left_after < 0

    @property
    def window(self) -> str:
        return _window(self.rail.window_s)

    def reason(self) -> str:
        """The sentence that blocks an action, with its numbers."""
        action = self.rail.action
        if self.rail.scope == GuardScope.CLUSTER:
            how = f" ({self.how} {self.unit})" if self.how else ""
            return f"cluster cap: {self.used} of {self.cap} {PLURAL[action]} in {self.window}{how}"
        label = GuardScope(self.rail.scope).label.lower()
        doing = "drained or draining" if action == ActionKind.DRAIN else f"under {PLURAL[action]}"
        how = f" ({self.how})" if self.how else ""
        return (f"{label} cap ({self.group}): {self.used} of {self.size} nodes {doing} in {self.window}; "
                f"at most {self.cap}{how}")


def budgets(kind: str, target: Target, *, now: datetime, exclude_id: int | None = None,
            shadow: bool = False) -> list[Budget]:
    """Every blast-radius cap of `kind` that applies to `target` (cluster first, then its groups), as it stands
    now. Cooldowns and maintenance are not budgets: `blocked_reason` tells those."""
    rails = sorted(GuardRail.objects.filter(action=kind, enabled=True).exclude(scope=GuardScope.TARGET),
                   key=lambda r: SCOPE_ORDER.index(r.scope))
    out: list[Budget] = []
    for rail in rails:
        counted = _counted(kind, now - timedelta(seconds=rail.window_s), exclude_id=exclude_id, shadow=shadow)
        out.extend(_BUDGETS[rail.scope](rail, target, counted))
    return out


def _cluster_budgets(rail: GuardRail, target: Target, counted: QuerySet) -> list[Budget]:
    size, unit = _cluster_size(rail.action)
    cap, how = _cap(rail, size)
    if cap is None:
        return []
    used = len(set(counted.values_list("target_key", flat=True)) - {target.key})
    return [Budget(rail, "", size, unit, used, cap, how)]


def _cluster_cap(rail: GuardRail, target: Target, counted: QuerySet, now: datetime) -> str:
    return next((b.reason() for b in _cluster_budgets(rail, target, counted) if b.exhausted), "")


def _groups(scope: str, node: Node) -> list[tuple[str, QuerySet]]:
    """(name, member nodes) of each group of `scope` the node belongs to; a node may sit under several leaves."""
    if scope == GuardScope.NVLINK_DOMAIN and node.nvlink_domain_id:
        return [(node.nvlink_domain.name, Node.objects.filter(nvlink_domain_id=node.nvlink_domain_id))]
    if scope == GuardScope.RACK and node.rack_id:
        return [(node.rack.name, Node.objects.filter(rack_id=node.rack_id))]
    if scope == GuardScope.LEAF:
        leaves = Switch.objects.filter(role=Switch.Role.LEAF).filter(
            Q(ports__link_as_a__b__node=node) | Q(ports__link_as_b__a__node=node)).distinct().order_by("name")
        return [(leaf.name, Node.objects.filter(
            Q(ports__link_as_a__b__switch=leaf) | Q(ports__link_as_b__a__switch=leaf)).distinct()) for leaf in leaves]
    return []


def _nodes_of(kind: str, counted: QuerySet) -> QuerySet:
    """Ids of the nodes the counted actions touched (their target, or their GPU's node)."""
    keys = counted.values("target_key")
    if TARGET_KIND[kind] == "gpu":
        return Gpu.objects.filter(uuid__in=keys).values_list("node_id", flat=True)
    return Node.objects.filter(hostname__in=keys).values_list("id", flat=True)


def _group_budgets(rail: GuardRail, target: Target, counted: QuerySet) -> list[Budget]:
    if target.node is None or TARGET_KIND[rail.action] == "job":
        return []
    out = []
    for name, members in _groups(rail.scope, target.node):
        member_ids = set(members.values_list("id", flat=True))
        busy = set(_nodes_of(rail.action, counted)) & member_ids
        if rail.action == ActionKind.DRAIN:
            busy |= set(members.filter(state__in=DOWN_STATES).values_list("id", flat=True))
        busy.discard(target.node.pk)
        cap, how = _cap(rail, len(member_ids))
        if cap is not None:
            out.append(Budget(rail, name, len(member_ids), "nodes", len(busy), cap, how))
    return out


def _group_cap(rail: GuardRail, target: Target, counted: QuerySet, now: datetime) -> str:
    return next((b.reason() for b in _group_budgets(rail, target, counted) if b.exhausted), "")


_BUDGETS = {
    GuardScope.CLUSTER: _cluster_budgets,
    GuardScope.NVLINK_DOMAIN: _group_budgets,
    GuardScope.LEAF: _group_budgets,
    GuardScope.RACK: _group_budgets,
}
_CHECKS = {
    GuardScope.TARGET: _target_cooldown,
    GuardScope.CLUSTER: _cluster_cap,
    GuardScope.NVLINK_DOMAIN: _group_cap,
    GuardScope.LEAF: _group_cap,
    GuardScope.RACK: _group_cap,
}
