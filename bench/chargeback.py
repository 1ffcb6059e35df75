"""bench/chargeback: the monthly invoice run for 100 tenants over 30 days of a 16,384-GPU cluster, from the
metered hourly usage (UsageHour: what metering makes of the 1-minute rollups and the ledger), against the same
invoices computed from raw 10 s samples and the ledger. Targets: >= 100x faster, totals equal to the cent.

Method (docs/chargeback.md says more):

1. A scratch database gets a 16,384-GPU inventory (2,048 nodes of 8: H100; A100; A100 in MIG mode, seven
   1g.10gb slices each; A100 shared by pods holding half a GPU), 100 tenants (every tenth on showback), rate
   cards (a default card changing mid-month, a few tenants' own cards) and a seeded synthetic schedule for
   September 2026 plus 3 days before and 1 after (jobs cross the period's edges): jobs and their ledger.
2. UsageHour for every hour of the schedule, computed from it with metering's definitions
   (tenancy/metering.py: seconds x fraction; idle-held minutes under the GR-activity threshold; GPU counter
   energy; node overhead; PUE) in exact arithmetic. Building the month's 1-minute rollups (708M rows) to let
   metering produce it is out of reach on this machine; step 5 checks the definitions against real metering.
3. OURS: `tenancy.billing.run_invoices` for the month: every tenant's draft invoice, lines written, timed.
4. RAW: 30 days of 10 s samples of 16,384 GPUs is 4.2 billion rows, which neither fits nor runs here. The
   whole fleet's raw samples are written for a window of --raw-hours (default 2) in the middle of the month,
   across the default card's change: 16,384 GPU rows and 896 MIG-instance rows every 10 s. The raw path
   (counter deltas per GPU, samples joined to the ledger, sums per hour and job, the same pricing) is timed
   on the window and on its first hour (to show the cost is linear in samples), and its time per hour is
   extrapolated linearly to the month. Its invoice lines for the window must equal ours to the cent.
5. --meter-hours (default 1): the window's first hour of raw samples is rolled up to 1 minute by
   telemetry.rollups, and `tenancy.metering.meter_hours` meters it from those rollups and the ledger,
   replacing the generated rows; the lines priced from them are compared with the raw path's for that hour.
   metering_equal=yes: identical in every field; cents: every amount and the total equal, but a quantity
   differs in its 6th decimal somewhere (metering's float energy at exact half-micro ties); no: a cent differs.

PASS when ratio = extrapolated raw time / ours >= 100, ours and raw are identical line by line for the window
(quantities, prices, amounts, totals), and metering_equal is not "no".
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from fractions import Fraction

from _common import REPO, drop_database, recreate_database, result, say, scratch_database_url, setup_django

# bench/ holds scripts named like the project's apps (bench/anomaly.py): the apps win once bench/ is behind the
# repository root on the path (it stays last, for this script's helper module).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [str(REPO)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE] + [_HERE]
sys.modules.pop("anomaly", None)

from _chargeback_data import (  # noqa: E402
    A100,
    CHANGE_AT,
    MIG_PROFILE,
    PERIOD,
    STEP,
    Fleet,
    Meter,
    SimJob,
    build_cards,
    build_fleet,
    build_tenants,
    copy_window,
    epoch,
    paint_window,
    schedule,
    ts,
    write_ledger,
    write_usage,
)

TARGET = 100


# --- The raw path ------------------------------------------------------------------------------------------

RAW_GPU_SQL = """
WITH s AS (
    SELECT gpu_id, time, gr_engine_active AS gr,
        CASE WHEN energy_mj >= lag(energy_mj) OVER w THEN energy_mj - lag(energy_mj) OVER w
             WHEN energy_mj < lag(energy_mj) OVER w THEN energy_mj END AS de
    FROM telemetry_gpu_sample
    WHERE time >= %(a)s - interval '10 seconds' AND time < %(b)s
    WINDOW w AS (PARTITION BY gpu_id ORDER BY time)
)
SELECT time_bucket(interval '1 hour', s.time) AS hour, al.job_id, al.fraction, g.model,
    coalesce(mi.profile, '') AS profile, count(*) AS n,
    count(*) FILTER (WHERE al.mig_instance_id IS NULL AND s.gr < %(idle)s) AS n_idle,
    coalesce(sum(s.de), 0) AS mj
FROM s
JOIN telemetry_allocation al ON al.gpu_id = s.gpu_id AND al.start <= s.time AND (al."end" IS NULL OR s.time < al."end")
JOIN telemetry_gpu g ON g.id = s.gpu_id
LEFT JOIN telemetry_miginstance mi ON mi.id = al.mig_instance_id
WHERE s.time >= %(a)s AND al.start < %(b)s AND (al."end" IS NULL OR al."end" > %(a)s)
GROUP BY 1, 2, 3, 4, 5
"""
# A MIG slice is idle-held by its own instance's activity (the GPU's counter still gives its energy).
RAW_MIG_SQL = """
SELECT time_bucket(interval '1 hour', m.time) AS hour, al.job_id, al.fraction,
    count(*) FILTER (WHERE m.gr_engine_active < %(idle)s) AS n_idle
FROM telemetry_mig_sample m
JOIN telemetry_allocation al ON al.mig_instance_id = m.mig_id AND al.start <= m.time
    AND (al."end" IS NULL OR m.time < al."end")
WHERE m.time >= %(a)s AND m.time < %(b)s
GROUP BY 1, 2, 3
"""


def raw_lines(a: datetime, b: datetime, meter: Meter) -> tuple[dict, float]:
    """Invoice lines per tenant slug for [a, b) computed from raw samples and the ledger; (lines, seconds)."""
    from django.db import connection, transaction

    from telemetry.models import Job
    from tenancy.models import TenantAccount

    t0 = time.perf_counter()
    acc = defaultdict(lambda: [Fraction(0), Fraction(0), Fraction(0)])  # (hour, job, model, profile)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL work_mem = '256MB'")
        params = {"a": a, "b": b, "idle": meter.idle_threshold}
        cur.execute(RAW_GPU_SQL, params)
        for hour, job_id, frac, model, profile, n, n_idle, mj in cur.fetchall():
            f = Fraction(frac).limit_denominator(1000)
            s = acc[(hour, job_id, model, profile)]
            s[0] += STEP * n * f
            s[1] += STEP * n_idle * f
            s[2] += int(mj) * f
        cur.execute(RAW_MIG_SQL, params)
        for hour, job_id, frac, n_idle in cur.fetchall():
            acc[(hour, job_id, A100, MIG_PROFILE)][1] += STEP * n_idle * Fraction(frac).limit_denominator(1000)
    jobs = {j: (src, account, qos) for j, src, account, qos in
            Job.objects.filter(id__in={k[1] for k in acc}).values_list("id", "source", "account", "qos")}
    owner = {(kind, name): slug for kind, name, slug in
             TenantAccount.objects.values_list("kind", "name", "tenant__slug")}
    usage = []
    for (hour, job_id, model, profile), (sec, idle, mj) in acc.items():
        src, account, qos = jobs[job_id]
        q = meter.from_fractions(sec, idle, mj)
        usage.append((owner[(src, account)], hour, job_id, model, profile, qos, q))
    return price_rows(usage), time.perf_counter() - t0


def price_rows(usage) -> dict:
    """Price hourly (tenant, hour, job, model, profile, qos, quantities) rows the way billing does."""
    from tenancy.billing import USAGE_SUMS, lines_for_usage, load_cards
    from tenancy.models import Tenant

    tenants = {t.slug: t for t in Tenant.objects.all()}
    books = {slug: load_cards(t) for slug, t in tenants.items()}
    groups = defaultdict(lambda: dict.fromkeys(USAGE_SUMS, Decimal(0)))
    for slug, hour, job_id, model, profile, qos, q in usage:
        card = books[slug].card_at(hour)
        s = groups[(slug, card, (job_id, model, profile, qos))]
        for name, value in zip(("gpu_hours", "idle_held_hours", "energy_gpu_kwh", "energy_node_kwh",
                                "energy_facility_kwh"), (q[0], q[2], q[4], q[5], q[6]), strict=True):
            s[name] += Decimal(value)
    out = defaultdict(list)
    for (slug, card, key), sums in groups.items():
        out[slug] += lines_for_usage(key, sums, card, books[slug].price(card, *key[1:]))
    return out


def ours_lines(a: datetime, b: datetime) -> tuple[dict, float]:
    """The same window priced by billing from UsageHour (read only); (lines per tenant slug, seconds)."""
    from tenancy.billing import price_usage
    from tenancy.models import Tenant

    t0 = time.perf_counter()
    out = {t.slug: price_usage(t, a, b) for t in Tenant.objects.all()}
    return {k: v for k, v in out.items() if v}, time.perf_counter() - t0


@dataclass
class Match:
    """Two sets of invoice lines compared: keyed by tenant, job, kind, model, profile, QoS and card."""

    lines: int
    differ: int  # any of quantity, unit price, amount
    amounts_differ: int  # the amount (to the cent)
    ours_total: Decimal
    raw_total: Decimal
    examples: list[str]

    @property
    def exact(self) -> bool:
        return self.lines > 0 and self.differ == 0 and self.ours_total == self.raw_total

    @property
    def to_the_cent(self) -> bool:
        return self.lines > 0 and self.amounts_differ == 0 and self.ours_total == self.raw_total


def compare(ours: dict, raw: dict) -> Match:
    """Line by line, across all tenants."""

    def keyed(lines):
        return {(ln.job_id, ln.kind, ln.gpu_model, ln.mig_profile, ln.qos, ln.card.id if ln.card else None):
                (ln.quantity, ln.unit_price, ln.amount) for ln in lines}

    n = differ = amounts = 0
    examples = []
    for slug in sorted(set(ours) | set(raw)):
        a, b = keyed(ours.get(slug, [])), keyed(raw.get(slug, []))
        n += len(a | b)
        for k in sorted(a | b, key=str):
            if a.get(k) != b.get(k):
                differ += 1
                amounts += (a.get(k) or (0, 0, None))[2] != (b.get(k) or (0, 0, None))[2]
                examples.append(f"{slug} {k}: ours {a.get(k)} raw {b.get(k)}")
    return Match(n, differ, amounts, sum((ln.amount for v in ours.values() for ln in v), Decimal(0)),
                 sum((ln.amount for v in raw.values() for ln in v), Decimal(0)), examples[:3])


# --- 5. Real metering over the window ----------------------------------------------------------------------


def meter_window(a: datetime, b: datetime) -> tuple[int, int, list[str], float]:
    """Roll [a, b) up to 1 minute, meter it with tenancy.metering, compare with the generated rows.
    Returns (rows generated, rows differing, a few differences, seconds)."""
    from django.db import transaction

    from telemetry.rollups import BY_NAME, _execute
    from tenancy.metering import meter_hours
    from tenancy.models import UsageHour

    cols = ("tenant_id", "gpu_hours", "busy_hours", "idle_held_hours", "lost_hours", "energy_gpu_kwh",
            "energy_node_kwh", "energy_facility_kwh")

    def snapshot():
        return {(r[0], r[1], r[2], r[3], r[4]): r[5:] for r in UsageHour.objects.filter(hour__gte=a, hour__lt=b)
                .values_list("hour", "job_id", "gpu_model", "mig_profile", "qos", *cols)}

    before = snapshot()
    t0 = time.perf_counter()
    # The rollup steps each counter's first reading of a slice from the minute before it, which run_rollups
    # has always rolled up already (its watermark starts at the source's earliest bucket). The window's raw
    # samples start one step before `a`, so that minute is rolled up too, as run_rollups would: starting at
    # `a` loses each GPU's first energy step of the hour (1/360 of its energy) and fails the comparison.
    first = a - timedelta(minutes=1)
    for name in ("gpu_1m", "mig_1m"):
        with transaction.atomic():
            rows, ms = _execute(BY_NAME[name], first, b)
        say(f"  rollup {name}: {rows:,} one-minute rows in {ms / 1000:.1f} s")
    metered = meter_hours(a, b)
    took = time.perf_counter() - t0
    say(f"  tenancy.metering.meter_hours: {metered:,} UsageHour rows")
    after = snapshot()
    diffs = [f"{k}: generated {before.get(k)} metered {after.get(k)}" for k in sorted(before.keys() | after.keys(),
                                                                                     key=str)
             if before.get(k) != after.get(k)]
    return len(before), len(diffs), diffs[:3], took


# --- Main --------------------------------------------------------------------------------------------------


def build_world(args, url: str, meter: Meter) -> tuple[Fleet, list[SimJob]]:
    """Steps 1 and 2: inventory, tenants, cards, schedule, ledger and the month's UsageHour."""
    from django.db import connection

    t0, t1 = epoch(PERIOD[0] - timedelta(days=3)), epoch(PERIOD[1] + timedelta(days=1))
    fleet = build_fleet(args.gpus)
    tenants = build_tenants(args.tenants)
    build_cards(tenants)
    say(f"inventory: {len(fleet.gpu_ids):,} GPUs on {len(fleet.pool):,} nodes "
        f"({sum(len(v) for v in fleet.mig_ids.values())} MIG slices); {len(tenants)} tenants "
        f"({sum(t.billing_mode == 'showback' for t in tenants)} showback)")
    jobs = schedule(fleet, args.tenants, t0, t1, args.seed)
    allocs = write_ledger(url, jobs)
    say(f"ledger: {len(jobs):,} jobs, {allocs:,} allocations from {ts(t0):%Y-%m-%d} to {ts(t1):%Y-%m-%d}")
    t = time.perf_counter()
    rows = write_usage(url, jobs, meter, t0, t1, [x.id for x in tenants])
    say(f"UsageHour: {rows:,} rows (hour x job) generated with metering's definitions in "
        f"{time.perf_counter() - t:.1f} s")
    with connection.cursor() as cur:
        cur.execute("ANALYZE")
    return fleet, jobs


def run_ours(n_tenants: int) -> tuple[dict, float]:
    """Step 3: the monthly invoice run, timed."""
    from tenancy.billing import run_invoices

    say(f"OURS: run_invoices for {PERIOD[0]:%Y-%m-%d} .. {PERIOD[1]:%Y-%m-%d} ({n_tenants} tenants)")
    t = time.perf_counter()
    run = run_invoices(*PERIOD, progress=lambda i, n, tn, inv: i % 20 == 0 and say(f"  {i}/{n} tenants"))
    ours_s = time.perf_counter() - t
    say(f"  {run['invoices']} invoices ({run['billed']} billed, {run['showback']} showback), {run['lines']:,} "
        f"lines in {ours_s:.2f} s; billed {run['total']} USD, showback {run['showback_total']} USD; "
        f"errors {run['errors'] or 'none'}")
    return run, ours_s


def run_raw(args, url: str, fleet: Fleet, jobs: list[SimJob], win, meter: Meter) -> dict:
    """Step 4: the window's raw samples written, the raw path timed on it and on its first hour."""
    base, k = epoch(win[0]) - STEP, int((win[1] - win[0]).total_seconds()) // STEP + 1
    say(f"RAW: writing the whole fleet's 10 s samples for {win[0]:%Y-%m-%d %H:%M} .. {win[1]:%H:%M} "
        f"({args.raw_hours} h, plus one sample before for the counter deltas)")
    t = time.perf_counter()
    gr, counter, mig_gr, mig_ids = paint_window(fleet, jobs, base, k, args.seed)
    rows = copy_window(url, fleet, gr, counter, mig_gr, mig_ids, base)
    del gr, counter, mig_gr
    say(f"  {rows:,} raw rows in {time.perf_counter() - t:.1f} s")
    out = {"rows": rows}
    out["lines"], out["s"] = raw_lines(*win, meter)
    out["first_lines"], out["first_s"] = raw_lines(win[0], win[0] + timedelta(hours=1), meter)
    period_h = (PERIOD[1] - PERIOD[0]).total_seconds() / 3600
    out["month_s"] = out["s"] / args.raw_hours * period_h
    say(f"  raw path: {out['s']:.1f} s for {args.raw_hours} h ({out['first_s']:.1f} s for its first hour) of "
        f"{len(fleet.gpu_ids):,} GPUs -> extrapolated to {period_h:.0f} h: {out['month_s']:,.0f} s "
        f"({out['month_s'] / 3600:.1f} h)")
    return out


def check_window(win, raw: dict) -> Match:
    """Step 4, continued: ours for the window (from UsageHour) against the raw path's lines."""
    ours, ours_s = ours_lines(*win)
    m = compare(ours, raw["lines"])
    say(f"window, ours from UsageHour ({ours_s:.2f} s) vs raw: {m.lines:,} lines, {m.differ} differ; "
        f"totals {m.ours_total} vs {m.raw_total} USD")
    for d in m.examples:
        say(f"  differs: {d}")
    return m


def check_metering(args, win, raw: dict, meter: Meter) -> str:
    """Step 5: "yes" (identical), "cents" (amounts and totals equal, a 6th decimal off somewhere) or "no"."""
    mwin = (win[0], win[0] + timedelta(hours=min(args.meter_hours, args.raw_hours)))
    say(f"METERING: rolling {mwin[0]:%H:%M} .. {mwin[1]:%H:%M} up to 1 minute and metering it with "
        "tenancy.metering (replacing the generated rows of those hours)")
    n_rows, bad_rows, row_diffs, meter_s = meter_window(*mwin)
    raw_m = raw["first_lines"] if mwin[1] - mwin[0] == timedelta(hours=1) else raw_lines(*mwin, meter)[0]
    m = compare(ours_lines(*mwin)[0], raw_m)
    for d in row_diffs + m.examples:
        say(f"  differs: {d}")
    say(f"  {meter_s:.1f} s; UsageHour rows metered vs generated: {n_rows - bad_rows:,}/{n_rows:,} equal; "
        f"lines priced from them vs raw: {m.lines - m.differ:,}/{m.lines:,} equal in every field, "
        f"{m.lines - m.amounts_differ:,}/{m.lines:,} to the cent; totals {m.ours_total} vs {m.raw_total}")
    return "yes" if m.exact and bad_rows == 0 else "cents" if m.to_the_cent else "no"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--tenants", type=int, default=100)
    ap.add_argument("--raw-hours", type=int, default=2, help="hours of raw 10 s samples (whole fleet) to time")
    ap.add_argument("--meter-hours", type=int, default=1,
                    help="hours at the window's start to roll up and meter for real (0: skip)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--keep-db", action="store_true")
    args = ap.parse_args()
    url = scratch_database_url("chargeback")
    recreate_database(url)
    setup_django(url)
    from django.db import connections

    started, meter = time.perf_counter(), Meter.from_settings()
    win = (CHANGE_AT - timedelta(hours=args.raw_hours // 2), CHANGE_AT + timedelta(hours=-(-args.raw_hours // 2)))
    try:
        fleet, jobs = build_world(args, url, meter)
        run, ours_s = run_ours(args.tenants)
        raw = run_raw(args, url, fleet, jobs, win, meter)
        window = check_window(win, raw)
        metering = check_metering(args, win, raw, meter) if args.meter_hours else "skipped"
    finally:
        connections.close_all()
        if not args.keep_db:
            drop_database(url)
    ratio = raw["month_s"] / ours_s
    say(f"whole bench: {time.perf_counter() - started:.0f} s")
    result("chargeback", "ratio", ratio, TARGET, ratio >= TARGET and window.exact and metering != "no",
           ours_s=f"{ours_s:.2f}", raw_measured_s=f"{raw['s']:.1f}", raw_hours=args.raw_hours,
           raw_extrapolated_s=f"{raw['month_s']:.0f}", tenants=args.tenants, gpus=len(fleet.gpu_ids),
           invoices=run["invoices"], lines=run["lines"], billed_usd=run["total"],
           window_equal="yes" if window.exact else "no", metering_equal=metering)


if __name__ == "__main__":
    main()
