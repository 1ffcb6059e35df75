"""Refill the last-value tables from recent raw data (after a crash emptied them)."""

from datetime import timedelta

from django.core.management.base import BaseCommand

from telemetry.actions import do_rebuild_latest


class Command(BaseCommand):
    help = "Rebuild the last-value tables from the raw hypertables (default: the last hour)."

    def add_arguments(self, parser):
        parser.add_argument("--hours", type=float, default=1.0)

    def handle(self, *args, hours, **options):
        counts = do_rebuild_latest(timedelta(hours=hours))
        for kind, n in counts.items():
            self.stdout.write(f"{kind}: {n} entities")
