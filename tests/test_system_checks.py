"""Django's system checks pass (a broken admin registration or model would otherwise only show at startup)."""

from django.core.management import call_command


def test_django_system_checks_pass():
    call_command("check", fail_level="ERROR")


def test_no_model_changes_without_a_migration(db):  # makemigrations reads the applied-migration table
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)
