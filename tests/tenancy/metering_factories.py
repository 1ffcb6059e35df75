"""Small builders for the metering, quota and reconciliation tests: inventory, jobs, ledger rows, 1-minute rollups."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from telemetry.models import Allocation, Gpu, Job, JobStateChange, MigInstance, Node
from tenancy.models import Tenant, TenantAccount, TenantKind, UsageHour
from tests.telemetry.factories import insert_rollup

MINUTE = timedelta(minutes=1)


def make_node(hostname: str, gpus: int = 8, model: str = "H100") -> tuple[Node, list[Gpu]]:
    """A node with `gpus` GPUs of one model, indexed 0..gpus-1."""
    node = Node.objects.create(hostname=hostname)
    rows = Gpu.objects.bulk_create([Gpu(uuid=f"GPU-{hostname}-{i}", node=node, index=i, model=model)
                                    for i in range(gpus)])
    return node, rows


def make_tenant(slug: str, *accounts: tuple[str, str], parent: Tenant | None = None) -> Tenant:
    """A tenant (an organisation unless a parent is given) owning (kind, name) scheduler accounts."""
    kind = TenantKind.TEAM if parent else TenantKind.ORGANISATION
    tenant = Tenant.objects.create(name=slug.title(), slug=slug, kind=kind, parent=parent)
    for kind_, name in accounts:
        TenantAccount.objects.create(tenant=tenant, kind=kind_, name=name)
    return tenant


def make_job(external_id: str, *, account: str = "acct", qos: str = "normal", source: str = "slurm",
             state: str = "completed", start: datetime | None = None, end: datetime | None = None) -> Job:
    """A job with a running state change at its start (and its final state at its end, when it has one)."""
    job = Job.objects.create(source=source, external_id=external_id, account=account, qos=qos, state=state,
                             start_time=start, end_time=end, name=f"job {external_id}")
    if start:
        JobStateChange.objects.create(job=job, time=start, state="running")
    if end and state != "running":
        JobStateChange.objects.create(job=job, time=end, state=state)
    return job


def allocate(job: Job, gpus: list[Gpu], start: datetime, end: datetime | None, *, fraction: float = 1.0,
             mig: MigInstance | None = None) -> list[Allocation]:
    """Ledger rows: `job` holds each of `gpus` over [start, end)."""
    return Allocation.objects.bulk_create([
        Allocation(job=job, node_id=g.node_id, gpu=g, gpu_index=g.index, start=start, end=end, fraction=fraction,
                   mig_instance=mig) for g in gpus])


def minutes(entity_id: int, start: datetime, count: int, **columns) -> list[tuple]:
    """`count` consecutive 1-minute rollup rows for one entity with the same column values."""
    return [(entity_id, start + MINUTE * i, dict(columns)) for i in range(count)]


def gpu_minutes(gpu: Gpu, start: datetime, count: int, **columns) -> int:
    """Write 1-minute GPU rollup rows (e.g. gr_engine_active_avg=0.5, energy_mj_delta=18e6)."""
    return insert_rollup("gpu", "1m", minutes(gpu.id, start, count, **columns))


def usage(job: Job, field: str = "gpu_hours") -> Decimal:
    """A job's total of one UsageHour column."""
    return sum((getattr(u, field) for u in UsageHour.objects.filter(job=job)), Decimal(0))


def usage_rows() -> list[tuple]:
    """Every usage row as a comparable tuple, in a stable order."""
    return list(UsageHour.objects.order_by("hour", "job_id", "gpu_model", "mig_profile").values_list(
        "hour", "tenant_id", "job_id", "gpu_model", "mig_profile", "qos", "gpu_hours", "busy_hours",
        "idle_held_hours", "lost_hours", "energy_gpu_kwh", "energy_node_kwh", "energy_facility_kwh"))
