"""Make an ingest token for one collector. The raw token is shown once; only its hash is kept."""

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from telemetry.actions import do_create_collector_token


class Command(BaseCommand):
    help = "Create an ingest token for a collector (node agent, exporter pusher, simulator)."

    def add_arguments(self, parser):
        parser.add_argument("name", help="Collector name, unique, e.g. 'rack-a01-agent'")
        parser.add_argument("--replace", action="store_true", help="Revoke and replace an existing token of this name")
        parser.add_argument("--quiet", action="store_true", help="Print only the token")

    def handle(self, *args, name, replace, quiet, **options):
        name = name.strip()
        if not name:
            raise CommandError("the collector name must not be empty")
        try:
            with transaction.atomic():
                raw = do_create_collector_token(name, replace=replace)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if quiet:
            self.stdout.write(raw)
        else:
            self.stdout.write(f"collector token for {name!r} (shown once, store it now):\n{raw}")
