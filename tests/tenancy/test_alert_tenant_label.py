"""Alerts on a job, or on a GPU or node one tenant's jobs hold, carry `tenant=<slug>` (how a tenant sees them)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from alerts.evaluation import run_evaluation
from alerts.models import Alert, Rule, RuleKind
from anomaly.models import Anomaly
from telemetry.ingest.documents import parse_json
from telemetry.ingest.schema import TimeParser
from telemetry.ingest.writer import write_batch
from telemetry.models import Gpu, Node
from tenancy.selectors import tenants_for
from tests.conftest import FIXED_NOW
from tests.tenancy.metering_factories import allocate, make_job, make_tenant

pytestmark = pytest.mark.django_db

T0 = FIXED_NOW
HOUR = timedelta(hours=1)


def _ingest(**temps_by_host) -> None:
    """GPU temperatures through the real ingest writer (which registers the nodes and GPUs)."""
    gpus = [{"host": host, "uuid": f"GPU-{host}-{i}", "index": i, "fields": {"gpu_temp": t}}
            for host, temps in temps_by_host.items() for i, t in enumerate(temps)]
    body = json.dumps({"time": T0.isoformat(), "gpus": gpus}).encode()
    write_batch(parse_json(body, TimeParser(T0, timedelta(minutes=5), timedelta(days=7))), collector="t", fmt="json")


@pytest.fixture
def held():
    """node-a: GPU 0 acme's, GPU 1 shared by acme and globex, GPU 2 held by a job of no tenant, GPU 3 free
    (its acme job ended); node-b: both GPUs acme's (two jobs)."""
    _ingest(**{"node-a": [95.0, 95.0, 95.0, 95.0], "node-b": [95.0, 95.0]})
    acme, globex = make_tenant("acme", ("slurm", "acme")), make_tenant("globex", ("k8s", "globex"))
    a = {g.index: g for g in Gpu.objects.filter(node__hostname="node-a")}
    b = list(Gpu.objects.filter(node__hostname="node-b").order_by("index"))
    start = T0 - HOUR
    allocate(make_job("1", account="acme", state="running", start=start), [a[0]], start, None)
    allocate(make_job("2", account="acme", state="running", start=start), [a[1]], start, None, fraction=0.5)
    allocate(make_job("3", account="globex", source="k8s", state="running", start=start), [a[1]], start, None,
             fraction=0.5)
    allocate(make_job("4", account="unmapped", state="running", start=start), [a[2]], start, None)
    ended = T0 - timedelta(seconds=1)
    allocate(make_job("5", account="acme", start=start, end=ended), [a[3]], start, ended)
    allocate(make_job("6", account="acme", state="running", start=start), b[:1], start, None)
    allocate(make_job("7", account="acme", state="running", start=start), b[1:], start, None)
    return {"acme": acme, "globex": globex, "a": a, "b": b}


def test_tenants_for_gpus_names_only_gpus_one_tenant_holds(held):
    a = held["a"]
    assert tenants_for("gpu", [g.id for g in a.values()], T0) == {a[0].id: "acme"}
    assert tenants_for("gpu", [a[3].id], T0 - 2 * timedelta(seconds=1)) == {a[3].id: "acme"}  # still held then


def test_tenants_for_nodes_and_jobs_names_only_single_tenant_holders(held):
    nodes = dict(Node.objects.values_list("hostname", "id"))
    assert tenants_for("node", list(nodes.values()), T0) == {nodes["node-b"]: "acme"}
    assert tenants_for("job", ["slurm:1", "k8s:3", "slurm:4", "slurm:missing"], T0) == {"slurm:1": "acme",
                                                                                           "k8s:3": "globex"}
    assert tenants_for("rack", [1], T0) == {} and tenants_for("gpu", [], T0) == {}


def test_gpu_and_node_alerts_carry_the_holding_tenant(held):
    gpu_rule = Rule.objects.create(name="Hot", kind=RuleKind.THRESHOLD, metric="gpu_temp", op=">", threshold=90)
    node_rule = Rule.objects.create(name="HotNode", kind=RuleKind.THRESHOLD, entity="node", metric="gpu_temp",
                                    op=">", threshold=90)
    with CaptureQueriesContext(connection) as ctx:
        run_evaluation(T0)
    labelled = [q["sql"] for q in ctx.captured_queries if "count(DISTINCT coalesce(ta.tenant_id" in q["sql"]]
    assert len(labelled) == 2  # one tenant lookup per rule evaluated
    tenants = {a.entity_key: a.labels.get("tenant") for a in Alert.objects.filter(rule=gpu_rule)}
    assert tenants == {"GPU-node-a-0": "acme", "GPU-node-a-1": None, "GPU-node-a-2": None, "GPU-node-a-3": None,
                       "GPU-node-b-0": "acme", "GPU-node-b-1": "acme"}
    nodes = {a.entity_key: a.labels.get("tenant") for a in Alert.objects.filter(rule=node_rule)}
    assert nodes == {"node-a": None, "node-b": "acme"}


def test_job_alerts_carry_the_jobs_tenant(held):
    Rule.objects.create(name="Straggler", kind=RuleKind.JOB, entity="job", metric="straggler", op=">=", threshold=0)
    for key in ("slurm:1#0", "k8s:3#2", "slurm:4#1"):
        Anomaly.objects.create(kind="straggler", entity_kind="rank", entity_id=key, host="node-a", started_at=T0,
                               last_seen=T0, score=3, last_score=3, summary="slow rank")
    run_evaluation(T0)
    tenants = {a.entity_key: a.labels.get("tenant") for a in Alert.objects.filter(rule__name="Straggler")}
    assert tenants == {"slurm:1": "acme", "k8s:3": "globex", "slurm:4": None}
