"""The audit log's model moves from alerts to core; its table (alerts_auditentry) and triggers stay as they are."""

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [("alerts", "0003_audit_refuses_truncate")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="AuditEntry",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                                   verbose_name="ID")),
                        ("time", models.DateTimeField()),
                        ("actor", models.CharField(help_text="Username, or system:<component>", max_length=150)),
                        ("verb", models.CharField(help_text="e.g. action.approve, rule.create, silence.expire",
                                                  max_length=40)),
                        ("object_kind", models.CharField(max_length=40)),
                        ("object_id", models.CharField(max_length=200)),
                        ("reason", models.TextField(blank=True)),
                        ("outcome", models.CharField(blank=True, max_length=40)),
                        ("detail", models.JSONField(blank=True, default=dict)),
                    ],
                    options={
                        "db_table": "alerts_auditentry",
                        "ordering": ["-time", "-id"],
                        "indexes": [models.Index(fields=["-time"], name="audit_time"),
                                    models.Index(fields=["object_kind", "object_id"], name="audit_object")],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
