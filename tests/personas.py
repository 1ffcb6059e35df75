"""Who the tests act as, defined once for every app's tests.

- `operator()`: staff, every operator page and API;
- `tenant_user(tenant, role)`: a member (or tenant_admin, viewer) of one tenant, who sees only its objects;
- `nobody()`: signed in, no role anywhere;
- anonymous: a bare `Client()`;
- tokens: `api_token(tenant)` (a tenant's), `api_token(None, read_only=False)` (an operator's), `collector_token()`.

`signed_in(user)` is a test client with that user's session. tests/tenancy/access_world.py builds the two-tenant
world of the isolation matrix from these.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.test import Client

from telemetry.actions import do_create_collector_token
from tenancy.actions import do_add_membership, do_create_api_token

PASSWORD = "pw-persona-12345"  # every persona's password (the sign-in tests type it)


def operator(username: str = "operator", *, superuser: bool = False):
    """A staff user: operators read and change everything (tenancy.scoping treats staff as operators)."""
    users = get_user_model().objects
    if superuser:
        return users.create_superuser(username, f"{username}@example.com", PASSWORD)
    return users.create_user(username, password=PASSWORD, is_staff=True)


def tenant_user(tenant, role: str = "member", username: str | None = None):
    """A user holding `role` (viewer, member, tenant_admin) in `tenant` and nowhere else."""
    user = get_user_model().objects.create_user(username or f"{tenant.slug}-{role}", password=PASSWORD)
    do_add_membership(user, tenant, role, actor="test")
    return user


def nobody(username: str = "nora"):
    """Signed in, with no role in any tenant: every page and endpoint refuses it."""
    return get_user_model().objects.create_user(username, password=PASSWORD)


def signed_in(user, client: Client | None = None) -> Client:
    """A client carrying `user`'s session (a fresh one unless `client` is given)."""
    client = client or Client(raise_request_exception=False)
    client.force_login(user)
    return client


def api_token(tenant=None, *, name: str | None = None, read_only: bool = True) -> str:
    """A raw API token: a tenant's (read-only by default), or an operator's with tenant=None."""
    return do_create_api_token(name or (f"{tenant.slug}-token" if tenant else "ops-token"), tenant=tenant,
                               read_only=read_only, actor="test")[1]


def collector_token(name: str = "rack-a01-agent") -> str:
    """A raw collector token: ingest only."""
    return do_create_collector_token(name)
