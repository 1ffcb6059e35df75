"""List and manage tenants: add one, map a Slurm account or Kubernetes namespace to it, give a user a role."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from tenancy.actions import do_add_membership, do_create_tenant, do_map_account, do_remove_membership
from tenancy.models import AccountKind, BillingMode, Membership, Role, Tenant, TenantKind


def _errors(exc: ValidationError) -> str:
    """`field: message` for each problem, so the operator knows which argument to fix."""
    if hasattr(exc, "error_dict"):
        return "; ".join(f"{field}: {msg}" for field, msgs in exc.message_dict.items() for msg in msgs)
    return "; ".join(exc.messages)


class Command(BaseCommand):
    help = "Tenants: list, add, map (scheduler accounts), member (roles)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="verb", required=True)
        sub.add_parser("list", help="Every tenant with its accounts and members")
        add = sub.add_parser("add", help="Create a tenant")
        add.add_argument("slug")
        add.add_argument("--name", help="Display name (default: the slug)")
        add.add_argument("--kind", choices=TenantKind.values, default=TenantKind.TEAM)
        add.add_argument("--parent", help="Slug of the organisation a team or project belongs to")
        add.add_argument("--billing", choices=BillingMode.values, default=BillingMode.INVOICE)
        add.add_argument("--currency", default="USD")
        mapping = sub.add_parser("map", help="Jobs of a Slurm account or Kubernetes namespace belong to a tenant")
        mapping.add_argument("slug")
        mapping.add_argument("kind", choices=AccountKind.values)
        mapping.add_argument("name", help="The Slurm account or the namespace")
        member = sub.add_parser("member", help="Give a user a role (operator: no tenant)")
        member.add_argument("username")
        member.add_argument("role", choices=Role.values)
        member.add_argument("slug", nargs="?", help="The tenant (not for operator)")
        member.add_argument("--remove", action="store_true", help="Take the user's role in the tenant away")

    def handle(self, *args, verb, **options):
        try:
            getattr(self, f"_{verb}")(**options)
        except ValidationError as exc:
            raise CommandError(_errors(exc)) from exc

    def _list(self, **options):
        tenants = Tenant.objects.select_related("parent").prefetch_related("accounts", "memberships__user")
        for t in tenants.order_by("parent_id", "slug"):
            accounts = ", ".join(str(a) for a in t.accounts.all()) or "-"
            members = ", ".join(f"{m.user.get_username()}={m.role}" for m in t.memberships.all()) or "-"
            parent = f" in {t.parent.slug}" if t.parent else ""
            self.stdout.write(f"{t.slug}\t{t.kind}{parent}\t{t.billing_mode}\taccounts: {accounts}\tmembers: {members}")
        operators = Membership.objects.filter(role=Role.OPERATOR).select_related("user")
        self.stdout.write("operators (role): " + (", ".join(m.user.get_username() for m in operators) or "-"))

    def _add(self, slug, name, kind, parent, billing, currency, **options):
        tenant = do_create_tenant(name or slug, slug, kind=kind, parent=parent, billing_mode=billing,
                                  currency=currency, actor="manage.py tenants")
        self.stdout.write(f"tenant {tenant.slug} created ({tenant.kind})")

    def _map(self, slug, kind, name, **options):
        account = do_map_account(slug, kind, name, actor="manage.py tenants")
        self.stdout.write(f"{account} now belongs to {slug}")

    def _member(self, username, role, slug, remove, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"username: no user {username!r}")
        tenant = None if role == Role.OPERATOR else slug
        if remove:
            gone = do_remove_membership(user, tenant, actor="manage.py tenants")
            self.stdout.write(f"{username}: role in {slug or 'the cluster'} {'removed' if gone else 'was not held'}")
            return
        if role == Role.OPERATOR and slug:
            raise CommandError("slug: operators hold the whole cluster; give no tenant")
        do_add_membership(user, tenant, role, actor="manage.py tenants")
        self.stdout.write(f"{username} is {role}" + (f" in {slug}" if tenant else " (whole cluster)"))
