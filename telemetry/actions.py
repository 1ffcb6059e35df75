"""Writes owned by telemetry. Each action runs in one transaction."""

from __future__ import annotations

from django.db import transaction

from telemetry.models import CollectorToken


@transaction.atomic
def do_create_collector_token(name: str, *, replace: bool = False) -> str:
    """Create a token for collector `name` and return the raw value (never stored)."""
    existing = CollectorToken.objects.filter(name=name).first()
    if existing and not replace:
        raise ValueError(f"a collector token named {name!r} exists; pass --replace to rotate it")
    if existing:
        existing.delete()
    raw = CollectorToken.generate()
    CollectorToken.objects.create(name=name, prefix=raw[:10], token_hash=CollectorToken.hash(raw))
    return raw
