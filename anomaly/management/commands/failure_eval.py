"""Leave-family-out evaluation of failure prediction on simulated fleets.

    ./dev manage failure_eval [--fleets 6] [--gpus 1024] [--failures 32] [--sudden-share 0.2] [--seed 1]
                              [--truth PATH] [--json PATH]

Simulates `--fleets` fleets with failures planted from every degradation family
(`anomaly.failure_families`) and runs the protocol of `anomaly.failure_eval`: for each precursor family,
a model trained without it (on half the fleets), its alert threshold chosen on its own training families
for at most 1 false alarm per 1,000 GPU-days, scored on the other half. It needs no database.

Prints a table per held-out family, the overall figures, the unforeseeable failures apart, and last:
``RESULT failure_eval median_lead_h=.. false_alarms_per_1k_gpu_days=.. recall=.. unforeseeable_share=.. PASS|FAIL``
(PASS: median lead >= 1 h over the caught held-out precursor failures at <= 1 false alarm per 1,000
healthy GPU-days).
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import orjson
from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from anomaly.evaluation.report import json_path, write_atomic
from anomaly.failure import HOUR, FailurePredictor, min_calibration_gpu_days
from anomaly.failure_eval import (
    EVAL_PARAMS,
    PASS_FALSE_ALARMS,
    Fold,
    leave_family_out,
    pool_fleets,
    summarize,
)
from anomaly.failure_families import FAMILIES
from anomaly.failure_prior import titan_csv, titan_prior
from anomaly.failure_sim import simulate_fleet

HORIZON = timedelta(hours=24)
STEP = timedelta(minutes=15)


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(text)
    return value


class Command(BaseCommand):
    help = "Leave-family-out evaluation of failure prediction on simulated fleets (no database)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--fleets", type=_positive_int, default=6,
                            help="Simulated fleets, split in two halves by parity (default 6, at least 4)")
        parser.add_argument("--gpus", type=_positive_int, default=1024, help="GPUs per fleet (default 1024)")
        parser.add_argument("--failures", type=_positive_int, default=32,
                            help="Planted failures per fleet, one node each (default 32)")
        parser.add_argument("--sudden-share", type=float, default=0.2,
                            help="Share of planted failures with no precursor (default 0.2)")
        parser.add_argument("--span-h", type=float, default=48.0,
                            help="Hours of cut times per fleet, after a day of warm-up (default 48, at least 25)")
        parser.add_argument("--tick-s", type=float, default=300.0, help="Simulator tick in seconds (default 300)")
        parser.add_argument("--seed", type=int, default=1, help="Fleet k uses seed SEED + k (default 1)")
        parser.add_argument("--titan-csv", type=Path, default=None,
                            help="Titan gc_full.csv for the survival prior (default: fit_survival's path; "
                                 "without it the failures strike at random and the prior is unknown)")
        parser.add_argument("--truth", type=json_path, help="Write the ground truth (JSON lines) here")
        parser.add_argument("--json", type=json_path, help="Write every figure (JSON) here")

    def handle(self, *args, **opts) -> None:
        self._check(opts)
        started = time.monotonic()
        fleets = self._simulate(opts)
        if opts["truth"]:
            write_atomic(opts["truth"], b"".join(orjson.dumps({**r, "fleet": f.fleet}) + b"\n"
                                           for f in fleets for r in f.truth))
        pool = pool_fleets(fleets)
        with tqdm(total=2 * len(FAMILIES), desc="leave-family-out", unit="model") as bar:
            def advance(fold: Fold) -> None:
                bar.set_postfix_str(f"{fold.family} on fleets {'+'.join(str(k + 1) for k in fold.train_fleets)}")
                bar.update()
            folds = leave_family_out(pool, horizon_s=HORIZON.total_seconds(), seed=opts["seed"], progress=advance)
        summary = summarize(folds, pool)
        self._report(folds, summary, pool, opts, time.monotonic() - started)
        if opts["json"]:
            write_atomic(opts["json"], orjson.dumps({"options": {k: str(v) for k, v in opts.items()}, **summary,
                                               "folds": [_fold_json(f) for f in folds]}, option=orjson.OPT_INDENT_2,
                                              default=_plain))
        o = summary["overall"]
        self.stdout.write(f"RESULT failure_eval median_lead_h={_num(o['lead_median_h'])} "
                          f"false_alarms_per_1k_gpu_days={o['false_alarms_per_1k_gpu_days']:.3f} "
                          f"recall={_num(o['recall'])} unforeseeable_share={summary['unforeseeable_share']:.3f} "
                          f"{'PASS' if summary['pass'] else 'FAIL'}")

    def _check(self, opts: dict) -> None:
        if opts["fleets"] < 4:
            raise CommandError(f"--fleets must be at least 4 (two to train on, two to test), got {opts['fleets']}")
        if opts["gpus"] % 8:
            raise CommandError(f"--gpus must be a multiple of 8 (8 GPUs a node), got {opts['gpus']}")
        if opts["failures"] > opts["gpus"] // 8:
            raise CommandError(f"--failures {opts['failures']} needs as many nodes; {opts['gpus']} GPUs have "
                               f"{opts['gpus'] // 8}")
        if not 0 <= opts["sudden_share"] < 1:
            raise CommandError(f"--sudden-share must be in [0, 1), got {opts['sudden_share']}")
        if opts["span_h"] < 25:
            raise CommandError(f"--span-h must be at least 25: a 24 h precursor must fit after the first cut, "
                               f"got {opts['span_h']}")
        if not opts["tick_s"] > 0:
            raise CommandError(f"--tick-s must be > 0, got {opts['tick_s']}")

    def _simulate(self, opts: dict) -> list:
        path = opts["titan_csv"] or titan_csv()
        prior = titan_prior(path)
        self.stdout.write(f"survival prior from {path}" if prior else f"no survival prior: {path} is missing")
        ticks = int(opts["span_h"] * 3600 / opts["tick_s"] + 24 * 3600 / opts["tick_s"]) + 1
        fleets = []
        with tqdm(total=opts["fleets"] * ticks, desc="simulate", unit="tick") as bar:
            for k in range(opts["fleets"]):
                done = [0]

                def progress(stage: str, tick: int, total: int, done=done) -> None:
                    bar.update(tick - done[0])
                    done[0] = tick

                fleets.append(simulate_fleet(gpus=opts["gpus"], failures=opts["failures"],
                                             sudden_share=opts["sudden_share"], span_h=opts["span_h"],
                                             horizon=HORIZON, tick_s=opts["tick_s"], step=STEP,
                                             seed=opts["seed"] + k, offset=k, prior=prior, progress=progress))
                bar.update(ticks - done[0])
        return fleets

    def _report(self, folds, summary: dict, pool, opts: dict, seconds: float) -> None:
        w = self.stdout.write
        counts = ", ".join(f"{k} {n}" for k, n in summary["failures"].items())
        w(f"{opts['fleets']} fleets of {opts['gpus']} GPUs, {opts['span_h']:g} h of cuts every "
          f"{STEP.total_seconds() / 60:.0f} min each; failures: {counts}")
        w(f"model: {', '.join(f'{k}={v}' for k, v in EVAL_PARAMS.items())}; threshold per model: at most 1 "
          f"false alarm per 1,000 GPU-days on its training families' calibration slice")
        w("")
        w(f"{'held-out family':<15} {'failures':>8} {'caught':>6} {'recall':>6} {'lead p10':>8} {'median':>7} "
          f"{'p90 (h)':>7} {'>=1 h':>5} {'FA/1k GPU-d':>11} {'thresholds':>13}")
        rows = [*summary["per_family"].items(), ("overall", summary["overall"])]
        for name, r in rows:
            thresholds = "/".join(f"{t:.2f}" for t in r.get("thresholds", []))
            w(f"{name:<15} {r['failures']:>8} {r['caught']:>6} {_num(r['recall']):>6} {_num(r['lead_p10_h']):>8} "
              f"{_num(r['lead_median_h']):>7} {_num(r['lead_p90_h']):>7} {r['lead_ge_1h']:>5} "
              f"{r['false_alarms_per_1k_gpu_days']:>11.3f} {thresholds:>13}")
        o = summary["overall"]
        w(f"false alarms: {o['false_alarms']} over {o['gpu_days']:,.0f} healthy GPU-days (each test fleet's healthy "
          f"GPUs, once per model)")
        for name, r in summary["unforeseeable"].items():
            w(f"unforeseeable ({name}): {r['caught']} of {r['failures']} alarmed within the horizon before them "
              f"(recall {_num(r['recall'])}; each failure scored by every model that saw its fleet as test)")
        w(f"unforeseeable share: {summary['unforeseeable_share']:.3f} of all failures (sudden and background), "
          "counted apart from the precursor failures")
        calibration = [f.calibration for f in folds]
        w(f"threshold choice: {sum(c['alarms'] for c in calibration)} alarms over "
          f"{sum(c['gpu_days'] for c in calibration):,.0f} training GPU-days of calibration slices")
        confidence = {**FailurePredictor().get_params(), **EVAL_PARAMS}["false_alarm_confidence"]
        need = min_calibration_gpu_days(PASS_FALSE_ALARMS, confidence)
        short = [c["gpu_days"] for c in calibration if c["gpu_days"] < need]
        if short:
            w(f"warning: {len(short)} of {len(calibration)} calibration slices hold under {need:,.0f} GPU-days "
              f"(smallest {min(short):,.0f}): too few to show <= {PASS_FALSE_ALARMS:g} false alarm per 1,000 "
              "GPU-days even with none, so their thresholds promise less; use more or larger fleets")
        w(f"lead: median {_num(o['lead_median_h'])} h (target >= 1 h), false alarms "
          f"{o['false_alarms_per_1k_gpu_days']:.3f} per 1,000 GPU-days (target <= 1); {seconds:.0f} s")


def _num(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _plain(value):
    """numpy scalars as Python numbers for the JSON report."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _fold_json(f: Fold) -> dict:
    def hours(leads: np.ndarray) -> list:
        return [None if np.isnan(x) else ("inf" if np.isinf(x) else round(x / HOUR, 3)) for x in leads]

    return {"family": f.family, "train_fleets": list(f.train_fleets), "test_fleets": list(f.test_fleets),
            "threshold": f.threshold, "calibration": f.calibration, "false_alarms": f.false_alarms,
            "gpu_days": round(f.gpu_days, 1), "lead_h": hours(f.leads),
            "unforeseeable_lead_h": {k: hours(v) for k, v in f.unforeseeable.items()}}
