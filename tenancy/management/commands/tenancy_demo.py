"""Install the demo tenants, quotas, rate card and tenant logins (idempotent) and print the logins."""

import secrets
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from tenancy.demo import USERS, install_demo


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("--password-dir", required=True,
                            help="Directory of the demo_<username>_password files (made, mode 0600, when missing)")

    def handle(self, *args, password_dir, **options):
        folder = Path(password_dir)
        if not folder.is_dir():
            raise CommandError(f"--password-dir {password_dir} is not a directory")
        passwords = {u.username: self._password(folder / f"demo_{u.username}_password") for u in USERS}
        result = install_demo(passwords, now=timezone.now())
        names = ", ".join(t.name for t in result["tenants"].values() if t.parent_id is None)
        self.stdout.write(f"demo tenants in place: {names} (rate card from {result['card'].effective_from:%Y-%m-%d})")
        for user, created in result["users"]:
            self.stdout.write(f"tenant login: {user.username} / {passwords[user.username]}  ({user.description})"
                              + (" (created)" if created else ""))

    @staticmethod
    def _password(path: Path) -> str:
        """The password kept in `path`; a new random one is written there (owner-only) first if it is missing."""
        if not path.exists() or not path.read_text().strip():
            path.touch(mode=0o600)
            path.chmod(0o600)
            path.write_text(secrets.token_urlsafe(15) + "\n")
        password = path.read_text().strip()
        if len(password) < 12:
            raise CommandError(f"the password in {path} is shorter than 12 characters")
        return password
