"""Install the default rules, inhibition, routing tree, playbooks and guard rails (idempotent)."""

from django.core.management.base import BaseCommand

from alerts.defaults import install_defaults


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("--receiver-url", help="Wire webhook channels to this local receiver (./dev up)")
        parser.add_argument("--secret-file", help="File holding the webhook HMAC secret")

    def handle(self, *args, receiver_url=None, secret_file=None, **options):
        secret = open(secret_file).read().strip() if secret_file else ""
        result = install_defaults(receiver_url, secret)
        self.stdout.write(f"alerting defaults in place ({result['rules_created']} rule(s) created)")
