"""The audit log is append-only in the database itself, not just in the UI: UPDATE and DELETE raise."""

from django.db import migrations

SQL = """
CREATE FUNCTION alerts_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'alerts_auditentry is append-only (% refused)', TG_OP USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER alerts_auditentry_append_only BEFORE UPDATE OR DELETE ON alerts_auditentry
    FOR EACH ROW EXECUTE FUNCTION alerts_audit_append_only();
"""
REVERSE = """
DROP TRIGGER IF EXISTS alerts_auditentry_append_only ON alerts_auditentry;
DROP FUNCTION IF EXISTS alerts_audit_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [("alerts", "0001_initial")]
    operations = [migrations.RunSQL(SQL, REVERSE)]
