"""Usage metering: the allocation ledger joined to the 1-minute rollups, one UsageHour row per clock hour,
job, GPU model, MIG profile and QoS class. Series carry no job labels; the ledger says who held which GPU when.

What a row holds (all GPU-hours weighted by `Allocation.fraction`: a MIG slice by its share of the GPU, a
shared GPU by its gpu_milli / 1000):

- ``gpu_hours``: the seconds each ledger row overlaps the hour, / 3600, x fraction. Exact (numeric).
- a four-way split of ``gpu_hours``: ``lost_hours`` + ``idle_held_hours`` + ``unmeasured_hours`` + ``busy_hours``:
  - lost: every hour of a *run* that ended by preemption, node failure or a requeue. A run is a job's ledger
    rows with one start time; it is lost when the job's first state change after that start other than
    running is preempted, node_fail or pending (back in the queue), or when the job started again later (a
    requeued Slurm job runs again under the same id). A lost run's hours are neither busy nor idle-held:
    its work is gone whatever the GPU did. Also lost, and counted again in ``failed_hours``: a ledger row's
    seconds from the first sighting of a fault that fails its GPU (the health model's failing event kinds
    and reset-or-RMA XIDs, open when the row started or first seen during it) until the row ends (the job
    ended or was requeued). Tenants' policy (charge or credit, `Tenant.lost_hours_policy`) prices those.
  - idle-held: the seconds of minutes whose GR-engine activity (1-minute average of `gr_engine_active`)
    is under `settings.IDLE_HELD_THRESHOLD` (default 5 %). A MIG slice uses its own MIG instance's activity
    for minutes where the instance reported one, else the whole GPU's.
  - unmeasured: the seconds of minutes with no activity reading (before a GPU's first sample, a collector
    gap): allocated, but whether the GPU worked is unknown, so they are neither busy nor idle-held.
  - busy: the rest: minutes with a reading at or above the threshold.
- energy, in kWh, shown as a split:
  - ``energy_gpu_kwh``: the GPU's own energy counter (`energy_mj` 1-minute deltas, resets handled by the
    rollup), each minute pro rata to the seconds of it the allocation covers, x fraction;
  - ``energy_node_kwh``: the job's share of its node's overhead: node power minus its GPUs' power, where
    PSUs linked to the node (`PowerDevice.nodes`, kind psu) report it for a minute (every PSU of the node,
    a PSU feeding several nodes split evenly), else `settings.NODE_OVERHEAD_W`; split by the job's share of
    the node's GPUs (fraction / the node's GPU count; an idle GPU's share is nobody's);
  - ``energy_facility_kwh``: (PUE - 1) x (GPU + node energy), PUE measured per hour from cooling loops and
    facility meters (`telemetry.selectors.power.pue_series`) where they report, else `settings.PUE`.
- ``tenant``: the TenantAccount mapping of the job's account at metering time (null: unmapped).

An hour is recomputed from scratch (delete + insert, in one transaction under an advisory lock), so a rerun
changes nothing. Every statement is set-based: one INSERT ... SELECT per slice of hours, however many jobs.
Re-metering an hour whose jobs were pruned from the ledger would erase their usage: `run_metering` only
redoes recent hours and recently changed jobs; `meter_hours` over old ranges is an operator's deliberate act.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from time import monotonic, perf_counter

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, F, Min, OuterRef, Q

from telemetry.fields import KINDS
from telemetry.health import FAILING_EVENT_KINDS, RESET_OR_RMA_XIDS
from telemetry.models import (
    Allocation,
    Gpu,
    GpuEvent,
    Job,
    JobState,
    JobStateChange,
    MigInstance,
    Node,
    PowerDevice,
    RollupWatermark,
)
from telemetry.selectors.power import pue_series
from tenancy.models import MeteringWatermark, TenantAccount, UsageHour

logger = logging.getLogger(__name__)

HOUR = timedelta(hours=1)
WATERMARK = "usage"
# Hours per transaction: a long backfill commits its progress as it goes instead of in one huge transaction.
SLICE_HOURS = 24
# Stop a pass after this long (the rest of a backfill is the next pass's): a beat tick never runs into the next.
RUN_BUDGET_SECONDS = 60.0
# A job whose ledger or state changed since the last pass is re-metered over at most this much of its past:
# a billing period plus slack (an invoice older than that is final anyway).
JOB_LOOKBACK = timedelta(days=35)
# First half of the advisory-lock key (second: the crc of "usage"), apart from the rollups' and other locks.
LOCK_NAMESPACE = 0x42574D54  # "BWMT"
LOCK_KEY = 1
LOST_STATES = (JobState.PREEMPTED.value, JobState.NODE_FAIL.value, JobState.PENDING.value)

_T = {
    "alloc": Allocation._meta.db_table, "job": Job._meta.db_table, "change": JobStateChange._meta.db_table,
    "node": Node._meta.db_table, "gpu": Gpu._meta.db_table, "mig": MigInstance._meta.db_table,
    "device": PowerDevice._meta.db_table, "node_feeds": PowerDevice.nodes.through._meta.db_table,
    "gpu_1m": KINDS["gpu"].rollup_table("1m"), "mig_1m": KINDS["mig"].rollup_table("1m"),
    "power_1m": KINDS["power"].rollup_table("1m"), "account": TenantAccount._meta.db_table,
    "usage": UsageHour._meta.db_table, "event": GpuEvent._meta.db_table,
}

# The seconds of minute bucket `b` that piece `p` ([ps, pe)) covers.
_OVERLAP = "date_part('epoch', least(p.{end}, {b}.bucket + interval '1 minute') - greatest(p.ps, {b}.bucket))"

# 1. `node_gpus`: GPUs per node: the inventory's, or (no inventory) the highest index in the ledger + 1.
#    `alloc`: ledger rows overlapping [start, end), clipped to it; the GPU by id, or by (node, index) when the
#    row was made before the GPU was known; model from the GPU (the node's system model as a last resort);
#    whether its run ended lost (see the module docstring), as per-row index probes rather than a join to a
#    CTE: with the row estimates of a freshly vacuumed ledger the planner nest-loops such joins and re-runs
#    the CTE for every ledger row (minutes per slice instead of milliseconds).
# 2. `pieces`: each row cut at clock hours.
# 3. `gpu_hour`: one scan of the GPU 1-minute rollup over the range, grouped by (GPU, hour), for the pieces that
#    cover their whole hour on a whole GPU (hash-joined: probing the index per piece costs ~3 us a minute row,
#    10 s for a day of 2048 GPUs). Other pieces (a run's first and last hour, MIG slices, whose own activity
#    comes first) read the minutes and weigh each by the seconds of it they cover.
# 4. `psu` .. `overhead`: measured node overhead where PSUs feed the node, per minute they all reported; it
#    adjusts the configured constant for those minutes.
# 5. `parts`: every contribution (held and lost seconds, idle-held seconds, counter energy, node overhead) as
#    rows of one UNION ALL, summed once per (hour, job, model, profile): no join between per-piece aggregates,
#    whose plans go quadratic when the planner misjudges a CTE's size. The CTEs read more than once, and the
#    aggregate, are materialised for the same reason.
# 6. Rounded once; the split is made to add up to gpu_hours exactly. Unmeasured seconds are the held seconds
#    before any fault (pieces) less the seconds of minutes with an activity reading (minute and hour rows).
_METER_SQL = """
WITH node_gpus AS MATERIALIZED (
    SELECT n.node_id, coalesce(nullif(c.gpus, 0),
                               (SELECT max(x.gpu_index) + 1 FROM {alloc} x WHERE x.node_id = n.node_id)) AS gpus
    FROM (SELECT DISTINCT a.node_id FROM {alloc} a
          WHERE a.start < %(end)s AND (a."end" IS NULL OR a."end" > %(start)s)) n
    CROSS JOIN LATERAL (SELECT count(*) AS gpus FROM {gpu} g WHERE g.node_id = n.node_id) c
),
alloc AS MATERIALIZED (
    SELECT a.id, a.job_id, a.node_id, coalesce(a.gpu_id, gi.id) AS gpu_id, a.mig_instance_id AS mig_id,
        a.fraction::numeric AS frac,
        greatest(a.start, %(start)s) AS s, least(coalesce(a."end", %(end)s), %(end)s) AS e,
        coalesce(nullif(g.model, ''), nullif(gi.model, ''), n.system_model) AS gpu_model,
        coalesce(mi.profile, '') AS mig_profile,
        EXISTS (SELECT 1 FROM {alloc} x WHERE x.job_id = a.job_id AND x.start > a.start)
            OR coalesce((SELECT c.state FROM {change} c WHERE c.job_id = a.job_id AND c.time > a.start
                         AND c.state <> 'running' ORDER BY c.time LIMIT 1) = ANY(%(lost_states)s), false) AS lost,
        (SELECT min(greatest(ev.first_seen, a.start)) FROM {event} ev
         WHERE ev.gpu_id = coalesce(a.gpu_id, gi.id) AND ev.first_seen < coalesce(a."end", %(end)s)
             AND (ev.cleared_at IS NULL OR ev.cleared_at > a.start)
             AND (ev.kind = ANY(%(failing_kinds)s) OR (ev.kind = 'xid' AND ev.code = ANY(%(failing_xids)s)))
        ) AS fault_at,
        ng.gpus
    FROM {alloc} a
    JOIN {node} n ON n.id = a.node_id
    JOIN node_gpus ng ON ng.node_id = a.node_id
    LEFT JOIN {gpu} g ON g.id = a.gpu_id
    LEFT JOIN LATERAL (SELECT x.id, x.model FROM {gpu} x WHERE a.gpu_id IS NULL AND x.node_id = a.node_id
                       AND x.index = a.gpu_index ORDER BY x.id DESC LIMIT 1) gi ON true
    LEFT JOIN {mig} mi ON mi.id = a.mig_instance_id
    WHERE a.start < %(end)s AND (a."end" IS NULL OR a."end" > %(start)s) AND a.fraction > 0 {job_filter}
),
pieces AS MATERIALIZED (
    SELECT al.id, al.job_id, al.node_id, al.gpu_id, al.mig_id, al.frac, al.gpu_model, al.mig_profile, al.lost,
        al.gpus, h.hour, b.ps, b.pe, least(b.pe, greatest(b.ps, coalesce(al.fault_at, b.pe))) AS pe_ok,
        al.s <= h.hour AND al.e >= h.hour + interval '1 hour'
            AND (al.fault_at IS NULL OR al.fault_at >= h.hour + interval '1 hour') AS full_hour
    FROM alloc al
    CROSS JOIN LATERAL generate_series(time_bucket(interval '1 hour', al.s), al.e - interval '1 microsecond',
                                       interval '1 hour') AS h(hour)
    CROSS JOIN LATERAL (SELECT greatest(al.s, h.hour) AS ps, least(al.e, h.hour + interval '1 hour') AS pe) b
    WHERE al.e > al.s
),
gpu_hour AS MATERIALIZED (
    SELECT s.gpu_id, time_bucket(interval '1 hour', s.bucket) AS hour,
        60 * count(*) FILTER (WHERE s.gr_engine_active_avg < %(threshold)s) AS idle_s,
        60 * count(s.gr_engine_active_avg) AS measured_s, sum(s.energy_mj_delta) AS gpu_mj
    FROM {gpu_1m} s
    WHERE s.bucket >= %(start)s AND s.bucket < %(end)s
        AND s.gpu_id IN (SELECT gpu_id FROM pieces WHERE full_hour AND mig_id IS NULL)
    GROUP BY 1, 2
),
psu AS (
    SELECT f.node_id, f.powerdevice_id AS dev, 1.0 / count(*) OVER (PARTITION BY f.powerdevice_id) AS share
    FROM {node_feeds} f JOIN {device} d ON d.id = f.powerdevice_id AND d.kind = 'psu'
),
psu_nodes AS (
    SELECT node_id, count(*) AS psus FROM psu WHERE node_id IN (SELECT node_id FROM alloc) GROUP BY node_id
),
node_w AS (
    SELECT psu.node_id, r.bucket, sum(r.watts_avg * psu.share) AS watts
    FROM psu JOIN psu_nodes pn ON pn.node_id = psu.node_id
    JOIN {power_1m} r ON r.device_id = psu.dev AND r.bucket >= %(start)s AND r.bucket < %(end)s
    GROUP BY psu.node_id, r.bucket, pn.psus
    HAVING count(r.watts_avg) = pn.psus
),
overhead AS MATERIALIZED (
    SELECT w.node_id, w.bucket, greatest(w.watts - coalesce(sum(s.power_w_avg), 0), 0) - %(node_w)s AS adj_w
    FROM node_w w
    LEFT JOIN {gpu} g ON g.node_id = w.node_id
    LEFT JOIN {gpu_1m} s ON s.gpu_id = g.id AND s.bucket = w.bucket
    GROUP BY w.node_id, w.bucket, w.watts
),
parts AS (
    SELECT p.hour, p.job_id, p.gpu_model, p.mig_profile, ex.sec * p.frac AS held_s,
        CASE WHEN p.lost THEN ex.sec * p.frac ELSE ex.failed * p.frac END AS lost_s, ex.failed * p.frac AS failed_s,
        0::float8 AS idle_s, CASE WHEN p.lost THEN 0 ELSE (ex.sec - ex.failed) * p.frac END::float8 AS unmeasured_s,
        0::float8 AS gpu_mj, %(node_w)s * ex.sec::float8 * p.frac::float8 / p.gpus AS node_ws
    FROM pieces p CROSS JOIN LATERAL (SELECT extract(epoch FROM p.pe - p.ps) AS sec,
                                             extract(epoch FROM p.pe - p.pe_ok) AS failed) ex
    UNION ALL
    SELECT p.hour, p.job_id, p.gpu_model, p.mig_profile, 0, 0, 0,
        CASE WHEN p.lost THEN 0 ELSE gh.idle_s * p.frac::float8 END,
        CASE WHEN p.lost THEN 0 ELSE -gh.measured_s * p.frac::float8 END, gh.gpu_mj * p.frac::float8, 0
    FROM pieces p JOIN gpu_hour gh ON gh.gpu_id = p.gpu_id AND gh.hour = p.hour
    WHERE p.full_hour AND p.mig_id IS NULL
    UNION ALL
    SELECT p.hour, p.job_id, p.gpu_model, p.mig_profile, 0, 0, 0,
        CASE WHEN NOT p.lost AND ov.gr < %(threshold)s THEN ov.sec_ok * p.frac::float8 ELSE 0 END,
        CASE WHEN NOT p.lost AND ov.gr IS NOT NULL THEN -ov.sec_ok * p.frac::float8 ELSE 0 END,
        s.energy_mj_delta * ov.sec / 60 * p.frac::float8, 0
    FROM pieces p
    JOIN {gpu_1m} s ON s.gpu_id = p.gpu_id AND s.bucket > p.ps - interval '1 minute' AND s.bucket < p.pe
    LEFT JOIN {mig_1m} mm ON mm.mig_id = p.mig_id AND mm.bucket = s.bucket
    CROSS JOIN LATERAL (SELECT {overlap_s} AS sec, greatest({overlap_ok}, 0) AS sec_ok,
                               coalesce(mm.gr_engine_active_avg, s.gr_engine_active_avg) AS gr) ov
    WHERE NOT p.full_hour OR p.mig_id IS NOT NULL
    UNION ALL
    SELECT p.hour, p.job_id, p.gpu_model, p.mig_profile, 0, 0, 0, 0, 0, 0,
        o.adj_w * 60 * p.frac::float8 / p.gpus
    FROM pieces p JOIN overhead o ON o.node_id = p.node_id AND time_bucket(interval '1 hour', o.bucket) = p.hour
    WHERE p.full_hour
    UNION ALL
    SELECT p.hour, p.job_id, p.gpu_model, p.mig_profile, 0, 0, 0, 0, 0, 0,
        o.adj_w * ov.sec * p.frac::float8 / p.gpus
    FROM pieces p
    JOIN overhead o ON o.node_id = p.node_id AND o.bucket > p.ps - interval '1 minute' AND o.bucket < p.pe
    CROSS JOIN LATERAL (SELECT {overlap_o} AS sec) ov
    WHERE NOT p.full_hour
),
sums AS MATERIALIZED (
    SELECT hour, job_id, gpu_model, mig_profile,
        round(sum(held_s) / 3600, 6) AS g, round(sum(lost_s) / 3600, 6) AS l, round(sum(failed_s) / 3600, 6) AS f,
        round((sum(idle_s) / 3600)::numeric, 6) AS i, greatest(round((sum(unmeasured_s) / 3600)::numeric, 6), 0) AS u,
        sum(gpu_mj) / 3.6e9 AS gpu_kwh, sum(node_ws) / 3.6e6 AS node_kwh
    FROM parts
    GROUP BY hour, job_id, gpu_model, mig_profile
),
pue AS (
    SELECT * FROM unnest(%(hours)s::timestamptz[], %(pue)s::numeric[]) AS x(hour, pue)
)
INSERT INTO {usage} (hour, tenant_id, job_id, gpu_model, mig_profile, qos, gpu_hours, busy_hours, idle_held_hours,
                     unmeasured_hours, lost_hours, failed_hours, energy_gpu_kwh, energy_node_kwh, energy_facility_kwh)
SELECT r.hour, ta.tenant_id, r.job_id, left(r.gpu_model, 128), r.mig_profile, j.qos, r.g,
    r.g - r.l - x.i - x.u, x.i, x.u, r.l, least(r.f, r.l),
    round(r.gpu_kwh::numeric, 6), round(r.node_kwh::numeric, 6),
    round((pu.pue - 1) * (r.gpu_kwh + r.node_kwh)::numeric, 6)
FROM sums r
CROSS JOIN LATERAL (SELECT least(r.i, r.g - r.l) AS i, least(r.u, r.g - r.l - least(r.i, r.g - r.l)) AS u) x
JOIN {job} j ON j.id = r.job_id
LEFT JOIN {account} ta ON ta.kind = j.source AND ta.name = j.account
JOIN pue pu ON pu.hour = r.hour
"""


def _sql(job_filter: bool) -> str:
    where = "AND a.job_id = ANY(%(jobs)s)" if job_filter else ""
    return _METER_SQL.format(job_filter=where, overlap_s=_OVERLAP.format(b="s", end="pe"),
                             overlap_ok=_OVERLAP.format(b="s", end="pe_ok"), overlap_o=_OVERLAP.format(b="o", end="pe"),
                             **_T)


METER_SQL, METER_JOBS_SQL = _sql(False), _sql(True)


def floor_hour(t: datetime) -> datetime:
    """Start of the clock hour holding `t` (UTC)."""
    if t.tzinfo is None:
        raise ValueError(f"{t.isoformat()} is naive; pass a timezone-aware UTC datetime")
    return datetime.fromtimestamp(int(t.timestamp()) // 3600 * 3600, tz=UTC)


def ceil_hour(t: datetime) -> datetime:
    """The first clock hour at or after `t`."""
    start = floor_hour(t)
    return start if start == t else start + HOUR


def _hours(start: datetime, end: datetime) -> list[datetime]:
    return [start + HOUR * i for i in range(int((end - start) / HOUR))]


def hourly_pue(start: datetime, end: datetime) -> list[float]:
    """PUE per clock hour of [start, end): measured where facility telemetry covers the hour, else the setting.

    A measured value below 1 (a meter glitch) would make facility energy negative, so it is raised to 1.
    """
    hours = _hours(start, end)
    measured = pue_series(start, end, max_points=len(hours) + 1)["y"]
    if len(measured) != len(hours):  # never expected: the series is hourly for whole-hour ranges
        logger.warning("metering: PUE series has %d points for %d hours; using the default", len(measured),
                       len(hours))
        measured = [None] * len(hours)
    return [settings.PUE if v is None else max(1.0, v) for v in measured]


def _lock() -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", [LOCK_NAMESPACE, LOCK_KEY])


def _meter_slice(start: datetime, end: datetime, job_ids: list[int] | None) -> int:
    """Delete and re-insert the usage of [start, end) (of `job_ids` only, if given); the caller's transaction."""
    hours = _hours(start, end)
    params = {"start": start, "end": end, "threshold": settings.IDLE_HELD_THRESHOLD,
              "node_w": float(settings.NODE_OVERHEAD_W), "lost_states": list(LOST_STATES),
              "failing_kinds": list(FAILING_EVENT_KINDS), "failing_xids": list(RESET_OR_RMA_XIDS),
              "hours": hours, "pue": hourly_pue(start, end), "jobs": job_ids or []}
    deleted = UsageHour.objects.filter(hour__gte=start, hour__lt=end)
    if job_ids is not None:
        deleted = deleted.filter(job_id__in=job_ids)
    deleted.delete()
    with connection.cursor() as cur:
        # ~40 aggregates over a join that crosses the JIT thresholds; compiling costs more than it saves.
        cur.execute("SET LOCAL jit = off")
        cur.execute(METER_JOBS_SQL if job_ids is not None else METER_SQL, params)
        return max(cur.rowcount, 0)


def meter_hours(start: datetime, end: datetime, *, job_ids: list[int] | None = None) -> int:
    """Recompute the usage of every clock hour in [start, end) (widened to whole hours); returns rows written.

    Each slice of `SLICE_HOURS` is one transaction: its rows are deleted and inserted again under the metering
    lock, so readers never see a half-metered hour and two passes never interleave. Open ledger rows count up
    to `end`: meter complete hours only (`run_metering` does). `job_ids` narrows the work to those jobs.
    """
    start, end = floor_hour(start), ceil_hour(end)
    if job_ids is not None and not job_ids:
        return 0
    rows, t0 = 0, perf_counter()
    while start < end:
        stop = min(end, start + HOUR * SLICE_HOURS)
        with transaction.atomic():
            _lock()
            rows += _meter_slice(start, stop, job_ids)
        start = stop
    logger.info("metered %d usage rows in %.0f ms", rows, (perf_counter() - t0) * 1000)
    return rows


def _complete_until(now: datetime) -> datetime:
    """The end of the last hour that is over and whose GPU minutes are rolled up (when the rollups run here)."""
    until = floor_hour(now)
    rolled = RollupWatermark.objects.filter(name="gpu_1m").values_list("done_until", flat=True).first()
    return min(until, floor_hour(rolled)) if rolled else until


def _first_hour(until: datetime) -> datetime:
    """Where a first pass starts: the ledger's earliest row, at most `METERING_BACKFILL_DAYS` back."""
    earliest = Allocation.objects.aggregate(t=Min("start"))["t"]
    floor = until - timedelta(days=settings.METERING_BACKFILL_DAYS)
    return max(floor_hour(earliest), floor) if earliest else until


def _changed_jobs(since: datetime | None, first: datetime) -> list[int]:
    """Jobs saved since the last pass whose hours before `first` (which this pass does not redo) are now wrong:

    - it was preempted, failed with its node or went back to the queue, and some of those hours are not yet
      metered as lost (once they are, the job is left alone however often the scheduler sync saves it);
    - it ended before hours that were metered while its ledger rows were still open (a sync that came late).
    None before the first pass.
    """
    if since is None:
        return []
    older = UsageHour.objects.filter(job_id=OuterRef("pk"), hour__lt=first)
    not_lost = older.filter(lost_hours__lt=F("gpu_hours"))
    after_end = UsageHour.objects.filter(job_id=OuterRef("pk"), hour__gt=OuterRef("end_time"))
    return list(Job.objects.filter(updated__gte=since)
                .alias(has_not_lost=Exists(not_lost), has_after_end=Exists(after_end))
                .filter(Q(state__in=LOST_STATES, has_not_lost=True) | Q(end_time__isnull=False, has_after_end=True))
                .values_list("id", flat=True))


def _remeter_jobs(job_ids: list[int], before: datetime) -> int:
    """Re-meter the hours of `job_ids` before `before` (the hours from there on are metered in full anyway)."""
    if not job_ids:
        return 0
    first = Allocation.objects.filter(job_id__in=job_ids).aggregate(t=Min("start"))["t"]
    if first is None:
        return 0
    start = max(floor_hour(first), before - JOB_LOOKBACK)
    return meter_hours(start, before, job_ids=job_ids) if start < before else 0


def run_metering(now: datetime, *, since: datetime | None = None) -> dict:
    """Meter every complete hour up to `now`; idempotent, safe from two processes at once.

    0. Complete hours only: up to the last clock hour before `now`, and before the GPU 1-minute rollup's
       watermark where the rollups run (an hour is metered once its minutes are final).
    1. The watermark `usage` says where the last pass stopped. This pass re-meters from
       `METERING_LATE_HOURS` before it (ledger rows and rollups that arrived late), or from `since` when
       given, or on a first pass from the ledger's start (at most `METERING_BACKFILL_DAYS` back).
    2. Slices of hours up to the last complete hour are metered, each in its own transaction, and the
       watermark advances with each; a pass stops after `RUN_BUDGET_SECONDS` and the next one continues.
    3. Jobs saved since the previous pass whose older hours are now wrong (`_changed_jobs`) are re-metered
       over those hours too (up to `JOB_LOOKBACK`): a preemption turns a run's earlier hours into lost work.
    Returns {"from", "until", "metered_until", "rows", "jobs_remetered", "ms"}.
    """
    t0, deadline = perf_counter(), monotonic() + RUN_BUDGET_SECONDS
    until = _complete_until(now)
    mark = MeteringWatermark.objects.filter(name=WATERMARK).first()
    if since is not None:
        first = floor_hour(since)
    elif mark is not None:
        first = min(mark.metered_until, until) - HOUR * settings.METERING_LATE_HOURS
    else:
        first = _first_hour(until)
    rows, cursor = 0, first
    while cursor < until and monotonic() < deadline:
        stop = min(until, cursor + HOUR * SLICE_HOURS)
        with transaction.atomic():
            _lock()
            rows += _meter_slice(cursor, stop, None)
            _advance(stop)
        cursor = stop
    # A pass's own run time is the slack: a job saved while the previous pass ran is looked at again.
    changed = _changed_jobs(mark.updated_at - timedelta(seconds=2 * RUN_BUDGET_SECONDS) if mark else None, first)
    rows += _remeter_jobs(changed, first)
    if cursor >= until:
        _advance(until)  # also stamps updated_at: the next pass looks for jobs changed from here on
    done = MeteringWatermark.objects.filter(name=WATERMARK).values_list("metered_until", flat=True).first()
    out = {"from": first, "until": until, "metered_until": done, "rows": rows, "jobs_remetered": len(changed),
           "ms": round((perf_counter() - t0) * 1000, 1)}
    logger.info("metering pass: %s", out)
    return out


def _advance(to: datetime) -> None:
    """Move the watermark forward (never back: a `since` rerun of old hours leaves it where it was)."""
    mark, created = MeteringWatermark.objects.get_or_create(name=WATERMARK, defaults={"metered_until": to})
    if not created:
        mark.metered_until = max(mark.metered_until, to)
        mark.save(update_fields=["metered_until", "updated_at"])
