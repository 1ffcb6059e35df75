"""Fit the fleet survival analysis on the ORNL Titan GPU records and make it the active version.

    ./dev manage fit_survival [--csv PATH] [--holdout-fraction 0.2] [--force]

Kaplan-Meier curves by cage, slot and node (old batch, new batch, all), log-rank tests, and a Cox
model over cage, slot, node, cabinet row and column and batch. The stored artefact is the plain
dict `anomaly.survival.survival_report` returns; the reliability page reads it.
"""

from __future__ import annotations

import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from anomaly.failure_prior import titan_csv
from anomaly.models import ModelKind
from anomaly.registry import do_promote_version, do_register_version
from anomaly.survival import NEW_BATCH_AFTER, lifetimes_from_records, read_records, survival_report


class Command(BaseCommand):
    help = "Fit Kaplan-Meier curves and a Cox model of GPU lifetimes (Titan records) and promote the result."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--csv", type=Path, default=None,
                            help="gc_full.csv from olcf/TitanGPULife (default: ../shared/data/traces/"
                                 "titan-gpu-failures/gc_full.csv)")
        parser.add_argument("--holdout-fraction", type=float, default=0.2,
                            help="Share of GPUs, the last installed, kept out to score concordance (default 0.2)")
        parser.add_argument("--points", type=int, default=250, help="Points per stored curve (default 250)")
        parser.add_argument("--force", action="store_true",
                            help="Promote even if the holdout concordance is below the active version's")

    def handle(self, *args, csv: Path | None, holdout_fraction: float, points: int, force: bool, **options):
        path = csv or titan_csv()
        if not path.is_file():
            raise CommandError(f"{path}: no such file. Pass --csv PATH to the Titan gc_full.csv "
                               "(olcf/TitanGPULife data/gc_full.csv).")
        self._t0 = time.monotonic()
        try:
            records = read_records(path)
            self._say(f"Read {len(records)} records from {path}")
            life, dropped = lifetimes_from_records(records)
            self._say(f"{len(life)} GPUs, {int(life.failed.sum())} failed (DBE/OTB and taken out); "
                      f"{dropped} without a stay of positive length left out")
            report = survival_report(life, holdout_fraction=holdout_fraction, max_points=points, progress=self._say)
        except ValueError as exc:
            raise CommandError(f"{path}: {exc}") from exc
        report.update(source=path.name, records=len(records), dropped=dropped,
                      runtime_s=round(time.monotonic() - self._t0, 2))
        self._print_summary(report)
        self._store(report, path, holdout_fraction, points, force, records)

    def _say(self, message: str) -> None:
        self.stdout.write(f"[{time.monotonic() - self._t0:5.1f} s] {message}")

    def _print_summary(self, report: dict) -> None:
        for row in report["hazards"]:
            if row["covariate"] in ("cage", "node", "batch"):
                p = f"{row['p']:.2g}" if row["p"] > 0 else "<1e-300"  # 0 is an underflow
                self.stdout.write(f"  {row['name']:<10} vs {row['reference']:<4} HR {row['hr']:7.3f} "
                                  f"(95% CI {row['lower']:.3f}-{row['upper']:.3f}, p={p})")
        for level, curve in report["curves"]["old"]["cage"].items():
            median = f"{curve['median_days']:.0f} d" if curve["median_days"] else "not reached"
            self.stdout.write(f"  old batch cage {level}: median life {median}, "
                              f"S(3 y) = {curve['survival_3y']:.3f}, {curve['failures']}/{curve['n']} failed")

    def _store(self, report: dict, path: Path, holdout_fraction: float, points: int, force: bool, records) -> None:
        cox = report["cox"]
        metrics = {"primary": "concordance", "higher_is_better": True,
                   "concordance": cox["holdout"]["concordance"], "concordance_train": cox["concordance_train"],
                   "holdout_n": cox["holdout"]["n"], "holdout_failures": cox["holdout"]["failures"],
                   "n": report["n"], "failures": report["failures"]}
        params = {"csv": str(path), "holdout_fraction": holdout_fraction, "points": points,
                  "new_batch_after": NEW_BATCH_AFTER.date().isoformat(),
                  "lifetime": "sum of stays per serial number; failed = DBE/OTB and taken out"}
        start = min(r.insert for r in records if r.insert is not None)
        end = max(r.remove for r in records)
        version = do_register_version(ModelKind.SURVIVAL, report, params=params, features=cox["features"],
                                      metrics=metrics, train_start=start, train_end=end)
        outcome = do_promote_version(version, force=force)
        style = self.style.SUCCESS if outcome.promoted else self.style.WARNING
        verdict = "promoted" if outcome.promoted else "not promoted"
        self.stdout.write(style(f"survival v{version.version} {verdict}: {outcome.reason} "
                                f"(holdout concordance {metrics['concordance']:.3f}, "
                                f"{report['runtime_s']:.1f} s)"))
