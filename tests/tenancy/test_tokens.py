"""API tokens and the tenancy actions and commands: created once (only the hash kept), scoped, read-only by
default, revocable and expiring; validation errors that name the field; the `tenants` and `create_api_token`
management commands."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from alerts.models import Rule
from core.models import AuditEntry
from tenancy.actions import (
    do_add_membership,
    do_create_api_token,
    do_create_tenant,
    do_map_account,
    do_remove_membership,
    do_revoke_api_token,
)
from tenancy.models import ApiToken, Membership, Tenant, TenantAccount
from tenancy.scoping import scope_for

pytestmark = pytest.mark.django_db

RULE = {"name": "HbmHot", "kind": "threshold", "metric": "memory_temp", "op": ">", "threshold": 95,
        "severity": "warning"}


@pytest.fixture
def acme():
    return do_create_tenant("Acme", "acme", kind="organisation", actor="test")


def api(method: str, path: str, raw: str, body: dict | None = None):
    client = Client(enforce_csrf_checks=True)  # a token request carries no cookie, so CSRF must not apply
    kwargs = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}
    if body is not None:
        kwargs.update(data=json.dumps(body), content_type="application/json")
    return getattr(client, method)(f"/api/v1{path}", **kwargs)


def field_of(exc: pytest.ExceptionInfo) -> list[str]:
    return list(exc.value.message_dict)


# --- Tokens -----------------------------------------------------------------------------------------------

def test_a_token_is_shown_once_and_only_its_hash_is_kept(acme):
    token, raw = do_create_api_token("acme-ci", tenant=acme, actor="test")
    stored = ApiToken.objects.get(pk=token.pk)
    assert raw.startswith("bwt_") and len(raw) > 40 and raw not in json.dumps(list(ApiToken.objects.values()),
                                                                               default=str)
    assert stored.token_hash == ApiToken.hash(raw) and stored.prefix == raw[:8] and stored.read_only
    assert AuditEntry.objects.filter(verb="token.create", object_id=str(token.pk)).exists()


def test_a_read_only_operator_token_reads_but_cannot_write():
    _, raw = do_create_api_token("ops-dashboard", actor="test")
    assert api("get", "/rules", raw).status_code == 200
    resp = api("post", "/rules", raw, RULE)
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "read_only_token"
    assert not Rule.objects.exists()


def test_a_read_write_operator_token_writes_without_csrf_and_the_owner_is_the_actor(django_user_model):
    owner = django_user_model.objects.create_user("olivia", is_staff=True)
    _, raw = do_create_api_token("ops-script", user=owner, read_only=False, actor="test")
    resp = api("post", "/rules", raw, RULE)
    assert resp.status_code == 201, resp.content
    assert Rule.objects.get(name="HbmHot").created_by == owner
    assert AuditEntry.objects.filter(verb="rule.create", actor="olivia").exists()


def test_a_revoked_or_expired_token_is_refused(acme):
    token, raw = do_create_api_token("acme-ci", tenant=acme, actor="test")
    assert api("get", "/alerts", raw).status_code == 200
    do_revoke_api_token(token.pk, actor="test")
    do_revoke_api_token(token.pk, actor="test")  # twice changes nothing
    resp = api("get", "/alerts", raw)
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "revoked_token"
    assert AuditEntry.objects.filter(verb="token.revoke").count() == 1

    later, raw2 = do_create_api_token("acme-cron", tenant=acme, expires_at=timezone.now() + timedelta(hours=1))
    ApiToken.objects.filter(pk=later.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    resp = api("get", "/alerts", raw2)
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "expired_token"


def test_use_is_recorded_at_most_once_a_minute(acme):
    token, raw = do_create_api_token("acme-ci", tenant=acme, actor="test")
    api("get", "/alerts", raw)
    first = ApiToken.objects.get(pk=token.pk).last_used
    api("get", "/alerts", raw)
    assert first is not None and ApiToken.objects.get(pk=token.pk).last_used == first


def test_a_token_reaches_no_further_than_its_owner(acme, django_user_model):
    viewer = django_user_model.objects.create_user("vic")
    do_add_membership(viewer, acme, "viewer", actor="test")
    with pytest.raises(ValidationError) as exc:
        do_create_api_token("vic-ops", user=viewer, actor="test")
    assert field_of(exc) == ["tenant"]
    with pytest.raises(ValidationError) as exc:
        do_create_api_token("vic-rw", tenant=acme, user=viewer, read_only=False, actor="test")
    assert field_of(exc) == ["user"]
    token, _ = do_create_api_token("vic-ro", tenant=acme, user=viewer, actor="test")
    assert scope_for(token).roles == {acme.pk: "viewer"}


def test_a_token_stops_working_when_its_owner_loses_the_role(acme, django_user_model):
    dev = django_user_model.objects.create_user("dev")
    do_add_membership(dev, acme, "member", actor="test")
    _, raw = do_create_api_token("dev-ci", tenant=acme, user=dev, actor="test")
    assert api("get", "/alerts", raw).status_code == 200
    do_remove_membership(dev, acme, actor="test")
    resp = api("get", "/alerts", raw)
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "owner_lost_role"


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"name": " "}, "name"), ({"name": "x", "expires_at": "past"}, "expires_at"),
    ({"name": "x", "tenant": "no-such-tenant"}, "tenant"),
])
def test_bad_token_input_names_the_field(acme, kwargs, field):
    if kwargs.get("expires_at") == "past":
        kwargs["expires_at"] = timezone.now() - timedelta(days=1)
    name = kwargs.pop("name")
    with pytest.raises(ValidationError) as exc:
        do_create_api_token(name, actor="test", **kwargs)
    assert field_of(exc) == [field]
    assert not ApiToken.objects.exists()


def test_revoking_an_unknown_token_names_it():
    with pytest.raises(ValidationError) as exc:
        do_revoke_api_token(999_999)
    assert field_of(exc) == ["token"]


# --- Tenancy actions --------------------------------------------------------------------------------------

def test_tenant_hierarchy_rules_name_the_parent_field(acme):
    with pytest.raises(ValidationError) as exc:
        do_create_tenant("Loose Team", "loose", kind="team")
    assert field_of(exc) == ["parent"]
    team = do_create_tenant("Acme ML", "acme-ml", kind="team", parent="acme")
    with pytest.raises(ValidationError) as exc:
        do_create_tenant("Nested", "nested", kind="project", parent=team)
    assert field_of(exc) == ["parent"]
    with pytest.raises(ValidationError) as exc:
        do_create_tenant("Acme", "acme-2", kind="organisation")
    assert field_of(exc) == ["name"]
    assert Tenant.objects.count() == 2


def test_an_account_maps_to_one_tenant_only(acme):
    other = do_create_tenant("Globex", "globex", kind="organisation")
    do_map_account(acme, "slurm", "acme-acct")
    with pytest.raises(ValidationError) as exc:
        do_map_account(other, "slurm", "acme-acct")
    assert "__all__" in exc.value.message_dict or field_of(exc) == ["name"]
    with pytest.raises(ValidationError) as exc:
        do_map_account(other, "pbs", "q1")
    assert field_of(exc) == ["kind"]
    assert list(TenantAccount.objects.values_list("tenant__slug", "name")) == [("acme", "acme-acct")]


def test_memberships_replace_a_role_and_check_operator_rows(acme, django_user_model):
    user = django_user_model.objects.create_user("uma")
    do_add_membership(user, acme, "viewer", actor="test")
    assert scope_for(user).roles == {acme.pk: "viewer"}
    do_add_membership(user, acme, "tenant_admin", actor="test")  # the scope memo on `user` is refreshed
    assert scope_for(user).roles == {acme.pk: "tenant_admin"}
    for tenant, role, field in [(acme, "operator", "tenant"), (None, "member", "tenant"), (acme, "owner", "role")]:
        with pytest.raises(ValidationError) as exc:
            do_add_membership(user, tenant, role)
        assert field_of(exc) == [field]
    assert do_remove_membership(user, acme, actor="test") and not do_remove_membership(user, acme)
    assert not Membership.objects.exists()


# --- Commands ---------------------------------------------------------------------------------------------

def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_tenants_command_adds_maps_grants_and_lists(django_user_model):
    django_user_model.objects.create_user("alice")
    django_user_model.objects.create_user("root")
    run("tenants", "add", "acme", "--name", "Acme Corp", "--kind", "organisation")
    run("tenants", "add", "acme-ml", "--parent", "acme")
    run("tenants", "map", "acme-ml", "k8s", "ml-training")
    run("tenants", "member", "alice", "member", "acme")
    run("tenants", "member", "root", "operator")
    listing = run("tenants", "list")
    assert "acme\torganisation" in listing and "acme-ml\tteam in acme" in listing
    assert "k8s:ml-training" in listing and "alice=member" in listing and "operators (role): root" in listing


@pytest.mark.parametrize(("args", "says"), [
    (("tenants", "add", "team-x"), "parent: a team belongs to an organisation"),
    (("tenants", "map", "nope", "slurm", "a"), "tenant: no tenant 'nope'"),
    (("tenants", "member", "ghost", "member", "acme"), "username: no user 'ghost'"),
    (("tenants", "member", "alice", "operator", "acme"), "operators hold the whole cluster"),
    (("tenants", "member", "alice", "viewer"), "tenant: a viewer belongs to a tenant"),
])
def test_tenants_command_errors_name_the_argument(acme, django_user_model, args, says):
    django_user_model.objects.create_user("alice")
    with pytest.raises(CommandError, match=says):
        run(*args)


def test_create_api_token_prints_the_token_once_and_it_works(acme):
    out = run("create_api_token", "acme-ci", "--tenant", "acme")
    raw = out.strip().splitlines()[-1]
    assert "tenant acme, read-only (shown once" in out and raw.startswith("bwt_")
    assert api("get", "/alerts", raw).status_code == 200
    quiet = run("create_api_token", "ops", "--operator", "--read-write", "--quiet", "--expires-days", "30").strip()
    token = ApiToken.objects.get(token_hash=ApiToken.hash(quiet))
    assert token.is_operator and not token.read_only and token.expires_at is not None


def test_create_api_token_refuses_an_owner_without_the_role(acme, django_user_model):
    django_user_model.objects.create_user("bob")
    with pytest.raises(CommandError, match="user: bob needs a role in acme"):
        run("create_api_token", "bob-ci", "--tenant", "acme", "--user", "bob")
    with pytest.raises(CommandError, match="tenant: bob is no operator"):
        run("create_api_token", "bob-ops", "--operator", "--user", "bob")
