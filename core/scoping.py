"""The base of tenant scoping: `Model.objects.visible_to(who)` on any app's models.

The rules (who sees which rows) are the tenancy app's, which installs them when Django starts
(tenancy.apps); the models that are scoped live in several apps, below and above tenancy, and all of them
take their manager from here, so none imports tenancy for it.
"""

from __future__ import annotations

from collections.abc import Callable

from django.core.exceptions import ImproperlyConfigured
from django.db import models

_visible: Callable[[models.QuerySet, object], models.QuerySet] | None = None


def install(visible: Callable[[models.QuerySet, object], models.QuerySet]) -> None:
    """Set the function that narrows a queryset to what a user or token may see (tenancy.scoping.visible)."""
    global _visible
    _visible = visible


class ScopedQuerySet(models.QuerySet):
    """Adds `.visible_to(who)`: the rows `who` (a user, an API token) may see."""

    def visible_to(self, who) -> models.QuerySet:
        if _visible is None:
            raise ImproperlyConfigured("tenant scoping is not installed: add 'tenancy' to INSTALLED_APPS")
        return _visible(self, who)
