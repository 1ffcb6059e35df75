"""The Anomalies page, the drill-down pages' "Anomalies and risk" section, and the live consumer.

Anomaly rows are made by hand at fixed times around FIXED_NOW on the drill-down tests' topology
(tests/fixtures/topology/good.yaml), as the detectors and the failure model would write them.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from anomaly.models import Anomaly, AnomalyKind, EntityScore
from dashboard.pages import anomalies as page
from telemetry.models import Gpu, Job, JobState, Port
from tests import personas
from tests.conftest import FIXED_NOW
from tests.dashboard.conftest import ws_communicator
from tests.dashboard.test_drilldown_pages import GPU_0, GPU_2, _hca, cluster  # noqa: F401  (fixture)

NOW = FIXED_NOW
H = timedelta(hours=1)
TICK = {"type": "telemetry.tick", "at": "x"}
TEMP = {"field": "memory_temp", "label": "memory temperature", "value": 84.5, "expected": 71.0, "deviation": 6.2,
        "basis": "peers in node"}
POWER = {"field": "power_w", "label": "power", "value": 512.0, "expected": 480.0, "deviation": 3.1,
         "basis": "peers in node"}
STEP = {"field": "step_time_s", "label": "step time", "value": 1.6, "expected": 1.0, "deviation": 8.4,
        "basis": "gang median"}


def anomaly(kind: str, entity_kind: str, entity_id: str, host: str, start, end=None, **kw) -> Anomaly:
    score = kw.pop("score", 0.8)
    return Anomaly.objects.create(kind=kind, entity_kind=entity_kind, entity_id=entity_id, host=host,
                                  started_at=start, last_seen=end or NOW - timedelta(minutes=5), ended_at=end,
                                  score=score, last_score=score, **kw)


@pytest.fixture
def events(db) -> dict[str, Anomaly]:
    """Open: a GPU's peer anomaly, its failure risk, a straggling rank. Closed: a divergence within
    the last 24 h, a port's peer anomaly within 7 d, a GPU's baseline anomaly 9 days ago."""
    return {
        "gpu": anomaly(AnomalyKind.PEER_NODE, "gpu", GPU_2, "gpu-0001", NOW - 2 * H, score=0.91,
                       summary="memory temperature +6.2σ vs peers in node", contributions=[TEMP, POWER]),
        "risk": anomaly(AnomalyKind.FAILURE_RISK, "gpu", GPU_2, "gpu-0001", NOW - H, score=0.23,
                        summary="23% risk of failure within 24 h: memory temperature high"),
        "rank": anomaly(AnomalyKind.STRAGGLER, "rank", "slurm:100#5", "gpu-0002", NOW - 3 * H, score=0.7,
                        summary="step time +8.4σ vs gang median (1.60× over 8 ranks)", contributions=[STEP]),
        "div": anomaly(AnomalyKind.DIVERGENCE, "job", "slurm:100", "gpu-0002", NOW - 4 * H, NOW - H,
                       summary="loss rising 3 evaluations in a row"),
        "port": anomaly(AnomalyKind.PEER_LEAF, "port", "77", "gpu-0001", NOW - 30 * H, NOW - 26 * H,
                        summary="symbol errors +5.0σ vs links on its leaf"),
        "old": anomaly(AnomalyKind.BASELINE, "gpu", GPU_0, "gpu-0001", NOW - 240 * H, NOW - 216 * H,
                       summary="gpu temperature +4.0σ vs own baseline"),
    }


@pytest.fixture
def operator(client, django_user_model, monkeypatch):
    """A signed-in operator, with the page's clock pinned to FIXED_NOW."""
    monkeypatch.setattr(page, "now", lambda: NOW)
    return personas.signed_in(personas.operator("operator"), client)


def listed(client, query: str = "") -> list[int]:
    response = client.get(f"/anomalies/{query}")
    assert response.status_code == 200
    return [int(i) for i in re.findall(r'<tr class="bw-anom-row" data-id="(\d+)"', response.content.decode())]


def ids(events: dict, *names: str) -> list[int]:
    return [events[n].pk for n in names]


# --- the page --------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_anomalies_page_redirects_anonymous_to_login(client):
    response = client.get("/anomalies/?state=7d")
    assert response.status_code == 302 and response["Location"].startswith("/login/")


@pytest.mark.django_db
@pytest.mark.parametrize(("query", "expected"), [
    ("", ["risk", "gpu", "rank"]),  # open now, newest first
    ("?state=24h", ["risk", "gpu", "rank", "div"]),
    ("?state=7d", ["risk", "gpu", "rank", "div", "port"]),
    ("?state=7d&kind=straggler", ["rank"]),
    ("?state=7d&q=gpu-0001", ["risk", "gpu", "port"]),
    ("?state=open&q=MEMORY+temperature", ["risk", "gpu"]),
    ("?state=24h&q=slurm:100&kind=", ["rank", "div"]),
])
def test_anomalies_filters_select_by_state_kind_and_text(operator, events, query, expected):
    assert listed(operator, query) == ids(events, *expected)


@pytest.mark.django_db
@pytest.mark.parametrize(("query", "name", "value"), [
    ("?state=forever", "state", "forever"), ("?kind=psychic", "kind", "psychic"), (f"?q={'x' * 101}", "q", "xxx"),
])
def test_anomalies_bad_filter_is_400_naming_it(operator, query, name, value):
    response = operator.get(f"/anomalies/{query}")
    assert response.status_code == 400
    error = re.search(r'id="bw-anom-error">([^<]*)<', response.content.decode()).group(1)
    assert error.startswith(f"Bad filter {name}=") and value in error


@pytest.mark.django_db
def test_anomalies_page_explains_each_row_and_charts_open_kinds(operator, events):
    response = operator.get("/anomalies/")
    html = response.content.decode()
    chips = re.findall(r'<span class="bw-anom-chip" data-level="(\w+)" style="--dev: (#\w+)">([^<]*)</span>', html)
    assert chips == [
        ("high", "#d55e00", "memory temperature 84.5 °C vs median of peers in node 71 °C (+6.2σ)"),
        ("medium", "#e69f00", "power 512 W vs median of peers in node 480 W (+3.1σ)"),
        ("high", "#d55e00", "step time 1.6 s vs gang median 1 s (+8.4σ)"),
    ]
    summary = "memory temperature 84.5 °C vs median of peers in node 71 °C (+6.2σ)"
    for part in (f'<div class="bw-anom-summary">{summary}</div>',
                 f'href="/gpus/{GPU_2}/"', 'href="/jobs/slurm:100/"', "rank 5 of slurm:100", 'href="/nodes/gpu-0001/"',
                 "23.0%", "0.91", "Against the GPUs in its node"):
        assert part in html, part
    figure = json.loads(re.search(r'id="bw-anom-figure" type="application/json">(.*?)</script>', html, re.S)[1])
    bars = dict(zip(figure["data"][0]["y"], figure["data"][0]["x"], strict=True))
    assert bars == {label: {"peer_node": 1, "failure_risk": 1, "straggler": 1}.get(kind, 0)
                    for kind, label in AnomalyKind.choices}
    assert response.context["open_total"] == 3
    assert '<p class="bw-small" id="bw-anom-scored">Anomaly scoring has not run yet.</p>' in html


def visible_text(html: str) -> str:
    """What a reader sees: tags (and with them hrefs, titles and data attributes) stripped."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


@pytest.mark.django_db
@pytest.mark.usefixtures("cluster")
def test_anomaly_rows_name_host_gpu_index_and_units_never_raw_ids(operator):
    leaf_port = Port.objects.get(switch__name="leaf-01", name="p1")
    wait = {"field": "xmit_wait", "label": "PortXmitWait", "value": 9.0e7, "expected": 1.2e6, "deviation": 41.0,
            "basis": "leaf uplinks"}
    gpu = anomaly(AnomalyKind.PEER_NODE, "gpu", GPU_2, "gpu-0001", NOW - H, summary="memory temperature +6.2σ vs "
                  "peers in node; power +3.1σ vs peers in node", contributions=[TEMP, POWER])
    port = anomaly(AnomalyKind.PEER_LEAF, "port", str(leaf_port.pk), "leaf-01:p1", NOW - 2 * H,
                   summary="PortXmitWait +41.0σ vs leaf uplinks", contributions=[wait])
    html = operator.get("/anomalies/").content.decode()
    rows = dict(re.findall(r'<tr class="bw-anom-row" data-id="(\d+)".*?>(.*?)</tr>', html, re.S))
    gpu_text, port_text = visible_text(rows[str(gpu.pk)]), visible_text(rows[str(port.pk)])
    assert "GPU 2 of gpu-0001" in gpu_text and " gpu-0001 " in gpu_text  # the GPU by index, and its host
    assert "84.5 °C vs median of peers in node 71 °C" in gpu_text and "512 W" in gpu_text
    assert "gpu-0001 mlx5_0/1 ↔ leaf-01 p1" in port_text
    assert "PortXmitWait 1,500,000 ticks/s vs median of leaf uplinks 20,000 ticks/s (+41.0σ)" in port_text
    gpu_pk = Gpu.objects.get(uuid=GPU_2).pk
    assert GPU_2 not in gpu_text and not re.search(rf"(?<![\w.,-]){gpu_pk}(?![\w.,])", gpu_text)
    assert not re.search(rf"(?<![\w.,-]){leaf_port.pk}(?![\w.,])", port_text), port_text
    # The live push carries the same words the page rendered.
    pushed = {r["id"]: r for r in page.page_data(page.parse_filters({}))["rows"]}
    assert pushed[gpu.pk]["entity_text"] == "GPU 2 of gpu-0001" and pushed[port.pk]["host"] == "gpu-0001"
    assert [c["text"] for c in pushed[port.pk]["chips"]] == [
        "PortXmitWait 1,500,000 ticks/s vs median of leaf uplinks 20,000 ticks/s (+41.0σ)"]


# --- the drill-down sections -------------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.usefixtures("cluster")
def test_gpu_page_shows_its_risk_and_anomaly_explanation(operator, events):
    EntityScore.objects.create(entity_kind="gpu", entity_id=GPU_2, anomaly_score=0.91, anomaly_at=NOW - 5 * H / 60,
                               failure_risk=0.2345, risk_at=NOW - H, risk_version=3)
    html = operator.get(f"/gpus/{GPU_2}/").content.decode()
    section = html[html.index('id="bw-anomalies"'):]
    assert "23.4% (failure model v3, scored 2026-11-30 11:00:00 UTC)" in section
    assert "0.91 (scored 2026-11-30 11:55:00 UTC)" in section
    assert "memory temperature 84.5 °C vs median of peers in node 71 °C (+6.2σ)" in section
    # Its two events, open ones first and newest first; not the other GPU's.
    assert re.findall(r'data-id="(\d+)"', section) == [str(i) for i in ids(events, "risk", "gpu")]
    other = operator.get(f"/gpus/{GPU_0}/").content.decode()
    assert "<dt>Failure risk</dt><dd>not scored</dd>" in other and "gpu temperature +4.0σ" in other


@pytest.mark.django_db
@pytest.mark.usefixtures("cluster")
def test_node_and_port_pages_show_their_events(operator, events):
    port = _hca("gpu-0001", "mlx5_0/1")
    Anomaly.objects.filter(pk=events["port"].pk).update(entity_id=str(port.id))
    EntityScore.objects.create(entity_kind="gpu", entity_id=GPU_2, failure_risk=0.5, risk_at=NOW, risk_version=2)
    node = operator.get("/nodes/gpu-0001/").content.decode()
    section = node[node.index('id="bw-anomalies"'):]
    assert f'<dt><a href="/gpus/{GPU_2}/">GPU 2</a></dt><dd>50.0% (failure model v2' in section
    assert re.findall(r'data-id="(\d+)"', section) == [str(i) for i in ids(events, "risk", "gpu", "port", "old")]
    assert ">gpu-0001 mlx5_0/1 ↔ leaf-01 p1</a>" in section and ">GPU 2 of gpu-0001</a>" in section
    port_html = operator.get(f"/ports/{port.id}/").content.decode()
    assert "symbol errors +5.0σ vs links on its leaf" in port_html and "<dd>none now</dd>" in port_html


@pytest.mark.django_db
@pytest.mark.usefixtures("cluster")
def test_job_page_shows_a_straggling_ranks_event(operator, events):
    Job.objects.create(source="slurm", external_id="100", name="llm-pretrain", user="alice", account="ml",
                       state=JobState.RUNNING, submit_time=NOW - 5 * H, start_time=NOW - 4 * H)
    html = operator.get("/jobs/slurm:100/").content.decode()
    section = html[html.index('id="bw-anomalies"'):]
    assert "<dt>Straggling now</dt><dd>rank 5</dd>" in section
    assert "step time 1.6 s vs gang median 1 s (+8.4σ) (1.60× over 8 ranks)" in section
    assert "rank 5 of llm-pretrain (slurm:100)" in section
    assert re.findall(r'data-id="(\d+)"', section) == [str(i) for i in ids(events, "rank", "div")]


def _rank_member(entity_id: str, seen, host: str) -> dict:
    return {"kind": "straggler", "entity_kind": "rank", "entity_id": entity_id, "host": host,
            "first_seen": (NOW - H).isoformat(), "last_seen": seen.isoformat(), "score": 0.8, "last_score": 0.8,
            "summary": f"{entity_id} compute time 1.2x its gang", "signals": [["compute_time_s", 7.0]]}


@pytest.mark.django_db
@pytest.mark.usefixtures("cluster")
def test_job_page_names_a_straggling_rank_that_is_a_member_of_its_hosts_event_only_while_it_is_found(operator):
    Job.objects.create(source="slurm", external_id="200", name="llm-sft", user="alice", account="ml",
                       state=JobState.RUNNING, submit_time=NOW - 5 * H, start_time=NOW - 4 * H)
    # Rank 4's host is hot: the event's face is the GPU, the rank is a member the latest pass found.
    # Rank 9 caught up ten minutes ago: its host's event is open (waiting out its hold), it is not straggling now.
    for host, member in (("gpu-0001", _rank_member("slurm:200#4", NOW, "gpu-0001")),
                         ("gpu-0002", _rank_member("slurm:200#9", NOW - H / 6, "gpu-0002"))):
        Anomaly.objects.create(kind=AnomalyKind.PEER_NODE, entity_kind="gpu", entity_id=GPU_2, host=host,
                               group_key=f"fleet|host:{host}", started_at=NOW - H, last_seen=NOW, score=0.9,
                               last_score=0.9, summary="gpu temperature +9.0σ vs peers in node", members=[member])
    EntityScore.objects.create(entity_kind="fleet", entity_id="*", anomaly_at=NOW)
    html = operator.get("/jobs/slurm:200/").content.decode()
    section = html[html.index('id="bw-anomalies"'):]
    assert "<dt>Straggling now</dt><dd>rank 4</dd>" in section
    assert len(re.findall(r'data-id="(\d+)"', section)) == 2  # both events hold a rank of the job


@pytest.mark.django_db
@pytest.mark.usefixtures("cluster")
def test_an_event_of_several_entities_is_one_line_and_shows_on_each_members_page(operator):
    def member(kind: str, entity_id: str) -> dict:
        return {"kind": kind, "entity_kind": "gpu", "entity_id": entity_id, "host": "gpu-0001",
                "first_seen": (NOW - H).isoformat(), "last_seen": NOW.isoformat(), "score": 0.8, "last_score": 0.8,
                "summary": "hot", "signals": [["memory_temp", 6.2]]}

    event = anomaly(AnomalyKind.PEER_NODE, "gpu", GPU_2, "gpu-0001", NOW - H, group_key="fleet|host:gpu-0001",
                    summary="memory temperature +6.2σ vs peers in node", contributions=[TEMP], member_count=2,
                    members=[member("peer_node", GPU_2), member("baseline", GPU_2), member("peer_node", GPU_0)])
    html = operator.get("/anomalies/").content.decode()
    assert listed(operator) == [event.pk] and ">GPU 2 of gpu-0001 (+1 more GPU)</a>" in html
    other = operator.get(f"/gpus/{GPU_0}/").content.decode()
    assert re.findall(r'data-id="(\d+)"', other[other.index('id="bw-anomalies"'):]) == [str(event.pk)]


# --- the live consumer ---------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_anomalies_consumer_pushes_the_list_again_after_a_new_event_and_a_tick(session_cookie, events):
    async def scenario():
        ws = ws_communicator("/ws/anomalies/", session_cookie)
        assert (await ws.connect())[0]
        await ws.send_json_to({"subscribe": "anomalies", "sub": 4, "state": "open", "kind": "", "q": ""})
        first = await ws.receive_json_from(timeout=5)
        await ws.send_input(TICK)  # nothing changed: nothing sent
        quiet = await ws.receive_nothing(timeout=0.5)
        # What a scoring pass commits: a new event, and the fleet row that says when it ran.
        new = await sync_to_async(anomaly)(AnomalyKind.COHORT, "gpu", GPU_0, "gpu-0001", NOW - 0.1 * H,
                                           summary="gpu temperature +5.1σ vs H100 cohort")
        await sync_to_async(EntityScore.objects.create)(entity_kind="fleet", entity_id="*", anomaly_at=NOW)
        await ws.send_input(TICK)
        second = await ws.receive_json_from(timeout=5)
        await ws.send_json_to({"subscribe": "anomalies", "sub": 5, "kind": "psychic"})
        refused = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return first, quiet, new, second, refused

    first, quiet, new, second, refused = async_to_sync(scenario)()

    assert (first["type"], first["sub"], first["seq"]) == ("anomalies", 4, 1)
    assert [r["id"] for r in first["rows"]] == ids(events, "risk", "gpu", "rank") and first["open_total"] == 3
    assert quiet is True
    assert [r["id"] for r in second["rows"]] == [new.pk, *ids(events, "risk", "gpu", "rank")]
    assert second["rows"][0]["summary"] == "gpu temperature +5.1σ vs H100 cohort" and second["open_total"] == 4
    assert second["scored_text"] == "Detectors last ran 2026-11-30 12:00:00 UTC; no failure model has scored yet."
    assert dict(zip(second["figure"]["data"][0]["y"], second["figure"]["data"][0]["x"], strict=True))[
        AnomalyKind.COHORT.label] == 1
    assert refused["type"] == "error" and "kind='psychic'" in refused["message"]


def test_anomalies_consumer_closes_anonymous_with_4401():
    async def scenario():
        ws = ws_communicator("/ws/anomalies/")
        connected, code = await ws.connect()
        await ws.disconnect()
        return connected, code

    assert async_to_sync(scenario)() == (False, 4401)
