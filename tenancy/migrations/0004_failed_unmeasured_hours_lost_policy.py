"""Failed and unmeasured hours on UsageHour, the GPU failure invoice line, and each tenant's policy for failed hours."""

from django.db import migrations, models

HOURS = {"max_digits": 20, "decimal_places": 6, "default": 0, "db_default": 0}


class Migration(migrations.Migration):

    dependencies = [
        ("tenancy", "0003_final_invoices_refuse_truncate"),
    ]

    operations = [
        migrations.AddField(
            model_name="tenant",
            name="lost_hours_policy",
            field=models.CharField(choices=[("credit", "Credit: not charged"), ("charge", "Charge as GPU time")],
                                   db_default="credit", default="credit", max_length=6,
                                   help_text="GPU-hours after a fault failed the job's GPU: credit or charge"),
        ),
        migrations.AddField(
            model_name="usagehour",
            name="failed_hours",
            field=models.DecimalField(**HOURS, help_text="Part of lost_hours: after a fault failed the job's GPU"),
        ),
        migrations.AddField(
            model_name="usagehour",
            name="unmeasured_hours",
            field=models.DecimalField(**HOURS, help_text="Allocated minutes with no activity reading: never busy"),
        ),
        migrations.AlterField(
            model_name="invoiceline",
            name="kind",
            field=models.CharField(choices=[("gpu_time", "GPU time"), ("idle_held", "Idle-held GPU time"),
                                            ("energy", "Energy"), ("discount", "Preemptible discount"),
                                            ("failed", "GPU failure"), ("credit", "Credit (correction)"),
                                            ("debit", "Debit (correction)")], max_length=10),
        ),
    ]
