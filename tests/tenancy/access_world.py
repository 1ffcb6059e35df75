"""Two tenants side by side for the access tests: acme and globex, each with a running job on its own GPU, an
alert labelled with its slug, usage rows, an invoice with lines and a quota; personas and API tokens.

Every tenant-owned object carries a marker string unique to its tenant, so a test can say "nothing of globex
reached acme" by searching a response for globex's markers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.test import Client

from alerts.models import Alert, AlertEvent
from telemetry.models import Allocation, Gpu, Job, Node, Port
from tenancy.actions import do_create_tenant, do_map_account
from tenancy.models import Invoice, InvoiceLine, Quota, UsageHour
from tests import personas
from tests.conftest import FIXED_NOW

H = timedelta(hours=1)
PERIOD_START = FIXED_NOW.replace(day=1, hour=0)
PERIOD_END = PERIOD_START.replace(month=PERIOD_START.month % 12 + 1)


@dataclass
class TenantWorld:
    """One tenant's objects and the strings that identify them."""

    slug: str
    tenant: object
    job: Job
    node: Node
    gpu: Gpu
    port: Port
    alert: Alert
    invoice: Invoice
    line: InvoiceLine
    markers: tuple[str, ...] = field(default=())


def _alert(name: str, slug: str, gpu_uuid: str) -> Alert:
    labels = {"alertname": name, "severity": "warning", "gpu": gpu_uuid, "tenant": slug}
    alert = Alert.objects.create(fingerprint=f"fp-{slug}", name=name, state="firing", severity="warning",
                                 labels=labels, entity_kind="gpu", entity_key=gpu_uuid, starts_at=FIXED_NOW - 2 * H,
                                 last_seen=FIXED_NOW)
    AlertEvent.objects.create(alert=alert, time=FIXED_NOW - 2 * H, kind="fired", actor="system:rules")
    return alert


def make_tenant_world(slug: str, job_id: str, *, admin=None) -> TenantWorld:
    """A tenant (organisation) mapped to Slurm account `<slug>-acct`, with one running job on its own GPU."""
    tenant = do_create_tenant(slug.title(), slug, kind="organisation", actor="test")
    do_map_account(tenant, "slurm", f"{slug}-acct", actor="test")
    node = Node.objects.create(hostname=f"{slug}-node-01")
    gpu = Gpu.objects.create(uuid=f"GPU-{slug}-0000-4bad-8bad-{job_id:0>12}", node=node, index=0,
                             model="NVIDIA H100 80GB HBM3", serial=f"SN-{slug}-01")
    port = Port.objects.create(node=node, name="mlx5_0/1")
    job = Job.objects.create(source="slurm", external_id=job_id, name=f"{slug}-secret-train-{job_id}",
                             user=f"{slug}-user", account=f"{slug}-acct", partition="gpu", qos="normal",
                             state="running", submit_time=FIXED_NOW - 4 * H, start_time=FIXED_NOW - 3 * H,
                             node_count=1, gpu_count=1)
    Allocation.objects.create(job=job, node=node, gpu=gpu, gpu_index=0, fraction=1.0, start=FIXED_NOW - 3 * H)
    for hour in (FIXED_NOW - 3 * H, FIXED_NOW - 2 * H):
        UsageHour.objects.create(hour=hour, tenant=tenant, job=job, gpu_model=gpu.model, qos="normal",
                                 gpu_hours=Decimal(1), busy_hours=Decimal("0.75"), idle_held_hours=Decimal("0.25"),
                                 energy_gpu_kwh=Decimal("0.6"))
    Quota.objects.create(tenant=tenant, gpu_model=gpu.model, guaranteed=8, borrowable=4)
    invoice = Invoice.objects.create(tenant=tenant, number=f"INV-{slug.upper()}-2026-11", period_start=PERIOD_START,
                                     period_end=PERIOD_END, total=Decimal("6.40"))
    line = InvoiceLine.objects.create(invoice=invoice, kind="gpu_time", description=f"GPU time of {job.name}",
                                      job=job, job_key=f"slurm:{job_id}", gpu_model=gpu.model, qos="normal",
                                      quantity=Decimal(2), unit="gpu_hour", unit_price=Decimal("3.2"),
                                      amount=Decimal("6.40"))
    alert = _alert(f"{slug.title()}OnlyAlert", slug, gpu.uuid)
    markers = (job.name, invoice.number, gpu.uuid, alert.name, node.hostname)
    return TenantWorld(slug, tenant, job, node, gpu, port, alert, invoice, line, markers)


@dataclass
class Personas:
    """Signed-in clients, and raw API tokens."""

    clients: dict[str, Client]
    users: dict[str, object]
    tokens: dict[str, str]


def make_personas(acme: TenantWorld, globex: TenantWorld) -> Personas:
    """operator (staff), acme / globex members, nobody (signed in, no role), anonymous; acme, operator and
    collector tokens."""
    users = {
        "operator": personas.operator("op"),
        "acme": personas.tenant_user(acme.tenant, "member", "alice"),
        "globex": personas.tenant_user(globex.tenant, "member", "gary"),
        "nobody": personas.nobody("nora"),
    }
    clients = {"anonymous": Client(raise_request_exception=False)}
    clients.update({name: personas.signed_in(user) for name, user in users.items()})
    tokens = {
        "acme_token": personas.api_token(acme.tenant, name="acme-ci"),
        "operator_token": personas.api_token(None, name="ops-script", read_only=False),
        "collector_token": personas.collector_token("rack-a01-agent"),
    }
    return Personas(clients, users, tokens)


def session_cookie(client: Client) -> bytes:
    """The Cookie header of a signed-in test client (for websocket clients)."""
    name = settings.SESSION_COOKIE_NAME
    return f"{name}={client.cookies[name].value}".encode()
