"""What the header shows a user: the operator console, or the portals of the tenants they belong to."""

from __future__ import annotations

from django import template

from dashboard.pages.portal import root_tenants
from tenancy.scoping import scope_for

register = template.Library()


@register.simple_tag(takes_context=True)
def nav_scope(context) -> dict:
    """{"operator": bool, "tenants": [Tenant]} for the signed-in user; tenants are listed for non-operators.

    The header is drawn on every page: a tenant's user must never be shown a link to an operator page.
    """

    request = context.get("request")
    user = getattr(request, "user", None) or context.get("user")
    if scope_for(user).operator:
        return {"operator": True, "tenants": []}
    return {"operator": False, "tenants": root_tenants(user)}
