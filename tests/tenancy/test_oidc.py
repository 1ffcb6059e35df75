"""Single sign-on: the OIDC backend against a real local provider (tests/tenancy/oidc_provider.py), group claims
mapped to roles and synced at every login; settings that refuse bad OIDC variables by name."""

from __future__ import annotations

import os
import subprocess
import sys
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from cryptography.hazmat.primitives.asymmetric import rsa
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.test import Client, RequestFactory

from dashboard.settings import _oidc_group_roles
from tenancy.actions import do_add_membership, do_create_tenant
from tenancy.models import Membership
from tenancy.oidc import GroupRolesOIDCBackend
from tenancy.scoping import scope_for
from tests.conftest import REPO
from tests.tenancy.oidc_provider import Provider

pytestmark = pytest.mark.django_db

GROUP_ROLES = "bw-ops=operator,acme-admins=tenant_admin@acme,acme-devs=member@acme,globex-devs=member@globex"
ALICE = {"sub": "u-alice", "email": "alice@acme.example", "email_verified": True, "preferred_username": "alice",
         "given_name": "Alice", "family_name": "Liddell"}


@pytest.fixture
def tenants():
    return {slug: do_create_tenant(slug.title(), slug, kind="organisation", actor="test")
            for slug in ("acme", "globex")}


@pytest.fixture(params=["RS256", "HS256"])
def provider(request, settings, tenants):
    """The provider, and this project configured as its client (as settings.py would from the environment)."""
    with Provider(request.param) as p:
        for name, value in p.settings().items():
            setattr(settings, name, value)
        settings.OIDC_GROUP_ROLES = _oidc_group_roles(GROUP_ROLES)
        settings.OIDC_GROUPS_CLAIM = "groups"
        settings.OIDC_RP_SCOPES = "openid email profile groups"
        settings.OIDC_USERNAME_ALGO = "tenancy.oidc.username_from_claims"
        settings.OIDC_TIMEOUT = 5
        settings.AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend",
                                            "tenancy.oidc.GroupRolesOIDCBackend"]
        settings.ROOT_URLCONF = "tests.tenancy.oidc_urls"
        yield p


def login(provider: Provider, claims: dict, *, nonce: str = "n-0123456789", session_nonce: str | None = None):
    """One authorization-code round: the provider's /authorize gives a code, the backend's authenticate()
    trades it at /token, checks the ID token (against the session's nonce) and reads /userinfo."""
    provider.claims = claims
    callback = "http://testserver/oidc/callback/"
    grant = requests.get(f"{provider.url}/authorize", allow_redirects=False, timeout=5, params={
        "client_id": "breakwater-test", "redirect_uri": callback, "state": "st-1", "nonce": nonce,
        "response_type": "code", "scope": "openid email profile groups"})
    code = parse_qs(urlsplit(grant.headers["Location"]).query)["code"][0]
    request = RequestFactory().get("/oidc/callback/", {"code": code, "state": "st-1"})
    request.session = SessionStore()
    return GroupRolesOIDCBackend().authenticate(request, nonce=session_nonce or nonce)


def roles(user) -> dict:
    return {(m.tenant.slug if m.tenant else None): (m.role, m.source)
            for m in Membership.objects.filter(user=user).select_related("tenant")}


def test_first_login_creates_the_user_with_the_roles_its_groups_grant(provider, tenants):
    user = login(provider, {**ALICE, "groups": ["acme-devs", "globex-devs", "unmapped-group"]})

    assert user.username == "alice" and user.email == "alice@acme.example" and user.last_name == "Liddell"
    assert roles(user) == {"acme": ("member", "oidc"), "globex": ("member", "oidc")}
    scope = scope_for(get_user_model().objects.get(pk=user.pk))
    assert not scope.operator and scope.slugs == {"acme", "globex"}
    assert provider.token_requests[-1]["client_secret"]  # the code was traded with the client's credentials


def test_each_login_resyncs_removed_groups_lose_their_roles_and_local_roles_stay(provider, tenants):
    first = login(provider, {**ALICE, "groups": ["acme-devs", "globex-devs"]})
    other = do_create_tenant("Initech", "initech", kind="organisation", actor="test")
    do_add_membership(first, other, "viewer", actor="an operator")  # granted by hand: not the provider's

    again = login(provider, {**ALICE, "groups": ["acme-admins", "acme-devs"]})

    assert again.pk == first.pk  # the same account, found by its verified email
    assert roles(again) == {"acme": ("tenant_admin", "oidc"), "initech": ("viewer", "local")}
    login(provider, {**ALICE, "groups": []})
    assert roles(again) == {"initech": ("viewer", "local")}


def test_the_operator_group_makes_an_operator_until_it_is_taken_away(provider, tenants):
    user = login(provider, {**ALICE, "groups": ["bw-ops"]})
    assert roles(user) == {None: ("operator", "oidc")}
    assert scope_for(get_user_model().objects.get(pk=user.pk)).operator

    login(provider, {**ALICE, "groups": ["acme-devs"]})
    refreshed = get_user_model().objects.get(pk=user.pk)
    assert roles(refreshed) == {"acme": ("member", "oidc")} and not scope_for(refreshed).operator


def test_a_mapping_to_a_tenant_that_does_not_exist_grants_nothing(provider, tenants, settings):
    settings.OIDC_GROUP_ROLES = _oidc_group_roles("ghost-devs=member@ghost,acme-devs=member@acme")
    user = login(provider, {**ALICE, "groups": ["ghost-devs", "acme-devs"]})
    assert roles(user) == {"acme": ("member", "oidc")}


def test_an_unverified_email_never_opens_an_account(provider, tenants, django_user_model):
    django_user_model.objects.create_user("root", email="alice@acme.example", is_staff=True)
    assert login(provider, {**ALICE, "email_verified": False, "groups": ["bw-ops"]}) is None
    assert not Membership.objects.exists()


def test_a_deactivated_user_is_refused_and_keeps_no_new_roles(provider, tenants, django_user_model):
    django_user_model.objects.create_user("alice", email="alice@acme.example", is_active=False)
    assert login(provider, {**ALICE, "groups": ["acme-devs"]}) is None
    assert not Membership.objects.exists()


def test_a_wrong_nonce_or_a_foreign_signature_is_refused(provider, tenants):
    with pytest.raises(SuspiciousOperation):  # the ID token carries the nonce of another login
        login(provider, {**ALICE, "groups": ["bw-ops"]}, session_nonce="n-of-another-login")
    if provider.algo == "RS256":
        provider.signing_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        with pytest.raises(SuspiciousOperation):  # signed by a key the provider's JWKS does not hold
            login(provider, {**ALICE, "groups": ["bw-ops"]})
    assert not Membership.objects.exists()


def test_the_whole_browser_flow_signs_in_and_lands_a_member_on_the_portal(provider, tenants):
    provider.claims = {**ALICE, "groups": ["acme-devs"]}
    client = Client()
    start = client.get("/oidc/authenticate/")
    assert start.status_code == 302 and start["Location"].startswith(f"{provider.url}/authorize?")
    back = requests.get(start["Location"], allow_redirects=False, timeout=5)
    callback = urlsplit(back.headers["Location"])
    assert callback.path == "/oidc/callback/"

    done = client.get(f"{callback.path}?{callback.query}")

    assert done.status_code == 302
    assert client.get("/").status_code == 403  # an operator page: not for a tenant's member
    assert client.get("/portal/acme/").status_code == 200
    assert client.get("/portal/globex/").status_code in (403, 404)


# --- Settings: only dashboard/settings.py reads the environment ------------------------------------------

def test_group_roles_parse_into_role_and_tenant_per_group():
    assert _oidc_group_roles(GROUP_ROLES) == {
        "bw-ops": ("operator", None), "acme-admins": ("tenant_admin", "acme"), "acme-devs": ("member", "acme"),
        "globex-devs": ("member", "globex")}
    assert _oidc_group_roles(" a = viewer@t1 , ") == {"a": ("viewer", "t1")}


@pytest.mark.parametrize(("raw", "says"), [
    ("ops", "is not group=role"), ("ops=root", "is not group=role"), ("ops=operator@acme", "takes no @tenant"),
    ("devs=member", "needs @tenant-slug"), ("devs=member@a/b", "is not a tenant slug"),
    ("a=viewer@x,a=member@y", "mapped twice"),
])
def test_bad_group_roles_are_refused_naming_the_variable(raw, says):
    with pytest.raises(ImproperlyConfigured, match=f"OIDC_GROUP_ROLES: .*{says}"):
        _oidc_group_roles(raw)


def _django_starts(env: dict) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OIDC_")}
    code = "import django; django.setup(); from django.conf import settings; print(settings.AUTHENTICATION_BACKENDS)"
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**base, "DJANGO_SETTINGS_MODULE": "dashboard.settings", **env})


def test_settings_turn_sso_on_from_the_environment_and_name_a_missing_variable():
    full = {"OIDC_RP_CLIENT_ID": "bw", "OIDC_RP_CLIENT_SECRET": "x", "OIDC_OP_AUTHORIZATION_ENDPOINT": "https://i/a",
            "OIDC_OP_TOKEN_ENDPOINT": "https://i/t", "OIDC_OP_USER_ENDPOINT": "https://i/u",
            "OIDC_OP_JWKS_ENDPOINT": "https://i/j", "OIDC_GROUP_ROLES": "bw-ops=operator"}
    assert "tenancy.oidc.GroupRolesOIDCBackend" in _django_starts(full).stdout
    assert "GroupRolesOIDCBackend" not in _django_starts({}).stdout  # off unless configured
    missing = _django_starts({k: v for k, v in full.items() if k != "OIDC_OP_JWKS_ENDPOINT"})
    assert missing.returncode != 0 and "OIDC_OP_JWKS_ENDPOINT must be set" in missing.stderr
    bad_url = _django_starts({**full, "OIDC_OP_TOKEN_ENDPOINT": "ftp://i/t"})
    assert bad_url.returncode != 0 and "OIDC_OP_TOKEN_ENDPOINT must be an http(s) URL" in bad_url.stderr
