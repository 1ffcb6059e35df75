"""The facility pages (NVLink domains, power and cooling): access, Dash callbacks, the live consumer.

The cluster is tests/fixtures/topology/good.yaml: NVLink domains nvd-gpu-0001 (gpu-0001's four
GPUs) and nvl72-r02-01 (gb-0001's one GPU; gb-0002 has none), gpu-0002 and gpu-0003 without a
declared domain (implicit node domains); r01-01 has a 40 kW cap and PDU pdu-r01-01-a, r02-01 a
power shelf and no cap, r01-02 neither; one cooling loop covers all three racks.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.urls import reverse

from dashboard.consumers import facility as consumer
from dashboard.dash_apps import facility as dash_facility
from telemetry.ingest.documents import parse_json
from telemetry.ingest.schema import TimeParser
from telemetry.ingest.writer import write_batch
from telemetry.rollups import run_rollups
from telemetry.selectors import nvlink_domains, power_overview
from telemetry.topology import do_import_topology, load_topology_file
from tests import personas
from tests.conftest import FIXED_NOW
from tests.dashboard.conftest import assert_dash_app_refuses_anonymous, ws_communicator

GOOD = Path(__file__).resolve().parent.parent / "fixtures" / "topology" / "good.yaml"
SEC = timedelta(seconds=1)
# Readings every 30 s from 11:56:00; at FIXED_NOW rates come from the 11:58 bucket.
TIMES = [FIXED_NOW - timedelta(minutes=4) + i * 30 * SEC for i in range(8)]
NVLINK_COUNTERS = ("nvlink_crc_flit_errors", "nvlink_crc_data_errors", "nvlink_replay_errors",
                   "nvlink_recovery_errors", "nvlink_bandwidth")
GPU1 = ("gpu-0001", 1, "GPU-47daa2ad-a218-6286-252b-af45f0dfaf00")  # in nvd-gpu-0001
GB = ("gb-0001", 0, "GPU-b0fe4996-1f7c-91f6-0ccd-08ae3b7e23c5")  # in nvl72-r02-01
APPS = ("nvlink", "power")


def ingest(**collections: list[dict]) -> None:
    times = TimeParser(FIXED_NOW, timedelta(minutes=5), timedelta(days=7))
    batch = parse_json(json.dumps(collections).encode(), times)
    assert batch.rejected == 0, batch.rejections
    write_batch(batch, collector="test", fmt="json")


def gpu_readings(gpu: tuple[str, int, str], series: dict[str, list[int]], **gauges) -> list[dict]:
    """GPU readings at TIMES: NVLink counters from 10 upwards (bandwidth 600/s), `series` as given."""
    host, index, uuid = gpu
    out = []
    for i, t in enumerate(TIMES):
        fields = {c: 10 for c in NVLINK_COUNTERS} | {"nvlink_bandwidth": 10 + 600 * 30 * i}
        fields.update({c: values[i] for c, values in series.items()}, **gauges)
        out.append({"host": host, "uuid": uuid, "index": index, "time": t.isoformat(), "fields": fields})
    return out


def power(device: str, t=FIXED_NOW - 30 * SEC, **fields) -> dict:
    return {"device": device, "time": t.isoformat(), "fields": fields}


@pytest.fixture
def topology(db):
    do_import_topology(load_topology_file(GOOD))


@pytest.fixture
def samples(topology):
    """gpu-0001 GPU 1: one NVLink recovery in the rate's minute (its domain is in error); gb-0001
    GPU 0: clean, 600 counts/s and 20 GB/s out. r01-01 draws 42 kW against its 40 kW cap, r02-01
    15 kW from its shelf, r01-02 500 W from its GPU; the loop reports 74.75 kW of facility power."""
    recovery = {"nvlink_recovery_errors": [0, 0, 0, 0, 1, 1, 1, 1]}
    ingest(gpus=gpu_readings(GPU1, recovery) + gpu_readings(GB, {}, nvlink_tx_bps=2e10, nvlink_rx_bps=1e10))
    run_rollups(FIXED_NOW)
    ingest(
        power=[power("pdu-r01-01-a", watts=42000.0), power("shelf-r02-01", watts=15000.0),
               power("loop-hall-a-1", coolant_supply_temp=30.0, coolant_return_temp=40.0, flow_lpm=600.0,
                     facility_watts=74750.0)],
        gpus=[{"host": "gpu-0003", "uuid": "GPU-4ef109e9-e925-4834-2b85-0771b4ef696c", "index": 0,
               "time": (FIXED_NOW - 30 * SEC).isoformat(), "fields": {"power_w": 500.0}}],
    )


@pytest.fixture
def fixed_now(monkeypatch):
    """The Dash callbacks and the consumer read the clock; here it is FIXED_NOW."""
    monkeypatch.setattr(dash_facility, "now", lambda: FIXED_NOW)
    monkeypatch.setattr(consumer, "now", lambda: FIXED_NOW)


@pytest.fixture
def operator(client, django_user_model):
    user = personas.operator("operator")
    personas.signed_in(user, client)
    return user


# --- access --------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_pages_and_dash_endpoints_need_a_login(client):
    for url in (reverse("nvlink"), reverse("power")):
        page = client.get(url)
        assert page.status_code == 302 and page["Location"].startswith("/login/"), url
    for app in APPS:
        assert_dash_app_refuses_anonymous(client, app)


@pytest.mark.django_db
@pytest.mark.usefixtures("operator")
def test_pages_embed_their_dash_apps_and_render_for_an_empty_cluster(client):
    for url, app in ((reverse("nvlink"), "nvlink"), (reverse("power"), "power")):
        page = client.get(url)
        assert page.status_code == 200
        html = page.content.decode()
        assert 'id="react-entry-point"' in html and "DashRenderer" in html and 'data-live-url="/ws/facility/"' in html
        assert "breakwater/facility.js?v=" in html and "breakwater/facility.css?v=" in html
        assert 'aria-current="page"' in html and "DJANGO_PLOTLY_DASH" not in html
        assert client.get(f"/django_plotly_dash/app/{app}/_dash-layout").status_code == 200


# --- Dash callbacks ------------------------------------------------------------------------------

def dash_update(client, app: str, output: tuple[str, str], inputs: list[tuple[str, str, object]]) -> dict:
    """POST one single-output callback the way the Dash renderer does; returns {id: {prop: value}}."""
    body = {
        "output": f"{output[0]}.{output[1]}", "outputs": {"id": output[0], "property": output[1]},
        "inputs": [{"id": i, "property": p, "value": v} for i, p, v in inputs],
        "changedPropIds": [f"{i}.{p}" for i, p, _ in inputs], "state": [],
    }
    resp = client.post(f"/django_plotly_dash/app/{app}/_dash-update-component", data=json.dumps(body),
                       content_type="application/json")
    assert resp.status_code == 200, resp.content[:500]
    return json.loads(resp.content)["response"][output[0]][output[1]]


def load_nvlink(client) -> dict:
    return dash_update(client, "nvlink", ("nvlink-data", "data"), [("nvlink-reload", "data", 0)])


def load_power(client) -> dict:
    return dash_update(client, "power", ("power-data", "data"), [("power-reload", "data", 0)])


def column(payload: dict, field: str, uuid: str):
    return payload["gpus"]["v"][payload["fields"].index(field)][payload["static"]["uuid"].index(uuid)]


@pytest.mark.django_db
@pytest.mark.usefixtures("samples", "operator", "fixed_now")
def test_nvlink_callback_returns_the_domains_as_columns(client):
    out = load_nvlink(client)

    assert out == json.loads(json.dumps(dash_facility.nvlink_payload(nvlink_domains(FIXED_NOW))))
    static = out["static"]
    assert [d["name"] for d in static["domains"]] == ["nvd-gpu-0001", "nvl72-r02-01", "gpu-0002", "gpu-0003"]
    assert [d["implicit"] for d in static["domains"]] == [False, False, True, True]
    assert len(static["uuid"]) == 8 and static["hosts"][static["host"][static["uuid"].index(GB[2])]] == "gb-0001"
    assert out["by_state"] == {"errors": 1, "ok": 1, "no data": 2}
    assert [d["state"] for d in out["domains"]] == ["errors", "ok", "no data", "no data"]
    # One recovery in the minute; the clean GPU's bandwidth counter and throughput.
    assert column(out, "nvlink_recovery_errors", GPU1[2]) == pytest.approx(1 / 60, rel=1e-5)
    assert out["states"][out["gpus"]["state"][static["uuid"].index(GPU1[2])]] == "errors"
    assert (column(out, "nvlink_bandwidth", GB[2]), column(out, "nvlink_tx_bps", GB[2])) == (600.0, 2e10)
    assert out["units"]["nvlink_replay_errors"] == "errors/s" and out["units"]["nvlink_tx_bps"] == "B/s"
    nvd = out["domains"][0]
    assert (nvd["gpus"], nvd["gpus_reporting"], nvd["gpus_with_errors"]) == (4, 1, 1)


@pytest.mark.django_db
@pytest.mark.usefixtures("samples", "operator", "fixed_now")
def test_power_callback_returns_the_overview_and_pue_follows_the_range(client):
    out = load_power(client)

    assert out == json.loads(json.dumps(power_overview(FIXED_NOW)))
    racks = {r["name"]: (r["source"], r["draw_w"], r["cap_w"], r["pct_of_cap"]) for r in out["racks"]}
    assert racks == {"r01-01": ("pdu", 42000.0, 40000.0, 105.0), "r01-02": ("gpus", 500.0, None, None),
                     "r02-01": ("power_shelf", 15000.0, None, None)}
    assert [(r["row"], r["draw_w"]) for r in out["rows"]] == [("row-01", 42500.0), ("row-02", 15000.0)]
    (loop,) = out["cooling_loops"]
    assert (loop["name"], loop["supply_c"], loop["return_c"], loop["delta_t_c"], loop["flow_lpm"]) == (
        "loop-hall-a-1", 30.0, 40.0, 10.0, 600.0)
    assert out["pue"] == pytest.approx(1.3)

    for name, resolution, step, points in (("1h", "1m", 60.0, 60), ("24h", "1m", 60.0, 1440),
                                           ("7d", "1h", 3600.0, 168), ("bogus", "1m", 60.0, 1440)):
        series = dash_update(client, "power", ("pue-series", "data"),
                             [("pue-range", "value", name), ("pue-reload", "data", 0)])
        assert (series["resolution"], series["step_s"], len(series["x"])) == (resolution, step, points), name
        assert series["range"] == (name if name != "bogus" else "24h")


@pytest.mark.django_db
@pytest.mark.usefixtures("operator", "fixed_now")
def test_callbacks_for_an_empty_cluster_return_empty_data(client):
    nv = load_nvlink(client)
    assert nv["static"]["uuid"] == [] and nv["domains"] == [] and nv["by_state"] == {"errors": 0, "ok": 0, "no data": 0}
    pw = load_power(client)
    assert pw["racks"] == [] and pw["cooling_loops"] == [] and pw["pue"] is None
    series = dash_update(client, "power", ("pue-series", "data"),
                         [("pue-range", "value", "1h"), ("pue-reload", "data", 0)])
    assert series["y"] == [None] * 60


@pytest.mark.django_db
@pytest.mark.usefixtures("topology")
def test_layout_id_names_where_gpus_sit():
    payload = dash_facility.nvlink_payload(nvlink_domains(FIXED_NOW))
    same = dash_facility.nvlink_payload(nvlink_domains(FIXED_NOW + timedelta(hours=1)))
    assert payload["layout"] == same["layout"]
    moved = json.loads(json.dumps(payload["static"]))
    moved["index"][0], moved["index"][1] = moved["index"][1], moved["index"][0]
    assert dash_facility.layout_id(moved) != payload["layout"]


# --- live consumer -------------------------------------------------------------------------------

def communicator(cookie: bytes | None = None):
    return ws_communicator("/ws/facility/", cookie)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("samples", "fixed_now")
def test_power_subscription_sends_everything_then_only_the_rack_that_changed(session_cookie):
    async def scenario():
        ws = communicator(session_cookie)
        assert (await ws.connect())[0]
        await ws.send_json_to({"subscribe": "power"})
        first = await ws.receive_json_from(timeout=5)
        await sync_to_async(ingest)(power=[power("shelf-r02-01", FIXED_NOW - 10 * SEC, watts=18000.0)])
        await ws.send_input({"type": "telemetry.tick", "at": "t1"})
        second = await ws.receive_json_from(timeout=5)
        await ws.send_input({"type": "telemetry.tick", "at": "t2"})  # nothing changed: nothing sent
        quiet = await ws.receive_nothing(timeout=0.5)
        await ws.send_json_to({"subscribe": "racks"})
        error = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return first, second, quiet, error

    first, second, quiet, error = async_to_sync(scenario)()

    assert first["type"] == "power" and first["full"] is True and first["seq"] == 1
    assert [r["name"] for r in first["racks"]] == ["r01-01", "r01-02", "r02-01"]
    assert second["full"] is False and second["seq"] == 2
    assert [(r["name"], r["draw_w"]) for r in second["racks"]] == [("r02-01", 18000.0)]
    # Row, hall and site totals and PUE moved with it; the loop did not, so it is not sent.
    assert [r["draw_w"] for r in second["rows"]] == [42500.0, 18000.0]
    assert second["total"]["draw_w"] == 60500.0 and "cooling_loops" not in second
    assert second["pue"]["pue"] == pytest.approx(74750.0 / 60500.0)
    assert quiet is True
    assert error["type"] == "error" and "racks" in error["message"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("samples", "fixed_now")
def test_nvlink_subscription_sends_values_then_only_the_gpu_that_changed(session_cookie):
    payload = json.loads(json.dumps(dash_facility.nvlink_payload(nvlink_domains(FIXED_NOW))))
    gb = payload["static"]["uuid"].index(GB[2])

    async def scenario():
        ws = communicator(session_cookie)
        assert (await ws.connect())[0]
        await ws.send_json_to({"subscribe": "nvlink", "layout": "not-what-the-page-has"})
        stale_page = await ws.receive_json_from(timeout=5)
        await ws.send_json_to({"subscribe": "nvlink", "layout": payload["layout"]})
        first = await ws.receive_json_from(timeout=5)
        await sync_to_async(ingest)(gpus=[{"host": GB[0], "uuid": GB[2], "index": 0,
                                           "time": (FIXED_NOW - 5 * SEC).isoformat(),
                                           "fields": {"nvlink_tx_bps": 4e10, "nvlink_rx_bps": 1e10}}])
        await ws.send_input({"type": "telemetry.tick", "at": "t1"})
        second = await ws.receive_json_from(timeout=5)
        await ws.send_input({"type": "telemetry.tick", "at": "t2"})
        quiet = await ws.receive_nothing(timeout=0.5)
        await ws.disconnect()
        return stale_page, first, second, quiet

    stale_page, first, second, quiet = async_to_sync(scenario)()

    # A page that drew another layout is told to reload (the Dash callback has no size limit).
    assert stale_page == {"type": "nvlink", "reload": True, "layout": payload["layout"], "seq": 1}
    # A page with this layout gets every value once, then only what changed, by position.
    assert first["full"] is True and first["last"] is True and first["offset"] == 0 and "static" not in first
    assert (first["state"], first["v"], first["domains"]) == (payload["gpus"]["state"], payload["gpus"]["v"],
                                                              payload["domains"])
    assert second["full"] is False and second["gpus"] == {"nvlink_tx_bps": [[gb], [4e10]]}
    assert list(second["domains"]) == ["1"]  # nvl72-r02-01's totals
    assert second["domains"]["1"]["v"][payload["fields"].index("nvlink_tx_bps")] == 4e10
    assert second["by_state"] == payload["by_state"]
    assert quiet is True


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("topology", "fixed_now")
def test_nvlink_subscription_asks_for_a_reload_when_gpus_appear(session_cookie):
    async def scenario():
        ws = communicator(session_cookie)
        assert (await ws.connect())[0]
        await ws.send_json_to({"subscribe": "nvlink", "layout": None})
        told = await ws.receive_json_from(timeout=5)
        await ws.send_json_to({"subscribe": "nvlink", "layout": told["layout"]})
        first = await ws.receive_json_from(timeout=5)
        # gb-0002 reports its first GPU: the layout changes.
        await sync_to_async(ingest)(gpus=[{"host": "gb-0002", "uuid": "GPU-new-gb-0002-0", "index": 0,
                                           "time": (FIXED_NOW - 5 * SEC).isoformat(),
                                           "fields": {"nvlink_tx_bps": 1e9}}])
        await ws.send_input({"type": "telemetry.tick", "at": "t1"})
        second = await ws.receive_json_from(timeout=5)
        await ws.send_input({"type": "telemetry.tick", "at": "t2"})  # told once, not on every tick
        quiet = await ws.receive_nothing(timeout=0.5)
        await ws.disconnect()
        return first, second, quiet

    first, second, quiet = async_to_sync(scenario)()
    assert first["full"] is True and len(first["state"]) == 8
    assert second["reload"] is True and second["layout"] != first["layout"]
    assert quiet is True


def _payload(n: int) -> dict:
    return {"layout": "L", "generated_at": "t", "by_state": {"ok": 1}, "fields": ("a", "b"),
            "domains": [{"state": "ok"}], "gpus": {"state": [1] * n, "v": [list(range(n)), [0.0] * n]}}


def test_nvlink_values_go_in_parts_small_enough_for_the_websocket(monkeypatch):
    monkeypatch.setattr(consumer, "FULL_CHUNK", 4)
    monkeypatch.setattr(consumer, "MAX_ENTRIES", 5)
    sent = consumer.Sent(kind="nvlink", page_layout="L")
    full = consumer.nvlink_change(sent, _payload(10))
    assert [(m["offset"], len(m["state"]), m.get("last", False)) for m in full] == [(0, 4, False), (4, 4, False),
                                                                                    (8, 2, True)]
    assert full[1]["v"] == [[4, 5, 6, 7], [0.0] * 4] and "domains" in full[0] and "domains" not in full[1]
    moved = _payload(10)
    moved["gpus"]["v"] = [[x + 1 for x in range(10)], [0.0] * 9 + [9.0]]
    parts = consumer.nvlink_change(sent, moved)
    # Eleven changed values, at most five a part; the first part carries the domains and summary.
    assert [sum(len(p[0]) for p in m["gpus"].values()) for m in parts] == [5, 5, 1]
    assert parts[1]["gpus"] == {"a": [[5, 6, 7, 8, 9], [6, 7, 8, 9, 10]]} and parts[2]["gpus"] == {"b": [[9], [9.0]]}
    assert parts[0]["domains"] == {} and "domains" not in parts[1]
    assert consumer.nvlink_change(sent, moved) == []


@pytest.mark.django_db(transaction=True)
def test_consumer_rejects_anonymous_users():
    async def scenario():
        ws = communicator(None)
        connected, code = await ws.connect()
        await ws.disconnect()
        return connected, code

    assert async_to_sync(scenario)() == (False, 4401)


def test_one_read_per_tick_is_shared(monkeypatch):
    from dashboard.consumers.base import TickMemo

    reads = []
    monkeypatch.setattr(consumer, "read", lambda kind: reads.append(kind) or {"n": len(reads)})
    shared = TickMemo()

    def get(kind, tick):
        return shared.get(kind, tick, consumer.read, kind)

    assert get("power", "t1") == get("power", "t1") == {"n": 1}
    assert get("nvlink", "t1") == {"n": 2}
    assert get("power", "t2") == {"n": 3}
    assert get("power", None) == {"n": 4}  # a new subscription reads afresh
    # A page still on the older tick reads for itself, and does not evict the newer tick's read.
    assert get("power", "t1") == {"n": 5}
    assert get("power", "t2") == {"n": 3}
    assert reads == ["power", "nvlink", "power", "power", "power"]


def test_power_change_is_empty_when_nothing_moved():
    overview = {"generated_at": "x", "racks": [{"id": 1, "name": "r", "draw_w": 1.0, "source": "pdu", "cap_w": None,
                                                "pct_of_cap": None, "pdus": 1, "pdus_reporting": 1, "gpus": 0,
                                                "gpus_reporting": 0}],
                "rows": [], "halls": [], "total": {}, "cooling_loops": [], "pue": None, "facility_w": None,
                "it_w": None, "pue_devices": 0, "pue_devices_reporting": 0}
    sent = consumer.Sent(kind="power")
    assert consumer.power_change(sent, overview)[0]["full"] is True
    assert consumer.power_change(sent, {**overview, "generated_at": "y"}) == []
    moved = {**overview, "racks": [{**overview["racks"][0], "draw_w": 2.0}]}
    assert consumer.power_change(sent, moved)[0]["racks"][0]["draw_w"] == 2.0
