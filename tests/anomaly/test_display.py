"""The anomaly formatter: entities named as an operator says them, values with units, the peers' value.

Events are made by hand on the small fixture topology (tests/fixtures/topology/good.yaml), as the
detectors would write them: a GPU by UUID, a switch port by database id, a rack by name, a job by key.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest

from anomaly import display
from anomaly.findings import Contribution, Finding
from anomaly.models import Anomaly, AnomalyKind
from telemetry.models import Gpu, Job, JobState, Port
from telemetry.topology import do_import_topology, load_topology_file
from tests.conftest import FIXED_NOW

TOPOLOGY = Path(__file__).resolve().parents[1] / "fixtures" / "topology" / "good.yaml"


@pytest.fixture
def cluster(db):
    do_import_topology(load_topology_file(TOPOLOGY))


def event(entity_kind: str, entity_id: str, *, kind=AnomalyKind.PEER_NODE, host="", contributions=(),
          summary="") -> Anomaly:
    cs = [c.as_dict() for c in contributions]
    summary = summary or Finding(kind, entity_kind, entity_id, 0.9, tuple(contributions)).text()
    return Anomaly.objects.create(kind=kind, entity_kind=entity_kind, entity_id=entity_id, host=host,
                                  started_at=FIXED_NOW - timedelta(hours=1), last_seen=FIXED_NOW, score=0.9,
                                  last_score=0.9, summary=summary, contributions=cs)


def switch_port(switch: str, name: str) -> Port:
    return Port.objects.get(switch__name=switch, name=name)


# --- values and units --------------------------------------------------------------------------------

@pytest.mark.parametrize(("field", "value", "text"), [
    ("memory_temp", 84.5, "84.5 °C"),
    ("gpu_util", 37.25, "37.25%"),
    ("sm_clock", 1410.0, "1,410 MHz"),
    ("power_w", 512.0, "512 W"),
    ("sm_active", 0.42, "42%"),  # activity ratios read as a share
    ("nvlink_tx_bps", 25e9, "200 Gb/s"),  # bytes per second on the wire as bits
    ("fb_used", 40960.0, "40 GiB"),
    ("ecc_sbe_vol", 30.0, "0.5 errors/s"),  # rates are stored per minute, read per second
    ("pcie_replay", 120.0, "2 retries/s"),
    ("xmit_wait", 6e7, "1,000,000 ticks/s"),
    ("link_util", 91.0, "91%"),
    ("throttle_reasons", 0.25, "25% of the time"),
    ("rack_power", 41_200.0, "41.2 kW"),
    ("step_time_s", 1.6, "1.6 s"),
    ("nobody_knows", 3.0, "3"),
    ("memory_temp", None, "—"),
    ("memory_temp", float("nan"), "—"),
])
def test_format_value_shows_the_unit_an_operator_reads(field, value, text):
    assert display.format_value(field, value) == text


def test_reason_names_metric_value_and_peers_median_with_units():
    r = display.reason(Contribution("memory_temp", "memory temperature", 84.5, 71.0, 6.2, "peers in node").as_dict())
    assert r["text"] == "memory temperature 84.5 °C vs median of peers in node 71 °C (+6.2σ)"
    assert (r["value_text"], r["expected_text"], r["unit"], r["deviation"]) == ("84.5 °C", "71 °C", "°C", 6.2)


@pytest.mark.parametrize(("basis", "reference"), [
    ("leaf uplinks", "median of leaf uplinks"), ("own baseline", "own baseline"), ("its cap", "its cap"),
    ("gang median", "gang median"),
])
def test_reason_says_what_the_value_was_compared_with(basis, reference):
    r = display.reason(Contribution("ecc_sbe_vol", "single-bit ECC errors", 120.0, 6.0, 9.0, basis).as_dict())
    assert r["text"] == f"single-bit ECC errors 2 errors/s vs {reference} 0.1 errors/s (+9.0σ)"


def test_reason_of_a_non_finite_deviation_says_so():
    r = display.reason({"field": "loss", "label": "loss", "value": None, "expected": 2.1, "deviation": None,
                        "basis": "own history"})
    assert r["text"] == "loss — vs own history 2.1 (not finite)" and r["deviation"] is None


def test_headline_replaces_bare_sigma_phrases_and_keeps_a_detectors_own_sentence():
    temp = Contribution("memory_temp", "memory temperature", 84.5, 71.0, 6.2, "peers in node")
    step = Contribution("step_time_s", "step time", 1.6, 1.0, 8.4, "gang median")
    assert display.headline(Finding("peer_node", "gpu", "x", 1, (temp,)).text(), [temp.as_dict()]) == \
        "memory temperature 84.5 °C vs median of peers in node 71 °C (+6.2σ)"
    straggler = f"{step.phrase()} (1.60× over 8 ranks)"
    assert display.headline(straggler, [step.as_dict()]) == \
        "step time 1.6 s vs gang median 1 s (+8.4σ) (1.60× over 8 ranks)"
    rack = "rack power 104% of its 40.0 kW cap"
    assert display.headline(rack, [Contribution("rack_power", "rack power", 41600, 40000, 0.8, "its cap").as_dict()]) \
        == rack


# --- entities ------------------------------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.usefixtures("cluster")
def test_rows_name_each_entity_kind_as_an_operator_says_it():
    gpu = Gpu.objects.get(node__hostname="gpu-0001", index=2)
    down, up = switch_port("leaf-01", "p1"), switch_port("leaf-01", "p7")
    lonely = switch_port("leaf-01", "p8")
    Job.objects.create(source="slurm", external_id="100", name="llm-pretrain", state=JobState.RUNNING)
    temp = Contribution("memory_temp", "memory temperature", 84.5, 71.0, 6.2, "peers in node")
    made = [
        event("gpu", gpu.uuid, host="gpu-0001", contributions=[temp]),
        event("port", str(down.pk), kind=AnomalyKind.PEER_LEAF, host="leaf-01:p1"),
        event("port", str(up.pk), kind=AnomalyKind.PEER_LEAF, host="leaf-01:p7"),
        event("port", str(lonely.pk), kind=AnomalyKind.PEER_LEAF, host="leaf-01:p8"),
        event("rack", "r01-01", kind=AnomalyKind.RACK_POWER, summary="rack power 104% of its 17.3 kW cap"),
        event("rank", "slurm:100#5", kind=AnomalyKind.STRAGGLER, host="gpu-0002"),
        event("job", "slurm:100", kind=AnomalyKind.DIVERGENCE, host="gpu-0002"),
        event("job", "slurm:999", kind=AnomalyKind.DIVERGENCE),
        event("gpu", "GPU-00000000-gone-from-the-inventory", host="gpu-0009"),
    ]
    rows = display.rows(made)
    assert [(r["entity_text"], r["host"]) for r in rows] == [
        ("GPU 2 of gpu-0001", "gpu-0001"),
        ("gpu-0001 mlx5_0/1 ↔ leaf-01 p1", "gpu-0001"),  # the node's end first
        ("leaf-01 p7 ↔ spine-01 sw1", ""),
        ("leaf-01 p8", ""),  # no cable
        ("rack r01-01", ""),
        ("rank 5 of llm-pretrain (slurm:100)", "gpu-0002"),
        ("llm-pretrain (slurm:100)", "gpu-0002"),
        ("slurm:999", ""),
        ("GPU GPU-00000000… of gpu-0009", "gpu-0009"),
    ]
    assert rows[0]["summary"] == "memory temperature 84.5 °C vs median of peers in node 71 °C (+6.2σ)"
    assert rows[0]["entity_title"] == gpu.uuid and rows[0]["url"] == f"/gpus/{gpu.uuid}/"
    assert rows[1]["url"] == f"/ports/{down.pk}/" and rows[1]["entity_title"] == "switch port leaf-01 p1"
    for r in rows[1:4]:  # a port's database id is in its URL only, never in what is read
        read = " ".join((r["entity_text"], r["summary"], r["entity_title"]))
        assert not re.search(rf"(?<![\w.-]){r['entity_id']}(?![\w.])", read), read


@pytest.mark.django_db
@pytest.mark.usefixtures("cluster")
def test_rows_name_a_whole_list_with_one_query_per_kind(django_assert_max_num_queries):
    gpus = list(Gpu.objects.all())
    made = [event("gpu", g.uuid, host=g.node.hostname) for g in gpus]
    made += [event("port", str(p.pk), kind=AnomalyKind.PEER_LEAF) for p in Port.objects.filter(switch__isnull=False)]
    with django_assert_max_num_queries(3):
        rows = display.rows(made)
    assert len(rows) == len(made) and all(" of gpu-" in r["entity_text"] or " of gb-" in r["entity_text"]
                                          for r in rows[:len(gpus)])
