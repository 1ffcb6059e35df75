from django.apps import AppConfig


class TenancyConfig(AppConfig):
    """Tenants, roles and scoping, API tokens, quotas, metering, rate cards and invoices."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "tenancy"

    def ready(self):
        # Django's hook for wiring once every app's models are loaded (these modules import models).
        from core import api, scoping  # in ready(): models are loaded only now
        from tenancy.access import api_check  # in ready(): models are loaded only now
        from tenancy.scoping import visible  # in ready(): models are loaded only now

        scoping.install(visible)  # the rules behind every model's `objects.visible_to(who)`
        api.install_api_check(api_check)  # who may call core.api's JSON endpoints
