"""manage.py run_invoices --period YYYY-MM [--finalize]: every tenant's invoice (or showback statement) for a month."""

from __future__ import annotations

from datetime import UTC, datetime

from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from tenancy.billing import add_month, run_invoices


def _month(text: str) -> datetime:
    try:
        return datetime.strptime(text, "%Y-%m").replace(tzinfo=UTC)
    except ValueError:
        raise CommandError(f"--period {text!r}: expected YYYY-MM, e.g. 2026-11") from None


class Command(BaseCommand):
    help = ("Generate (or regenerate) the draft invoice of every tenant with usage in a calendar month (UTC); "
            "showback tenants get showback statements. --finalize makes them final (immutable).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--period", required=True, help="The month to bill, YYYY-MM (UTC)")
        parser.add_argument("--finalize", action="store_true", help="Finalize each invoice after generating it")

    def handle(self, *args, **opts) -> None:
        start = _month(opts["period"])
        end = add_month(start)
        with tqdm(unit="tenant", desc=f"invoices {start:%Y-%m}") as bar:
            def progress(i, n, tenant, invoice):
                bar.total = n
                bar.set_postfix_str(f"{tenant.slug} {invoice.total if invoice else '-'}")
                bar.update(1)

            out = run_invoices(start, end, finalize=opts["finalize"], actor="manage.py run_invoices",
                               progress=progress)
        self.stdout.write(f"{out['invoices']} invoices for {out['tenants']} tenants with usage "
                          f"({out['billed']} billed, {out['showback']} showback, {out['finalized']} finalized), "
                          f"{out['lines']} lines in {out['seconds']:.1f} s; billed total {out['total']}, "
                          f"showback total {out['showback_total']}")
        if out["already_final"]:
            self.stdout.write(f"already final, left alone: {', '.join(out['already_final'])}")
        for slug, error in out["errors"].items():
            self.stderr.write(f"{slug}: {error}")
        if out["errors"]:
            raise CommandError(f"{len(out['errors'])} tenants could not be invoiced (see above)")
