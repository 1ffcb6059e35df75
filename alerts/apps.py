from django.apps import AppConfig


class AlertsConfig(AppConfig):
    """Rules, the alert lifecycle, routing, notification transports, remediation and the audit log."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "alerts"

    def ready(self):
        # In ready(): Django's place to wire apps together, once every model is loaded.
        from alerts.actions import schedule_evaluation  # in ready(): see above
        from alerts.audit import publish_audited  # in ready(): see above
        from core.audit import audited  # in ready(): see above
        from telemetry.signals import fleet_changed  # in ready(): see above

        def evaluate_soon(sender, new_faults: int = 0, **kwargs) -> None:
            schedule_evaluation(urgent=new_faults > 0)

        # Rules are evaluated when the fleet changes (ingest, a GPU gone silent), debounced to one queued run.
        fleet_changed.connect(evaluate_soon, weak=False, dispatch_uid="alerts.evaluate_on_fleet_change")
        # An audited change to an alert, silence or action refreshes the pages that show it.
        audited.connect(publish_audited, dispatch_uid="alerts.publish_audited")
