"""Long fuzz run: ≥100,000 generated inputs per parser, every one a result or the parser's documented error.

Drives the generators and contract checks of tests/fuzz/targets.py (the CI short mode runs the same
ones under Hypothesis) from seeded `random.Random` choosers, which is what makes 100k examples per
parser affordable. Example ``i`` of a run with ``--seed S`` is fully determined by ``S + i``: a crash
is printed with its seed, and ``--replay SEED --only NAME`` shows the input and the traceback.

An example that raises anything but the documented error, breaks the contract check, or runs longer
than ``--hang-s`` seconds (a super-linear path) counts as a crash.

Run: ``./dev bench fuzz [--examples N] [--only exposition,slurm] [--seed S]``. The last line is
``RESULT fuzz min_examples_per_parser=<n> crashes=<n> target=crashes=0 PASS|FAIL``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

import django  # noqa: E402

django.setup()  # the ingest and topology validators read model choices; no database is touched

from hypothesis.configuration import set_hypothesis_home_dir  # noqa: E402

set_hypothesis_home_dir(REPO / "var" / "hypothesis")  # its caches go to ignored scratch space, as in the tests

from tests.fuzz import targets  # noqa: E402
from tests.fuzz.strategies import RandomChooser  # noqa: E402

TARGET_CRASHES = 0


class Hang(Exception):
    """An example ran past --hang-s."""


def _on_alarm(signum, frame):
    raise Hang("example ran past the hang limit")


def _signature(exc: BaseException) -> str:
    """Exception type and the innermost frame in our code: one line per distinct bug."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if str(REPO) in f.filename]
    where = f"{Path(frames[-1].filename).relative_to(REPO)}:{frames[-1].lineno}" if frames else "?"
    return f"{type(exc).__name__} at {where}"


def run_target(target: targets.Target, examples: int, seed: int, hang_s: float) -> tuple[int, float, Counter, dict]:
    crashes: Counter = Counter()
    first: dict[str, tuple[int, str]] = {}
    step = max(1, examples // 10)
    start = time.perf_counter()
    for i in range(examples):
        case_seed = seed + i
        case = target.generate(RandomChooser(case_seed))  # outside the try: a generator bug must not pass as a crash
        signal.setitimer(signal.ITIMER_REAL, hang_s)
        try:
            target.check(case)
        except Exception as exc:  # noqa: BLE001 - anything undocumented is exactly what is being counted
            sig = _signature(exc)
            crashes[sig] += 1
            first.setdefault(sig, (case_seed, str(exc)[:160]))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if (i + 1) % step == 0:
            elapsed = time.perf_counter() - start
            print(f"  {target.name:<12} {i + 1:>8,} examples  {elapsed:7.1f} s  {(i + 1) / elapsed:7,.0f}/s  "
                  f"crashes {sum(crashes.values())}", flush=True)
    return examples, time.perf_counter() - start, crashes, first


def replay(target: targets.Target, seed: int) -> None:
    case = target.generate(RandomChooser(seed))
    print(f"input: {case!r}"[:4000])
    target.check(case)
    print("no crash")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=int(os.environ.get("BW_FUZZ_EXAMPLES", 100_000)))
    parser.add_argument("--only", default="", help=f"comma-separated subset of {', '.join(targets.TARGETS)}")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--hang-s", type=float, default=10.0)
    parser.add_argument("--replay", type=int, default=None, help="show and check the one example with this seed")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(targets.TARGETS)
    unknown = set(names) - set(targets.TARGETS)
    if unknown:
        parser.error(f"unknown target(s) {sorted(unknown)}; choose from {', '.join(targets.TARGETS)}")
    signal.signal(signal.SIGALRM, _on_alarm)
    if args.replay is not None:
        for name in names:
            replay(targets.TARGETS[name], args.replay)
        return
    print(f"fuzzing {', '.join(names)}: {args.examples:,} examples each, seed {args.seed}", flush=True)
    rows = []
    try:
        for name in names:
            n, secs, crashes, first = run_target(targets.TARGETS[name], args.examples, args.seed, args.hang_s)
            rows.append((name, n, secs, sum(crashes.values())))
            for sig, count in crashes.most_common():
                seed, message = first[sig]
                print(f"    CRASH x{count}: {sig}: {message!r} (replay: --only {name} --replay {seed})")
    finally:
        for box in targets._sandbox:
            box.close()
    print(f"\n{'parser':<12} {'examples':>10} {'seconds':>9} {'per s':>8} {'crashes':>8}")
    for name, n, secs, crashed in rows:
        print(f"{name:<12} {n:>10,} {secs:9.1f} {n / secs:8,.0f} {crashed:>8}")
    total = sum(r[3] for r in rows)
    least = min(r[1] for r in rows)
    verdict = "PASS" if total <= TARGET_CRASHES and least >= 100_000 else "FAIL"
    print(f"RESULT fuzz min_examples_per_parser={least} crashes={total} target=crashes={TARGET_CRASHES} {verdict}")


if __name__ == "__main__":
    main()
