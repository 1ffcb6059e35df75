"""After signing in without a `next`, operators land on the fleet and tenants' users on their portal."""

import pytest
from django.contrib.auth import get_user_model

from tenancy.models import Membership, Tenant
from tests import personas


@pytest.mark.django_db
def test_login_lands_operators_on_the_fleet_and_tenant_users_on_the_portal(client):
    users = get_user_model()
    personas.operator("op")
    acme = Tenant.objects.create(name="Acme", slug="acme", kind="organisation")
    dev = users.objects.create_user("dev", password="pw-dev-123456")
    Membership.objects.create(user=dev, tenant=acme, role="member")
    assert client.post("/login/", {"username": "op", "password": personas.PASSWORD})["Location"] == "/"
    client.logout()
    assert client.post("/login/", {"username": "dev", "password": "pw-dev-123456"})["Location"] == "/portal/"
    client.logout()
    with_next = client.post("/login/?next=/portal/acme/", {"username": "dev", "password": "pw-dev-123456",
                                                          "next": "/portal/acme/"})
    assert with_next["Location"] == "/portal/acme/"


@pytest.mark.django_db
def test_login_page_offers_single_sign_on_only_when_configured(client, settings):
    settings.OIDC_ENABLED = False
    assert b"/oidc/authenticate/" not in client.get("/login/").content
    settings.OIDC_ENABLED = True
    assert b"/oidc/authenticate/" in client.get("/login/").content
