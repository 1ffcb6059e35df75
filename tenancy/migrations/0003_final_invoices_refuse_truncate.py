"""TRUNCATE fires no row triggers, so 0002's guard does not see it: statement triggers refuse TRUNCATE of the
invoices or their lines while a final invoice (or a final invoice's line) is there. A test database is emptied
by TRUNCATE between transactional tests; that session sets breakwater.allow_truncate = on (tests/conftest.py).
Anyone who can set it could also drop the trigger: the guard stops an application path, not the owner."""

from django.db import migrations

SQL = """
CREATE FUNCTION tenancy_invoice_refuse_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('breakwater.allow_truncate', true) = 'on'
       OR NOT EXISTS (SELECT 1 FROM tenancy_invoice WHERE state = 'final') THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION '% holds final invoices, which cannot be changed (TRUNCATE refused)', TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER tenancy_invoice_refuse_truncate BEFORE TRUNCATE ON tenancy_invoice
    FOR EACH STATEMENT EXECUTE FUNCTION tenancy_invoice_refuse_truncate();
CREATE TRIGGER tenancy_invoiceline_refuse_truncate BEFORE TRUNCATE ON tenancy_invoiceline
    FOR EACH STATEMENT EXECUTE FUNCTION tenancy_invoice_refuse_truncate();
"""
REVERSE = """
DROP TRIGGER IF EXISTS tenancy_invoiceline_refuse_truncate ON tenancy_invoiceline;
DROP TRIGGER IF EXISTS tenancy_invoice_refuse_truncate ON tenancy_invoice;
DROP FUNCTION IF EXISTS tenancy_invoice_refuse_truncate();
"""


class Migration(migrations.Migration):
    dependencies = [("tenancy", "0002_final_invoices_immutable")]
    operations = [migrations.RunSQL(SQL, REVERSE)]
