"""The fleet summary selector and the fleet page that renders it.

Rows go into the last-value table with plain SQL (what ingest writes), inventory through the
ORM. Time is fixed with FIXED_NOW and passed as `now=`; the page, which asks for the real now,
gets FIXED_NOW through the `fixed_selector_now` fixture.
"""

from __future__ import annotations

import itertools
from datetime import timedelta
from types import SimpleNamespace
from uuid import uuid4

import pytest
from django.db import connection
from django.urls import reverse

from telemetry.fields import KINDS
from telemetry.models import Gpu, Hall, IngestBatch, Node, NodeState, Rack, Row, Site
from telemetry.selectors import fleet as selectors
from telemetry.selectors import fleet_summary
from tests import personas
from tests.conftest import FIXED_NOW

FRESH = FIXED_NOW - timedelta(seconds=12)
STALE_AFTER = timedelta(seconds=180)
_serial = itertools.count()


# --- factories -------------------------------------------------------------------------------

def make_rack() -> Rack:
    n = next(_serial)
    site = Site.objects.create(name=f"site-{n}")
    row = Row.objects.create(hall=Hall.objects.create(site=site, name="h1"), name="r1")
    return Rack.objects.create(row=row, name=f"rack-{n}")


def make_node(*, placed: bool = True, state: str = NodeState.ACTIVE) -> Node:
    rack = make_rack() if placed else None
    return Node.objects.create(hostname=f"node-{next(_serial)}", rack=rack, state=state)


def make_gpu(node: Node | None = None, **latest) -> Gpu:
    """A GPU on `node` (a new placed, active one by default); `latest` fields, if any, plus
    `time` (default FRESH), are written as its last-value row."""
    node = node or make_node()
    gpu = Gpu.objects.create(uuid=f"GPU-{uuid4()}", node=node, index=node.gpus.count())
    if latest:
        write_latest(gpu, **latest)
    return gpu


def write_latest(gpu: Gpu, *, time=None, **fields) -> None:
    """Upsert the GPU's row in telemetry_gpu_sample_latest, as the ingest writer would."""
    spec = KINDS["gpu"]
    unknown = set(fields) - set(spec.by_name)
    assert not unknown, f"no such GPU fields: {unknown}"
    cols = ["gpu_id", "time", *fields]
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in cols[1:])
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {spec.latest_table} ({', '.join(cols)})"
            f" VALUES ({', '.join(['%s'] * len(cols))})"
            f" ON CONFLICT (gpu_id) DO UPDATE SET {updates}",
            [gpu.id, time or FRESH, *fields.values()],
        )


def write_batch(time, *, samples: int, rejected: int = 0) -> None:
    IngestBatch.objects.create(
        time=time, batch_id=uuid4(), collector="test", format="json",
        samples=samples, rejected=rejected, body_bytes=1, duration_ms=1.0,
    )


def counts(summary: dict, entity: str = "gpus") -> dict[str, int]:
    """Non-zero health counts, for compact assertions."""
    return {k: v["count"] for k, v in summary[entity]["by_health"].items() if v["count"]}


@pytest.fixture(autouse=True)
def _pin_stale_after(settings):
    settings.STALE_AFTER = STALE_AFTER


@pytest.fixture
def fixed_selector_now(monkeypatch):
    """Make the selector's default `now` FIXED_NOW, for callers that cannot pass it."""
    monkeypatch.setattr(selectors, "timezone", SimpleNamespace(now=lambda: FIXED_NOW))


# --- health classification -------------------------------------------------------------------

HEALTHY = {"gpu_util": 50.0, "gpu_temp": 60.0, "memory_temp": 70.0, "throttle_reasons": 0}


def _on(**node_kwargs):
    return lambda: make_node(**node_kwargs)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("node", "latest", "expected"),
    [
        pytest.param(None, HEALTHY, "ok", id="ok"),
        pytest.param(_on(placed=False), HEALTHY, "ok", id="unplaced-is-placement-not-health"),
        pytest.param(_on(placed=False, state=NodeState.DRAINED), HEALTHY, "drained",
                     id="unplaced-drained"),
        pytest.param(_on(state=NodeState.DRAINED), HEALTHY, "drained", id="drained"),
        pytest.param(_on(state=NodeState.DOWN), HEALTHY, "failed", id="node-down-is-failed"),
        pytest.param(_on(state=NodeState.DRAINED), {**HEALTHY, "ecc_dbe_vol": 3}, "failed",
                     id="failed-beats-drained"),
        pytest.param(None, None, "stale", id="never-reported"),
        pytest.param(None, {**HEALTHY, "time": FIXED_NOW - STALE_AFTER - timedelta(seconds=1)},
                     "stale", id="stale"),
        pytest.param(None, {**HEALTHY, "time": FIXED_NOW - STALE_AFTER}, "ok",
                     id="exactly-stale-after-still-reporting"),
        pytest.param(None, {**HEALTHY, "ecc_dbe_vol": 1, "time": FIXED_NOW - timedelta(hours=1)},
                     "failed", id="failed-stays-failed-when-silent"),
        pytest.param(None, {**HEALTHY, "ecc_dbe_vol": 1}, "failed", id="failed-dbe"),
        pytest.param(None, {**HEALTHY, "xid": 79}, "ok", id="xid-gauge-alone-is-no-event"),
        pytest.param(None, {**HEALTHY, "row_remap_failure": 1}, "failed", id="failed-row-remap"),
        pytest.param(None, {**HEALTHY, "ecc_dbe_vol": 2, "throttle_reasons": 0x40}, "failed",
                     id="failed-beats-degraded"),
        pytest.param(None, {**HEALTHY, "throttle_reasons": 0x40}, "degraded",
                     id="degraded-hw-thermal"),
        pytest.param(None, {**HEALTHY, "throttle_reasons": 0x80 | 0x1}, "degraded",
                     id="degraded-power-brake"),
        pytest.param(None, {**HEALTHY, "throttle_reasons": 0x1 | 0x4}, "ok",
                     id="idle-and-sw-power-cap-ok"),
        pytest.param(None, {**HEALTHY, "gpu_temp": 87.0}, "degraded", id="degraded-gpu-temp"),
        pytest.param(None, {**HEALTHY, "memory_temp": 95.0}, "degraded", id="degraded-hbm-temp"),
        pytest.param(None, {**HEALTHY, "row_remap_pending": 1}, "degraded",
                     id="degraded-remap-pending"),
    ],
)
def test_gpu_health_first_matching_rule_wins(node, latest, expected):
    make_gpu(node() if node else None, **(latest or {}))

    summary = fleet_summary(now=FIXED_NOW)

    assert counts(summary) == {expected: 1}
    assert summary["gpus"]["total"] == 1


@pytest.mark.django_db
def test_node_health_is_its_worst_gpu_or_its_own_state():
    degraded = make_node()
    make_gpu(degraded, **HEALTHY)
    make_gpu(degraded, **{**HEALTHY, "gpu_temp": 90.0})
    make_gpu(degraded)  # never reported: no data outranks degraded (part of the node is unseen)
    stale = make_node()
    make_gpu(stale, **HEALTHY)
    make_gpu(stale)
    failed = make_node()
    make_gpu(failed, **{**HEALTHY, "ecc_dbe_vol": 4})
    make_gpu(failed, **{**HEALTHY, "throttle_reasons": 0x8})
    make_gpu(make_node(), **HEALTHY)
    make_node()  # active, placed, no GPUs
    make_node(placed=False)
    make_gpu(make_node(state=NodeState.DOWN), **{**HEALTHY, "ecc_dbe_vol": 9})

    summary = fleet_summary(now=FIXED_NOW)

    # The down node is failed; the unplaced one has no GPUs, so nothing worse than ok.
    assert counts(summary, "nodes") == {"ok": 3, "stale": 2, "failed": 2}
    assert summary["nodes"]["total"] == 7
    assert counts(summary) == {"ok": 3, "degraded": 2, "stale": 2, "failed": 2}


@pytest.mark.django_db
def test_empty_fleet_reports_nothing_rather_than_zeroes():
    summary = fleet_summary(now=FIXED_NOW)

    assert summary["gpus"]["total"] == 0 and summary["nodes"]["total"] == 0
    assert summary["utilization"] == {
        "reporting": 0, "total": 0, "gpu_util_pct": None, "busy_pct": None,
    }
    assert summary["power"] == {"draw_kw": None, "cap_kw": None, "used_pct": None, "pue": None}
    assert summary["newest_sample"] == {"time": None, "age_s": None}


# --- utilization, power, ingest, freshness ---------------------------------------------------

@pytest.mark.django_db
def test_utilization_and_power_cover_reporting_gpus_only():
    make_gpu(gpu_util=20.0, gr_engine_active=0.5, power_w=300.0, power_limit_w=700.0)
    make_gpu(gpu_util=40.0, gr_engine_active=0.7, power_w=400.0, power_limit_w=700.0)
    # A drained node's GPUs still draw power and are counted.
    make_gpu(make_node(state=NodeState.DRAINED), gpu_util=90.0, power_w=500.0, power_limit_w=700.0)
    # No limit reported: its draw counts in the total but not in the share of caps.
    make_gpu(gpu_util=30.0, power_w=100.0)
    # Stale: its last reading says nothing about now.
    make_gpu(gpu_util=100.0, gr_engine_active=1.0, power_w=700.0, power_limit_w=700.0,
             time=FIXED_NOW - timedelta(minutes=10))
    make_gpu()  # never reported

    summary = fleet_summary(now=FIXED_NOW)

    util = summary["utilization"]
    assert (util["reporting"], util["total"]) == (4, 6)
    assert util["gpu_util_pct"] == pytest.approx(45.0)
    assert util["busy_pct"] == pytest.approx(60.0)
    power = summary["power"]
    assert power["draw_kw"] == pytest.approx(1.3)
    assert power["cap_kw"] == pytest.approx(2.1)
    assert power["used_pct"] == pytest.approx(100 * 1200 / 2100)


@pytest.mark.django_db
def test_ingest_rate_counts_the_last_minute_of_batches():
    write_batch(FIXED_NOW - timedelta(seconds=10), samples=900, rejected=2)
    write_batch(FIXED_NOW - timedelta(seconds=59), samples=300, rejected=1)
    write_batch(FIXED_NOW - timedelta(seconds=61), samples=50_000, rejected=7)  # too old
    write_batch(FIXED_NOW + timedelta(seconds=5), samples=50_000)  # not yet, at this `now`

    ingest = fleet_summary(now=FIXED_NOW)["ingest"]

    assert ingest == {
        "window_s": 60.0, "samples_per_s": 20.0, "batches_per_min": 2.0, "rejected": 3,
    }


@pytest.mark.django_db
def test_newest_sample_spans_every_last_value_table():
    make_gpu(**HEALTHY, time=FIXED_NOW - timedelta(seconds=40))
    make_gpu(**HEALTHY, time=FIXED_NOW - timedelta(seconds=12))
    with connection.cursor() as cursor:  # a fabric port reported last of all
        cursor.execute(
            f"INSERT INTO {KINDS['port'].latest_table} (port_id, time) VALUES (1, %s)",
            [FIXED_NOW - timedelta(seconds=5)],
        )

    newest = fleet_summary(now=FIXED_NOW)["newest_sample"]

    assert newest == {"time": "2026-11-30T11:59:55+00:00", "age_s": 5.0}


@pytest.mark.django_db
def test_summary_times_are_iso_strings_in_utc():
    summary = fleet_summary(now=FIXED_NOW)

    assert summary["generated_at"] == "2026-11-30T12:00:00+00:00"
    assert summary["stale_after_s"] == 180.0


# --- the page --------------------------------------------------------------------------------

@pytest.fixture
def operator(django_user_model):
    return personas.operator("operator")


@pytest.fixture
def member(django_user_model):
    """An operator by role (tenancy Membership), not staff: the console's pages but not Django's admin."""
    from tenancy.models import Membership

    user = django_user_model.objects.create_user("member", password="pw-member-1")
    Membership.objects.create(user=user, tenant=None, role="operator")
    return user


@pytest.mark.django_db
def test_fleet_page_redirects_anonymous_visitors_to_login(client):
    response = client.get(reverse("fleet"))

    assert response.status_code == 302
    assert response["Location"] == f"{reverse('login')}?next=/"


@pytest.mark.django_db
def test_fleet_page_renders_the_numbers_server_side(client, operator, fixed_selector_now):
    make_gpu(gpu_util=40.0, gr_engine_active=0.5, power_w=1200.0, power_limit_w=1500.0, ecc_dbe_vol=1)
    make_gpu(gpu_util=50.0, gr_engine_active=0.3, power_w=150.0, power_limit_w=500.0)
    make_gpu(make_node(placed=False), **HEALTHY)
    write_batch(FIXED_NOW - timedelta(seconds=3), samples=61_440, rejected=4)
    client.force_login(operator)

    html = client.get(reverse("fleet")).content.decode()

    assert 'id="gpus-failed">1<' in html
    assert 'id="gpus-ok">2<' in html
    assert 'id="gpus-degraded">0<' in html
    assert 'id="nodes-failed">1<' in html
    assert "--tile-colour: #d64545" in html  # HealthState.colour("failed")
    assert 'id="util-pct">46.7%<' in html
    assert 'id="busy-pct">40.0%<' in html
    assert 'id="power-draw">1.4 kW<' in html
    assert 'id="power-cap">2.0 kW<' in html
    assert 'id="power-pct">67.5%<' in html
    assert 'style="width: 67.5%"' in html
    assert 'id="ingest-rate">1,024.0<' in html
    assert 'id="ingest-rejected">4<' in html
    assert "12 s ago" in html
    assert 'id="newest-time">2026-11-30 11:59:48 UTC<' in html


@pytest.mark.django_db
def test_fleet_page_goes_live_with_local_assets_only(client, member):
    client.force_login(member)

    html = client.get(reverse("fleet")).content.decode()

    assert 'data-live-url="/ws/fleet/"' in html
    assert 'id="bw-fleet-summary"' in html  # the JSON the script starts from
    assert "/static/breakwater/fleet.js" in html and "/static/breakwater/breakwater.css" in html
    assert "http://" not in html and "https://" not in html  # no CDN: consoles run offline


@pytest.mark.django_db
def test_nav_offers_admin_to_staff_only_and_logs_out_by_post(client, operator, member):
    client.force_login(member)
    member_html = client.get(reverse("fleet")).content.decode()
    client.force_login(operator)
    operator_html = client.get(reverse("fleet")).content.decode()

    assert 'href="/admin/"' in operator_html and 'href="/admin/"' not in member_html
    assert '<form method="post" action="/logout/">' in operator_html


@pytest.mark.django_db
def test_login_page_signs_in_and_lands_on_fleet(client, operator):
    assert client.get(reverse("login")).status_code == 200

    response = client.post(reverse("login"), {"username": "operator", "password": personas.PASSWORD})

    assert response.status_code == 302 and response["Location"] == reverse("fleet")


@pytest.mark.django_db
def test_login_page_shows_a_bad_password(client, operator):
    response = client.post(reverse("login"), {"username": "operator", "password": "wrong"})

    assert response.status_code == 200
    assert 'role="alert"' in response.content.decode()


@pytest.mark.django_db
def test_logout_by_post_returns_to_login(client, operator):
    client.force_login(operator)

    response = client.post(reverse("logout"))

    assert response.status_code == 302 and response["Location"] == reverse("login")
    assert client.get(reverse("fleet")).status_code == 302


@pytest.mark.django_db
def test_latest_values_rejects_unknown_fields():
    from telemetry.selectors import latest_values

    with pytest.raises(ValueError, match="gpu_utl"):
        latest_values("gpu", ["gpu_utl"])
    assert latest_values("gpu", ["gpu_util"]) == []


@pytest.mark.django_db
def test_summary_counts_open_faults_by_severity_and_lists_the_newest(client, django_user_model):
    from telemetry.models import GpuEvent

    gpu, other = make_gpu(**HEALTHY), make_gpu(**HEALTHY)
    at = FIXED_NOW - timedelta(minutes=5)

    def event(g, kind, code, minutes, cleared=False):
        GpuEvent.objects.create(gpu=g, kind=kind, code=code, first_seen=at, last_seen=at + timedelta(minutes=minutes),
                                source="kmsg", cleared_at=FIXED_NOW if cleared else None)

    event(gpu, "xid", 79, 1)  # fallen off the bus: critical
    event(gpu, "xid", 13, 2)  # graphics exception: an application fault, a warning
    event(other, "ecc_dbe", 0, 3)  # same catalogue entry as XID 48: critical
    event(other, "xid", 79, 0, cleared=True)  # cleared: not open

    faults = fleet_summary(now=FIXED_NOW)["faults"]

    assert faults["open"] == 3 and faults["gpus"] == 2
    assert faults["by_severity"] == {"critical": 2, "warning": 1, "info": 0}
    assert [(e["kind"], e["code"]) for e in faults["newest"]] == [("ecc_dbe", 0), ("xid", 13), ("xid", 79), ("xid", 79)]

    personas.signed_in(personas.operator("op"), client)
    html = client.get("/").content.decode()
    assert "XID 79" in html and f"/gpus/{gpu.uuid}/" in html and 'id="faults-open">3<' in html


@pytest.mark.django_db
def test_fleet_alert_counts_are_the_alerts_lists_counts(client, django_user_model):
    """Severity counts on the fleet page come from the alerts app's one count, never from XID severities."""
    from alerts.models import Alert

    def alert(name, severity, state="firing"):
        Alert.objects.create(fingerprint=name, name=name, severity=severity, state=state,
                             starts_at=FIXED_NOW, last_seen=FIXED_NOW)

    alert("a", "critical")
    alert("b", "critical", "acknowledged")
    alert("c", "warning")
    alert("d", "critical", "resolved")  # not open
    personas.signed_in(personas.operator("op"), client)

    fleet = client.get("/").content.decode()
    alerts = client.get(reverse("alerts")).content.decode()

    assert 'id="alerts-open">3<' in fleet and 'id="alerts-critical">2<' in fleet and 'id="alerts-firing">2<' in fleet
    assert '<span id="bw-alerts-open">3</span>' in alerts
    assert '<span data-severity="critical">2 critical</span>' in alerts
    assert '<span id="bw-alerts-firing">2</span>' in alerts
