"""A generation number bumped whenever inventory rows are deleted or truncated.

Every ingest process caches natural key → id (UUID → GPU id…). A deletion in another process
(the admin, a topology replace, a test flush) would leave those caches pointing at rows that no
longer exist; each batch reads this sequence first (one cheap query) and drops its cache when the
number moved. A sequence, not a table, so that a TRUNCATE of every table leaves it counting.
"""

from django.db import migrations

TABLES = [
    "telemetry_node", "telemetry_gpu", "telemetry_miginstance", "telemetry_switch",
    "telemetry_port", "telemetry_powerdevice",
]

FORWARD = [
    "CREATE SEQUENCE IF NOT EXISTS telemetry_inventory_generation;",
    """
    CREATE OR REPLACE FUNCTION telemetry_bump_inventory_generation() RETURNS trigger AS $$
    BEGIN
        PERFORM nextval('telemetry_inventory_generation');
        RETURN NULL;
    END $$ LANGUAGE plpgsql;
    """,
] + [
    f"CREATE TRIGGER {t}_generation AFTER DELETE OR TRUNCATE ON {t} "
    f"FOR EACH STATEMENT EXECUTE FUNCTION telemetry_bump_inventory_generation();"
    for t in TABLES
]

REVERSE = [f"DROP TRIGGER IF EXISTS {t}_generation ON {t};" for t in TABLES] + [
    "DROP FUNCTION IF EXISTS telemetry_bump_inventory_generation();",
    "DROP SEQUENCE IF EXISTS telemetry_inventory_generation;",
]


class Migration(migrations.Migration):
    dependencies = [("telemetry", "0003_unlogged_latest")]

    operations = [migrations.RunSQL(FORWARD, reverse_sql=REVERSE)]
