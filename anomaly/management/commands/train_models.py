"""manage.py train_models: train the cohort and failure models now and promote each if no worse."""

from __future__ import annotations

from datetime import datetime

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from tqdm import tqdm

from anomaly.lifecycle import train_all


def _when(text: str) -> datetime:
    t = datetime.fromisoformat(text)
    if t.tzinfo is None:
        raise ValueError("give a timezone, e.g. 2026-11-30T12:00:00+00:00")
    return t


class Command(BaseCommand):
    help = ("Train the cohort anomaly model and the failure model on the stored history; each new version "
            "is promoted only if it is no worse than the active one on the same holdout.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--now", type=_when, help="Train as of this time (ISO 8601 with zone; default now)")
        parser.add_argument("--missing-only", action="store_true", help="Only kinds that have no active version")
        parser.add_argument("--no-bootstrap", action="store_true",
                            help="Never fall back to a failure model trained on the simulator")
        parser.add_argument("--force", action="store_true", help="Promote even if worse on the holdout")

    def handle(self, *args, **opts) -> None:
        now = opts["now"] or timezone.now()
        with tqdm(total=2, unit="model", desc="train_models") as bar:
            def progress(line: str) -> None:
                bar.write(line)
                if line.startswith(("cohort:", "failure:")):
                    bar.update(1)
            try:
                out = train_all(now, progress=progress, force=opts["force"], missing_only=opts["missing_only"],
                                bootstrap=not opts["no_bootstrap"])
            except ValueError as exc:
                raise CommandError(str(exc)) from exc
        for kind, said in out.items():
            self.stdout.write(f"{kind}: {said}")
