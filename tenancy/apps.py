from django.apps import AppConfig


class TenancyConfig(AppConfig):
    """Tenants, roles and scoping, API tokens, quotas, metering, rate cards and invoices."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "tenancy"
