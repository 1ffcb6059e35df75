"""Single sign-on through OpenID Connect (mozilla-django-oidc), with roles from the provider's groups.

Configured by environment in dashboard/settings.py (off unless OIDC_RP_CLIENT_ID is set). At every login the
user's OIDC-sourced memberships are made exactly what the group claim grants through OIDC_GROUP_ROLES
(tenancy.actions.do_sync_oidc_memberships): a group left at the provider loses its role at the next login.
Memberships made by hand (source "local") are never touched.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.contrib.auth import get_user_model
from mozilla_django_oidc.auth import OIDCAuthenticationBackend, default_username_algo

from tenancy.actions import do_sync_oidc_memberships

logger = logging.getLogger(__name__)


def username_from_claims(email: str, claims: dict | None = None) -> str:
    """The provider's preferred_username when it is free, else a stable hash of the email (never a clash)."""
    wanted = ((claims or {}).get("preferred_username") or "").strip()[:150]
    if wanted and not get_user_model().objects.filter(username=wanted).exists():
        return wanted
    return default_username_algo(email, claims)


def group_claim(claims: dict) -> list[str]:
    """The groups in the configured claim: a list, or one string (some providers send one group bare)."""
    raw = claims.get(getattr(settings, "OIDC_GROUPS_CLAIM", "groups")) or []
    if isinstance(raw, str):
        raw = [raw]
    return [str(g) for g in raw if isinstance(g, str | int)]


class GroupRolesOIDCBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's code-flow backend; users are matched by verified email, roles synced from groups."""

    def get_userinfo(self, access_token, id_token, payload):
        # Providers put groups in the ID token, the userinfo answer, or both: read them together.
        return {**(payload or {}), **super().get_userinfo(access_token, id_token, payload)}

    def verify_claims(self, claims) -> bool:
        # Users are matched by email: an address the provider has not verified must not open someone's account.
        return bool(claims.get("email")) and claims.get("email_verified", True) is not False

    def create_user(self, claims):
        user = super().create_user(claims)
        return self.update_user(user, claims)

    def update_user(self, user, claims):
        if not user.is_active:
            logger.info("OIDC login refused: %s is deactivated", user.get_username())
            return None
        names = {"first_name": claims.get("given_name", ""), "last_name": claims.get("family_name", "")}
        changed = [k for k, v in names.items() if v and getattr(user, k) != v[:150]]
        for k in changed:
            setattr(user, k, names[k][:150])
        if changed:
            user.save(update_fields=changed)
        result = do_sync_oidc_memberships(user, group_claim(claims), settings.OIDC_GROUP_ROLES)
        logger.info("OIDC login %s: roles %s", user.get_username(), result["roles"])
        return user
