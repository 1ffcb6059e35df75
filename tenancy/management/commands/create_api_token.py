"""Make an API token, scoped to one tenant or an operator token. The raw token is shown once; only its hash
is kept."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from tenancy.actions import do_create_api_token
from tenancy.management.commands.tenants import _errors


class Command(BaseCommand):
    help = "Create an API token for a tenant (--tenant SLUG) or for operators (--operator)."

    def add_arguments(self, parser):
        parser.add_argument("name", help="What or who uses the token, e.g. 'acme-ci'")
        scope = parser.add_mutually_exclusive_group(required=True)
        scope.add_argument("--tenant", help="Slug of the tenant the token reads (and writes, with --read-write)")
        scope.add_argument("--operator", action="store_true", help="An operator token: the whole cluster")
        parser.add_argument("--user", help="Owner; the token never reaches further than this user's role")
        parser.add_argument("--read-write", action="store_true", help="Allow writes (default: read-only)")
        parser.add_argument("--expires-days", type=int, help="Expire after this many days (default: never)")
        parser.add_argument("--quiet", action="store_true", help="Print only the token")

    def handle(self, *args, name, tenant, operator, user, read_write, expires_days, quiet, **options):
        owner = None
        if user:
            owner = get_user_model().objects.filter(username=user).first()
            if owner is None:
                raise CommandError(f"user: no user {user!r}")
        if expires_days is not None and expires_days < 1:
            raise CommandError("expires-days: at least 1")
        expires = timezone.now() + timedelta(days=expires_days) if expires_days else None
        try:
            token, raw = do_create_api_token(name, tenant=None if operator else tenant, user=owner,
                                             read_only=not read_write, expires_at=expires,
                                             actor="manage.py create_api_token")
        except ValidationError as exc:
            raise CommandError(_errors(exc)) from exc
        if quiet:
            self.stdout.write(raw)
            return
        scope = "operator (whole cluster)" if token.is_operator else f"tenant {token.tenant.slug}"
        mode = "read-only" if token.read_only else "read-write"
        self.stdout.write(f"API token {token.name!r}, {scope}, {mode} (shown once, store it now):\n{raw}")
