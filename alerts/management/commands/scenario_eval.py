"""``manage.py scenario_eval``: run each simulator fault scenario through the real pipeline and score
detection against its ground truth, then measure precision over a scenario-free hour of a big fleet.

1. Unless ``--in-place``, a scratch database ``<NAME>_scenario_eval`` is created and migrated, so
   the evaluation never touches live telemetry, rollup watermarks, jobs or anomaly events (the
   simulator's first job snapshot closes every job it does not list). It is dropped at the end
   unless ``--keep-db``.
2. Each scenario runs alone on a small cluster (``--gpus``) on a simulated day of its own, with
   ``--lead-in`` minutes of telemetry and scoring before it starts; anomaly rows are cleared before
   each run. `anomaly.scoring.score_fleet` runs every simulated minute, the failure model's
   `score_failure_risk` every ``--risk-every`` minutes (once it exists).
3. Its anomalies are matched to its ground-truth line (`anomaly.evaluation.simulation.match_scenario`).
4. The quiet run: ``--fleet-gpus`` GPUs without scenarios, scored from the first tick; after
   ``--warmup`` minutes, ``--quiet-minutes`` are judged: the anomaly events they open, held against
   everything the simulator declared it planted (`anomaly.evaluation.groundtruth`), the alerts the anomaly-fed
   rules would fire (`alerts.evaluation.RuleReplay`), and the straggler flags per training job-hour.
5. A table per scenario, the quiet run, where the time went, and one ``RESULT`` line, ending PASS when every target of
   what ran is met.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection
from django.db.models import Q
from django.test.utils import override_settings

from alerts.defaults import DEFAULT_RULES
from alerts.evaluation import RuleReplay
from alerts.models import Rule
from anomaly.evaluation.simulation import (
    Every,
    Outcome,
    Precision,
    Simulation,
    canonical_entities,
    match_scenario,
    quiet_precision,
)
from anomaly.failure_pipeline import bootstrap_failure_model, score_failure_risk
from anomaly.grouping import HOLD
from anomaly.lifecycle import COHORT_HOURS, NotEnoughData, train_cohort_model
from anomaly.models import Anomaly, EntityScore
from anomaly.registry import load_active
from anomaly.scoring import score_fleet
from telemetry import live
from telemetry.simulator.jobs import RUNNING, TRAINING_KINDS
from telemetry.simulator.scenarios import SCENARIOS, Spec

# Every run starts at noon UTC (a busy cluster) on a day of its own, so runs never share a bucket.
BASE = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
# Per scenario: simulated minutes to run at least after it starts, and the tick. A scenario that
# fails runs on until five minutes past its failure, whatever its story's length and speed. The
# tick is 10 s, the simulator's own default, which the step-time detectors assume (a rank needs a
# few step reports a minute); gpu-degrading's three-hour story ticks every 30 s to stay affordable.
PLAN: dict[str, tuple[float, float]] = {
    "gpu-degrading": (10.0, 30.0), "cooling-failure": (15.0, 10.0), "nvlink-crc": (10.0, 10.0),
    "ib-link-flap": (16.0, 10.0), "congested-uplink": (20.0, 10.0), "straggler": (8.0, 10.0),
    "straggler-hw": (8.0, 10.0),
    "rack-over-cap": (15.0, 10.0), "divergence": (16.0, 10.0), "fallen-off-bus": (10.0, 10.0),
}
AFTER_FAILURE_MIN = 5.0
# A cooling loop serves a row (8 racks, 512 GPUs): two rows, so the failing one has a healthy one beside it.
MIN_GPUS = {"cooling-failure": 1024}
# A rank slowed 1.15x: within a minute from its compute time, within two from its GPU's telemetry alone.
STRAGGLER_TTD_S = {"straggler": 60.0, "straggler-hw": 120.0}
DEGRADING_LEAD_S = 3600.0
QUIET_PRECISION = 0.9
QUIET_EVENTS_PER_1K_GPU_H = 5.0
QUIET_PAGES = 1
FALSE_STRAGGLERS_PER_1K_JOB_H = 1.0
# The judged hour starts once the console has run one event hold (`anomaly.grouping.HOLD`): from
# then on an event opened is a cause not seen for a whole hold, which is what an event means, and
# not merely one not seen since the console started. Every standing defect of the fleet shows in
# those first minutes once; the report counts them per half hour (`opened_by_half_hour`).
QUIET_WARMUP_MIN = HOLD.total_seconds() / 60
PRIVATE_CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


class Command(BaseCommand):
    help = "Score anomaly detection against the simulator's fault scenarios and a scenario-free fleet hour."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--scenario", action="append", choices=sorted(PLAN), default=[],
                            help="Run only this scenario (repeatable); default: all of them")
        parser.add_argument("--repeats", type=int, default=1,
                            help="Runs of each scenario, seeds --seed, --seed+1, ... (default 1)")
        parser.add_argument("--gpus", type=int, default=256, help="Cluster size of each scenario run (default 256)")
        parser.add_argument("--interval", type=float,
                            help="Simulated seconds per tick of the scenario runs (default: per scenario, 10 or 30)")
        parser.add_argument("--lead-in", type=float, default=10.0,
                            help="Simulated minutes before each scenario starts (default 10)")
        parser.add_argument("--speed", type=float, default=1.0,
                            help="Play the scenarios' stories this many times faster (default 1: as written)")
        parser.add_argument("--risk-every", type=float, default=5.0,
                            help="Simulated minutes between failure-risk passes (default 5)")
        parser.add_argument("--no-scenarios", action="store_true", help="Only the quiet run")
        parser.add_argument("--train-minutes", type=float, default=COHORT_HOURS * 60,
                            help="Scenario-free minutes to train the cohort model on, when none is active "
                                 f"(default {COHORT_HOURS * 60:g}, the nightly training's window)")
        parser.add_argument("--failure-runs", type=int, default=3,
                            help="Simulated fleets to bootstrap the failure model on, when none is active (default 3)")
        parser.add_argument("--fleet-gpus", type=int, default=16384, help="Quiet run size (default 16384)")
        parser.add_argument("--quiet-minutes", type=float, default=60.0, help="Quiet run length; 0 skips it")
        parser.add_argument("--quiet-interval", type=float, default=60.0, help="Quiet run tick (default 60 s)")
        parser.add_argument("--per-rack", action="store_true",
                            help="Quiet run: one ingest request per rack, as simulate sends (default: one per tick)")
        parser.add_argument("--warmup", type=float, default=QUIET_WARMUP_MIN,
                            help="Unscored minutes the quiet fleet runs, scored, before its judged window "
                                 f"(default {QUIET_WARMUP_MIN:g}: one event hold, see QUIET_WARMUP_MIN)")
        parser.add_argument("--seed", type=int, default=1, help="Simulator seed (default 1)")
        parser.add_argument("--in-place", action="store_true",
                            help="Use the configured database, not a scratch one: only a database kept for this, "
                                 "since the runs write simulated telemetry and jobs, train models and DELETE every "
                                 "anomaly row before each run")
        parser.add_argument("--keep-db", action="store_true", help="Keep the scratch database afterwards")

    def handle(self, *args, **opts) -> None:
        if opts["verbosity"] < 2:  # the per-minute INFO lines of rollups and scoring would bury the table
            for name in ("telemetry", "anomaly"):
                logging.getLogger(name).setLevel(logging.WARNING)
        if opts["gpus"] % 8 or opts["fleet_gpus"] % 8 or (opts["interval"] or 1) <= 0 or opts["quiet_interval"] <= 0:
            raise CommandError("cluster sizes must be multiples of 8 and intervals positive")
        if opts["warmup"] < 0 or opts["quiet_minutes"] < 0:
            raise CommandError(f"--warmup and --quiet-minutes must be >= 0, got {opts['warmup']:g} and "
                               f"{opts['quiet_minutes']:g}")
        if opts["in_place"]:
            self._evaluate(opts)
            return
        creation = connection.creation
        live_name = connection.settings_dict["NAME"]
        connection.settings_dict.setdefault("TEST", {})["NAME"] = f"{live_name}_scenario_eval"
        started = time.perf_counter()
        creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False, serialize=False)
        self.stdout.write(f"scratch database {connection.settings_dict['NAME']} migrated in "
                          f"{time.perf_counter() - started:.0f} s")
        try:
            # Ingest pushes a fleet summary to the operator pages after each commit: the scratch
            # fleet's must not reach the live ones, so pushes stay in this process.
            with override_settings(CHANNEL_LAYERS=PRIVATE_CHANNEL_LAYERS):
                self._evaluate(opts)
                live.wait_for_trailing_publish()  # its thread must not outlive the scratch database
        finally:
            creation.destroy_test_db(live_name, verbosity=0, keepdb=opts["keep_db"])

    # --- the runs ---------------------------------------------------------------------------------
    def _evaluate(self, opts: dict) -> None:
        self.failures = 0
        self._train_cohort(opts)
        score_risk = _failure_scorer(self.stdout.write, opts)
        names = [] if opts["no_scenarios"] else opts["scenario"] or list(PLAN)
        repeats = opts["repeats"]
        outcomes = [self._scenario(k * repeats + r, name, opts, score_risk, opts["seed"] + r)
                    for k, name in enumerate(names) for r in range(repeats)]
        day = len(PLAN) * repeats
        quiet = self._quiet(day, opts, score_risk) if opts["quiet_minutes"] > 0 else None
        self._report(outcomes, quiet, opts)

    def _train_cohort(self, opts: dict) -> None:
        """The cohort detector needs a model trained on healthy fleet history, as the nightly training
        gives it live: a scenario-free run of the scenario cluster the day before the first scenario."""
        if load_active("cohort") is not None or opts["train_minutes"] <= 0:
            return
        start = BASE - timedelta(days=1, minutes=opts["train_minutes"])  # ends the day before, at noon
        sim = Simulation(gpus=opts["gpus"], start=start, interval_s=30, seed=opts["seed"],
                         progress=True, label="cohort history")
        wall = time.perf_counter()
        result = sim.run(opts["train_minutes"])
        try:
            promotion = train_cohort_model(result.end, hours=opts["train_minutes"] / 60)
        except NotEnoughData as exc:
            self.stdout.write(f"cohort model not trained: {exc}")
            return
        self.stdout.write(f"cohort model v{promotion.version.version} trained on {opts['train_minutes']:g} min of "
                          f"{opts['gpus']} GPUs in {time.perf_counter() - wall:.0f} s: {promotion.reason}")

    def _callbacks(self, opts: dict, score_risk) -> list[Every]:
        out = [Every(60, score_fleet, "score_fleet")]
        if score_risk is not None:
            out.append(Every(opts["risk_every"] * 60, score_risk, "score_failure_risk"))
        return out

    def _scenario(self, day: int, name: str, opts: dict, score_risk, seed: int) -> Outcome:
        minutes, interval = PLAN[name]
        speed = opts["speed"] or 1.0
        fails_s = SCENARIOS[name].fails_after_s
        if fails_s is not None:
            minutes = max(minutes, fails_s / speed / 60 + AFTER_FAILURE_MIN)
        start = BASE + timedelta(days=day)
        _clear_anomalies()
        sim = Simulation(gpus=max(opts["gpus"], MIN_GPUS.get(name, 0)), start=start,
                         interval_s=opts["interval"] or interval, seed=seed,
                         specs=[Spec(name, opts["lead_in"])], speed=speed,
                         callbacks=self._callbacks(opts, score_risk), progress=True, label=name, tolerate_errors=True)
        wall = time.perf_counter()
        result = sim.run(opts["lead_in"] + minutes)
        seen = canonical_entities(Anomaly.objects.filter(started_at__gte=start, started_at__lte=result.end))
        outcome = match_scenario(result.truth[0], seen, sim.layout, until=result.end, population=sim.population)
        self.stdout.write(f"{name} (seed {seed}): {result.ticks} ticks of {sim.layout.gpu_count} GPUs in "
                          f"{time.perf_counter() - wall:.0f} s ({_phases(result.seconds)}); "
                          f"{len(seen)} anomalies, {outcome.matching} on the scenario's entity"
                          + (f"; {result.rejected} rejected: {result.rejections[0]}" if result.rejected else ""))
        self._errors(result.errors)
        return outcome

    def _quiet(self, day: int, opts: dict, score_risk) -> QuietRun:
        """The scenario-free run. The detectors score from the first tick, as a live console has been
        scoring before any hour one picks: a condition found in the warm-up is already open when the
        hour starts (a standing event, reported apart), and the hour is judged on the events it opens."""
        start = BASE + timedelta(days=day)
        scored_from = start + timedelta(minutes=opts["warmup"])
        until = scored_from + timedelta(minutes=opts["quiet_minutes"])
        _clear_anomalies()
        pages = _anomaly_rules()
        sim = Simulation(gpus=opts["fleet_gpus"], start=start, interval_s=opts["quiet_interval"], seed=opts["seed"],
                         callbacks=[*self._callbacks(opts, score_risk), Every(60, pages, "anomaly alert rules")],
                         progress=True, label="quiet fleet", per_request="rack" if opts["per_rack"] else "tick",
                         tolerate_errors=True)
        job_hours = TrainingJobHours(sim, scored_from, until)
        sim.callbacks.append(Every(60, job_hours, "training job-hours"))
        wall = time.perf_counter()
        result = sim.run(opts["warmup"] + opts["quiet_minutes"])
        opened = Anomaly.objects.filter(started_at__gte=scored_from, started_at__lte=result.end)
        standing = Anomaly.objects.filter(Q(ended_at=None) | Q(ended_at__gte=scored_from), started_at__lt=scored_from)
        later = [s for s in canonical_entities(standing) if s.started_at >= scored_from]
        halves = Counter(int((t - start).total_seconds() // 1800) for t in Anomaly.objects.filter(
            started_at__gte=start, started_at__lte=result.end).values_list("started_at", flat=True))
        log = result.faults
        self.stdout.write(f"quiet fleet: {result.ticks} ticks of {opts['fleet_gpus']} GPUs in "
                          f"{time.perf_counter() - wall:.0f} s ({_phases(result.seconds)}); "
                          f"{len(log.events)} simulator events; declared: "
                          f"{_counts(log.count(latent=True))} latent, {_counts(log.count(latent=False))} injected")
        self._errors(result.errors)
        return QuietRun(quiet_precision(canonical_entities(opened), log), standing.count(),
                        {"members": len(later), "unexplained": sum(log.explain(s) is None for s in later)},
                        [p for p in pages.fired if p["at"] >= scored_from], job_hours.hours,
                        [s for s in [*canonical_entities(opened), *later]
                         if s.kind == "straggler" and log.explain(s) is None], opts["fleet_gpus"],
                        opts["quiet_minutes"],
                        [halves[k] for k in range(math.ceil((opts["warmup"] + opts["quiet_minutes"]) / 30))])

    def _errors(self, errors: dict[str, list[str]]) -> None:
        for name, messages in errors.items():
            self.stdout.write(f"  {name} FAILED {len(messages)} time(s); first: {messages[0]}")
            self.failures += len(messages)

    # --- the report -------------------------------------------------------------------------------
    def _report(self, outcomes: list[Outcome], quiet: QuietRun | None, opts: dict) -> None:
        w = self.stdout.write
        w("")
        self._scenario_table(outcomes)
        recall = sum(o.detected for o in outcomes) / len(outcomes) if outcomes else math.nan
        w(f"recall {sum(o.detected for o in outcomes)}/{len(outcomes)} = {_num(recall)}, target all detected: "
          + ("-" if not outcomes else "PASS" if recall == 1.0 else "FAIL"))
        if quiet is not None:
            self._precision_lines(quiet, opts)
        if self.failures:
            w(f"scorer failures: {self.failures} pass(es) raised (see above); those minutes went unscored")
        q = quiet or QuietRun.none()
        w(f"RESULT scenario_eval straggler_ttd_s={_worst_ttd(outcomes, 'straggler')} "
          f"straggler_hw_ttd_s={_worst_ttd(outcomes, 'straggler-hw')} "
          f"false_straggler_per_1k_job_h={_num(q.false_stragglers_per_1k_job_h)} "
          f"quiet_precision={_num(q.precision.precision)} quiet_events_per_1k_gpu_h={_num(q.events_per_1k_gpu_h)} "
          f"quiet_pages={'nan' if quiet is None else len(q.paging)} recall={_num(recall)} "
          f"{_overall(outcomes, quiet)}")

    def _scenario_table(self, outcomes: list[Outcome]) -> None:
        w = self.stdout.write
        w(f"{'scenario':<17} {'entity':<42} {'detected':<8} {'ttd':>7} {'first by':<12} {'lead':>7} {'noise':>6} "
          f"{'target':<14} result")
        for o in outcomes:
            target, ok = _target(o)
            noise = "-" if o.noise is None else f"{o.noise:.0%}"
            w(f"{o.scenario:<17} {o.entity[:42]:<42} {'yes' if o.detected else 'no':<8} {_secs(o.ttd_s):>7} "
              f"{o.first_kind or '-':<12} {_secs(o.lead_s):>7} {noise:>6} {target:<14} {'PASS' if ok else 'FAIL'}")
        w("noise: the share of the other entities of the same kind that were flagged after the scenario started")
        by: dict[str, list[Outcome]] = {}
        for o in outcomes:
            by.setdefault(o.scenario, []).append(o)
        for name, runs in by.items():
            if len(runs) > 1:
                ttds = sorted(o.ttd_s for o in runs if o.ttd_s is not None)
                w(f"  {name}: recall {sum(o.detected for o in runs)}/{len(runs)}, ttd median "
                  f"{_secs(ttds[len(ttds) // 2] if ttds else None)}, worst {_secs(ttds[-1] if ttds else None)}, "
                  f"passed {sum(_target(o)[1] for o in runs)}/{len(runs)}")
        for o in outcomes:
            if o.first_summary:
                w(f"  {o.scenario} first flagged by {o.first_kind}: {o.first_summary}")
            if o.fails_at is not None and o.lead_s is not None:
                w(f"  {o.scenario}: failure_risk events on {o.risk_elsewhere} other GPU(s) in the same run")

    def _precision_lines(self, q: QuietRun, opts: dict) -> None:
        """The quiet run's figures, each with its target and verdict, and what explains (or not) its events."""
        w, p = self.stdout.write, q.precision
        explained = ", ".join(f"{why} {n}" for why, n in sorted(p.explained.items(), key=lambda kv: -kv[1])) or "none"
        w(f"quiet fleet ({q.gpus} GPUs, {q.minutes:g} min scored after {opts['warmup']:g} min of warm-up): "
          f"{p.events} anomaly events opened ({q.standing} standing from the warm-up); their {p.members} members "
          f"(detector x entity) explained by: {explained}")
        w(f"  events per 1,000 GPUs per hour {_num(q.events_per_1k_gpu_h)}, target <= {QUIET_EVENTS_PER_1K_GPU_H:g}: "
          f"{_verdict(q.events_per_1k_gpu_h, QUIET_EVENTS_PER_1K_GPU_H, below=True)}")
        w("  events opened per half hour since the fleet started (the fleet's standing defects show once, early): "
          + ", ".join(f"{30 * k}-{30 * (k + 1)} min {n}" for k, n in enumerate(q.opened_by_half_hour)))
        w(f"  precision {_num(p.precision)} ({p.true_events} of {p.events} events have every member explained; "
          f"{_num(p.strict_precision)} counting only faults injected during the run; "
          f"members {_num(p.member_precision)}), target >= {QUIET_PRECISION}: "
          f"{_verdict(p.precision, QUIET_PRECISION, below=False)}")
        severities = Counter(f["severity"] for f in q.fired)
        w(f"  pages (critical alerts from anomaly, risk and job rules) {len(q.paging)}, target <= {QUIET_PAGES}: "
          f"{_verdict(len(q.paging), QUIET_PAGES, below=True)}; all their alerts: "
          + (", ".join(f"{sev} {n}" for sev, n in severities.most_common()) or "none"))
        w(f"  false straggler flags {len(q.false_stragglers)} over {q.job_hours:.1f} training job-hours = "
          f"{_num(q.false_stragglers_per_1k_job_h)} per 1,000, target <= {FALSE_STRAGGLERS_PER_1K_JOB_H:g}: "
          f"{_verdict(q.false_stragglers_per_1k_job_h, FALSE_STRAGGLERS_PER_1K_JOB_H, below=True)}")
        w(f"  standing events took {q.later['members']} new members during the hour, {q.later['unexplained']} "
          "of them unexplained")
        kinds = Counter(s.kind for s in p.unexplained)
        w("  unexplained members by detector: " + (", ".join(f"{k} {n}" for k, n in kinds.most_common()) or "none"))
        for s in p.unexplained[:5]:
            w(f"  e.g. {s.kind} on {s.entity_kind} {s.entity} from {s.started_at:%H:%M}: {s.summary}")
        for f in q.fired[:3]:
            w(f"  alert {f['rule']} ({f['severity']}) at {f['at']:%H:%M} on {f['entity']}: {f['summary']}")


def _failure_scorer(write, opts: dict):
    """`score_failure_risk`, with a model bootstrapped on a simulated fleet when none is active."""
    if load_active("failure") is None and opts["failure_runs"] > 0:
        wall = time.perf_counter()
        # Its own seed: the bootstrap's stories must not replay the evaluated ones (train/test leakage).
        version, promotion = bootstrap_failure_model(BASE - timedelta(days=2), runs=opts["failure_runs"],
                                                     seed=opts["seed"] + 100)
        write(f"failure model v{version.version} bootstrapped on {opts['failure_runs']} simulated fleet(s) in "
              f"{time.perf_counter() - wall:.0f} s: {promotion.reason}")
    return score_failure_risk


def _clear_anomalies() -> None:
    """Each run is judged on its own events: an event left open would be extended into the next."""
    Anomaly.objects.all().delete()
    EntityScore.objects.all().delete()


def _target(o: Outcome) -> tuple[str, bool]:
    if o.scenario in STRAGGLER_TTD_S:
        limit = STRAGGLER_TTD_S[o.scenario]
        return f"ttd <= {limit:.0f} s", o.ttd_s is not None and o.ttd_s <= limit
    if o.scenario == "gpu-degrading":
        return f"lead >= {DEGRADING_LEAD_S / 3600:.0f} h", o.lead_s is not None and o.lead_s >= DEGRADING_LEAD_S
    return "detected", o.detected


def _overall(outcomes: list[Outcome], quiet) -> str:
    """PASS when every target of what ran is met (each scenario's, and the quiet hour's four)."""
    verdicts = [_target(o)[1] for o in outcomes]
    if quiet is not None:
        verdicts += [_verdict(v, target, below=below) != "FAIL" for v, target, below in (
            (quiet.false_stragglers_per_1k_job_h, FALSE_STRAGGLERS_PER_1K_JOB_H, True),
            (quiet.precision.precision, QUIET_PRECISION, False),
            (quiet.events_per_1k_gpu_h, QUIET_EVENTS_PER_1K_GPU_H, True),
            (len(quiet.paging), QUIET_PAGES, True))]
    return "PASS" if verdicts and all(verdicts) else "FAIL"


def _worst_ttd(outcomes: list[Outcome], scenario: str) -> str:
    """The slowest detection over the runs of `scenario`: inf when one was missed, nan when none ran."""
    runs = [o for o in outcomes if o.scenario == scenario]
    if not runs:
        return "nan"
    return "inf" if any(o.ttd_s is None for o in runs) else f"{max(o.ttd_s for o in runs):.0f}"


def _secs(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.0f} s" if abs(s) < 5400 else f"{s / 3600:.1f} h"


def _num(x: float | None, fmt: str = ".3f") -> str:
    return "nan" if x is None or x != x else format(x, fmt)


def _phases(seconds: dict[str, float]) -> str:
    """Where the wall time went, biggest first; each rollup's share in brackets after the rollups' total."""
    top = [(k, v) for k, v in seconds.items() if not k.startswith("rollup ") and v >= 0.5]
    rollups = [(k.removeprefix("rollup "), v) for k, v in seconds.items() if k.startswith("rollup ") and v >= 0.5]
    out = []
    for k, v in sorted(top, key=lambda kv: -kv[1]):
        detail = ", ".join(f"{n} {x:.0f}" for n, x in sorted(rollups, key=lambda kv: -kv[1])) if k == "rollups" else ""
        out.append(f"{k} {v:.0f} s" + (f" [{detail}]" if detail else ""))
    return ", ".join(out)


# --- the quiet run's figures ------------------------------------------------------------------------------
@dataclass(frozen=True)
class QuietRun:
    """What the scenario-free run measured: its events, pages and straggler flags."""

    precision: Precision  # the events opened in the scored window, judged (anomaly.evaluation.groundtruth)
    standing: int  # events opened in the warm-up and still open in the window
    later: dict  # members first flagged in the window inside standing events: {"members", "unexplained"}
    fired: list[dict]  # alerts the anomaly-fed rules fired in the window (alerts.evaluation.RuleReplay)
    job_hours: float  # training jobs (pretrain, finetune) running in the window, in job-hours
    false_stragglers: list  # straggler members first flagged in the window that no declared fault explains
    gpus: int
    minutes: float
    opened_by_half_hour: list[int]  # events opened in each half hour since the fleet started, warm-up included

    @classmethod
    def none(cls) -> QuietRun:
        return cls(Precision(0, 0, 0, 0, {}, []), 0, {}, [], 0.0, [], 0, 0.0, [])

    @property
    def paging(self) -> list[dict]:
        """The alerts that page: critical severity (the default route tree pages on it at once)."""
        return [f for f in self.fired if f["severity"] == PAGING_SEVERITY]

    @property
    def events_per_1k_gpu_h(self) -> float | None:
        return self.precision.events / (self.gpus / 1000) / (self.minutes / 60) if self.gpus and self.minutes else None

    @property
    def false_stragglers_per_1k_job_h(self) -> float | None:
        return len(self.false_stragglers) / (self.job_hours / 1000) if self.job_hours else None


PAGING_SEVERITY = "critical"
ANOMALY_RULE_KINDS = ("anomaly", "risk", "job")


def _anomaly_rules():
    """The default rules fed by anomaly events and scores, replayed read-only each minute: nothing is
    stored, routed or sent from the scratch run (a queued notification would reach the live workers)."""
    return RuleReplay([Rule(**spec) for spec in DEFAULT_RULES if spec["kind"] in ANOMALY_RULE_KINDS])


class TrainingJobHours:
    """Job-hours of the training jobs (the kinds that report steps) running in [start, until), counted
    from the simulator's scheduler once a simulated minute."""

    def __init__(self, sim: Simulation, start: datetime, until: datetime):
        self.sim, self.start, self.until, self.hours = sim, start, until, 0.0

    def __call__(self, t: datetime) -> int:
        if not self.start <= t < self.until:
            return 0
        running = sum(j.state == RUNNING and j.kind in TRAINING_KINDS for j in self.sim.cluster.scheduler.jobs.values())
        self.hours += running / 60
        return running


def _verdict(value: float | None, target: float, *, below: bool) -> str:
    if value is None or value != value:
        return "-"
    return "PASS" if (value <= target if below else value >= target) else "FAIL"


def _counts(counter: Counter) -> str:
    return ", ".join(f"{n} {what}" for what, n in counter.most_common()) or "none"
