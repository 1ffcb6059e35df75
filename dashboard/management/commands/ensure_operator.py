"""Create the operator login if it is missing (or reset its password) and print it."""

from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Ensure an operator (superuser) login exists with the password in a file, and print it."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="operator")
        parser.add_argument("--password-file", required=True)

    def handle(self, *args, username, password_file, **options):
        try:
            password = Path(password_file).read_text().strip()
        except OSError as exc:
            raise CommandError(f"cannot read --password-file {password_file}: {exc}") from exc
        if len(password) < 12:
            raise CommandError(f"the password in {password_file} is shorter than 12 characters")
        User = get_user_model()
        user, created = User.objects.get_or_create(
            username=username, defaults={"is_staff": True, "is_superuser": True}
        )
        if created or not user.check_password(password):
            user.set_password(password)
            user.is_staff = user.is_superuser = True
            user.save()
        self.stdout.write(f"operator login: {username} / {password}" + (" (created)" if created else ""))
