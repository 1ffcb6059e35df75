"""Tenants, who belongs to them, the scheduler accounts that map to them, and API tokens."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from core.api import API_TOKEN_PREFIX
from core.scoping import ScopedQuerySet


class TenantKind(models.TextChoices):
    """An organisation holds teams or projects."""

    ORGANISATION = "organisation", "Organisation"
    TEAM = "team", "Team"
    PROJECT = "project", "Project"


class BillingMode(models.TextChoices):
    """Invoice bills the tenant; showback shows the cost without billing it."""

    INVOICE = "invoice", "Invoice"
    SHOWBACK = "showback", "Showback"


class LostHoursPolicy(models.TextChoices):
    """What a tenant pays for GPU-hours after a hardware fault failed its job's GPU (UsageHour.failed_hours)."""

    CREDIT = "credit", "Credit: not charged"
    CHARGE = "charge", "Charge as GPU time"


class Tenant(models.Model):
    """A customer of the cluster: an organisation, or a team or project inside one."""

    objects = ScopedQuerySet.as_manager()  # .visible_to(user): tenant scoping (core.scoping, rules in tenancy.scoping)

    name = models.CharField(max_length=128, unique=True)
    slug = models.SlugField(max_length=64, unique=True, help_text="Used in URLs and as the alert label 'tenant'")
    kind = models.CharField(max_length=12, choices=TenantKind.choices, default=TenantKind.TEAM)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")
    billing_mode = models.CharField(max_length=8, choices=BillingMode.choices, default=BillingMode.INVOICE)
    currency = models.CharField(max_length=3, default="USD")
    lost_hours_policy = models.CharField(max_length=6, choices=LostHoursPolicy.choices,
                                         default=LostHoursPolicy.CREDIT, db_default=LostHoursPolicy.CREDIT,
                                         help_text="GPU-hours after a fault failed the job's GPU: credit or charge")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.kind == TenantKind.ORGANISATION and self.parent_id:
            raise ValidationError({"parent": "an organisation is a top-level tenant"})
        if self.kind != TenantKind.ORGANISATION and not self.parent_id:
            raise ValidationError({"parent": f"a {self.kind} belongs to an organisation"})
        if self.parent_id and self.parent.kind != TenantKind.ORGANISATION:
            raise ValidationError({"parent": "teams and projects sit directly under an organisation"})


class AccountKind(models.TextChoices):
    """Which scheduler an account name belongs to."""

    SLURM = "slurm", "Slurm account"
    KUBERNETES = "k8s", "Kubernetes namespace"


class TenantAccount(models.Model):
    """A Slurm account or Kubernetes namespace whose jobs belong to a tenant (jobs carry no tenant label)."""

    objects = ScopedQuerySet.as_manager()  # .visible_to(user): tenant scoping (core.scoping, rules in tenancy.scoping)

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="accounts")
    kind = models.CharField(max_length=8, choices=AccountKind.choices)
    name = models.CharField(max_length=128, help_text="Job.account: the Slurm account or the namespace")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["kind", "name"], name="tenant_account_unique",
                                    violation_error_message="this account already belongs to a tenant"),
        ]

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"


class Role(models.TextChoices):
    """What a user may do: operators see the whole cluster; the others only their tenant (and its children)."""

    OPERATOR = "operator", "Operator"
    TENANT_ADMIN = "tenant_admin", "Tenant admin"
    MEMBER = "member", "Tenant member"
    VIEWER = "viewer", "Viewer"


class Membership(models.Model):
    """A user's role in one tenant; an operator membership has no tenant (the whole cluster)."""

    objects = ScopedQuerySet.as_manager()  # .visible_to(user): tenant scoping (core.scoping, rules in tenancy.scoping)

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=12, choices=Role.choices)
    source = models.CharField(max_length=8, default="local", help_text="local, or oidc (synced from group claims)")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_user_tenant",
                                    violation_error_message="a user has one role per tenant"),
            models.UniqueConstraint(fields=["user"], condition=models.Q(tenant__isnull=True),
                                    name="membership_one_operator_row",
                                    violation_error_message="a user has at most one cluster-wide role"),
            models.CheckConstraint(
                condition=models.Q(role="operator", tenant__isnull=True) | (~models.Q(role="operator")
                                                                           & models.Q(tenant__isnull=False)),
                name="membership_operator_has_no_tenant",
                violation_error_message="operators hold the whole cluster; other roles need a tenant"),
        ]


class ApiToken(models.Model):
    """A bearer token for the API: scoped to one tenant, or an operator token (tenant empty)."""

    objects = ScopedQuerySet.as_manager()  # .visible_to(user): tenant scoping (core.scoping, rules in tenancy.scoping)

    name = models.CharField(max_length=100)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="api_tokens")
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="api_tokens")
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    read_only = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    PREFIX = API_TOKEN_PREFIX

    @staticmethod
    def hash(raw: str) -> str:
        return hashlib.sha256(raw.encode()).hexdigest()

    @classmethod
    def new_secret(cls) -> str:
        return cls.PREFIX + secrets.token_urlsafe(32)

    @property
    def is_operator(self) -> bool:
        return self.tenant_id is None
