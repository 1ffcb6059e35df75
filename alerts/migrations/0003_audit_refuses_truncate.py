"""TRUNCATE empties a table without firing row triggers, so 0002's guard does not see it: a statement trigger
refuses TRUNCATE of a non-empty audit log. A test database is emptied by TRUNCATE between transactional
tests; that session sets breakwater.allow_truncate = on (tests/conftest.py). Anyone who can set it could also
drop the trigger: the guard stops an application path or a slip, not the database owner."""

from django.db import migrations

SQL = """
CREATE FUNCTION alerts_audit_refuse_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('breakwater.allow_truncate', true) = 'on' OR NOT EXISTS (SELECT 1 FROM alerts_auditentry)
    THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'alerts_auditentry is append-only (TRUNCATE refused)' USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER alerts_auditentry_refuse_truncate BEFORE TRUNCATE ON alerts_auditentry
    FOR EACH STATEMENT EXECUTE FUNCTION alerts_audit_refuse_truncate();
"""
REVERSE = """
DROP TRIGGER IF EXISTS alerts_auditentry_refuse_truncate ON alerts_auditentry;
DROP FUNCTION IF EXISTS alerts_audit_refuse_truncate();
"""


class Migration(migrations.Migration):
    dependencies = [("alerts", "0002_audit_append_only")]
    operations = [migrations.RunSQL(SQL, REVERSE)]
