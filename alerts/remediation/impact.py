"""What an action would do, shown before it does it: the confirmation's impact preview.

`impact_of()` is the one place that answers "if I approve this, what breaks?": the jobs running on the target
(node, GPU or job) with their tenants, how many GPUs it takes out, and how much of each blast-radius budget it
uses, read from the same `guards.budgets()` numbers that block an action. The confirm page, its dialog, the
API and the tests all call it.

A confirmation carries a token (`confirm_token`) signed over the preview's digest: approving checks it against
the preview computed again at that moment (`confirmed`), so an operator never approves on numbers that moved
since they read them (a job started on the node, another drain used the budget). The token expires after
CONFIRM_MAX_AGE.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.core import signing
from django.db.models import Q
from django.utils import timezone

from alerts.models import TARGET_KIND, ActionKind, RemediationAction
from alerts.remediation.actions import APPROVABLE
from alerts.remediation.guards import PLURAL, Budget, Target, blocked_reason, budgets, resolve_target
from telemetry.models import Allocation, Job
from telemetry.selectors.inventory import job_key
from tenancy.models import TenantAccount

__all__ = ["APPROVABLE", "CONFIRM_MAX_AGE", "Impact", "ImpactJob", "action_impact", "budget_text", "confirm_token",
           "confirmed", "impact_of"]

CONFIRM_SALT = "alerts.remediation.confirm"
CONFIRM_MAX_AGE = timedelta(minutes=15)
# Kinds that change nothing on the cluster (a ticket is a message); their preview says so.
HARMLESS = (ActionKind.TICKET,)
UNIT = {"node": "node", "gpu": "GPU", "job": "job"}


@dataclass(frozen=True)
class ImpactJob:
    """A job the action touches: on the target now, with its tenant (None where its account maps to none)."""

    job_id: int
    key: str
    name: str
    user: str
    account: str
    tenant: str | None
    state: str
    gpus: int


@dataclass(frozen=True)
class Impact:
    """The preview of one action on one target, now."""

    kind: str
    kind_label: str
    target_kind: str
    target_key: str
    node: str | None
    known: bool
    gpus: int
    jobs: list[ImpactJob]
    budgets: list[Budget]
    blocked_reason: str
    state: str | None = None
    action_id: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def tenants(self) -> list[str]:
        """Tenants whose jobs it touches, by name; an unmapped account reads "account X (no tenant)"."""
        names = {j.tenant or f"account {j.account or '?'} (no tenant)" for j in self.jobs}
        return sorted(names)

    @property
    def approvable(self) -> bool:
        return self.state is None or self.state in APPROVABLE

    @property
    def allowed(self) -> bool:
        """Whether approving now would let it run: approvable, and no guard rail blocks it."""
        return self.approvable and not self.blocked_reason

    @property
    def exhausted(self) -> list[Budget]:
        return [b for b in self.budgets if b.exhausted]

    def budget_lines(self) -> list[str]:
        """Each budget in words: "uses 1 of 4 drains of the last hour's cluster budget; 2 left after"."""
        return [budget_text(b) for b in self.budgets]

    def digest(self) -> str:
        """What the operator confirms: any change to these facts makes an earlier confirmation stale."""
        facts = [self.kind, self.target_key, self.state, self.gpus, sorted(j.job_id for j in self.jobs),
                 [(b.rail.scope, b.group, b.used, b.cap) for b in self.budgets], self.blocked_reason]
        return hashlib.sha256(json.dumps(facts, default=str).encode()).hexdigest()[:32]

    def as_dict(self) -> dict:
        """The preview for the API: the same facts and sentences the confirm page shows."""
        return {
            "action_id": self.action_id, "kind": self.kind, "target_kind": self.target_kind,
            "target_key": self.target_key, "node": self.node, "known": self.known, "gpus": self.gpus,
            "jobs": [j.__dict__ for j in self.jobs], "tenants": self.tenants,
            "budgets": [{"scope": b.rail.scope, "group": b.group, "window_s": b.rail.window_s, "used": b.used,
                         "cap": b.cap, "left_after": b.left_after, "exhausted": b.exhausted,
                         "text": budget_text(b)} for b in self.budgets],
            "blocked_reason": self.blocked_reason, "allowed": self.allowed, "notes": self.notes,
            "confirm": confirm_token(self),
        }


def budget_text(b: Budget) -> str:
    """A budget as the confirmation says it."""
    where = "cluster" if not b.group else f"{b.rail.get_scope_display().lower()} {b.group}"
    how = f" ({b.how} {b.unit})" if b.how and not b.group else f" ({b.how})" if b.how else ""
    head = f"uses 1 of {b.cap} {PLURAL[b.rail.action]}{how} of the {where} budget for {b.window}"
    if b.exhausted:
        return f"{head}: exhausted, {b.used} already used; refused"
    return f"{head}; {b.used} used before, {b.left_after} left after"


def impact_of(kind: str, target_key: str, *, now: datetime | None = None, exclude_id: int | None = None,
              state: str | None = None, action_id: int | None = None) -> Impact:
    """The impact preview of `kind` on `target_key` now (see the module docstring)."""
    now = now or timezone.now()
    target = resolve_target(kind, target_key)
    jobs = _jobs(target)
    notes = []
    if not target.node and target.kind != "job":
        notes.append(f"{target.key} is not in the inventory: the jobs and GPUs on it are unknown")
    if kind in HARMLESS:
        notes.append("this action changes nothing on the cluster")
    return Impact(
        kind=kind, kind_label=ActionKind(kind).label, target_kind=TARGET_KIND[kind], target_key=target_key,
        node=target.node.hostname if target.node else None, known=target.node is not None or bool(jobs),
        gpus=_gpu_count(target, jobs), jobs=jobs,
        budgets=budgets(kind, target, now=now, exclude_id=exclude_id),
        blocked_reason=blocked_reason(kind, target, now=now, exclude_id=exclude_id),
        state=state, action_id=action_id, notes=notes)


def action_impact(action: RemediationAction, *, now: datetime | None = None) -> Impact:
    """The preview of an existing action: its own earlier decision is not counted against its budget."""
    return impact_of(action.kind, action.target_key, now=now, exclude_id=action.pk, state=action.state,
                     action_id=action.pk)


def _allocations(target: Target):
    """Open allocations on the target (allocation_node_end_idx for a node; the GPU's own for a GPU)."""
    open_ = Allocation.objects.filter(end__isnull=True)
    if target.kind == "node":
        return open_.filter(node=target.node) if target.node else open_.none()
    if target.kind == "gpu":
        if target.gpu is None:
            return open_.none()
        return open_.filter(Q(gpu=target.gpu) | Q(gpu__isnull=True, node=target.node, gpu_index=target.gpu.index))
    source, _, external = target.key.partition(":")
    return open_.filter(job__source=source, job__external_id=external)


def _jobs(target: Target) -> list[ImpactJob]:
    per_job: dict[int, int] = {}
    jobs: dict[int, Job] = {}
    for a in _allocations(target).select_related("job").order_by("start", "gpu_index"):
        per_job[a.job_id] = per_job.get(a.job_id, 0) + 1
        jobs[a.job_id] = a.job
    tenants = _tenants({(j.source, j.account) for j in jobs.values()})
    return [ImpactJob(job_id=j.pk, key=job_key(j.source, j.external_id), name=j.name, user=j.user,
                      account=j.account, tenant=tenants.get((j.source, j.account)), state=j.state,
                      gpus=per_job[j.pk]) for j in jobs.values()]


def _tenants(accounts: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Tenant name per (scheduler, account); jobs carry no tenant label, the account map says whose they are."""
    if not accounts:
        return {}
    q = Q(pk__in=[])
    for kind, name in accounts:
        q |= Q(kind=kind, name=name)
    return {(a.kind, a.name): a.tenant.name for a in TenantAccount.objects.filter(q).select_related("tenant")}


def _gpu_count(target: Target, jobs: list[ImpactJob]) -> int:
    if target.kind == "gpu":
        return 1 if target.gpu else 0
    if target.kind == "node":
        return target.node.gpus.count() if target.node else 0
    return sum(j.gpus for j in jobs)


def confirm_token(impact: Impact) -> str:
    """A signed token for this preview of this action; `confirmed` accepts it while the preview is unchanged."""
    return signing.dumps({"a": impact.action_id, "d": impact.digest()}, salt=CONFIRM_SALT, compress=True)


def confirmed(impact: Impact, token: str) -> bool:
    """Whether `token` confirms exactly this preview (same action, same facts, not expired)."""
    if not token:
        return False
    try:
        data = signing.loads(token, salt=CONFIRM_SALT, max_age=CONFIRM_MAX_AGE)
    except signing.BadSignature:  # includes SignatureExpired
        return False
    return isinstance(data, dict) and data.get("a") == impact.action_id and data.get("d") == impact.digest()
