"""Tenancy models, split by domain and re-exported."""

from tenancy.models.billing import Invoice, InvoiceLine, InvoiceState, LineKind, RateCard, RatePrice
from tenancy.models.metering import MeteringWatermark, UsageHour
from tenancy.models.quotas import Quota
from tenancy.models.tenants import (
    AccountKind,
    ApiToken,
    BillingMode,
    LostHoursPolicy,
    Membership,
    Role,
    Tenant,
    TenantAccount,
    TenantKind,
)

__all__ = [
    "AccountKind", "ApiToken", "BillingMode", "Invoice", "InvoiceLine", "InvoiceState", "LineKind",
    "LostHoursPolicy", "Membership", "MeteringWatermark", "Quota", "RateCard", "RatePrice", "Role", "Tenant",
    "TenantAccount", "TenantKind", "UsageHour",
]
