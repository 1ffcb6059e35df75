"""Write tests/slow.txt: the tests that took more than a threshold in a measured run of the whole suite.

    ./dev test --durations=0 -p no:cacheprovider > /tmp/run.log
    ./.venv/bin/python scripts/slow_tests.py /tmp/run.log [--over 0.5]

tests/conftest.py marks every test listed there `slow`, so `./dev test --fast` (which deselects browser, Slurm and
slow tests) stays under three minutes as tests are added: rerun this after a change that adds slow tests.
A test's time is its setup, call and teardown together, as pytest's durations report them.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "slow.txt"
HEADER = """# Tests marked `slow` by tests/conftest.py (left out of `./dev test --fast`; CI runs everything): each took
# more than {over} s (setup, call and teardown) in a measured run of the whole suite on a 2-core machine.
# Regenerate with scripts/slow_tests.py from `./dev test --durations=0` output; do not edit by hand.
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path, help="the output of `./dev test --durations=0`")
    ap.add_argument("--over", type=float, default=0.5, help="seconds above which a test is slow (default 0.5)")
    args = ap.parse_args()
    text = args.log.read_text(errors="replace")
    if "slowest durations" not in text:
        raise SystemExit(f"{args.log}: no durations report in it (run the suite with --durations=0)")
    per: dict[str, float] = defaultdict(float)
    for seconds, _phase, node in re.findall(r"^([\d.]+)s (call|setup|teardown)\s+(\S+)",
                                            text.split("slowest durations", 1)[1], re.M):
        per[node] += float(seconds)
    slow = sorted(n for n, s in per.items() if s > args.over)
    OUT.write_text(HEADER.format(over=args.over) + "\n".join(slow) + "\n")
    print(f"{len(slow)} of {len(per)} timed tests over {args.over} s -> {OUT}")


if __name__ == "__main__":
    main()
