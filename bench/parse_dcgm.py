"""Benchmark: our exposition parser (and the DCGM mapper) against prometheus_client.

Builds a 1,000-host scrape from the real dcgm-exporter captures under shared/data/dcgm: every
host gets every capture's lines, with its own Hostname and fresh GPU UUIDs, so label sets repeat
the way they do in a real fleet (once per GPU, ~20 metrics each) while no two hosts share one.
Values are left exactly as captured.

Run: ``.venv/bin/python bench/parse_dcgm.py [--hosts N] [--runs N]``. The last line is
``RESULT parse_dcgm ratio=<baseline/ours> target=20 PASS|FAIL``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from telemetry.ingest.dcgm import dcgm_records  # noqa: E402
from telemetry.ingest.prometheus import parse_exposition  # noqa: E402

TARGET_RATIO = 20.0
_HOST_RE = re.compile(r'Hostname="[^"]*"')
_UUID_RE = re.compile(r'UUID="GPU-([0-9a-fA-F]{8})-([^"]*)"')


def shared_data() -> Path:
    """Same rule as tests/conftest.py: the env var, else ../shared/data beside the checkout."""
    return Path(os.environ.get("BREAKWATER_SHARED_DATA", REPO.parent / "shared" / "data"))


def load_captures(root: Path) -> list[str]:
    paths = sorted((root / "dcgm").glob("**/*.prom"))
    if not paths:
        sys.exit(f"no .prom captures under {root / 'dcgm'}; set BREAKWATER_SHARED_DATA")
    return [p.read_text(encoding="utf-8") for p in paths]


def build_fleet(captures: list[str], hosts: int) -> str:
    """Replicate every capture once per host with a host name and UUIDs unique to that host."""
    # Swap the real names for format slots once, then fill them per host.
    templates = []
    for index, text in enumerate(captures):
        text = text.replace("{", "{{").replace("}", "}}")
        text = _HOST_RE.sub('Hostname="{host}"', text)
        # The first UUID group becomes host+capture, so a UUID never repeats across hosts or
        # across captures of one host (two captures came from the same vendor node).
        text = _UUID_RE.sub(lambda m, i=index: f'UUID="GPU-{{h:04x}}{i:04x}-{m[2]}"', text)
        templates.append(text if text.endswith("\n") else text + "\n")
    block = "".join(templates)
    return "".join(block.format(host=f"gpu-node-{h:04d}", h=h) for h in range(hosts))


def best_of(label: str, runs: int, func: Callable[[], int]) -> tuple[float, int]:
    """Best wall time over ``runs`` calls; ``func`` returns the number of samples it produced."""
    best = float("inf")
    count = 0
    for run in range(1, runs + 1):
        start = time.perf_counter()
        count = func()
        elapsed = time.perf_counter() - start
        best = min(best, elapsed)
        print(f"  {label:<28} run {run}/{runs}: {elapsed:8.3f} s", flush=True)
    return best, count


def baseline_count(text: str) -> int:
    return sum(1 for family in text_string_to_metric_families(text) for _ in family.samples)


def ours_count(text: str) -> int:
    return len(parse_exposition(text))


def ours_with_records(text: str) -> int:
    samples = parse_exposition(text)
    records = dcgm_records(samples)
    if not records.gpus:
        raise SystemExit("dcgm_records produced no GPU rows")
    return len(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5, help="runs of our parser (best is kept)")
    parser.add_argument("--baseline-runs", type=int, default=3)
    args = parser.parse_args()

    captures = load_captures(shared_data())
    text = build_fleet(captures, args.hosts)
    lines = text.count("\n")
    print(f"captures: {len(captures)} files; fleet: {args.hosts} hosts, {lines:,} lines, "
          f"{len(text.encode()) / 1e6:.1f} MB")

    ours, n_ours = best_of("parse_exposition", args.runs, lambda: ours_count(text))
    mapped, n_mapped = best_of("parse + dcgm_records", args.runs, lambda: ours_with_records(text))
    base, n_base = best_of("prometheus_client", args.baseline_runs, lambda: baseline_count(text))
    assert n_ours == n_base == n_mapped, f"sample counts differ: {n_ours} {n_mapped} {n_base}"

    print(f"\n{'parser':<28} {'best s':>9} {'samples/s':>14}")
    for label, secs in (
        ("parse_exposition", ours),
        ("parse + dcgm_records", mapped),
        ("prometheus_client", base),
    ):
        print(f"{label:<28} {secs:9.3f} {n_ours / secs:14,.0f}")
    # Round once, so the printed ratio and the verdict can never disagree.
    ratio = round(base / ours, 1)
    verdict = "PASS" if ratio >= TARGET_RATIO else "FAIL"
    print(f"samples per parse: {n_ours:,}")
    print(f"RESULT parse_dcgm ratio={ratio:.1f} target={TARGET_RATIO:g} {verdict}")


if __name__ == "__main__":
    main()
