"""Access at the edge: operator pages, tenant pages, the JSON API's authentication and the Dash endpoints, with
the three personas (operator, a tenant's member, an outsider) and anonymous visitors."""

from __future__ import annotations

import pytest
from django.test import Client

from tenancy.models import Membership
from tests.tenancy.access_world import make_personas, make_tenant_world

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    acme = make_tenant_world("acme", "1001")
    globex = make_tenant_world("globex", "2002")
    return {"acme": acme, "globex": globex, "p": make_personas(acme, globex)}


def bearer(token: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def err(resp, status: int, code: str) -> str:
    assert resp.status_code == status, resp.content
    body = resp.json()["error"]
    assert body["code"] == code and body["message"]
    return body["message"]


# --- Operator pages ---------------------------------------------------------------------------------------

def test_operator_pages_send_anonymous_visitors_to_the_login_page(world):
    resp = world["p"].clients["anonymous"].get("/jobs/slurm:1001/")
    assert resp.status_code == 302 and resp["Location"] == "/login/?next=/jobs/slurm%3A1001/"


def test_a_tenants_member_gets_a_403_page_pointing_at_the_portal(world):
    resp = world["p"].clients["acme"].get("/")
    content = resp.content.decode()
    assert resp.status_code == 403
    assert 'href="/portal/"' in content and "operators" in content
    assert "acme-node-01" not in content and "fleet" not in resp.templates[0].name


def test_a_user_without_any_role_is_told_to_ask_for_one(world):
    resp = world["p"].clients["nobody"].get("/jobs/")
    content = resp.content.decode()
    assert resp.status_code == 403 and "tenant portal" not in content and "An operator can give" in content


def test_an_operator_by_role_without_staff_flag_opens_operator_pages(world, django_user_model):
    user = django_user_model.objects.create_user("olga")
    Membership.objects.create(user=user, tenant=None, role="operator")
    client = Client()
    client.force_login(user)
    assert client.get("/jobs/").status_code == 200
    assert client.get("/alerts/").status_code == 200


def test_alert_changes_by_a_tenant_member_are_refused_and_change_nothing(world):
    alert = world["acme"].alert
    resp = world["p"].clients["acme"].post(f"/alerts/{alert.pk}/ack/", {"note": "mine"})
    alert.refresh_from_db()
    assert resp.status_code == 403 and alert.state == "firing" and alert.acked_by is None


# --- Tenant pages -----------------------------------------------------------------------------------------

def test_tenant_pages_admit_members_and_operators_and_refuse_the_rest(world):
    clients = world["p"].clients
    assert clients["acme"].get("/portal/acme/").status_code == 200
    assert clients["operator"].get("/portal/acme/").status_code == 200
    assert clients["globex"].get("/portal/acme/").status_code in (403, 404)
    assert clients["nobody"].get("/portal/").status_code == 403
    assert clients["anonymous"].get("/portal/")["Location"].startswith("/login/")


# --- The JSON API: sessions and tokens ---------------------------------------------------------------------

def test_api_answers_401_json_without_credentials_and_names_the_fix(world):
    msg = err(world["p"].clients["anonymous"].get("/api/v1/events"), 401, "not_authenticated")
    assert "Bearer" in msg


@pytest.mark.parametrize(("header", "status", "code"), [
    ("Basic dXNlcjpwdw==", 401, "bad_authorization"), ("Bearer ", 401, "bad_authorization"),
    ("Bearer bwt_not-a-real-token", 401, "bad_token"), ("Bearer something-else", 401, "bad_token"),
])
def test_api_refuses_malformed_or_unknown_credentials(world, header, status, code):
    err(world["p"].clients["anonymous"].get("/api/v1/alerts", HTTP_AUTHORIZATION=header), status, code)


def test_collector_tokens_can_only_ingest(world):
    p = world["p"]
    msg = err(p.clients["anonymous"].get("/api/v1/events", **bearer(p.tokens["collector_token"])), 403,
              "collector_token")
    assert msg == "collector tokens can only ingest"


def test_api_tokens_cannot_ingest(world):
    p = world["p"]
    for token in ("acme_token", "operator_token"):
        resp = p.clients["anonymous"].post("/api/v1/ingest", data="{}", content_type="application/json",
                                           **bearer(p.tokens[token]))
        err(resp, 403, "api_token")


def test_operator_api_endpoints_refuse_tenant_members_and_tenant_tokens(world):
    p = world["p"]
    err(p.clients["acme"].get("/api/v1/events"), 403, "forbidden")
    err(p.clients["anonymous"].get("/api/v1/rules", **bearer(p.tokens["acme_token"])), 403, "forbidden")
    assert p.clients["anonymous"].get("/api/v1/events", **bearer(p.tokens["operator_token"])).status_code == 200
    assert p.clients["operator"].get("/api/v1/events").status_code == 200


def test_a_token_wins_over_the_session_it_comes_with(world):
    """An operator's browser session must not widen the acme token a script sends."""
    p = world["p"]
    resp = p.clients["operator"].get("/api/v1/rules", **bearer(p.tokens["acme_token"]))
    err(resp, 403, "forbidden")
    names = [a["name"] for a in p.clients["operator"].get(
        "/api/v1/alerts", **bearer(p.tokens["acme_token"])).json()["alerts"]]
    assert names == ["AcmeOnlyAlert"]


def test_tenant_alert_list_answers_405_for_writes_only_after_access(world):
    p = world["p"]
    err(p.clients["acme"].delete("/api/v1/alerts"), 403, "forbidden")
    err(p.clients["operator"].delete("/api/v1/alerts"), 405, "method_not_allowed")


# --- Dash endpoints ---------------------------------------------------------------------------------------

def test_operator_dash_apps_refuse_a_tenants_member_as_json_or_page(world):
    client = world["p"].clients["acme"]
    err(client.get("/django_plotly_dash/app/jobs/_dash-layout", HTTP_ACCEPT="application/json"), 403, "forbidden")
    page = client.get("/django_plotly_dash/app/jobs/", HTTP_ACCEPT="text/html")
    assert page.status_code == 403 and 'href="/portal/"' in page.content.decode()
    assert world["p"].clients["operator"].get("/django_plotly_dash/app/jobs/_dash-layout").status_code == 200


def test_dash_renderer_assets_are_served_to_any_signed_in_user(world):
    # The portal's charts need the renderer too; the files hold no data.
    resp = world["p"].clients["acme"].get(
        "/django_plotly_dash/app/jobs/_dash-component-suites/dash/deps/react@18.3.1.min.js")
    assert resp.status_code in (200, 302)
    anonymous = world["p"].clients["anonymous"].get(
        "/django_plotly_dash/app/jobs/_dash-component-suites/dash/deps/react@18.3.1.min.js")
    assert anonymous.status_code == 401
