"""Make the last-value tables UNLOGGED.

They are a cache of the newest row per entity, rewritten every interval: writing them to the WAL
costs as much as the raw insert itself. After a PostgreSQL crash they come back empty, and every
entity that still reports refills its row within one interval (`manage.py rebuild_latest` refills
them at once from the last hour of raw data). Raw data stays fully logged.
"""

from django.db import migrations

from telemetry.fields import KINDS


class Migration(migrations.Migration):
    dependencies = [("telemetry", "0002_hypertables")]

    operations = [
        migrations.RunSQL(
            [f"ALTER TABLE {k.latest_table} SET UNLOGGED;" for k in KINDS.values()],
            reverse_sql=[f"ALTER TABLE {k.latest_table} SET LOGGED;" for k in KINDS.values()],
        )
    ]
