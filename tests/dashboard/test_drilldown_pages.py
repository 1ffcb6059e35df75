"""GPU, node and port drill-downs, search, their Dash plots and the live series consumer."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.utils import timezone

from dashboard.consumers.inventory import Subscription, changes
from dashboard.dash_apps.inventory import entity_series, node_series, time_str
from telemetry.models import Allocation, Gpu, GpuEvent, Job, JobState, Node, Port
from telemetry.series import series
from telemetry.topology import do_import_topology, load_topology_file
from tests import personas
from tests.conftest import FIXED_NOW
from tests.dashboard.conftest import assert_dash_app_refuses_anonymous, ws_communicator
from tests.dashboard.test_fleet_page import write_latest
from tests.telemetry.factories import insert_rollup, insert_samples, insert_series

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
GPU_2 = "GPU-167d8376-ee13-fca4-938a-a05167c43cdc"  # gpu-0001, index 2, MIG mode, two instances
GPU_0 = "GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa"  # gpu-0001, index 0
END = f"?end={FIXED_NOW.isoformat()}"
MIN = timedelta(minutes=1)
SEC = timedelta(seconds=1)


@pytest.fixture
def cluster(db):
    do_import_topology(load_topology_file(FIXTURES / "good.yaml"))
    return {g.uuid: g for g in Gpu.objects.all()}


@pytest.fixture
def operator(client, django_user_model):
    personas.signed_in(personas.operator("operator"), client)
    return client


def _job(external_id: str, host: str, indexes: list[int], start, end=None, **kw) -> Job:
    job = Job.objects.create(source="slurm", external_id=external_id, name=f"run-{external_id}", user="alice",
                             account=kw.pop("account", "team-nlp"), state=kw.pop("state", JobState.RUNNING))
    node = Node.objects.get(hostname=host)
    for i in indexes:
        Allocation.objects.create(job=job, node=node, gpu=Gpu.objects.get(node=node, index=i), gpu_index=i,
                                  start=start, end=end)
    return job


def _hca(host: str, name: str) -> Port:
    return Port.objects.get(node__hostname=host, name=name)


# --- access and 404s ------------------------------------------------------------------------------

PAGES = [f"/gpus/{GPU_2}/", "/nodes/gpu-0001/", "/search/?q=gpu", "PORT"]
APPS = ["gpu_series", "port_series", "node_series"]


@pytest.mark.django_db
@pytest.mark.parametrize("path", PAGES)
def test_pages_need_a_login(client, cluster, path):
    path = f"/ports/{_hca('gpu-0001', 'mlx5_0/1').id}/" if path == "PORT" else path
    response = client.get(path)
    assert response.status_code == 302 and response["Location"].startswith("/login/")


@pytest.mark.django_db
@pytest.mark.parametrize("app", APPS)
def test_dash_endpoints_need_a_login(client, django_user_model, app):
    assert_dash_app_refuses_anonymous(client, app)
    personas.signed_in(personas.operator("op"), client)
    assert client.get(f"/django_plotly_dash/app/{app}/_dash-layout").status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/gpus/GPU-nope/", "/nodes/no-such-host/", "/ports/999999/"])
def test_unknown_entities_are_404(operator, cluster, path):
    assert operator.get(path).status_code == 404


# --- pages -------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_gpu_page_shows_facts_values_faults_and_ledger(operator, cluster):
    gpu = cluster[GPU_2]
    write_latest(gpu, time=FIXED_NOW, gpu_util=87.5, gpu_temp=61.0, throttle_reasons=0x44)
    _job("7", "gpu-0001", [2], FIXED_NOW - timedelta(hours=5), FIXED_NOW - timedelta(hours=4),
         state=JobState.COMPLETED, account="team-cv")
    _job("8", "gpu-0001", [2], FIXED_NOW - timedelta(hours=1))
    GpuEvent.objects.create(gpu=gpu, kind="xid", code=79, first_seen=FIXED_NOW - MIN, last_seen=FIXED_NOW, count=2,
                            source="kmsg", message="GPU has fallen off the bus.")

    response = operator.get(f"/gpus/{GPU_2}/")

    assert response.status_code == 200
    html = response.content.decode()
    for part in (
        'href="/nodes/gpu-0001/"', "rack r01-01", "U2", "nvd-gpu-0001", "NVIDIA H100 80GB HBM3",
        "1650124047722", "00000000:4C:00.0", "GI 1 / CI 0 3g.40gb", "GI 2 / CI 0 3g.40gb",
        'href="/jobs/slurm:8/"', 'href="/jobs/?account=team-nlp"', 'href="/jobs/slurm:7/"',
        "87.5 %", "61.0 °C", "0x44", "XID 79", "fallen off the bus", "Drain the node", "critical",
        'data-live-url="/ws/series/"', 'id="react-entry-point"',
    ):
        assert part in html, part
    assert "DJANGO_PLOTLY_DASH" not in html
    # Every GPU field has a row; those never reported read "—".
    fields = response.context["gpu"]["latest"]
    assert html.count('data-field="') == len(fields)
    assert [f["name"] for f in fields if f["text"] != "—"] == ["gpu_util", "gpu_temp", "throttle_reasons"]


@pytest.mark.django_db
def test_gpu_page_of_a_gpu_never_seen_or_held(operator, cluster):
    html = operator.get(f"/gpus/{GPU_0}/").content.decode()
    assert "No fault events recorded for this GPU." in html and "No job has held this GPU yet." in html


@pytest.mark.django_db
def test_gpu_uuid_without_prefix_redirects_to_the_canonical_page(operator, cluster):
    response = operator.get(f"/gpus/{GPU_2[4:]}/")
    assert response.status_code == 302 and response["Location"] == f"/gpus/{GPU_2}/"


@pytest.mark.django_db
def test_node_page_lists_gpus_ports_power_jobs_and_ledger(operator, cluster):
    # The page reads the real clock: a current sample is one written now (an old one shows as no data).
    write_latest(cluster[GPU_0], time=timezone.now(), gpu_util=40.0, gpu_temp=55.0, power_w=300.0)
    _job("9", "gpu-0001", [0, 1], FIXED_NOW - timedelta(hours=1))
    html = operator.get("/nodes/gpu-0001/").content.decode()
    port = _hca("gpu-0001", "mlx5_0/1")
    for part in (
        f'href="/gpus/{GPU_0}/"', f'href="/gpus/{GPU_2}/"', "40.0 %", "55.0 °C", "300.0 W",
        f'href="/ports/{port.id}/"', "leaf-01", "0xa288c2fffee3142a", "psu-gpu-0001-1", "pdu-r01-01-a",
        'href="/jobs/slurm:9/"', "0, 1", "DGX H100", "nvd-gpu-0001",
    ):
        assert part in html, part


@pytest.mark.django_db
def test_port_page_links_the_peer_and_owner(operator, cluster):
    port = _hca("gpu-0001", "mlx5_0/1")
    leaf = Port.objects.get(switch__name="leaf-01", name="p1")
    html = operator.get(f"/ports/{port.id}/").content.decode()
    for part in ('href="/nodes/gpu-0001/"', f'href="/ports/{leaf.id}/"', "leaf-01", "0xa288c2fffee3142a",
                 "infiniband", "400 Gb/s", "Bytes transmitted", 'data-live-url="/ws/series/"'):
        assert part in html, part
    back = operator.get(f"/ports/{leaf.id}/").content.decode()
    assert f'href="/ports/{port.id}/"' in back and "leaf switch port" in back


# --- search ------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_search_with_one_exact_hit_goes_straight_to_it(operator, cluster):
    _job("4242", "gpu-0002", [0], FIXED_NOW)
    assert operator.get("/search/?q=gpu-0003")["Location"] == "/nodes/gpu-0003/"
    assert operator.get(f"/search/?q={GPU_2}")["Location"] == f"/gpus/{GPU_2}/"
    assert operator.get("/search/?q=1650124047722")["Location"] == f"/gpus/{GPU_2}/"  # serial
    assert operator.get("/search/?q=slurm:4242")["Location"] == "/jobs/slurm:4242/"


@pytest.mark.django_db
def test_search_groups_results_by_kind(operator, cluster):
    _job("16501249999", "gpu-0002", [0], FIXED_NOW)
    response = operator.get("/search/?q=gpu-000")
    assert response.status_code == 200
    groups = {g["kind"]: [h["url"] for h in g["hits"]] for g in response.context["groups"]}
    assert groups == {"node": [f"/nodes/gpu-000{n}/" for n in (1, 2, 3)]}
    # The start of every serial in the fixture, and of a job id: nothing matches exactly.
    response = operator.get("/search/?q=1650124")
    groups = {g["kind"]: len(g["hits"]) for g in response.context["groups"]}
    assert response.status_code == 200 and groups == {"gpu": 4, "job": 1}
    assert 'href="/jobs/slurm:16501249999/"' in response.content.decode()


@pytest.mark.django_db
def test_search_hint_and_no_results(operator, cluster):
    assert 'id="bw-search-hint"' in operator.get("/search/").content.decode()
    assert 'id="bw-search-hint"' in operator.get("/search/?q=%20%20").content.decode()
    html = operator.get("/search/?q=zzz-nothing").content.decode()
    assert 'id="bw-search-none"' in html and "zzz-nothing" in html


# --- the Dash callbacks ------------------------------------------------------------------------

def _dash_update(client, app: str, pathname: str, field: str, range_key: str, search: str = END) -> dict:
    body = {
        "output": "series-data.data", "outputs": {"id": "series-data", "property": "data"},
        "inputs": [
            {"id": "url", "property": "pathname", "value": pathname},
            {"id": "url", "property": "search", "value": search},
            {"id": "field", "property": "value", "value": field},
            {"id": "range", "property": "value", "value": range_key},
        ] + ([{"id": "series-reload", "property": "data", "value": 0}] if app != "node_series" else []),
        "changedPropIds": ["field.value"], "state": [],
    }
    response = client.post(f"/django_plotly_dash/app/{app}/_dash-update-component", data=json.dumps(body),
                           content_type="application/json")
    assert response.status_code == 200, response.content[:500]
    return json.loads(response.content)["response"]["series-data"]["data"]


@pytest.mark.django_db
def test_gpu_callback_returns_the_series_points(operator, cluster):
    gpu = cluster[GPU_2]
    known = [(FIXED_NOW - 50 * MIN + i * 10 * SEC, 40.0 + i) for i in range(6)]
    insert_series("gpu", gpu.id, "gpu_temp", known)
    insert_series("gpu", gpu.id, "gpu_temp", [(FIXED_NOW - 2 * timedelta(hours=1), 99.0)])  # outside the hour

    data = _dash_update(operator, "gpu_series", f"/gpus/{GPU_2}/", "gpu_temp", "1h")

    assert (data["kind"], data["id"], data["field"], data["unit"], data["resolution"]) == (
        "gpu", gpu.id, "gpu_temp", "°C", "raw")
    assert data["x"] == [time_str(t) for t, _ in known] and data["y"] == [v for _, v in known]
    assert data["live"] is False and data["end"] == time_str(FIXED_NOW) and data["band"] is None
    assert data["resolution_label"] == "raw, a sample every 10 s"
    direct = series("gpu", gpu.id, "gpu_temp", FIXED_NOW - timedelta(hours=1), FIXED_NOW)
    assert list(zip(data["x"], data["y"], strict=True)) == [(time_str(t), v) for t, v in direct.points]


@pytest.mark.django_db
def test_gpu_callback_reads_rollups_with_a_band_for_long_ranges(operator, cluster):
    gpu = cluster[GPU_2]
    buckets = [(gpu.id, FIXED_NOW - timedelta(hours=h), {"gpu_util_min": 5.0, "gpu_util_avg": 50.0,
                                                         "gpu_util_max": 95.0, "gpu_util_last": 50.0})
               for h in range(3, 0, -1)]
    insert_rollup("gpu", "1h", buckets)
    data = _dash_update(operator, "gpu_series", f"/gpus/{GPU_2}/", "gpu_util", "30d")
    assert data["resolution"] == "1h" and data["resolution_label"] == "1 h rollup"
    assert data["y"] == [50.0] * 3 and data["band"] == {"lo": [5.0] * 3, "hi": [95.0] * 3}


@pytest.mark.django_db
def test_port_callback_plots_counters_as_rates(operator, cluster):
    port = _hca("gpu-0001", "mlx5_0/1")
    readings = [(FIXED_NOW - 10 * MIN + i * 30 * SEC, 1000 + i * 30 * 5_000_000) for i in range(5)]
    insert_samples("port", [(port.id, t, {"xmit_data_bytes": v}) for t, v in readings])
    data = _dash_update(operator, "port_series", f"/ports/{port.id}/", "xmit_data_bytes", "15m")
    assert data["unit"] == "B/s" and data["field_kind"] == "counter"
    assert data["x"] == [time_str(t) for t, _ in readings[1:]] and data["y"] == [5_000_000.0] * 4


@pytest.mark.django_db
def test_node_callback_draws_one_line_per_gpu(operator, cluster):
    a, b = cluster[GPU_0], cluster[GPU_2]
    insert_series("gpu", a.id, "power_w", [(FIXED_NOW - 5 * MIN, 300.0), (FIXED_NOW - 4 * MIN, 310.0)])
    insert_series("gpu", b.id, "power_w", [(FIXED_NOW - 5 * MIN, 200.0)])
    data = _dash_update(operator, "node_series", "/nodes/gpu-0001/", "power_w", "15m")
    lines = {t["name"]: t["y"] for t in data["traces"]}
    assert list(lines) == ["GPU 0", "GPU 1", "GPU 2", "GPU 3"] and data["unit"] == "W"
    assert lines["GPU 0"] == [300.0, 310.0] and lines["GPU 2"] == [200.0] and lines["GPU 1"] == []
    assert data["traces"][0]["uuid"] == GPU_0


@pytest.mark.django_db
def test_callbacks_never_fail_on_missing_data_or_bad_input(cluster):
    gpu = cluster[GPU_2]
    # No samples; a field MIG GPUs report per instance only; an unknown field and range fall back.
    empty = entity_series("gpu", f"/gpus/{GPU_2}/", END, "enc_util", "7d")
    assert (empty["x"], empty["y"], empty["resolution"]) == ([], [], "1m")
    fallback = entity_series("gpu", f"/gpus/{GPU_2}/", END, "no_such_field", "1y")
    assert (fallback["field"], fallback["range"], fallback["id"]) == ("gpu_util", "1h", gpu.id)
    assert entity_series("gpu", "/gpus/GPU-nope/", END, "gpu_util", "1h") is None
    assert entity_series("port", "/ports/abc/", END, "xmit_data_bytes", "1h") is None
    assert node_series("/nodes/nobody/", END, "gpu_util", "1h") is None
    assert node_series("/nodes/gb-0002/", END, "gpu_util", "1h")["traces"] == []  # a node without GPUs
    live = entity_series("gpu", f"/gpus/{GPU_2}/", "", "gpu_util", "15m")
    assert live["live"] is True


# --- the live series consumer ------------------------------------------------------------------

def _communicator(cookie: bytes | None = None):
    return ws_communicator("/ws/series/", cookie)


@pytest.mark.django_db(transaction=True)
def test_consumer_sends_points_after_since_then_only_new_ones(cluster, session_cookie):
    gpu = cluster[GPU_2]
    t = [FIXED_NOW - 3 * MIN + i * 10 * SEC for i in range(4)]
    insert_series("gpu", gpu.id, "gpu_temp", [(t[0], 50.0), (t[1], 51.0), (t[2], 52.0)])

    async def scenario():
        ws = _communicator(session_cookie)
        assert (await ws.connect())[0]
        await ws.send_json_to({"subscribe": {"kind": "gpu", "id": gpu.id, "field": "gpu_temp",
                                             "since": time_str(t[0]), "tag": 1}})
        first = await ws.receive_json_from(timeout=5)
        await sync_to_async(insert_series)("gpu", gpu.id, "gpu_temp", [(t[3], 53.5)])
        await ws.send_input({"type": "telemetry.tick", "at": "x"})
        second = await ws.receive_json_from(timeout=5)
        await ws.send_input({"type": "telemetry.tick", "at": "x"})  # nothing new: nothing sent
        quiet = await ws.receive_nothing(timeout=0.5)
        await ws.disconnect()
        return first, second, quiet

    first, second, quiet = async_to_sync(scenario)()

    assert (first["x"], first["y"], first["tag"]) == ([time_str(t[1]), time_str(t[2])], [51.0, 52.0], 1)
    assert (second["type"], second["x"], second["y"]) == ("points", [time_str(t[3])], [53.5])
    assert quiet is True


@pytest.mark.django_db(transaction=True)
def test_consumer_pushes_new_fault_events(cluster, session_cookie):
    gpu = cluster[GPU_2]

    async def scenario():
        ws = _communicator(session_cookie)
        assert (await ws.connect())[0]
        await ws.send_json_to({"subscribe": {"kind": "gpu", "id": gpu.id, "field": "gpu_util",
                                             "since": time_str(FIXED_NOW), "events": True}})
        first = await ws.receive_json_from(timeout=5)
        await sync_to_async(GpuEvent.objects.create)(gpu=gpu, kind="xid", code=48, first_seen=FIXED_NOW,
                                                     last_seen=FIXED_NOW, count=1, source="kmsg")
        await ws.send_input({"type": "telemetry.tick", "at": "x"})
        second = await ws.receive_json_from(timeout=5)
        await ws.send_input({"type": "telemetry.tick", "at": "x"})
        quiet = await ws.receive_nothing(timeout=0.5)
        await ws.disconnect()
        return first, second, quiet

    first, second, quiet = async_to_sync(scenario)()

    assert (first["type"], first["events"], second["type"], quiet) == ("events", [], "events", True)
    [event] = second["events"]
    assert (event["fault"], event["severity"], event["action_label"]) == ("XID 48", "critical", "Reset the GPU")
    assert "ECC" in event["meaning"] or "double" in event["meaning"].lower()


@pytest.mark.django_db(transaction=True)
def test_consumer_refuses_bad_subscriptions_and_anonymous_users(cluster, session_cookie):
    port = _hca("gpu-0001", "mlx5_0/1")

    async def scenario():
        ws = _communicator(session_cookie)
        assert (await ws.connect())[0]
        errors = []
        for sub in ({"kind": "rack", "id": 1, "field": "x", "since": "2026-11-30T00:00:00Z"},
                    {"kind": "port", "id": port.id, "field": "gpu_util", "since": "2026-11-30T00:00:00Z"},
                    {"kind": "port", "id": port.id, "field": "xmit_wait", "since": "yesterday"},
                    {"kind": "port", "id": 999999, "field": "xmit_wait", "since": "2026-11-30T00:00:00Z"}):
            await ws.send_json_to({"subscribe": sub})
            errors.append(await ws.receive_json_from(timeout=5))
        await ws.disconnect()
        anonymous = _communicator(None)
        refused = await anonymous.connect()
        await anonymous.disconnect()
        return errors, refused

    errors, refused = async_to_sync(scenario)()

    assert [e["type"] for e in errors] == ["error"] * 4
    assert "rack" in errors[0]["message"] and "gpu_util" in errors[1]["message"]
    assert "yesterday" in errors[2]["message"] and "999999" in errors[3]["message"]
    assert refused == (False, 4401)


@pytest.mark.django_db
def test_rollup_subscription_sends_only_complete_buckets(cluster):
    gpu = cluster[GPU_2]
    buckets = [(gpu.id, FIXED_NOW - m * MIN, {"gpu_util_min": 1.0, "gpu_util_avg": float(m),
                                             "gpu_util_max": 9.0, "gpu_util_last": 1.0}) for m in range(5, -1, -1)]
    insert_rollup("gpu", "1m", buckets)
    sub = Subscription("gpu", gpu.id, "gpu_util", FIXED_NOW - 5 * MIN, resolution="1m", step=MIN,
                       span=timedelta(hours=24))
    # At 12:00:30 the 11:59 bucket ended 30 s ago: the rollup beat may not have settled it yet.
    [points] = changes(sub, FIXED_NOW + 30 * SEC)
    assert points["x"] == [time_str(FIXED_NOW - m * MIN) for m in (4, 3, 2)] and points["y"] == [4.0, 3.0, 2.0]
    assert points["band"] == {"lo": [1.0] * 3, "hi": [9.0] * 3}
    assert changes(sub, FIXED_NOW + 40 * SEC) == []  # the next bucket is not due yet
    [points] = changes(sub, FIXED_NOW + 50 * SEC)
    assert points["x"] == [time_str(FIXED_NOW - MIN)]


@pytest.mark.django_db
def test_port_subscription_sends_new_counter_readings_as_rates(cluster):
    port = _hca("gpu-0001", "mlx5_0/1")
    t = [FIXED_NOW - 2 * MIN + i * 30 * SEC for i in range(4)]
    insert_samples("port", [(port.id, t[i], {"rcv_errors": v}) for i, v in enumerate([10, 40])])
    sub = Subscription("port", port.id, "rcv_errors", since=t[1], span=timedelta(minutes=15))
    assert changes(sub, FIXED_NOW) == []
    insert_samples("port", [(port.id, t[2], {"rcv_errors": 100}), (port.id, t[3], {"rcv_errors": 4})])  # a reset
    [points] = changes(sub, FIXED_NOW)
    # Each rate steps from the reading before it, the first from the last one the page already had.
    assert (points["x"], points["y"]) == ([time_str(t[2]), time_str(t[3])], [2.0, 4 / 30])
    assert sub.since == t[3] and changes(sub, FIXED_NOW) == []
