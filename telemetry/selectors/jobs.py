"""Read-side queries for the Jobs pages: the job list, one job's gang, and its step times per rank.

Everything returned is JSON-able (ISO 8601 strings for times, None where there is no data); a job
that does not exist gives None, and a job with no allocations or no training steps gives empty
ranks and None statistics, never an exception.

Cost, whatever the fleet size:

- `job_list`: three statements. The page is a UNION ALL of one small ordered, LIMITed read per
  state, each walking job_state_start_idx (state, start_time DESC), so the newest jobs come off
  the index instead of out of a sort of the whole table. Then a count per state under the same
  filters, and the dropdown values (accounts by a loose index scan of job_account_end_idx).
- `job_detail`: a fixed handful of statements however many ranks the gang has: the job and its
  history, its allocations with their places, the nodes' fabric peers, the GPUs' last values,
  and one aggregate over the window of training steps (primary key job_id, rank, time).
- `job_step_series`: one time_bucket aggregate over the job's steps in the range.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Max
from django.utils import timezone

from telemetry import health as health_model
from telemetry.models import Allocation, Job, JobState
from telemetry.selectors.inventory import gpu_tile, iso, job_key, latest_gpu_rows, node_leaves
from telemetry.series import GAP_FACTOR

ENDED_STATES = frozenset({
    JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED, JobState.TIMEOUT,
    JobState.NODE_FAIL,
})

# Straggler rule. A rank straggles when its median step time over the window exceeds
#     gang median + max(STRAGGLER_SIGMAS × MAD × MAD_TO_SIGMA, STRAGGLER_MIN_EXCESS × gang median)
# where the gang median and MAD (median absolute deviation) are taken over the ranks' medians.
# Medians and MAD are robust: one slow rank cannot drag the reference towards itself the way a
# mean and standard deviation would. MAD × 1.4826 estimates σ for normally distributed times, so
# the first term is "3 σ slower". The second term keeps a very uniform gang (MAD near 0) from
# flagging ranks that are only a hair slower: less than 10 % slower is not worth a page.
# Below STRAGGLER_MIN_RANKS reporting ranks there is no majority to compare against.
STRAGGLER_SIGMAS = 3.0
MAD_TO_SIGMA = 1.4826
STRAGGLER_MIN_EXCESS = 0.10
STRAGGLER_MIN_RANKS = 3

DEFAULT_WINDOW = timedelta(minutes=15)
JOB_STEPS_TABLE = "telemetry_training_step"
_JOB_TABLE = Job._meta.db_table


# --- One job's fields ----------------------------------------------------------------------------

def job_fields(job: Job, now: datetime) -> dict:
    """The fields every job view shows. Times are ISO strings; durations are seconds."""
    queued_s = runtime_s = None
    if job.submit_time:
        until = job.start_time or (now if job.state == JobState.PENDING else job.end_time)
        queued_s = None if until is None else max(0.0, (until - job.submit_time).total_seconds())
    if job.start_time:
        until = job.end_time or (None if job.state in ENDED_STATES else now)
        runtime_s = None if until is None else max(0.0, (until - job.start_time).total_seconds())
    return {
        "id": job.id, "key": job_key(job.source, job.external_id), "source": job.source,
        "external_id": job.external_id, "name": job.name, "user": job.user,
        # Tenancy has not landed: the scheduler account (or namespace) stands in for the tenant.
        "account": job.account, "tenant": job.account,
        "partition": job.partition, "qos": job.qos, "priority": job.priority,
        "state": job.state, "state_label": JobState(job.state).label, "colour": JobState.colour(job.state),
        "submit": iso(job.submit_time), "start": iso(job.start_time), "end": iso(job.end_time),
        "queued_s": queued_s, "runtime_s": runtime_s,
        "gpu_count": job.gpu_count, "node_count": job.node_count,
        "preempt_count": job.preempt_count, "requeue_count": job.requeue_count,
    }


def get_job(job: int | str) -> Job | None:
    """A job by id, or by its key `source:external_id` (the unique constraint's index)."""
    if isinstance(job, str) and ":" in job:
        source, _, external_id = job.partition(":")
        return Job.objects.filter(source=source.strip().lower(), external_id=external_id.strip()).first()
    try:
        return Job.objects.filter(pk=int(job)).first()
    except (TypeError, ValueError):
        return None


# --- The job list --------------------------------------------------------------------------------

def job_list(*, state: str | None = None, account: str | None = None, user: str | None = None,
             partition: str | None = None, source: str | None = None, q: str | None = None,
             limit: int = 200, offset: int = 0, now: datetime | None = None) -> dict:
    """Jobs newest first, running before pending before ended, with the total and dropdown values.

    Order: running jobs by start, newest first; then pending ones by submit time; then ended ones
    by start; last, jobs that ended without ever starting (cancelled in the queue), by submit
    time. `q` matches a `source:id` key exactly, or an id prefix, a name fragment, a user or an
    account. Returns {"total", "limit", "offset", "jobs": [job_fields...], "filters": {"states":
    [{value, label, colour, count}], "accounts": [...], "partitions": [...]}}; counts per state
    follow every filter but the state itself.
    """
    now = now or timezone.now()
    where, params = _filters(account=account, user=user, partition=partition, source=source, q=q)
    states = ([state] if state in JobState.values else []) if state else list(JobState.values)
    jobs = _page(states, where, params, max(0, limit), max(0, offset))
    counts = _state_counts(where, params)
    accounts, partitions = _dropdowns()
    return {
        "total": sum(counts.get(s, 0) for s in states), "limit": limit, "offset": offset,
        "jobs": _with_gpu_health([job_fields(j, now) for j in jobs], now),
        "filters": {
            "states": [{"value": s.value, "label": s.label, "colour": JobState.colour(s.value),
                        "count": counts[s.value]} for s in JobState if counts.get(s.value)],
            "accounts": accounts, "partitions": partitions,
        },
    }


def _with_gpu_health(rows: list[dict], now: datetime) -> list[dict]:
    """Each running job's GPUs by the health model: the worst state and how many are not OK, so the
    list says at once which jobs sit on failed or silent hardware."""
    running = {r["id"]: r for r in rows if r["state"] == JobState.RUNNING}
    held = list(Allocation.objects.filter(job_id__in=list(running), end__isnull=True, gpu__isnull=False)
                .values_list("job_id", "gpu_id"))
    states = health_model.gpu_health([g for _, g in held], now=now) if held else {}
    per_job: dict[int, list[health_model.Health]] = {}
    for job_id, gpu_id in held:
        per_job.setdefault(job_id, []).append(states[gpu_id])
    for row in rows:
        hs = per_job.get(row["id"], [])
        worst = min(hs, key=lambda h: health_model.RANK[h.state], default=None)
        bad = sum(h.state != "ok" for h in hs)
        row["gpu_health"] = None if worst is None else {
            **health_model.health_fields(worst), "not_ok": bad, "gpus": len(hs),
            # No ages here: the list is pushed as it changes, and a ticking age would change every row.
            "health_detail": f"{bad} of {len(hs)} GPUs not OK: "
                             f"{worst.detail if worst.reason != 'no_data' else health_model.REASONS['no_data']}"
            if bad else ""}
    return rows


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _filters(**given) -> tuple[list[str], dict]:
    where, params = [], {}
    for column in ("account", "user", "partition", "source"):
        if given[column]:
            where.append(f'"{column}" = %({column})s')
            params[column] = given[column]
    q = (given["q"] or "").strip()
    if q and ":" in q:
        src, _, ext = q.partition(":")
        where.append("source = %(q_source)s AND external_id = %(q_ext)s")
        params.update(q_source=src.strip().lower(), q_ext=ext.strip())
    elif q:
        where.append('(external_id LIKE %(q_prefix)s OR name ILIKE %(q_contains)s OR "user" = %(q)s'
                     " OR account = %(q)s)")
        params.update(q=q, q_prefix=_like_escape(q) + "%", q_contains="%" + _like_escape(q) + "%")
    return where, params


def _page(states: list[str], where: list[str], params: dict, limit: int, offset: int) -> list[Job]:
    """One ordered, LIMITed read per state group, merged: each stays an index-ordered scan."""
    started = ("start_time IS NOT NULL", "start_time DESC, id DESC", "start_time")
    by_submit = "submit_time DESC NULLS LAST, id DESC"
    parts, params = [], {**params, "inner": limit + offset, "limit": limit, "offset": offset}
    for i, s in enumerate(states):  # (group, condition, order, sort column)
        params[f"state{i}"] = s
        if s == JobState.PENDING:
            parts.append((1, f"state = %(state{i})s", by_submit, "submit_time"))
        else:
            parts.append((0 if s == JobState.RUNNING else 2, f"state = %(state{i})s AND {started[0]}",
                          started[1], started[2]))
    params["never"] = [s for s in states if s != JobState.PENDING]
    if params["never"]:
        parts.append((3, "state = ANY(%(never)s) AND start_time IS NULL", by_submit, "submit_time"))
    if not parts:
        return []
    extra = "".join(f" AND {w}" for w in where)
    union = " UNION ALL ".join(
        f"(SELECT *, {group} AS grp, {column} AS sort_time FROM {_JOB_TABLE}"
        f" WHERE {cond}{extra} ORDER BY {order} LIMIT %(inner)s)"
        for group, cond, order, column in parts
    )
    # Wrapped: with a single part, "(SELECT … ORDER BY … LIMIT) ORDER BY …" is two ORDER BYs.
    sql = (f"SELECT * FROM ({union}) AS page ORDER BY grp, sort_time DESC NULLS LAST, id DESC "
           "LIMIT %(limit)s OFFSET %(offset)s")
    return list(Job.objects.raw(sql, params))


def _state_counts(where: list[str], params: dict) -> dict[str, int]:
    cond = " WHERE " + " AND ".join(where) if where else ""
    with connection.cursor() as cur:
        cur.execute(f"SELECT state, count(*) FROM {_JOB_TABLE}{cond} GROUP BY state", params)
        return dict(cur.fetchall())


# Every distinct account by a loose index scan of job_account_end_idx: one index probe per
# distinct account, not a pass over every job. Shared with the search box's tenant lookup.
ACCOUNTS_CTE = f"""
acct AS (
    (SELECT account FROM {_JOB_TABLE} ORDER BY account LIMIT 1)
    UNION ALL
    SELECT (SELECT j.account FROM {_JOB_TABLE} j WHERE j.account > acct.account ORDER BY j.account LIMIT 1)
    FROM acct WHERE acct.account IS NOT NULL
)"""

# Partitions have no index of their own, so theirs is a plain DISTINCT over the job table.
_DROPDOWNS_SQL = f"""
WITH RECURSIVE {ACCOUNTS_CTE}
SELECT ARRAY(SELECT account FROM acct WHERE account IS NOT NULL AND account <> ''),
       ARRAY(SELECT DISTINCT partition FROM {_JOB_TABLE} WHERE partition <> '' ORDER BY 1)
"""


def _dropdowns() -> tuple[list[str], list[str]]:
    with connection.cursor() as cur:
        cur.execute(_DROPDOWNS_SQL)
        accounts, partitions = cur.fetchone()
    return list(accounts), list(partitions)


# --- One job -------------------------------------------------------------------------------------

def job_detail(job_id: int | str, *, now: datetime | None = None, window: timedelta = DEFAULT_WINDOW) -> dict | None:
    """One job: its fields, state history, ranks with place and health, stragglers and locality.

    `job_id` is the job's id or its key `source:external_id`. Step times are medians over the
    `window` that ends now, or at the job's end if it has ended. Returns None for an unknown job.
    Shape: {"job", "history", "window": {start, end}, "ranks": [...], "gang": {...}, "locality": {...}}.
    """
    now = now or timezone.now()
    job = get_job(job_id)
    if job is None:
        return None
    history = _history(job)
    fields = job_fields(job, now)
    fields["preempt_count"] = max(job.preempt_count, sum(h["preemption"] for h in history))
    fields["requeue_count"] = max(job.requeue_count, sum(h["requeue"] for h in history))
    end = job.end_time if job.end_time and job.end_time < now else now
    medians = _step_medians(job.id, end - window, end)
    ranks = _ranks(job, now)
    gang = _stragglers({r: m for r, (m, _) in medians.items()})
    _merge_steps(ranks, medians, gang)
    return {
        "job": fields, "history": history,
        "window": {"start": iso(end - window), "end": iso(end)},
        "ranks": ranks, "gang": gang, "locality": _locality(ranks),
    }


def _history(job: Job) -> list[dict]:
    """State changes oldest first; a move back to pending after running or preemption is a requeue."""
    out, previous = [], None
    for change in job.history.order_by("time", "id"):
        out.append({
            "time": iso(change.time), "state": change.state, "label": JobState(change.state).label,
            "colour": JobState.colour(change.state), "reason": change.reason,
            "preemption": change.state == JobState.PREEMPTED,
            "requeue": change.state == JobState.PENDING and previous in (JobState.RUNNING, JobState.PREEMPTED),
        })
        previous = change.state
    return out


def _gang_allocations(job: Job) -> list[Allocation]:
    """The open allocations; for a job holding none, those of its last run (the latest end)."""
    qs = job.allocations.select_related("gpu", "node__rack__row", "node__nvlink_domain")
    current = list(qs.filter(end__isnull=True))
    if current:
        return current
    last_end = job.allocations.aggregate(last=Max("end"))["last"]
    return list(qs.filter(end=last_end)) if last_end else []


def _ranks(job: Job, now: datetime) -> list[dict]:
    """Ranks in the order a launcher numbers them.

    Nodes in allocation order (start, then hostname: the scheduler's host list), GPUs by index
    within a node; a rank is the number of GPUs on earlier nodes plus the GPU's position on its
    node. With k GPUs on every node that is node position × k + local index, which on full
    8-GPU nodes is the simulator's node position × 8 + GPU index.
    """
    allocs = _gang_allocations(job)
    allocs.sort(key=lambda a: (a.start, a.node.hostname, a.gpu_index, a.id))
    by_node: dict[int, list[Allocation]] = {}
    for a in allocs:
        by_node.setdefault(a.node_id, []).append(a)
    leaves = node_leaves(by_node)
    latest = latest_gpu_rows(a.gpu_id for a in allocs)
    healths = health_model.gpu_health([a.gpu_id for a in allocs if a.gpu_id], now=now)
    out, rank = [], 0
    for node_allocs in by_node.values():
        for a in sorted(node_allocs, key=lambda a: (a.gpu_index, a.id)):
            node, rack = a.node, a.node.rack
            node_leaf_list = leaves.get(node.id, [])
            out.append({
                "rank": rank, "host": node.hostname, "node_id": node.id,
                "gpu_uuid": a.gpu.uuid if a.gpu_id else None, "gpu_index": a.gpu_index,
                "rack": rack.name if rack else None, "row": rack.row.name if rack else None,
                "nvlink_domain": node.nvlink_domain.name if node.nvlink_domain_id else None,
                "leaf": node_leaf_list[0] if node_leaf_list else None, "leaves": node_leaf_list,
                **gpu_tile(latest.get(a.gpu_id), healths.get(a.gpu_id, health_model.UNKNOWN)),
            })
            rank += 1
    return out


# A synchronous job's ranks all take the same wall time per step (the all-reduce waits for the slowest):
# where a rank reports its compute time, that is what tells it apart from its peers (docs/training.md).
STEP_TIME = "coalesce(compute_time_s, step_time_s)"


def _step_medians(job_id: int, start: datetime, end: datetime) -> dict[int, tuple[float, int]]:
    """{rank: (median compute time, or step time where it reports none, steps)} over [start, end];
    primary key (job_id, rank, time)."""
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT rank, percentile_cont(0.5) WITHIN GROUP (ORDER BY {STEP_TIME}), count(*)"
            f" FROM {JOB_STEPS_TABLE} WHERE job_id = %s AND time >= %s AND time <= %s"
            f" AND {STEP_TIME} IS NOT NULL GROUP BY rank",
            [job_id, start, end],
        )
        return {rank: (float(median), n) for rank, median, n in cur.fetchall()}


def _stragglers(medians: dict[int, float]) -> dict:
    """The gang's reference step time, its spread, the threshold and the ranks beyond it."""
    values = list(medians.values())
    gang = {"ranks_reporting": len(values), "median_step_time_s": None, "mad_s": None,
            "threshold_s": None, "stragglers": []}
    if not values:
        return gang
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    gang.update(median_step_time_s=median, mad_s=mad)
    if len(values) >= STRAGGLER_MIN_RANKS:
        threshold = median + max(STRAGGLER_SIGMAS * MAD_TO_SIGMA * mad, STRAGGLER_MIN_EXCESS * median)
        gang["threshold_s"] = threshold
        gang["stragglers"] = sorted(r for r, v in medians.items() if v > threshold)
    return gang


def _merge_steps(ranks: list[dict], medians: dict[int, tuple[float, int]], gang: dict) -> None:
    """Add each rank's step statistics; ranks that report steps but hold no known GPU are appended."""
    known = {r["rank"] for r in ranks}
    for rank in sorted(set(medians) - known):
        ranks.append({"rank": rank, "host": None, "node_id": None, "gpu_uuid": None, "gpu_index": None,
                      "rack": None, "row": None, "nvlink_domain": None, "leaf": None, "leaves": [],
                      **gpu_tile(None, health_model.UNKNOWN)})
    reference = gang["median_step_time_s"]
    stragglers = set(gang["stragglers"])
    for r in ranks:
        median, steps = medians.get(r["rank"], (None, 0))
        r["step_time_s"], r["steps"] = median, steps
        r["step_time_ratio"] = median / reference if median is not None and reference else None
        r["straggler"] = r["rank"] in stragglers


def _locality(ranks: list[dict]) -> dict:
    """How tightly the gang is packed: shares of its GPUs in its largest NVLink domain and under
    its most common leaf (a rank with no known domain or leaf counts against the share)."""
    placed = [r for r in ranks if r["host"] is not None]
    if not placed:
        return {"nvlink": None, "leaf": None, "racks": 0, "nodes": 0, "gpus": 0}

    def share(key: str) -> float | None:
        counts = Counter(r[key] for r in placed if r[key] is not None)
        return counts.most_common(1)[0][1] / len(placed) if counts else None

    return {
        "nvlink": share("nvlink_domain"), "leaf": share("leaf"),
        "racks": len({r["rack"] for r in placed if r["rack"]}),
        "nodes": len({r["node_id"] for r in placed}), "gpus": len(placed),
    }


# --- Step times for a plot -----------------------------------------------------------------------

def job_step_series(job_id: int | str, start: datetime, end: datetime, *, max_points: int = 500) -> dict | None:
    """Step time per rank (its compute time where it reports one) over [start, end), averaged into
    time_bucket buckets, ready to plot.

    At most `max_points` buckets per rank. Each rank's series has a None value wherever its
    reports stop for longer than GAP_FACTOR × its usual spacing, so a line breaks instead of
    bridging the gap; `gang_median` is the median over ranks of each bucket. Returns None for an
    unknown job; raises ValueError for a naive or empty range.
    Shape: {"job_id", "key", "start", "end", "bucket_s", "ranks": [{"rank", "times", "step_time_s"}],
    "gang_median": {"times", "step_time_s"}}.
    """
    if start.tzinfo is None or end.tzinfo is None or start >= end:
        raise ValueError("start and end must be timezone-aware with start before end")
    job = get_job(job_id)
    if job is None:
        return None
    width = timedelta(seconds=max(1, math.ceil((end - start).total_seconds() / max(1, max_points))))
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT rank, time_bucket(%s, time) AS t, avg({STEP_TIME}) FROM {JOB_STEPS_TABLE}"
            f" WHERE job_id = %s AND time >= %s AND time < %s AND {STEP_TIME} IS NOT NULL"
            " GROUP BY rank, t ORDER BY rank, t",
            [width, job.id, start, end],
        )
        rows = cur.fetchall()
    per_rank: dict[int, list[tuple[datetime, float]]] = {}
    by_time: dict[datetime, list[float]] = {}
    for rank, t, value in rows:
        per_rank.setdefault(rank, []).append((t, float(value)))
        by_time.setdefault(t, []).append(float(value))
    gang = sorted((t, statistics.median(v)) for t, v in by_time.items())
    return {
        "job_id": job.id, "key": job_key(job.source, job.external_id),
        "start": iso(start), "end": iso(end), "bucket_s": width.total_seconds(),
        "ranks": [{"rank": rank, **_plot(points, width)} for rank, points in per_rank.items()],
        "gang_median": _plot(gang, width),
    }


def _plot(points: list[tuple[datetime, float]], width: timedelta) -> dict:
    """{"times", "step_time_s"} with a None after any point followed by a gap.

    The expected spacing is the median spacing of the points (at least one bucket), so a rank
    that reports every 30 s in 5 s buckets is not broken between every report.
    """
    spacing = [b[0] - a[0] for a, b in zip(points, points[1:], strict=False)]
    step = max(width, statistics.median(spacing)) if spacing else width
    times, values = [], []
    for i, (t, v) in enumerate(points):
        if i and t - points[i - 1][0] > step * GAP_FACTOR:
            times.append(iso(points[i - 1][0] + step))
            values.append(None)
        times.append(iso(t))
        values.append(v)
    return {"times": times, "step_time_s": values}
