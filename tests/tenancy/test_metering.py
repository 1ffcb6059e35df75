"""Metering from the ledger and the 1-minute rollups: weighting, the busy / idle-held / lost split, energy, reruns."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection

from telemetry.models import Allocation, GpuEvent, JobStateChange, MigInstance, PowerDevice, Rack, Row
from tenancy.metering import floor_hour, meter_hours, run_metering
from tenancy.models import MeteringWatermark, UsageHour
from tests.conftest import FIXED_NOW
from tests.telemetry.factories import insert_rollup
from tests.tenancy.metering_factories import (
    allocate,
    gpu_minutes,
    make_job,
    make_node,
    make_tenant,
    minutes,
    usage,
    usage_rows,
)

pytestmark = pytest.mark.django_db

H = FIXED_NOW - timedelta(hours=4)  # 08:00, a clock hour well before "now"
HOUR, MINUTE = timedelta(hours=1), timedelta(minutes=1)
D = Decimal


@pytest.fixture
def node():
    return make_node("gpu-a", gpus=8)


@pytest.fixture(autouse=True)
def _defaults(settings):
    settings.IDLE_HELD_THRESHOLD, settings.NODE_OVERHEAD_W, settings.PUE = 0.05, 1600, 1.3


def test_job_spanning_two_hours_is_split_at_the_clock_hour(node):
    _, gpus = node
    job = make_job("1", start=H + 30 * MINUTE, end=H + 75 * MINUTE)
    allocate(job, gpus[:2], H + 30 * MINUTE, H + 75 * MINUTE)
    assert meter_hours(H, H + 2 * HOUR) == 2
    rows = {u.hour: u for u in UsageHour.objects.filter(job=job)}
    assert rows[H].gpu_hours == D("1.000000") and rows[H + HOUR].gpu_hours == D("0.500000")
    assert rows[H].gpu_model == "H100" and rows[H].qos == "normal" and rows[H].mig_profile == ""


def test_mig_slice_is_weighted_by_its_share_of_the_gpu(node):
    _, gpus = node
    mig = MigInstance.objects.create(gpu=gpus[0], gi_id=1, profile="1g.10gb")
    job = make_job("2", start=H, end=H + HOUR)
    allocate(job, gpus[:1], H, H + HOUR, fraction=1 / 7, mig=mig)
    meter_hours(H, H + HOUR)
    row = UsageHour.objects.get(job=job)
    assert row.mig_profile == "1g.10gb" and row.gpu_hours == D("0.142857")


def test_fractional_gpu_is_weighted_by_its_fraction(node):
    _, gpus = node
    job = make_job("3", source="k8s", start=H, end=H + 30 * MINUTE)
    allocate(job, gpus[:1], H, H + 30 * MINUTE, fraction=0.46)
    meter_hours(H, H + HOUR)
    assert usage(job) == D("0.230000")


def test_minutes_under_the_threshold_are_idle_held_and_minutes_without_data_unmeasured(node):
    _, gpus = node
    job = make_job("4", start=H, end=H + HOUR)
    allocate(job, gpus[:2], H, H + HOUR)
    for g in gpus[:2]:
        gpu_minutes(g, H, 20, gr_engine_active_avg=0.04)  # idle-held
        gpu_minutes(g, H + 20 * MINUTE, 10, gr_engine_active_avg=0.05)  # at the threshold: busy
        gpu_minutes(g, H + 30 * MINUTE, 20, gr_engine_active_avg=0.9)  # busy; the last 10 minutes have no data
    meter_hours(H, H + HOUR)
    row = UsageHour.objects.get(job=job)
    assert row.gpu_hours == D("2.000000")
    assert row.idle_held_hours == D("0.666667") and row.busy_hours == D("1.000000") and row.lost_hours == 0
    assert row.unmeasured_hours == D("0.333333")  # never busy: nothing says the GPU worked


def test_idle_held_threshold_follows_the_setting(node, settings):
    _, gpus = node
    job = make_job("5", start=H, end=H + HOUR)
    allocate(job, gpus[:1], H, H + HOUR)
    gpu_minutes(gpus[0], H, 60, gr_engine_active_avg=0.08)
    meter_hours(H, H + HOUR)
    assert usage(job, "idle_held_hours") == 0
    settings.IDLE_HELD_THRESHOLD = 0.10
    meter_hours(H, H + HOUR)
    assert usage(job, "idle_held_hours") == 1 and usage(job, "busy_hours") == 0


def test_partial_minutes_count_by_the_seconds_the_allocation_covers(node):
    _, gpus = node
    job = make_job("6", start=H + timedelta(seconds=30), end=H + 2 * MINUTE)
    allocate(job, gpus[:1], H + timedelta(seconds=30), H + 2 * MINUTE)
    gpu_minutes(gpus[0], H, 1, gr_engine_active_avg=0.0)  # 30 s of it held, all idle
    gpu_minutes(gpus[0], H + MINUTE, 1, gr_engine_active_avg=0.7)
    meter_hours(H, H + HOUR)
    assert usage(job) == D("0.025000")  # 90 s
    assert usage(job, "idle_held_hours") == D("0.008333")  # 30 s


def test_mig_slice_uses_its_own_activity_when_reported(node):
    _, gpus = node
    mig = MigInstance.objects.create(gpu=gpus[1], gi_id=2, profile="3g.40gb")
    job = make_job("7", start=H, end=H + HOUR)
    allocate(job, gpus[1:2], H, H + HOUR, fraction=3 / 7, mig=mig)
    gpu_minutes(gpus[1], H, 60, gr_engine_active_avg=0.8)  # another slice keeps the GPU busy
    insert_rollup("mig", "1m", minutes(mig.id, H, 30, gr_engine_active_avg=0.01))  # this slice idles half the hour
    meter_hours(H, H + HOUR)
    row = UsageHour.objects.get(job=job)
    assert row.gpu_hours == D("0.428571") and row.idle_held_hours == D("0.214286")
    assert row.busy_hours == D("0.214285")  # the split adds up to gpu_hours exactly


def test_a_preempted_run_is_lost_work(node):
    _, gpus = node
    job = make_job("8", state="preempted", start=H, end=H + HOUR)
    allocate(job, gpus[:4], H, H + HOUR)
    gpu_minutes(gpus[0], H, 60, gr_engine_active_avg=0.0)
    meter_hours(H, H + HOUR)
    row = UsageHour.objects.get(job=job)
    assert row.gpu_hours == row.lost_hours == 4 and row.busy_hours == row.idle_held_hours == 0


def test_a_requeued_job_loses_its_first_run_only(node):
    _, gpus = node
    job = make_job("9", state="completed", start=H, end=H + 2 * HOUR)
    JobStateChange.objects.create(job=job, time=H + HOUR, state="pending", reason="requeued")
    JobStateChange.objects.create(job=job, time=H + HOUR + 10 * MINUTE, state="running")
    allocate(job, gpus[:2], H, H + HOUR)  # first run: requeued
    allocate(job, gpus[2:4], H + HOUR + 10 * MINUTE, H + 2 * HOUR)  # second run completes
    node_fail = make_job("10", state="node_fail", start=H, end=H + 30 * MINUTE)
    allocate(node_fail, gpus[4:5], H, H + 30 * MINUTE)
    completed = make_job("11", state="completed", start=H, end=H + HOUR)
    allocate(completed, gpus[5:6], H, H + HOUR)
    meter_hours(H, H + 2 * HOUR)
    first, second = UsageHour.objects.filter(job=job).order_by("hour")
    assert first.lost_hours == 2 and first.busy_hours == 0
    assert second.lost_hours == 0 and second.gpu_hours == second.unmeasured_hours == D("1.666667")
    assert usage(node_fail, "lost_hours") == D("0.5") and usage(completed, "lost_hours") == 0


def test_hours_after_a_gpu_falls_off_the_bus_are_failed_not_busy(node):
    _, gpus = node
    job = make_job("40", state="failed", start=H, end=H + 90 * MINUTE)
    allocate(job, gpus[:2], H, H + 90 * MINUTE)
    gpu_minutes(gpus[0], H, 30, gr_engine_active_avg=0.9)  # then XID 79: the GPU reports nothing more
    gpu_minutes(gpus[1], H, 90, gr_engine_active_avg=0.9)
    GpuEvent.objects.create(gpu=gpus[0], kind="xid", code=79, first_seen=H + 30 * MINUTE,
                            last_seen=H + 30 * MINUTE, source="kmsg", message="GPU has fallen off the bus")
    meter_hours(H, H + 2 * HOUR)
    first, second = UsageHour.objects.filter(job=job).order_by("hour")
    assert first.gpu_hours == 2 and first.busy_hours == D("1.5") and first.lost_hours == first.failed_hours == D("0.5")
    assert second.gpu_hours == 1 and second.busy_hours == D("0.5") and second.failed_hours == D("0.5")
    assert usage(job, "unmeasured_hours") == 0 and usage(job, "idle_held_hours") == 0


def test_a_fault_open_before_the_job_started_fails_all_its_hours_on_that_gpu(node):
    _, gpus = node
    GpuEvent.objects.create(gpu=gpus[0], kind="ecc_dbe", first_seen=H - HOUR, last_seen=H - HOUR, source="nvml")
    job = make_job("41", start=H, end=H + HOUR)
    allocate(job, gpus[:1], H, H + HOUR)
    meter_hours(H, H + HOUR)
    assert usage(job, "failed_hours") == usage(job, "lost_hours") == 1 and usage(job, "busy_hours") == 0


def test_application_xids_and_faults_cleared_before_the_job_fail_nothing(node):
    _, gpus = node
    GpuEvent.objects.create(gpu=gpus[0], kind="xid", code=13, first_seen=H + MINUTE, last_seen=H + MINUTE,
                            source="kmsg")  # a kernel's own fault: the GPU is fine
    GpuEvent.objects.create(gpu=gpus[1], kind="xid", code=79, first_seen=H - 2 * HOUR, last_seen=H - 2 * HOUR,
                            source="kmsg", cleared_at=H - HOUR, cleared_reason="GPU reset")
    job = make_job("42", start=H, end=H + HOUR)
    allocate(job, gpus[:2], H, H + HOUR)
    for g in gpus[:2]:
        gpu_minutes(g, H, 60, gr_engine_active_avg=0.9)
    meter_hours(H, H + HOUR)
    assert usage(job, "busy_hours") == 2 and usage(job, "failed_hours") == usage(job, "lost_hours") == 0


def test_energy_is_split_into_gpu_node_and_facility(node):
    _, gpus = node
    job = make_job("12", start=H, end=H + HOUR)
    allocate(job, gpus[:2], H, H + HOUR)
    for g in gpus[:2]:
        gpu_minutes(g, H, 60, energy_mj_delta=18e6, power_w_avg=300.0)  # 300 W for an hour
    meter_hours(H, H + HOUR)
    row = UsageHour.objects.get(job=job)
    assert row.energy_gpu_kwh == D("0.600000")  # 2 GPUs x 300 W x 1 h
    assert row.energy_node_kwh == D("0.400000")  # 1600 W node overhead x 2 of its 8 GPUs
    assert row.energy_facility_kwh == D("0.300000")  # (1.3 - 1) x 1.0 kWh IT


def test_energy_counter_is_prorated_over_partial_minutes(node):
    _, gpus = node
    job = make_job("13", start=H + timedelta(seconds=45), end=H + 2 * MINUTE)
    allocate(job, gpus[:1], H + timedelta(seconds=45), H + 2 * MINUTE)
    gpu_minutes(gpus[0], H, 2, energy_mj_delta=36e6)  # 600 W
    meter_hours(H, H + HOUR)
    assert usage(job, "energy_gpu_kwh") == D("0.012500")  # 75 s at 600 W = 45 kJ


def test_node_overhead_comes_from_psu_power_when_reported(node):
    n, gpus = node
    psu = PowerDevice.objects.create(name="psu-a", kind="psu")
    psu.nodes.add(n)
    job = make_job("14", start=H, end=H + HOUR)
    allocate(job, gpus[:2], H, H + HOUR)
    for g in gpus:
        gpu_minutes(g, H, 30, power_w_avg=250.0)
    # 30 minutes at 3000 W wall power with 8 x 250 W of GPUs: 1000 W overhead; the other 30 use the setting.
    insert_rollup("power", "1m", minutes(psu.id, H, 30, watts_avg=3000.0))
    meter_hours(H, H + HOUR)
    expected = (D(1000) * D("0.5") + D(1600) * D("0.5")) * 2 / 8 / 1000
    assert usage(job, "energy_node_kwh") == expected


def test_facility_share_uses_measured_pue_where_loops_report(node):
    n, gpus = node
    rack = Rack.objects.create(row=Row.objects.create(hall=_hall(), name="r1"), name="rack-1")
    n.rack = rack
    n.save()
    pdu = PowerDevice.objects.create(name="pdu-a", kind="pdu")
    pdu.racks.add(rack)
    loop = PowerDevice.objects.create(name="loop-1", kind="cooling_loop")
    loop.racks.add(rack)
    insert_rollup("power", "1m", minutes(pdu.id, H, 60, watts_avg=10000.0))
    insert_rollup("power", "1m", minutes(loop.id, H, 60, facility_watts_avg=12000.0))
    job = make_job("15", start=H, end=H + 2 * HOUR)
    allocate(job, gpus[:8], H, H + 2 * HOUR)
    meter_hours(H, H + 2 * HOUR)
    measured, default = UsageHour.objects.filter(job=job).order_by("hour")
    assert measured.energy_node_kwh == default.energy_node_kwh == D("1.600000")
    assert measured.energy_facility_kwh == D("0.320000")  # PUE 1.2 measured in the first hour
    assert default.energy_facility_kwh == D("0.480000")  # no facility data: PUE 1.3


def _hall():
    from telemetry.models import Hall, Site

    return Hall.objects.create(site=Site.objects.create(name="s1"), name="h1")


def test_tenant_comes_from_the_account_mapping(node):
    _, gpus = node
    tenant = make_tenant("acme", ("slurm", "acme-ml"))
    mapped = make_job("16", account="acme-ml", start=H, end=H + HOUR)
    unmapped = make_job("17", account="nobody", start=H, end=H + HOUR)
    k8s_same_name = make_job("18", account="acme-ml", source="k8s", start=H, end=H + HOUR)
    for job, g in ((mapped, gpus[0]), (unmapped, gpus[1]), (k8s_same_name, gpus[2])):
        allocate(job, [g], H, H + HOUR)
    meter_hours(H, H + HOUR)
    tenants = dict(UsageHour.objects.values_list("job_id", "tenant_id"))
    assert tenants == {mapped.id: tenant.id, unmapped.id: None, k8s_same_name.id: None}


def test_rerunning_an_hour_changes_nothing(node):
    _, gpus = node
    job = make_job("19", start=H + 10 * MINUTE, end=H + 130 * MINUTE)
    allocate(job, gpus[:3], H + 10 * MINUTE, H + 130 * MINUTE)
    for g in gpus[:3]:
        gpu_minutes(g, H, 180, gr_engine_active_avg=0.03, energy_mj_delta=6e6)
    meter_hours(H, H + 3 * HOUR)
    first = usage_rows()
    assert len(first) == 3
    meter_hours(H, H + 3 * HOUR)
    meter_hours(H + HOUR, H + 2 * HOUR)
    assert usage_rows() == first


def test_open_allocation_counts_up_to_the_end_of_the_metered_range(node):
    _, gpus = node
    job = make_job("20", state="running", start=H + 30 * MINUTE)
    allocate(job, gpus[:1], H + 30 * MINUTE, None)
    meter_hours(H, H + 2 * HOUR)
    assert usage(job) == D("1.5")


def test_run_metering_advances_its_watermark_and_picks_up_late_ledger_rows(node, settings):
    _, gpus = node
    settings.METERING_LATE_HOURS = 2
    early = make_job("21", start=H, end=H + HOUR)
    allocate(early, gpus[:1], H, H + HOUR)
    out = run_metering(FIXED_NOW + 5 * MINUTE)
    assert out["from"] == H and out["metered_until"] == FIXED_NOW
    assert MeteringWatermark.objects.get(name="usage").metered_until == FIXED_NOW
    late = make_job("22", start=FIXED_NOW - HOUR, end=FIXED_NOW)  # arrives after its hour was metered
    allocate(late, gpus[1:2], FIXED_NOW - HOUR, FIXED_NOW)
    out = run_metering(FIXED_NOW + 10 * MINUTE)
    assert out["from"] == FIXED_NOW - 2 * HOUR
    assert usage(late) == 1 and usage(early) == 1


def test_run_metering_re_meters_the_older_hours_of_a_job_preempted_since(node, settings):
    _, gpus = node
    settings.METERING_LATE_HOURS = 1
    job = make_job("23", state="running", start=H)
    allocate(job, gpus[:2], H, None)
    run_metering(FIXED_NOW)
    assert usage(job, "unmeasured_hours") == 8 and usage(job, "lost_hours") == 0
    # The scheduler preempts it at 12:00; the sync closes its ledger rows.
    job.state, job.end_time = "preempted", FIXED_NOW
    job.save()
    JobStateChange.objects.create(job=job, time=FIXED_NOW, state="preempted")
    Allocation.objects.filter(job=job).update(end=FIXED_NOW)
    out = run_metering(FIXED_NOW + 5 * MINUTE)
    assert out["jobs_remetered"] == 1
    assert usage(job, "lost_hours") == 8 and usage(job, "busy_hours") == usage(job, "unmeasured_hours") == 0


def test_run_metering_trims_hours_metered_past_an_end_that_synced_late(node, settings):
    _, gpus = node
    settings.METERING_LATE_HOURS = 1
    job = make_job("26", state="running", start=H)
    allocate(job, gpus[:1], H, None)
    run_metering(FIXED_NOW)
    assert usage(job) == 4
    job.state, job.end_time = "completed", H + 90 * MINUTE  # the scheduler's sync arrives hours late
    job.save()
    Allocation.objects.filter(job=job).update(end=job.end_time)
    out = run_metering(FIXED_NOW + 5 * MINUTE)
    assert out["jobs_remetered"] == 1 and usage(job) == D("1.5")
    assert not UsageHour.objects.filter(job=job, hour__gt=job.end_time).exists()


def test_run_metering_leaves_alone_a_finished_job_saved_again(node, settings):
    _, gpus = node
    settings.METERING_LATE_HOURS = 1
    job = make_job("27", state="preempted", start=H, end=H + HOUR)
    allocate(job, gpus[:1], H, H + HOUR)
    run_metering(FIXED_NOW)
    job.save()  # the scheduler sync saves every job it lists, changed or not
    assert run_metering(FIXED_NOW + 5 * MINUTE)["jobs_remetered"] == 0
    assert usage(job, "lost_hours") == 1


def test_beat_task_meters_and_returns_iso_times(node):
    from tenancy.tasks import meter

    _, gpus = node
    job = make_job("28", start=H, end=H + HOUR)
    allocate(job, gpus[:1], H, H + HOUR)
    out = meter(now=FIXED_NOW.isoformat())
    assert out["metered_until"] == FIXED_NOW.isoformat() and out["rows"] == 1 and usage(job) == 1
    with pytest.raises(ValueError):
        meter(now="2026-11-30T12:00:00")


def test_run_metering_with_since_leaves_the_watermark_where_it_was(node):
    _, gpus = node
    job = make_job("24", start=H, end=H + HOUR)
    allocate(job, gpus[:1], H, H + HOUR)
    run_metering(FIXED_NOW)
    UsageHour.objects.all().delete()
    out = run_metering(FIXED_NOW, since=H - HOUR)
    assert out["from"] == H - HOUR and usage(job) == 1
    assert MeteringWatermark.objects.get(name="usage").metered_until == FIXED_NOW


def test_hours_are_widened_to_whole_clock_hours(node):
    _, gpus = node
    job = make_job("25", start=H, end=H + HOUR)
    allocate(job, gpus[:1], H, H + HOUR)
    meter_hours(H + 10 * MINUTE, H + 20 * MINUTE)
    assert usage(job) == 1 and floor_hour(H + 59 * MINUTE) == H


# --- Scale: a day of a 2048-GPU cluster -------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_day_of_2048_gpus_meters_in_seconds():
    """256 nodes x 8 GPUs, a job per node per half day (8 GPUs each), a 1-minute rollup row per GPU per minute
    (2.9M rows). Every GPU-hour of the day must come out, and metering must take seconds."""
    import time

    from telemetry.models import Gpu, Job, Node

    day = floor_hour(FIXED_NOW) - timedelta(days=1)
    Node.objects.bulk_create([Node(hostname=f"n{i:03d}") for i in range(256)])
    nodes = list(Node.objects.order_by("hostname"))
    Gpu.objects.bulk_create([Gpu(uuid=f"G-{n.id}-{i}", node=n, index=i, model="H100") for n in nodes
                             for i in range(8)])
    jobs = Job.objects.bulk_create([Job(source="slurm", external_id=str(k), account=f"a{k % 10}", state="completed")
                                    for k in range(512)])
    gpus = list(Gpu.objects.order_by("node_id", "index"))
    half = timedelta(hours=12)
    by_node: dict[int, list] = {}
    for g in gpus:
        by_node.setdefault(g.node_id, []).append(g)
    rows = []
    for k, node_gpus in enumerate(by_node.values()):
        for part in range(2):
            job = jobs[2 * k + part]
            rows += [Allocation(job=job, node_id=g.node_id, gpu=g, gpu_index=g.index, start=day + part * half,
                                end=day + (part + 1) * half) for g in node_gpus]
    Allocation.objects.bulk_create(rows)
    with connection.cursor() as cur:
        cur.execute("""INSERT INTO telemetry_gpu_sample_1m (gpu_id, bucket, samples, gr_engine_active_avg,
                                                            energy_mj_delta, power_w_avg)
                       SELECT g.id, b, 6, (g.id + extract(epoch FROM b)::bigint / 60) %% 10 / 10.0, 30e6, 500
                       FROM telemetry_gpu g, generate_series(%s::timestamptz, %s::timestamptz - interval '1 minute',
                                                             interval '1 minute') b""", [day, day + 2 * half])
        # Fresh statistics, as autovacuum keeps them (it never sees a test's uncommitted rows).
        for table in ("telemetry_gpu_sample_1m", "telemetry_allocation", "telemetry_gpu", "telemetry_job"):
            cur.execute(f"ANALYZE {table}")
    t0 = time.perf_counter()
    written = meter_hours(day, day + 2 * half)
    took = time.perf_counter() - t0
    print(f"\nmetered a day of 2048 GPUs: {written} rows in {took:.2f} s")
    total = sum(UsageHour.objects.values_list("gpu_hours", flat=True))
    idle = sum(UsageHour.objects.values_list("idle_held_hours", flat=True))
    assert written == 512 * 12 and total == 2048 * 24
    assert abs(idle - D(2048 * 24) / 10) < 1  # one minute in ten sits under 5 %
    assert took < 60
