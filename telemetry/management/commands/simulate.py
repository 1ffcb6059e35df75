"""Run a simulated GPU cluster that pushes its telemetry through the real ingest API.

`./dev up` runs ``simulate --server URL --token-file FILE $BW_SIM_ARGS``. The command imports
the cluster's topology (unless --no-topology), waits for the server, optionally backfills
history, then ticks on the wall clock and prints one line per tick.

``--scenario NAME[@START_MINUTES][:ENTITY]`` (repeatable) scripts failures on the cluster and
writes their ground truth as JSON lines to ``--truth`` (default ``var/scenarios/<first tick>.jsonl``);
``--scenario-speed`` plays their timelines faster. See `telemetry.simulator.scenarios`. The same file
declares everything else the simulator plants (`telemetry.simulator.truth`): the latent defects the
cluster was built with, then each fault it injects, as it happens. ``--truth`` alone (no scenario)
writes just those.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from telemetry.simulator.client import AuthError, IngestClient
from telemetry.simulator.dynamics import Cluster
from telemetry.simulator.runner import Runner, ServerUnavailable
from telemetry.simulator.scenarios import SCENARIOS, ScenarioError, ScenarioSet, parse_spec
from telemetry.simulator.topology import Layout, build_layout, topology_document
from telemetry.topology import TopologyError, do_import_topology


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise ValueError(text)
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


class Command(BaseCommand):
    help = "Simulate a GPU cluster (default 2,048 H100s) and push its telemetry to the ingest API."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--server", default="http://127.0.0.1:8000", help="Breakwater base URL")
        auth = parser.add_mutually_exclusive_group(required=True)
        auth.add_argument("--token-file", help="File holding the collector token")
        auth.add_argument("--token", help="The collector token itself (prefer --token-file)")
        parser.add_argument("--gpus", type=int, default=2048,
                            help="Cluster size: a multiple of 8 from 8 to 16384 (default 2048)")
        parser.add_argument("--interval", type=_positive(float), default=10.0,
                            help="Seconds between ticks, aligned to the wall clock (default 10)")
        parser.add_argument("--seed", type=int, default=1, help="Random seed (default 1)")
        parser.add_argument("--once", action="store_true", help="Send one tick and exit")
        parser.add_argument("--ticks", type=_positive(int), help="Send this many ticks and exit")
        parser.add_argument("--backfill", type=_positive(float), metavar="MINUTES",
                            help="First send history for the last MINUTES minutes")
        parser.add_argument("--no-topology", action="store_true",
                            help="Do not import the cluster's topology before sending")
        parser.add_argument("--concurrency", type=_positive(int), default=4,
                            help="Requests in flight at once (default 4)")
        parser.add_argument("--body", choices=("arrow", "json"), default="arrow",
                            help="Body of the sample pushes: Arrow IPC (default; a rack's batch with fault "
                                 "events goes as JSON) or JSON columns")
        parser.add_argument("--wait-timeout", type=float, default=0.0, metavar="SECONDS",
                            help="Give up if the server does not answer in time "
                                 "(default: wait forever)")
        parser.add_argument("--scenario", action="append", type=parse_spec, default=[],
                            metavar="NAME[@START_MINUTES][:ENTITY]",
                            help="Script a failure (repeatable): " + ", ".join(SCENARIOS))
        parser.add_argument("--scenario-speed", type=_positive(float), default=1.0, metavar="FACTOR",
                            help="Play scenario timelines FACTOR times faster (default 1)")
        parser.add_argument("--truth", type=Path, metavar="FILE",
                            help="Ground-truth JSON lines: scenarios, latent defects and injected faults "
                                 "(default with --scenario: var/scenarios/<first tick>.jsonl)")

    def handle(self, *args, **opts) -> None:
        token = self._token(opts)
        try:
            layout = build_layout(opts["gpus"], opts["seed"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self._describe(layout)
        if not opts["no_topology"]:
            self._import(layout)
        cluster = Cluster(layout, seed=opts["seed"], interval=opts["interval"],
                          scenarios=self._scenarios(opts))
        try:
            client = IngestClient(opts["server"], token, concurrency=opts["concurrency"], body=opts["body"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        # The runner opens its own clients for the jobs and training endpoints.
        runner = Runner(cluster, client, interval=opts["interval"], write=self.stdout.write, server=opts["server"])
        try:
            self._run(runner, opts)
        except AuthError as exc:
            raise CommandError(f"the server refused the collector token: {exc}") from exc
        except (ServerUnavailable, ScenarioError) as exc:
            raise CommandError(str(exc)) from exc
        except KeyboardInterrupt:
            self.stdout.write("stopped")
        finally:
            runner.close()
            client.close()

    def _run(self, runner: Runner, opts: dict) -> None:
        runner.wait_for_server(opts["wait_timeout"])
        if opts["backfill"]:
            runner.backfill(opts["backfill"])
        runner.run(1 if opts["once"] else opts["ticks"])

    def _scenarios(self, opts: dict) -> ScenarioSet | None:
        if not opts["scenario"] and not opts["truth"]:
            return None
        truth = opts["truth"] or _default_truth
        return ScenarioSet(opts["scenario"], seed=opts["seed"], speed=opts["scenario_speed"], truth=truth,
                           faults=True)

    def _token(self, opts: dict) -> str:
        if opts["token"]:
            return opts["token"].strip()
        path = Path(opts["token_file"])
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise CommandError(f"cannot read the token file {path}: {exc.strerror}") from exc
        if not token:
            raise CommandError(f"the token file {path} is empty")
        return token

    def _describe(self, layout: Layout) -> None:
        s = layout.summary()
        self.stdout.write(
            f"simulated cluster (seed {layout.seed}): {s['gpus']} GPUs on {s['nodes']} nodes in "
            f"{s['racks']} racks, {s['rows']} rows, {s['halls']} hall(s); "
            f"fabric {s['leaves']} leaves, {s['spines']} spines, {s['links']} links; "
            f"{s['pdus']} PDUs, {s['cooling_loops']} cooling loops"
        )

    def _import(self, layout: Layout) -> None:
        started = time.perf_counter()
        try:
            result = do_import_topology(topology_document(layout))
        except TopologyError as exc:
            for issue in exc.issues[:20]:
                self.stderr.write(f"topology: {issue}")
            raise CommandError(f"the simulated topology has {len(exc.issues)} problem(s)") from exc
        verdict = "imported" if result.changed else "already up to date"
        self.stdout.write(f"topology {verdict} in {time.perf_counter() - started:.1f} s")


def _default_truth(t: float) -> Path:
    """var/scenarios/<first tick, basic ISO 8601>.jsonl under the project."""
    stamp = datetime.fromtimestamp(t, UTC).strftime("%Y%m%dT%H%M%SZ")
    return Path(settings.BASE_DIR) / "var" / "scenarios" / f"{stamp}.jsonl"
