"""The search box: one string against hostnames, GPU UUIDs and serials, job ids and tenants.

`search(q)` returns [{"kind", "key", "label", "detail", "match"}], best first: exact matches
before prefix matches before fragments ("contains"), then nodes, GPUs, jobs, tenants, each kind
in its own order (hostname, UUID, newest job). `key` is what the page URL carries: the hostname,
the GPU UUID, the job's `source:external_id`, the account. Every lookup is LIMITed and says
below which index serves it; the ones with none are named in the comments too.
"""

from __future__ import annotations

import re

from django.db import connection
from django.db.models import Count

from telemetry.models import Gpu, Job, JobState, Node
from telemetry.selectors.jobs import ACCOUNTS_CTE

EXACT, PREFIX, CONTAINS = "exact", "prefix", "contains"
_TIER = {EXACT: 0, PREFIX: 1, CONTAINS: 2}
_KIND_ORDER = {"node": 0, "gpu": 1, "job": 2, "tenant": 3}
# Shorter fragments match most of the fleet: no use to anyone typing, and a scan for nothing.
MIN_CONTAINS = 2
MIN_SERIAL_PREFIX = 4
_UUID_HEX = re.compile(r"[0-9a-f-]+")


def search(q: str | None, limit: int = 20) -> list[dict]:
    """Everything `q` names, best matches first; [] for an empty or blank query."""
    q = (q or "").strip()
    if not q or limit <= 0:
        return []
    hits = [*_nodes(q, limit), *_gpus(q, limit), *_jobs(q, limit), *_tenants(q)]
    best: dict[tuple[str, str], tuple] = {}
    for order, hit in enumerate(hits):
        rank = (_TIER[hit["match"]], _KIND_ORDER[hit["kind"]], order)
        key = (hit["kind"], hit["key"])
        if key not in best or rank < best[key][0]:
            best[key] = (rank, hit)
    return [hit for _, hit in sorted(best.values(), key=lambda item: item[0])][:limit]


def _tier(value: str, q: str) -> str:
    value, q = value.lower(), q.lower()
    return EXACT if value == q else PREFIX if value.startswith(q) else CONTAINS


# --- Nodes ---------------------------------------------------------------------------------------

def _nodes(q: str, limit: int) -> list[dict]:
    """Hostname exact / prefix / contains, case-insensitive.

    1. Exact and prefix: `hostname LIKE 'q%'` on the lower-cased query, served by Django's
       telemetry_node_hostname_*_like index (varchar_pattern_ops). Hostnames are lower case by
       convention (DNS); a mixed-case one is still found by step 2.
    2. Contains (only while step 1 left room): `UPPER(hostname) LIKE UPPER('%q%')`. No index
       serves a fragment; it scans the node table (about 2k rows at 16k GPUs). A pg_trgm GIN
       index on hostname would serve it.
    """
    base = Node.objects.select_related("rack").annotate(gpu_total=Count("gpus")).order_by("hostname")
    nodes = list(base.filter(hostname__startswith=q.lower())[:limit])
    if len(nodes) < limit and len(q) >= MIN_CONTAINS:
        seen = {n.id for n in nodes}
        nodes += [n for n in base.filter(hostname__icontains=q)[:limit] if n.id not in seen]
    return [
        {"kind": "node", "key": n.hostname, "label": n.hostname, "match": _tier(n.hostname, q),
         "detail": " · ".join(filter(None, [
             f"rack {n.rack.name}" if n.rack_id else "unplaced", f"{n.gpu_total} GPUs", n.state]))}
        for n in nodes
    ]


# --- GPUs ----------------------------------------------------------------------------------------

def _gpus(q: str, limit: int) -> list[dict]:
    """GPU UUID (with or without "GPU-") by prefix; GPU serial exact, else by prefix.

    - UUID: `uuid LIKE 'GPU-<hex>%'`, served by telemetry_gpu_uuid_*_like (varchar_pattern_ops).
      NVIDIA prints the hex in lower case, so the query's hex is lower-cased.
    - Serial exact: `serial = q`, served by gpu_serial_idx.
    - Serial prefix (only when nothing matched exactly): `serial LIKE 'q%'`. gpu_serial_idx is a
      plain btree, which serves LIKE only under the C collation: elsewhere this scans the GPU table
      (16k rows). A varchar_pattern_ops index on serial would serve it.
    """
    base = Gpu.objects.select_related("node").order_by("uuid")
    hits: list[tuple[Gpu, str]] = []
    hex_part = (q[4:] if q.lower().startswith("gpu-") else q).lower()
    if len(hex_part) >= MIN_CONTAINS and _UUID_HEX.fullmatch(hex_part):
        uuid = f"GPU-{hex_part}"
        hits += [(g, EXACT if g.uuid == uuid else PREFIX) for g in base.filter(uuid__startswith=uuid)[:limit]]
    by_serial = list(base.filter(serial=q)[:limit])
    if not by_serial and len(q) >= MIN_SERIAL_PREFIX:
        by_serial = list(base.filter(serial__startswith=q)[:limit])
    hits += [(g, _tier(g.serial, q)) for g in by_serial]
    return [
        {"kind": "gpu", "key": g.uuid, "label": g.uuid, "match": match,
         "detail": " · ".join(filter(None, [
             f"{g.node.hostname} GPU {g.index}" if g.index is not None else g.node.hostname,
             g.model, f"serial {g.serial}" if g.serial else ""]))}
        for g, match in hits
    ]


# --- Jobs ----------------------------------------------------------------------------------------

def _jobs(q: str, limit: int) -> list[dict]:
    """A job by its key `source:id`, or by its scheduler id exactly or by prefix, newest first.

    - `source:id` and the exact id: job_unique_per_source (source, external_id), with the
      source bound to each scheduler's name (`source = ANY(...)`) when the query has none.
    - Prefix: `external_id LIKE 'q%'` has no index outside the C collation (the unique
      constraint's btree uses the default operator class); it walks the primary key from the
      newest job and stops at `limit` matches. A varchar_pattern_ops index on external_id would
      serve it.
    """
    sources = list(Job.Source.values)
    if ":" in q:
        source, _, ext = q.partition(":")
        source, ext = source.strip().lower(), ext.strip()
        if source in sources and ext:
            return [_job_hit(j, EXACT) for j in Job.objects.filter(source=source, external_id=ext)]
        return []
    exact = list(Job.objects.filter(source__in=sources, external_id=q).order_by("-id")[:limit])
    seen = {j.id for j in exact}
    prefix = [j for j in Job.objects.filter(external_id__startswith=q).order_by("-id")[:limit] if j.id not in seen]
    return [_job_hit(j, EXACT) for j in exact] + [_job_hit(j, PREFIX) for j in prefix]


def _job_hit(job: Job, match: str) -> dict:
    key = f"{job.source}:{job.external_id}"
    return {
        "kind": "job", "key": key, "label": f"{key} {job.name}".strip(), "match": match,
        "detail": " · ".join(filter(None, [job.user, job.account, JobState(job.state).label])),
    }


# --- Tenants -------------------------------------------------------------------------------------

# Tenancy has not landed, so a tenant is a scheduler account. Case-insensitive exact match: the
# distinct accounts come from a loose index scan of job_account_end_idx (one probe per account),
# are compared lower-cased, and the matches' jobs are counted through the same index.
_TENANT_SQL = f"""
WITH RECURSIVE {ACCOUNTS_CTE},
m AS (SELECT account FROM acct WHERE account IS NOT NULL AND account <> '' AND lower(account) = lower(%(q)s))
SELECT m.account, count(*),
       count(*) FILTER (WHERE j.state = %(running)s), count(*) FILTER (WHERE j.state = %(pending)s)
FROM m JOIN {Job._meta.db_table} j ON j.account = m.account
GROUP BY m.account ORDER BY m.account
"""


def _tenants(q: str) -> list[dict]:
    with connection.cursor() as cur:
        cur.execute(_TENANT_SQL, {"q": q, "running": JobState.RUNNING.value, "pending": JobState.PENDING.value})
        rows = cur.fetchall()
    return [
        {"kind": "tenant", "key": account, "label": account, "match": EXACT,
         "detail": f"{jobs} jobs · {running} running · {pending} pending",
         "jobs": jobs, "running": running, "pending": pending}
        for account, jobs, running, pending in rows
    ]
