from django.apps import AppConfig


class AnomalyConfig(AppConfig):
    """Features, detectors, failure prediction, survival analysis and the model registry."""

    name = "anomaly"
    default_auto_field = "django.db.models.BigAutoField"
