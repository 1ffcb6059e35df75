"""Turn the sample tables into TimescaleDB hypertables and tune the last-value tables.

Chunk intervals aim at chunks that fit comfortably in memory for a 16k-GPU fleet:
raw data at a 10 s interval is ~140M GPU rows a day, so raw chunks are 6 hours.
"""

from django.db import migrations

from telemetry.fields import KINDS

RAW_CHUNK = "6 hours"
CHUNKS = {"1m": "7 days", "1h": "90 days"}


def _hypertable(table: str, column: str, interval: str) -> str:
    return (
        f"SELECT create_hypertable('{table}', by_range('{column}', INTERVAL '{interval}'));"
    )


def _forward_sql() -> list[str]:
    sql = ["CREATE EXTENSION IF NOT EXISTS timescaledb;"]
    for kind in KINDS.values():
        sql.append(_hypertable(kind.table, "time", RAW_CHUNK))
        for res, interval in CHUNKS.items():
            sql.append(_hypertable(kind.rollup_table(res), "bucket", interval))
        # Last-value rows are rewritten every interval; free space on the page lets
        # PostgreSQL do HOT updates instead of index churn.
        sql.append(f"ALTER TABLE {kind.latest_table} SET (fillfactor = 50);")
    sql.append(_hypertable("telemetry_narrow_sample", "time", "1 day"))
    sql.append(_hypertable("telemetry_narrow_sample_1m", "bucket", "7 days"))
    sql.append(_hypertable("telemetry_narrow_sample_1h", "bucket", "90 days"))
    sql.append(_hypertable("telemetry_ingest_batch", "time", "1 day"))
    return sql


def _require_timescaledb(apps, schema_editor) -> None:
    """Fail with instructions, not a driver traceback, on a server without TimescaleDB."""
    with schema_editor.connection.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'timescaledb'")
        if cur.fetchone() is None:
            raise RuntimeError(
                "TimescaleDB is not installed on the PostgreSQL server in DATABASE_URL: install the "
                "timescaledb extension package for its PostgreSQL version (./dev does this for its own server)"
            )
        # A server that has it but does not preload it fails at CREATE EXTENSION with
        # TimescaleDB's own message naming shared_preload_libraries (reading that setting
        # needs privileges the application role should not have).


class Migration(migrations.Migration):
    dependencies = [("telemetry", "0001_initial")]

    operations = [
        migrations.RunPython(_require_timescaledb, migrations.RunPython.noop),
        # Hypertables cannot be turned back into plain tables; reversing drops the app instead.
        migrations.RunSQL(_forward_sql(), reverse_sql=migrations.RunSQL.noop),
    ]
