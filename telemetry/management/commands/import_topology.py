"""Load a cluster's topology from a YAML or JSON file (format: docs/topology.md)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from telemetry.topology import TopologyError, TopologyIssue, do_import_topology, load_topology_file
from telemetry.topology_schema import build_plan

MAX_SHOWN = 50  # a broken generator can produce thousands of issues; the first ones tell the story


class Command(BaseCommand):
    help = "Import sites, racks, nodes, GPUs, fabric and power from a topology file (YAML or JSON)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="Topology file: .yaml, .yml or .json")
        parser.add_argument("--dry-run", action="store_true",
                            help="Validate the file and write nothing")
        parser.add_argument("--replace", action="store_true",
                            help="Also remove racks, switches, ports, links and power devices the "
                                 "file does not name (nodes are unplaced, never deleted)")

    def handle(self, *args, file: str, dry_run: bool, replace: bool, **options) -> None:
        try:
            doc = load_topology_file(file)
            if dry_run:
                self._validate(file, doc)
                return
            result = do_import_topology(doc, replace=replace)
        except TopologyError as exc:
            self._report(file, exc.issues)
            count = len(exc.issues)
            raise CommandError(f"{file}: {count} problem(s); nothing was written") from exc
        for line in result.summary_lines():
            self.stdout.write(line)
        verdict = "imported" if result.changed else "already up to date, nothing changed"
        self.stdout.write(self.style.SUCCESS(f"{file}: {verdict}"))

    def _validate(self, file: str, doc: dict) -> None:
        plan, issues = build_plan(doc)
        if issues:
            raise TopologyError(issues)
        for kind, records in vars(plan).items():
            self.stdout.write(f"{kind:<10} {len(records):>7} in the file")
        self.stdout.write(self.style.SUCCESS(f"{file}: valid (dry run, nothing written)"))

    def _report(self, file: str, issues: list[TopologyIssue]) -> None:
        for issue in issues[:MAX_SHOWN]:
            self.stderr.write(f"{file}: {issue}")
        if len(issues) > MAX_SHOWN:
            self.stderr.write(f"and {len(issues) - MAX_SHOWN} more")
