"""A final invoice and its lines never change: the database refuses UPDATE and DELETE of a final invoice,
and INSERT, UPDATE and DELETE of a final invoice's lines. Corrections are credit/debit lines on a later invoice."""

from django.db import migrations

SQL = """
CREATE FUNCTION tenancy_invoice_final_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state = 'final' THEN
        RAISE EXCEPTION 'invoice % is final and cannot be changed (% refused)', OLD.number, TG_OP
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER tenancy_invoice_final BEFORE UPDATE OR DELETE ON tenancy_invoice
    FOR EACH ROW EXECUTE FUNCTION tenancy_invoice_final_guard();

CREATE FUNCTION tenancy_invoiceline_final_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    inv bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN inv := NEW.invoice_id; ELSE inv := OLD.invoice_id; END IF;
    IF EXISTS (SELECT 1 FROM tenancy_invoice WHERE id = inv AND state = 'final') THEN
        RAISE EXCEPTION 'invoice % is final: its lines cannot be changed (% refused)', inv, TG_OP
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER tenancy_invoiceline_final BEFORE INSERT OR UPDATE OR DELETE ON tenancy_invoiceline
    FOR EACH ROW EXECUTE FUNCTION tenancy_invoiceline_final_guard();
"""
REVERSE = """
DROP TRIGGER IF EXISTS tenancy_invoiceline_final ON tenancy_invoiceline;
DROP FUNCTION IF EXISTS tenancy_invoiceline_final_guard();
DROP TRIGGER IF EXISTS tenancy_invoice_final ON tenancy_invoice;
DROP FUNCTION IF EXISTS tenancy_invoice_final_guard();
"""


class Migration(migrations.Migration):
    dependencies = [("tenancy", "0001_initial")]
    operations = [migrations.RunSQL(SQL, REVERSE)]
