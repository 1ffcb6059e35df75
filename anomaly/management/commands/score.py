"""manage.py score: the scoring pass the beat task runs, now (or as of --now), with what it found.

It goes through the same watermark and lock as the beat task (`anomaly.lifecycle.score_all`): it scores the
minutes not yet scored up to --now and advances the watermark, so it never races a worker's pass or scores a
minute twice. A minute already scored is not scored again: events only move forwards in time.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from tqdm import tqdm

from anomaly.lifecycle import score_all
from anomaly.management.commands.train_models import _when
from anomaly.models import Anomaly, ScoringKind


class Command(BaseCommand):
    help = ("Score every minute up to now (or --now) that the detectors and the failure model have not scored, "
            "and store what they find (the beat task does it every minute).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--now", type=_when, help="Score up to this time (ISO 8601 with zone; default now)")
        parser.add_argument("--top", type=int, default=10, help="Open anomalies to list afterwards (default 10)")

    def handle(self, *args, **opts) -> None:
        at = opts["now"] or timezone.now()
        with tqdm(total=1, unit="pass", desc="score") as bar:
            out = score_all(at)
            bar.update(1)
        if "skipped" in out:
            self.stdout.write(f"skipped: {out['skipped']}")
        for kind in ScoringKind:
            if kind.value in out:
                self._report(kind, out[kind.value])
        for a in Anomaly.objects.filter(ended_at=None).order_by("-score")[: opts["top"]]:
            self.stdout.write(f"  {a.score:4.2f} {a.kind:<12} {a.entity_kind:<5} {a.entity_id:<40} {a.summary}")
        failed = [f"{k}: {v['error']}" for k, v in out.items() if isinstance(v, dict) and "error" in v]
        if failed:
            raise CommandError("scoring failed (the next pass retries the minute): " + "; ".join(failed))

    def _report(self, kind: ScoringKind, done: dict) -> None:
        name = "detectors" if kind == ScoringKind.DETECTORS else "failure risk"
        if "jumped" in done:
            j = done["jumped"]
            self.stdout.write(f"{name}: {j['minutes']} minutes not scored ({_hm(j['from'])} to {_hm(j['to'])}): "
                              "further behind than SCORING_MAX_CATCHUP_MINUTES")
        for p in done["passes"]:
            self.stdout.write(f"{name}: {_pass_line(kind, p)} as of {_hm(p['at'])}")
        if not done["passes"] and done["done_until"] and "error" not in done:
            self.stdout.write(f"{name}: nothing to score, already scored through {_hm(done['done_until'])}")


def _pass_line(kind: ScoringKind, p: dict) -> str:
    if kind == ScoringKind.DETECTORS:
        return (f"{p['findings']} findings in {p['ms']:.0f} ms ({p['opened']} opened, {p['extended']} extended, "
                f"{p['closed']} closed); per part ms " + ", ".join(f"{k} {v:.0f}" for k, v in p["timings"].items()))
    if p.get("version") is None:
        return p.get("skipped", "not run")
    return f"v{p['version']} scored {p['scored']} GPUs, {p['at_risk']} at or above {p.get('threshold', 0):.2f}"


def _hm(iso: str) -> str:
    return f"{datetime.fromisoformat(iso).astimezone(UTC):%Y-%m-%d %H:%M} UTC"
