"""Writes of tenants, memberships, scheduler-account mappings and API tokens.

Each action runs in one transaction with its audit entry (the append-only log the operators read at
/audit/). Bad input is a ValidationError keyed by the field at fault, so a command, a form or the API can
name it. API tokens: only the SHA-256 is stored; the raw token is returned once, by do_create_api_token.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.audit import actor_name, do_audit
from tenancy.models import AccountKind, ApiToken, BillingMode, Membership, Role, Tenant, TenantAccount, TenantKind
from tenancy.scoping import ROLE_ORDER, scope_for

logger = logging.getLogger(__name__)


def _actor(actor) -> str:
    return actor if isinstance(actor, str) else actor_name(actor)


def _forget_scope(user) -> None:
    # scope_for memoises on the user object; a changed role must show on this object too.
    user.__dict__.pop("_bw_scope", None)


def _tenant(value, field: str = "tenant") -> Tenant:
    """A Tenant from itself, its id or its slug; ValidationError naming `field` when there is none."""
    if isinstance(value, Tenant):
        return value
    found = Tenant.objects.filter(**({"pk": value} if isinstance(value, int) else {"slug": value})).first()
    if found is None:
        raise ValidationError({field: f"no tenant {value!r}"})
    return found


def _save(obj, unique_field: str, message: str) -> None:
    """Validate and insert; a unique constraint lost to a concurrent insert names `unique_field` too."""
    obj.full_clean()
    try:
        with transaction.atomic():  # a savepoint: a lost race must not poison the caller's transaction
            obj.save()
    except IntegrityError as exc:
        raise ValidationError({unique_field: message}) from exc


@transaction.atomic
def do_create_tenant(name: str, slug: str, *, kind: str = TenantKind.TEAM, parent=None,
                     billing_mode: str = "invoice", currency: str = "USD", actor=None) -> Tenant:
    """A new tenant: an organisation (no parent), or a team or project under one (`parent`: Tenant or slug)."""
    tenant = Tenant(name=(name or "").strip(), slug=(slug or "").strip(), kind=kind, billing_mode=billing_mode,
                    currency=currency, parent=_tenant(parent, "parent") if parent else None)
    _save(tenant, "slug", "a tenant with this name or slug already exists")
    do_audit(_actor(actor), "tenant.create", "tenant", tenant.slug,
             detail={"name": tenant.name, "kind": tenant.kind, "parent": tenant.parent.slug if tenant.parent else None})
    return tenant


@transaction.atomic
def do_map_account(tenant, kind: str, name: str, *, actor=None) -> TenantAccount:
    """Jobs of this Slurm account (kind "slurm") or Kubernetes namespace ("k8s") belong to `tenant` from now on."""
    if kind not in AccountKind.values:
        raise ValidationError({"kind": f"{kind!r} is not one of {', '.join(AccountKind.values)}"})
    account = TenantAccount(tenant=_tenant(tenant), kind=kind, name=(name or "").strip())
    _save(account, "name", "this account already belongs to a tenant")
    do_audit(_actor(actor), "tenant.map_account", "tenant", account.tenant.slug, detail={"kind": kind, "name": name})
    return account


def _check_role(role: str, tenant: Tenant | None) -> None:
    if role not in Role.values:
        raise ValidationError({"role": f"{role!r} is not one of {', '.join(Role.values)}"})
    if role == Role.OPERATOR and tenant is not None:
        raise ValidationError({"tenant": "operators hold the whole cluster: give no tenant"})
    if role != Role.OPERATOR and tenant is None:
        raise ValidationError({"tenant": f"a {role} belongs to a tenant: name one"})


@transaction.atomic
def do_set_billing_mode(tenant: Tenant, mode: str, *, actor=None) -> Tenant:
    """Bill the tenant (invoice) or only show its cost (showback); drafts follow at their next generation."""
    if mode not in BillingMode.values:
        raise ValidationError({"billing_mode": f"{mode!r} is not one of {', '.join(BillingMode.values)}"})
    previous = Tenant.objects.select_for_update().get(pk=tenant.pk).billing_mode
    Tenant.objects.filter(pk=tenant.pk).update(billing_mode=mode)
    do_audit(_actor(actor), "tenant.billing_mode", "tenant", tenant.slug,
             detail={"billing_mode": mode, "previous": previous})
    tenant.billing_mode = mode
    return tenant


@transaction.atomic
def do_add_membership(user, tenant, role: str, *, source: str = "local", actor=None) -> Membership:
    """Give `user` `role` in `tenant` (None with role "operator"); a role already held there is replaced."""
    tenant = _tenant(tenant) if tenant is not None else None
    _check_role(role, tenant)
    row, created = Membership.objects.select_for_update().get_or_create(
        user=user, tenant=tenant, defaults={"role": role, "source": source})
    previous = None if created else row.role
    if not created and (row.role, row.source) != (role, source):
        row.role, row.source = role, source
        row.full_clean()
        row.save(update_fields=["role", "source"])
    _forget_scope(user)
    do_audit(_actor(actor), "membership.add", "user", user.get_username(),
             detail={"tenant": tenant and tenant.slug, "role": role, "previous": previous, "source": source})
    return row


@transaction.atomic
def do_remove_membership(user, tenant, *, actor=None) -> bool:
    """Take away `user`'s role in `tenant` (None: the operator role); False when there was none."""
    tenant = _tenant(tenant) if tenant is not None else None
    deleted, _ = Membership.objects.filter(user=user, tenant=tenant).delete()
    _forget_scope(user)
    if deleted:
        do_audit(_actor(actor), "membership.remove", "user", user.get_username(),
                 detail={"tenant": tenant.slug if tenant else None})
    return bool(deleted)


_RANK = {**ROLE_ORDER, Role.OPERATOR: len(ROLE_ORDER)}


def desired_roles(groups: list[str], mapping: dict[str, tuple[str, str | None]]) -> dict[int | None, str]:
    """Roles per tenant id (None: operator) that `groups` grant through `mapping` (group -> (role, slug)).

    Two groups granting roles in one tenant give the stronger; a slug with no tenant grants nothing.
    """
    want: dict[int | None, str] = {}
    slugs = {mapping[g][1] for g in groups if g in mapping and mapping[g][1]}
    ids = dict(Tenant.objects.filter(slug__in=slugs).values_list("slug", "id"))
    for group in groups:
        if group not in mapping:
            continue
        role, slug = mapping[group]
        key = None if slug is None else ids.get(slug)
        if slug is not None and key is None:
            logger.warning("OIDC group %s maps to tenant %r, which does not exist", group, slug)
            continue
        if key not in want or _RANK[role] > _RANK[want[key]]:
            want[key] = role
    return want


@transaction.atomic
def do_sync_oidc_memberships(user, groups: list[str], mapping: dict[str, tuple[str, str | None]]) -> dict:
    """Make `user`'s OIDC-sourced memberships exactly what `groups` grant; local memberships are left alone.

    1. Compute the wanted role per tenant from the group claims.
    2. Delete OIDC rows that are no longer wanted (a group left at the provider loses its role here).
    3. Create or update OIDC rows for the rest, except where a local row holds that tenant (an operator's
       hand-made grant wins over the provider's).
    """
    want = desired_roles(groups, mapping)
    rows = {m.tenant_id: m for m in Membership.objects.select_for_update().filter(user=user)}
    removed = [t for t, m in rows.items() if m.source == "oidc" and t not in want]
    Membership.objects.filter(user=user, source="oidc", tenant_id__in=[t for t in removed if t is not None]).delete()
    if None in removed:
        Membership.objects.filter(user=user, source="oidc", tenant__isnull=True).delete()
    changed = []
    for tenant_id, role in want.items():
        row = rows.get(tenant_id)
        if row is None:
            Membership.objects.create(user=user, tenant_id=tenant_id, role=role, source="oidc")
        elif row.source == "oidc" and row.role != role:
            Membership.objects.filter(pk=row.pk).update(role=role)
        else:
            continue
        changed.append(tenant_id)
    _forget_scope(user)
    if removed or changed:
        do_audit("oidc", "membership.sync", "user", user.get_username(),
                 detail={"groups": sorted(groups), "removed": removed, "set": {str(t): want[t] for t in changed}})
    return {"removed": len(removed), "changed": len(changed), "roles": want}


def _check_token_owner(user, tenant: Tenant | None, read_only: bool) -> None:
    """A token never reaches further than its owner: an operator token needs an operator, a tenant's
    read-write token a member (or admin) of it."""
    if user is None:
        return
    scope = scope_for(user)
    if tenant is None and not scope.operator:
        raise ValidationError({"tenant": f"{user.get_username()} is no operator: an operator token needs one"})
    if tenant is not None and not scope.can(tenant.pk, "viewer" if read_only else "member"):
        need = "a role" if read_only else "at least the member role"
        raise ValidationError({"user": f"{user.get_username()} needs {need} in {tenant.slug} for this token"})


@transaction.atomic
def do_create_api_token(name: str, *, tenant=None, user=None, read_only: bool = True,
                        expires_at: datetime | None = None, actor=None) -> tuple[ApiToken, str]:
    """A new API token scoped to `tenant` (None: an operator token). Returns it and the raw secret, which is
    never stored and cannot be shown again."""
    tenant = _tenant(tenant) if tenant is not None else None
    name = (name or "").strip()
    if not name:
        raise ValidationError({"name": "give the token a name (what or who uses it)"})
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError({"expires_at": "the expiry is in the past"})
    _check_token_owner(user, tenant, read_only)
    raw = ApiToken.new_secret()
    token = ApiToken(name=name, user=user, tenant=tenant, token_hash=ApiToken.hash(raw),
                     prefix=raw[:len(ApiToken.PREFIX) + 4], read_only=read_only, expires_at=expires_at)
    _save(token, "name", "token collision; try again")
    do_audit(_actor(actor), "token.create", "api_token", token.pk,
             detail={"name": name, "tenant": tenant and tenant.slug, "read_only": read_only, "prefix": token.prefix,
                     "user": user and user.get_username()})
    return token, raw


@transaction.atomic
def do_revoke_api_token(token_id: int, *, actor=None, now: datetime | None = None) -> ApiToken:
    """Revoke a token now (revoking it again changes nothing); ValidationError when there is no such token."""
    token = ApiToken.objects.select_for_update().filter(pk=token_id).first()
    if token is None:
        raise ValidationError({"token": f"no API token with id {token_id}"})
    if token.revoked_at is None:
        token.revoked_at = now or timezone.now()
        token.save(update_fields=["revoked_at"])
        do_audit(_actor(actor), "token.revoke", "api_token", token.pk, detail={"name": token.name,
                                                                              "prefix": token.prefix})
    return token
