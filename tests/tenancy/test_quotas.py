"""Quotas against live allocations, preemption counts, fair share and the usage selectors, each seen by an
operator, a tenant's member and a member of another tenant."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model

from anomaly.models import Anomaly
from telemetry.models import JobStateChange, MigInstance
from tenancy import selectors
from tenancy.metering import meter_hours
from tenancy.models import Membership, Quota
from tests.conftest import FIXED_NOW
from tests.tenancy.metering_factories import allocate, gpu_minutes, make_job, make_node, make_tenant

pytestmark = pytest.mark.django_db

HOUR, DAY = timedelta(hours=1), timedelta(days=1)
D = Decimal


def _user(name: str, tenant=None, role: str = "member", **flags):
    user = get_user_model().objects.create_user(name, password="x", **flags)
    if tenant is not None:
        Membership.objects.create(user=user, tenant=tenant, role=role)
    return user


@pytest.fixture
def world():
    """Two organisations (acme with a team, globex), 16 H100s and 8 A100s, jobs running now and in the past."""
    acme = make_tenant("acme", ("slurm", "acme"))
    vision = make_tenant("acme-vision", ("k8s", "vision"), parent=acme)
    globex = make_tenant("globex", ("slurm", "globex"))
    _, h100 = make_node("h-1", 8, "H100")
    _, h100b = make_node("h-2", 8, "H100")
    _, a100 = make_node("a-1", 8, "A100")
    Quota.objects.create(tenant=acme, gpu_model="H100", guaranteed=4, borrowable=4)
    Quota.objects.create(tenant=acme, gpu_model="A100", mig_profile="1g.10gb", guaranteed=0.5, borrowable=0)
    Quota.objects.create(tenant=globex, gpu_model="", guaranteed=8, borrowable=0)
    now = FIXED_NOW
    # Live: acme 6 H100 (its own 2 + its team's 4, over the guarantee, within borrowing), 4 MIG 1g slices of
    # an A100 (4/7 GPU, over a 0.5 quota with nothing borrowable); globex 10 GPUs over a guarantee of 8.
    allocate(make_job("a1", account="acme", state="running", start=now - 2 * HOUR), h100[:2], now - 2 * HOUR, None)
    allocate(make_job("v1", account="vision", source="k8s", state="running", start=now - HOUR), h100[2:6],
             now - HOUR, None)
    for i in range(4):
        mig = MigInstance.objects.create(gpu=a100[0], gi_id=i + 1, profile="1g.10gb")
        allocate(make_job(f"m{i}", account="acme", state="running", start=now - HOUR), a100[:1], now - HOUR, None,
                 fraction=1 / 7, mig=mig)
    allocate(make_job("g1", account="globex", state="running", start=now - 3 * HOUR), h100b + a100[6:8],
             now - 3 * HOUR, None)
    # History: a finished acme job that idled, a preempted globex job, a job of nobody's account.
    done = make_job("a0", account="acme", start=now - 2 * DAY, end=now - 2 * DAY + 4 * HOUR)
    allocate(done, h100[6:8], done.start_time, done.end_time)
    for g in h100[6:8]:
        gpu_minutes(g, done.start_time, 4 * 60, gr_engine_active_avg=0.01)
    lost = make_job("g0", account="globex", state="preempted", start=now - DAY, end=now - DAY + 2 * HOUR)
    allocate(lost, a100[1:5], lost.start_time, lost.end_time)
    allocate(make_job("x0", account="nobody", start=now - DAY, end=now - DAY + HOUR), a100[5:6],
             now - DAY, now - DAY + HOUR)
    meter_hours(now - 3 * DAY, now)
    return {"acme": acme, "vision": vision, "globex": globex, "operator": _user("op", is_staff=True),
            "acme_member": _user("alice", acme), "vision_member": _user("vic", vision),
            "globex_member": _user("gus", globex), "nobody": _user("eve")}


def _by(rows, *keys):
    return {tuple(r[k] for k in keys) if len(keys) > 1 else r[keys[0]]: r for r in rows}


def test_quota_usage_compares_live_allocations_with_guaranteed_and_borrowable(world):
    rows = _by(selectors.quota_usage(world["operator"]), "tenant", "gpu_model", "mig_profile")
    h100 = rows[("acme", "H100", "")]
    assert h100["allocated"] == 6 and h100["jobs"] == 2  # the organisation's quota covers its team's job
    assert h100["borrowing"] and not h100["over_quota"]
    mig = rows[("acme", "A100", "1g.10gb")]
    assert mig["allocated"] == pytest.approx(4 / 7) and mig["over_quota"]
    globex = rows[("globex", "", "")]
    assert globex["allocated"] == 10 and globex["over_quota"] and globex["has_quota"]
    assert len(rows) == 3


def test_quota_usage_reports_usage_under_no_quota_without_flagging_it(world):
    Quota.objects.filter(tenant=world["globex"]).delete()
    rows = _by(selectors.quota_usage(world["operator"]), "tenant", "gpu_model", "mig_profile")
    assert rows[("globex", "H100", "")]["allocated"] == 8 and rows[("globex", "A100", "")]["allocated"] == 2
    assert not any(r["over_quota"] for t, r in rows.items() if t[0] == "globex")
    assert not rows[("globex", "H100", "")]["has_quota"]


def test_quota_usage_shows_a_tenant_only_its_own_quotas(world):
    assert {r["tenant"] for r in selectors.quota_usage(world["acme_member"])} == {"acme"}
    assert {r["tenant"] for r in selectors.quota_usage(world["globex_member"])} == {"globex"}
    # A team member sees neither its organisation's quota nor anyone else's; its live use has no quota of its own.
    team = selectors.quota_usage(world["vision_member"])
    assert [(r["tenant"], r["allocated"], r["has_quota"]) for r in team] == [("acme-vision", 4, False)]
    assert selectors.quota_usage(world["nobody"]) == []


def test_preemption_counts_per_tenant_in_the_window(world):
    lost_job = JobStateChange.objects.get(state="preempted").job
    JobStateChange.objects.create(job=lost_job, time=FIXED_NOW - 2 * HOUR, state="preempted")
    rows = _by(selectors.preemption_counts(world["operator"], FIXED_NOW - 3 * DAY, FIXED_NOW), "tenant")
    assert rows["globex"]["preemptions"] == 2 and rows["globex"]["jobs_preempted"] == 1
    assert "acme" not in rows
    assert selectors.preemption_counts(world["acme_member"], FIXED_NOW - 3 * DAY, FIXED_NOW) == []
    recent = selectors.preemption_counts(world["globex_member"], FIXED_NOW - 3 * HOUR, FIXED_NOW)
    assert [(r["tenant"], r["preemptions"]) for r in recent] == [("globex", 1)]


def test_fair_share_compares_guaranteed_share_with_used_share_of_the_cluster(world):
    rows = _by(selectors.fair_share(world["operator"], 7, now=FIXED_NOW), "tenant")
    cluster_hours = D(24 * 7 * 24)  # 24 GPUs for a week
    acme, globex = rows["acme"], rows["globex"]
    assert acme["entitlement_share"] == pytest.approx(4.5 / 24)
    acme_hours = D(8) + D(2 * 2) + D(4 * 1) + 4 * D("0.142857")  # a0, a1, v1 (its team), the MIG slices
    assert acme["gpu_hours"] == acme_hours and acme["actual_share"] == pytest.approx(float(acme_hours / cluster_hours))
    globex_hours = D(10 * 3) + D(4 * 2)
    assert globex["gpu_hours"] == globex_hours and globex["entitlement_share"] == pytest.approx(8 / 24)
    assert not globex["over_share"] and globex["ratio"] == pytest.approx(float(globex_hours / cluster_hours) / (8 / 24))
    # The team holds no guarantee of its own; its organisation's counts for it only when it holds none.
    assert rows["acme-vision"]["entitlement_share"] == 0 and rows["acme-vision"]["gpu_hours"] == 4


def test_fair_share_over_a_shorter_window_counts_only_its_hours(world):
    week = _by(selectors.fair_share(world["operator"], 7, now=FIXED_NOW), "tenant")
    day = _by(selectors.fair_share(world["operator"], 1, now=FIXED_NOW), "tenant")
    assert day["acme"]["gpu_hours"] < week["acme"]["gpu_hours"]  # a0 ran two days ago
    assert day["acme"]["actual_share"] > week["acme"]["actual_share"] / 7


def test_fair_share_is_scoped_to_the_viewer(world):
    assert [r["tenant"] for r in selectors.fair_share(world["globex_member"], 30, now=FIXED_NOW)] == ["globex"]
    assert selectors.fair_share(world["nobody"], 30, now=FIXED_NOW) == []
    with pytest.raises(ValueError):
        selectors.fair_share(world["operator"], 0)


def test_usage_summary_groups_and_splits_hours(world):
    rows = _by(selectors.usage_summary(world["operator"], FIXED_NOW - 3 * DAY, FIXED_NOW), "tenant")
    assert set(rows) == {"acme", "acme-vision", "globex", None}  # operators also see unmapped usage
    acme = rows["acme"]
    assert acme["idle_held_hours"] == 8 and acme["busy_hours"] + acme["idle_held_hours"] + acme["unmeasured_hours"] \
        + acme["lost_hours"] == acme["gpu_hours"]
    assert rows["globex"]["lost_hours"] == 8
    by_model = _by(selectors.usage_summary(world["globex_member"], FIXED_NOW - 3 * DAY, FIXED_NOW,
                                           by=("gpu_model", "qos")), "gpu_model")
    assert by_model["H100"]["gpu_hours"] == 24 and by_model["A100"]["gpu_hours"] == 6 + 8
    days = selectors.usage_summary(world["acme_member"], FIXED_NOW - 3 * DAY, FIXED_NOW, by=("day",))
    assert [r["day"].date().isoformat() for r in days] == ["2026-11-28", "2026-11-30"]
    [total] = selectors.usage_summary(world["acme_member"], FIXED_NOW - 3 * DAY, FIXED_NOW, by=())
    assert total["gpu_hours"] == sum(r["gpu_hours"] for r in days) and total["energy_kwh"] > 0
    with pytest.raises(ValueError):
        selectors.usage_summary(world["operator"], FIXED_NOW - DAY, FIXED_NOW, by=("colour",))


def test_usage_summary_never_shows_another_tenants_usage(world):
    member = selectors.usage_summary(world["acme_member"], FIXED_NOW - 3 * DAY, FIXED_NOW, by=("tenant", "job"))
    assert {r["tenant"] for r in member} == {"acme", "acme-vision"}  # the organisation sees its team
    team = selectors.usage_summary(world["vision_member"], FIXED_NOW - 3 * DAY, FIXED_NOW, by=("job",))
    assert [r["job_key"] for r in team] == ["k8s:v1"]
    assert selectors.usage_summary(world["nobody"], FIXED_NOW - 3 * DAY, FIXED_NOW) == []


def test_job_efficiency_shows_busy_idle_lost_and_stragglers(world):
    Anomaly.objects.create(kind="straggler", entity_kind="rank", entity_id="slurm:a1#3", host="h-1",
                           started_at=FIXED_NOW - HOUR, last_seen=FIXED_NOW, score=4, last_score=4, summary="slow")
    rows = _by(selectors.job_efficiency(world["acme_member"], FIXED_NOW - 3 * DAY, FIXED_NOW), "job_key")
    assert rows["slurm:a0"]["idle_pct"] == 100 and rows["slurm:a0"]["busy_hours"] == 0
    # a1 has no activity readings at all: its hours are unmeasured, never assumed busy.
    assert rows["slurm:a1"]["unmeasured_pct"] == 100 and rows["slurm:a1"]["straggler_ranks"] == ["3"]
    assert rows["slurm:a0"]["stragglers"] == 0
    # A rank can be a member of its host's event (anomaly.grouping): the window reads the members' own times.
    def member(rank: int, first, last) -> dict:
        return {"kind": "straggler", "entity_kind": "rank", "entity_id": f"slurm:a0#{rank}", "host": "h-2",
                "first_seen": first.isoformat(), "last_seen": last.isoformat(), "score": 4, "last_score": 4}

    Anomaly.objects.create(kind="peer_node", entity_kind="gpu", entity_id="GPU-x", host="h-2",
                           group_key="fleet|host:h-2", started_at=FIXED_NOW - 5 * DAY, last_seen=FIXED_NOW, score=9,
                           last_score=9, summary="hot",
                           members=[member(1, FIXED_NOW - 2 * HOUR, FIXED_NOW - HOUR),
                                    member(2, FIXED_NOW - 5 * DAY, FIXED_NOW - 4 * DAY)])
    rows = _by(selectors.job_efficiency(world["acme_member"], FIXED_NOW - 3 * DAY, FIXED_NOW), "job_key")
    assert rows["slurm:a0"]["straggler_ranks"] == ["1"] and rows["slurm:a1"]["straggler_ranks"] == ["3"]
    assert "slurm:g0" not in rows
    globex = _by(selectors.job_efficiency(world["globex_member"], FIXED_NOW - 3 * DAY, FIXED_NOW), "job_key")
    assert globex["slurm:g0"]["lost_pct"] == 100


def test_waste_report_names_the_jobs_that_idled_or_lost_work(world):
    lines = selectors.waste_report(world["operator"], FIXED_NOW - 7 * DAY, FIXED_NOW)
    texts = [str(line) for line in lines]
    assert texts == ["8 idle-held GPU-hours last week in job job a0 (slurm:a0)",
                     "8 GPU-hours of preempted or lost work last week in job job g0 (slurm:g0)"]
    assert [str(w) for w in selectors.waste_report(world["globex_member"], FIXED_NOW - 7 * DAY, FIXED_NOW)] \
        == texts[1:]
    assert selectors.waste_report(world["acme_member"], FIXED_NOW - 7 * DAY, FIXED_NOW, min_hours=9) == []
