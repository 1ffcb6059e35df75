from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    """Inventory, topology, ingest, time-series storage and rollups."""

    name = "telemetry"
    default_auto_field = "django.db.models.BigAutoField"
