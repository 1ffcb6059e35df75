"""Manage the dcgm-exporter endpoints the beat scraper pulls."""

from urllib.parse import urlsplit

from django.core.management.base import BaseCommand, CommandError

from telemetry.models import ScrapeTarget


class Command(BaseCommand):
    help = "List, add, enable/disable or remove dcgm-exporter scrape targets."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list", help="Show every target with its last scrape")
        add = sub.add_parser("add", help="Add a target (or re-enable it)")
        add.add_argument("url", help="e.g. http://gpu-0001:9400/metrics")
        add.add_argument("--host", default="", help="Hostname to use when the exporter sends no Hostname label")
        for name in ("remove", "disable"):
            sub.add_parser(name).add_argument("url")

    def handle(self, *args, action, **opts):
        if action == "list":
            return self._list()
        url = opts["url"]
        if action == "add":
            # Not Django's URLValidator: exporters live on bare cluster hostnames (gpu-0001:9400).
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise CommandError(f"not an http(s) URL: {url!r}")
            target, created = ScrapeTarget.objects.update_or_create(
                url=url, defaults={"enabled": True, "hostname": opts["host"]}
            )
            self.stdout.write(f"{'added' if created else 'updated'} {target.url}")
            return None
        target = ScrapeTarget.objects.filter(url=url).first()
        if target is None:
            raise CommandError(f"no scrape target {url!r}")
        if action == "remove":
            target.delete()
        else:
            target.enabled = False
            target.save(update_fields=["enabled"])
        self.stdout.write(f"{action}d {url}")
        return None

    def _list(self) -> None:
        for t in ScrapeTarget.objects.order_by("url"):
            state = "enabled " if t.enabled else "disabled"
            last = t.last_scrape.isoformat(timespec="seconds") if t.last_scrape else "never"
            error = f"  error: {t.last_error}" if t.last_error else ""
            self.stdout.write(f"{state}  {t.url}  last={last} samples={t.last_samples}{error}")
