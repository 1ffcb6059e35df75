"""Run a local notification receiver (the demo endpoint of `./dev up`): it logs every webhook it gets."""

import json
import time

from django.core.management.base import BaseCommand

from alerts.receiver import Receiver


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8025)
        parser.add_argument("--secret-file", help="Verify the X-Breakwater-Signature with this secret")

    def _log(self, rec) -> None:
        try:
            body = rec.json() or {}
        except ValueError:
            body = {}
        sig = {True: "signature ok", False: "BAD SIGNATURE", None: "unsigned"}[rec.signature_ok]
        stamp = time.strftime("%H:%M:%S", time.gmtime(rec.at))
        title = body.get("title") or body.get("summary") or json.dumps(body)[:120]
        self.stdout.write(f"{stamp} {rec.path} {body.get('event', '')} {body.get('status', '')}: {title} ({sig})")
        self.stdout.flush()

    def handle(self, *args, port=8025, secret_file=None, **options):
        secret = open(secret_file).read().strip() if secret_file else ""
        receiver = Receiver(port=port, secret=secret, on_request=self._log, max_kept=1000)
        receiver.start()
        self.stdout.write(f"receiving notifications on http://127.0.0.1:{receiver.port}/")
        self.stdout.flush()
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            receiver.stop()
