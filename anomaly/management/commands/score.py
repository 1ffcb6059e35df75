"""manage.py score: one scoring pass now (or as of --now), with what it found."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone
from tqdm import tqdm

from anomaly.lifecycle import score_all
from anomaly.management.commands.train_models import _when
from anomaly.models import Anomaly


class Command(BaseCommand):
    help = ("Run every detector and the failure model once and store what they find "
            "(the beat task does it every minute).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--now", type=_when, help="Score as of this time (ISO 8601 with zone; default now)")
        parser.add_argument("--top", type=int, default=10, help="Open anomalies to list afterwards (default 10)")

    def handle(self, *args, **opts) -> None:
        at = opts["now"] or timezone.now()
        with tqdm(total=1, unit="pass", desc="score") as bar:
            out = score_all(at)
            bar.update(1)
        d = out["detectors"]
        self.stdout.write(f"detectors: {d['findings']} findings in {d['ms']:.0f} ms "
                          f"({d['opened']} opened, {d['extended']} extended, {d['closed']} closed); per part ms "
                          + ", ".join(f"{k} {v:.0f}" for k, v in d["timings"].items()))
        r = out.get("failure_risk", {})
        if r.get("version") is None:
            self.stdout.write(f"failure risk: {r.get('skipped', 'not run')}")
        else:
            self.stdout.write(f"failure risk: v{r['version']} scored {r['scored']} GPUs, {r['at_risk']} at or above "
                              f"{r.get('threshold', 0):.2f}")
        for a in Anomaly.objects.filter(ended_at=None).order_by("-score")[: opts["top"]]:
            self.stdout.write(f"  {a.score:4.2f} {a.kind:<12} {a.entity_kind:<5} {a.entity_id:<40} {a.summary}")
