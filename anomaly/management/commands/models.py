"""manage.py models: list the registry, promote a version, or roll a kind back in one command."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from anomaly.models import ModelKind, ModelVersion
from anomaly.registry import RegistryError, do_promote_version, do_rollback


class Command(BaseCommand):
    help = "Model registry: `list [KIND]`, `promote KIND VERSION [--force]`, `rollback KIND`."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        ls = sub.add_parser("list", help="Every version with its status, window and primary metric")
        ls.add_argument("kind", nargs="?", choices=ModelKind.values)
        pr = sub.add_parser("promote", help="Promote a version if it is no worse than the active one")
        pr.add_argument("kind", choices=ModelKind.values)
        pr.add_argument("version", type=int)
        pr.add_argument("--force", action="store_true", help="Promote even if worse on the holdout")
        rb = sub.add_parser("rollback", help="Retire the active version and restore the one before it")
        rb.add_argument("kind", choices=ModelKind.values)

    def handle(self, *args, **opts) -> None:
        try:
            getattr(self, f"_{opts['action']}")(opts)
        except RegistryError as exc:
            raise CommandError(str(exc)) from exc

    def _list(self, opts) -> None:
        qs = ModelVersion.objects.defer("artefact").order_by("kind", "-version")
        if opts["kind"]:
            qs = qs.filter(kind=opts["kind"])
        for v in qs:
            name = v.metrics.get("primary", "-")
            value = v.primary_metric
            window = (f"{v.train_start:%Y-%m-%d %H:%M}..{v.train_end:%Y-%m-%d %H:%M}" if v.train_start and v.train_end
                      else "-")
            shown = f"{value:.4f}" if value is not None else "n/a"
            self.stdout.write(f"{v.kind:<9} v{v.version:<4} {v.status:<9} {name}={shown:<8} window {window}  {v.note}")

    def _promote(self, opts) -> None:
        try:
            v = ModelVersion.objects.get(kind=opts["kind"], version=opts["version"])
        except ModelVersion.DoesNotExist as exc:
            raise CommandError(f"no {opts['kind']} model v{opts['version']}") from exc
        p = do_promote_version(v, force=opts["force"])
        self.stdout.write(f"{v.kind} v{v.version} {'promoted' if p.promoted else 'not promoted'}: {p.reason}")

    def _rollback(self, opts) -> None:
        v = do_rollback(opts["kind"])
        self.stdout.write(f"{v.kind} rolled back: v{v.version} is active again")
