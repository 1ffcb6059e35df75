from django.apps import AppConfig


class AlertsConfig(AppConfig):
    """Rules, the alert lifecycle, routing, notification transports, remediation and the audit log."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "alerts"
