"""The search page for each persona: what an operator finds, what a tenant's user finds (its own only),
alerts and tenants, the links each gets, and bad input answered with a message, never an error."""

from __future__ import annotations

from datetime import timedelta

import pytest

from alerts.models import Alert
from alerts.search import find_anything
from telemetry.models import Port, Switch
from tests.conftest import FIXED_NOW
from tests.tenancy.access_world import make_personas, make_tenant_world

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    acme, globex = make_tenant_world("acme", "1001"), make_tenant_world("globex", "2002")
    leaf = Switch.objects.create(name="leaf-03", role="leaf")
    Port.objects.create(switch=leaf, name="p12", guid="0x0002c90300a1b2c3", lid=77)
    return {"acme": acme, "globex": globex, "personas": make_personas(acme, globex), "leaf": leaf}


def _get(world, persona: str, q: str):
    return world["personas"].clients[persona].get("/search/", {"q": q})


def _groups(response) -> dict[str, list[tuple[str, str]]]:
    return {g["kind"]: [(h["label"], h["url"]) for h in g["hits"]] for g in response.context["groups"]}


# --- Operators: everything, each hit linked to its page --------------------------------------------

def test_operator_finds_every_kind_grouped_with_counts(world):
    response = _get(world, "operator", "acm")
    groups = _groups(response)
    assert response.status_code == 200
    assert groups["tenant"] == [("Acme", "/portal/acme/")]
    assert groups["node"] == [("acme-node-01", "/nodes/acme-node-01/")]
    assert groups["job"] == [("slurm:1001 acme-secret-train-1001", "/jobs/slurm:1001/")]
    alert = world["acme"].alert
    assert groups["alert"] == [("AcmeOnlyAlert", f"/alerts/{alert.id}/")]
    html = response.content.decode()
    assert 'href="#bw-results-tenant"' in html and "acme-node-01" in html and "globex" not in html


def test_operator_finds_fabric_switches_ports_by_name_guid_and_lid(world):
    port = Port.objects.get(switch__name="leaf-03")
    groups = _groups(_get(world, "operator", "leaf"))
    assert groups["switch"] == [("leaf-03", "/search/?q=leaf-03%2F")]  # a switch's page: its ports
    assert "port" not in groups
    listed = _groups(_get(world, "operator", "leaf-03/"))
    assert listed["port"] == [("leaf-03/p12", f"/ports/{port.id}/")]
    for q in ("leaf-03/p12", "leaf-03:p12", "0x0002c90300a1b2c3", "0002c90300a1b2c3", "77"):
        assert _get(world, "operator", q)["Location"] == f"/ports/{port.id}/", q


def test_one_exact_hit_with_a_page_opens_it(world):
    acme, operator = world["acme"], "operator"
    assert _get(world, operator, "Acme")["Location"] == "/portal/acme/"  # the tenant's name
    assert _get(world, operator, "acme-acct")["Location"] == "/portal/acme/"  # its Slurm account
    assert _get(world, operator, "slurm:1001")["Location"] == "/jobs/slurm:1001/"
    assert _get(world, operator, "acme-secret-train-1001")["Location"] == "/jobs/slurm:1001/"  # by name
    assert _get(world, operator, "acme-node-01/0")["Location"] == f"/gpus/{acme.gpu.uuid}/"
    assert _get(world, operator, "acme-node-01 gpu 0")["Location"] == f"/gpus/{acme.gpu.uuid}/"
    assert _get(world, operator, "SN-acme-01")["Location"] == f"/gpus/{acme.gpu.uuid}/"
    assert _get(world, operator, "tenant=acme")["Location"] == f"/alerts/{acme.alert.id}/"  # a label
    assert _get(world, operator, "leaf-03").status_code == 200  # a switch has no page: the results stay


def test_alerts_by_name_summary_and_label_open_before_resolved(world):
    acme = world["acme"]
    old = Alert.objects.create(fingerprint="fp-old", name="AcmeOnlyAlert", state="resolved", severity="critical",
                               labels={"tenant": "acme"}, entity_kind="gpu", entity_key=acme.gpu.uuid,
                               annotations={"summary": "GPU fell off the bus"},
                               starts_at=FIXED_NOW - timedelta(days=2), last_seen=FIXED_NOW - timedelta(days=2),
                               ends_at=FIXED_NOW - timedelta(days=1))
    hits = [h for g in find_anything("acmeonly", world["personas"].users["operator"]) if g["kind"] == "alert"
            for h in g["hits"]]
    assert [(h["key"], h["state"]) for h in hits] == [(str(acme.alert.id), "firing"), (str(old.id), "resolved")]
    by_text = find_anything("fell off the", world["personas"].users["operator"])
    assert [(g["kind"], [h["key"] for h in g["hits"]]) for g in by_text] == [("alert", [str(old.id)])]
    by_entity = {g["kind"] for g in find_anything(acme.gpu.uuid, world["personas"].users["operator"])}
    assert by_entity == {"gpu", "alert"}


def test_results_show_each_entitys_state(world):
    html = _get(world, "operator", "node-01").content.decode()
    assert 'data-state="stale"' in html and "No data" in html  # neither node has reported
    assert 'data-state="running"' in _get(world, "operator", "secret-train").content.decode()


# --- A tenant's user: its own tenant's jobs, held hardware and alerts, on its portal ------------------

def test_tenant_user_finds_its_own_jobs_hardware_and_alerts_on_its_portal(world):
    groups = _groups(_get(world, "acme", "secret-train"))
    assert groups == {"job": [("slurm:1001 acme-secret-train-1001", "/portal/acme/jobs/")]}
    assert _groups(_get(world, "acme", "node-01")) == {"node": [("acme-node-01", "/portal/acme/health/")]}
    gpu = _groups(_get(world, "acme", "SN-acme"))
    assert gpu == {"gpu": [("acme-node-01 GPU 0", "/portal/acme/health/")]}
    assert _groups(_get(world, "acme", "OnlyAlert")) == {"alert": [("AcmeOnlyAlert", "/portal/acme/")]}
    assert _groups(_get(world, "acme", "acme")).get("tenant") == [("Acme", "/portal/acme/")]


def test_tenant_user_never_sees_another_tenant_or_the_fabric(world):
    globex = world["globex"]
    for q in ("globex", "2002", "slurm:2002", "GlobexOnlyAlert", globex.gpu.uuid, "SN-globex-01", "globex-node-01/0",
              "globex-user", "leaf-03", "leaf-03/p12", "mlx5_0/1", "77", "tenant=globex", "secret-train", "node-01"):
        response = _get(world, "acme", q)
        html = response.content.decode().replace(q, "")  # the page echoes the query itself
        assert response.status_code == 200, q
        for marker in globex.markers:
            assert marker not in html, (q, marker)
        assert not {"switch", "port", "rack"} & set(_groups(response)), q
    assert 'id="bw-search-none"' in _get(world, "acme", "globex").content.decode()


def test_only_signed_in_users_with_a_role_may_search(world):
    assert _get(world, "anonymous", "acme")["Location"].startswith("/login/")
    assert _get(world, "nobody", "acme").status_code == 403
    assert world["personas"].clients["acme"].post("/search/", {"q": "acme"}).status_code == 405


# --- Bad input ---------------------------------------------------------------------------------------

def test_blank_query_shows_how_to_search(world):
    for q in ("", "   "):
        html = _get(world, "operator", q).content.decode()
        assert 'id="bw-search-hint"' in html and "node-0227 gpu 7" in html


@pytest.mark.parametrize("q", ["x" * 201, "x" * 5000, "acme\x1b"])
def test_too_long_or_control_characters_are_a_400_that_says_why(world, q):
    response = _get(world, "operator", q)
    html = response.content.decode()
    assert response.status_code == 400 and 'id="bw-search-problem"' in html
    assert ("characters long" in html) if len(q) > 200 else ("control characters" in html)


def test_a_nul_byte_is_refused_before_the_search_runs(world):
    """Every route refuses NUL in a query (core.middleware), the search too: PostgreSQL cannot compare it."""
    response = _get(world, "operator", "gpu\x00-0001")
    assert response.status_code == 400 and "the query parameter 'q' contains a NUL byte" in response.content.decode()


@pytest.mark.parametrize("q", ["%", "_", "%%%", "' OR 1=1 --", "<script>alert(1)</script>", "\\", "🙂", "x" * 200])
def test_garbage_finds_nothing_and_is_no_error(world, q):
    response = _get(world, "operator", q)
    assert response.status_code == 200 and 'id="bw-search-none"' in response.content.decode()
    assert "<script>alert(1)</script>" not in response.content.decode()
