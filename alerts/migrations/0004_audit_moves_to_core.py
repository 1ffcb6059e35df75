"""The audit log's model now lives in core (core 0001); the table stays, so only the state changes here."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("alerts", "0003_audit_refuses_truncate"), ("core", "0001_initial")]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[migrations.DeleteModel(name="AuditEntry")],
                                            database_operations=[]),
    ]
