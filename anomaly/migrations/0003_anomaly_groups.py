"""Anomaly events per root cause: a group key, the member findings, and one open event per group."""

from django.contrib.postgres.indexes import GinIndex
from django.db import migrations, models

# Events recorded before grouping stood for one (detector, entity): that is their group, which keeps
# the open ones unique under the new constraint as they were under the old.
FILL_GROUP_KEY = """
UPDATE anomaly_anomaly SET group_key = 'legacy|' || kind || '|' || entity_kind || ':' || entity_id,
    members = jsonb_build_array(jsonb_build_object(
        'kind', kind, 'entity_kind', entity_kind, 'entity_id', entity_id, 'host', host,
        'first_seen', started_at, 'last_seen', last_seen, 'score', score, 'last_score', last_score,
        'summary', summary, 'signals', '[]'::jsonb))
"""


class Migration(migrations.Migration):

    dependencies = [
        ('anomaly', '0002_scoring_watermark'),
    ]

    operations = [
        migrations.AddField(
            model_name='anomaly',
            name='group_key',
            field=models.CharField(default='', help_text='The cause it stands for, e.g. "fleet|leaf:leaf-r4-01", "fleet|host:gpu-0012"', max_length=200),
        ),
        migrations.AddField(
            model_name='anomaly',
            name='members',
            field=models.JSONField(default=list, help_text='[{kind, entity_kind, entity_id, host, first_seen, last_seen, score, last_score, summary, signals: [[field, deviation], ...]}], one per detector and entity'),
        ),
        migrations.AddField(
            model_name='anomaly',
            name='member_count',
            field=models.PositiveIntegerField(default=1, help_text='Distinct entities among the members'),
        ),
        migrations.RunSQL(FILL_GROUP_KEY, migrations.RunSQL.noop),
        migrations.RemoveConstraint(
            model_name='anomaly',
            name='anomaly_one_open_per_entity',
        ),
        migrations.AddConstraint(
            model_name='anomaly',
            constraint=models.UniqueConstraint(condition=models.Q(('ended_at', None)), fields=('group_key',), name='anomaly_one_open_per_group', violation_error_message='This cause already has an open anomaly event.'),
        ),
        migrations.AddIndex(
            model_name='anomaly',
            index=GinIndex(fields=['members'], name='anomaly_members_idx', opclasses=['jsonb_path_ops']),
        ),
    ]
