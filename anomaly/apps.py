from django.apps import AppConfig


class AnomalyConfig(AppConfig):
    """Features, detectors, failure prediction, survival analysis and the model registry."""

    name = "anomaly"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # What anomaly adds to telemetry's fleet views, registered here so that telemetry never imports anomaly.
        from anomaly import selectors  # in ready(): Django's place to wire apps together
        from telemetry.selectors.fleet import NEWEST_EVENTS, register_fleet_section  # in ready(): as above
        from telemetry.selectors.racks import Metric, register_gpu_metric  # in ready(): as above

        register_fleet_section("anomalies", lambda now, failed: selectors.fleet_anomalies(
            limit=NEWEST_EVENTS, failed_gpu_ids=failed))
        register_gpu_metric(Metric("anomaly_score", "Anomaly score", "", "continuous", 0, 1, slow=True),
                            selectors.score_reader("anomaly_score"))
        register_gpu_metric(Metric("failure_risk", "Failure risk, next 24 h", "%", "continuous", 0, 100, slow=True),
                            selectors.score_reader("failure_risk"))
