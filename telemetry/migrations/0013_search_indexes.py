"""Indexes for the search box's job lookups (telemetry.selectors.search._jobs).

The job table keeps every job ever run, so a scan grows with the cluster's age. The search box asks:
- `UPPER(name::text)` / `UPPER("user"::text)` with `=`, `LIKE 'Q%'` and `LIKE '%Q%'` (Django's iexact,
  istartswith, icontains): a pg_trgm GIN index on those expressions serves all three;
- `external_id = q OR external_id LIKE 'q%'` (an id or a pod UID's first characters): the unique
  (source, external_id) btree cannot serve a prefix outside the C collation, a varchar_pattern_ops one can.
Expression and operator-class indexes are declared here only, not in the model's Meta.
"""

from django.contrib.postgres.operations import TrigramExtension
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("telemetry", "0012_latest_interval"),
    ]

    operations = [
        TrigramExtension(),
        migrations.RunSQL(
            sql=[
                'CREATE INDEX job_search_text_trgm ON telemetry_job USING gin '
                '(upper((name)::text) gin_trgm_ops, upper(("user")::text) gin_trgm_ops);',
                "CREATE INDEX job_external_id_pattern ON telemetry_job (external_id varchar_pattern_ops);",
            ],
            reverse_sql=[
                "DROP INDEX IF EXISTS job_search_text_trgm;",
                "DROP INDEX IF EXISTS job_external_id_pattern;",
            ],
        ),
    ]
