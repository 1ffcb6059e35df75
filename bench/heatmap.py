"""bench/heatmap: the rack heatmap at 16,384 GPUs in Debian's Chromium, through a real daphne.

Measures, on a scratch database filled by the cluster simulator (topology + one tick):

- cold_first_render_s: the first load of a fresh browser (login → every GPU's cell painted, plotly.js
  and the page's assets fetched), median of three fresh browser contexts (one load beside a ticking
  simulator ranged 2.5-4.1 s in one hour). Target ≤ 3 s.
- first_render_s: navigation start → every GPU's cell painted, median of several loads with the
  browser's static cache warm (an operator's browser has loaded Breakwater before; plotly.js
  is fetched once). Target ≤ 1.5 s.
- update_ms: a websocket push received → the changed cells painted, median over pushes that
  change every GPU's value (the worst case: a whole fleet's tick). Target ≤ 250 ms.
- ingest_to_paint_s: an ingest POST of every GPU's temperature → that value painted in the browser
  (includes the publish slot: one second, or eight times the fleet summary's cost where that is
  longer, telemetry/live.py). Target ≤ 2 s, the page promise. Each push carries a temperature the
  simulator never sends (150 °C and up), so the paint it waits for is that push's own: this push's
  values on at least half the cells (beside the simulator, a GPU it reports after the push already
  shows the simulator's newer value).
- Baseline, same page, same data: the same update delivered without deltas, as a full reload of
  the grid and values through the Dash callback and a redraw.

With --beside (default on) the simulator keeps ticking the whole fleet every 10 s through the same
daphne for the whole measurement, as a live 16k site does; --no-beside measures an idle server.
The Celery worker and beat (rollups, alert evaluation, metering) are not started: bench/soak runs
the whole stack.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from contextlib import ExitStack
from datetime import UTC, datetime

from _common import (
    daphne_server,
    drop_database,
    median,
    recreate_database,
    say,
    scratch_database_url,
    setup_django,
    simulate_once,
    simulator_ticking,
)

CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]
PASSWORD = "bench-operator-pw"
FIRST_RENDER_TARGET_S = 1.5
COLD_RENDER_TARGET_S = 3.0
UPDATE_TARGET_MS = 250.0
INGEST_TO_PAINT_TARGET_S = 2.0
MARKER_C = 150.0  # pushed temperatures start here: no simulated GPU runs this hot
RENDERED = "window.BW && BW.heatmapStats && BW.heatmapStats.renderedAt !== null"


def push_all(server: str, token: str, hosts: list[str], uuids: list[str], temp: float) -> float:
    """Every GPU's temperature set to `temp` (plus its index, so cells differ); returns POST seconds."""
    body = {"gpus": {"host": hosts, "uuid": uuids, "time": datetime.now(UTC).isoformat(),
                     "fields": {"gpu_temp": [temp + (i % 7) for i in range(len(uuids))]}}}
    req = urllib.request.Request(f"{server}/api/v1/ingest", data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=60) as resp:
        resp.read()
    return time.perf_counter() - t0


def open_page(page, server: str) -> float:
    """Load /racks/ and return seconds from navigation start to the heatmap painted."""
    page.goto(f"{server}/racks/")
    page.wait_for_function(RENDERED, timeout=60_000)
    return page.evaluate("BW.heatmapStats.renderedAt") / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--colds", type=int, default=3, help="cold loads to time, each in a fresh browser context")
    ap.add_argument("--loads", type=int, default=5, help="warm-cache page loads to time")
    ap.add_argument("--updates", type=int, default=5, help="whole-fleet pushes to time")
    ap.add_argument("--beside", action=argparse.BooleanOptionalAction, default=True,
                    help="keep the simulator ticking the whole fleet every 10 s during the measurement")
    args = ap.parse_args()
    if min(args.colds, args.loads, args.updates) < 1:
        ap.error("--colds, --loads and --updates must each be at least 1")

    url = scratch_database_url("heatmap")
    recreate_database(url)
    setup_django(url)
    from django.contrib.auth import get_user_model
    from playwright.sync_api import sync_playwright

    from telemetry.actions import do_create_collector_token
    from telemetry.models import Gpu

    try:
        with daphne_server(url) as server, ExitStack() as beside:
            simulate_once(server, args.gpus)
            get_user_model().objects.create_superuser("bench", "bench@example.com", PASSWORD)
            rows = list(Gpu.objects.select_related("node").order_by("id").values_list("node__hostname", "uuid"))
            hosts, uuids = [h for h, _ in rows], [u for _, u in rows]
            token = do_create_collector_token("bench-heatmap-push", replace=True)
            if args.beside:
                beside.enter_context(simulator_ticking(server, args.gpus))
            say(f"{len(uuids):,} GPUs in the inventory; starting Chromium")
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
                # bypass_csp: wait_for_function re-checks its predicate by eval inside the page, which the
                # pages' CSP forbids; the CSP itself is tested by tests/security/test_csp_browser.py.
                # Each cold load is a fresh browser context: an empty cache, no session, no compiled code.
                colds, context = [], None
                for i in range(args.colds):
                    if context is not None:
                        context.close()
                    context = browser.new_context(viewport={"width": 1600, "height": 1000}, bypass_csp=True)
                    page = context.new_page()
                    page.goto(f"{server}/login/?next=/racks/")
                    page.fill("input[name=username]", "bench")
                    page.fill("input[name=password]", PASSWORD)
                    page.click("button[type=submit]")
                    page.wait_for_function(RENDERED, timeout=60_000)
                    colds.append(page.evaluate("BW.heatmapStats.renderedAt") / 1000)
                    say(f"cold-cache first render {i + 1}/{args.colds}: {colds[-1]:.2f} s")
                cold = median(colds)
                loads = []
                for i in range(args.loads):
                    loads.append(open_page(page, server))
                    say(f"warm load {i + 1}/{args.loads}: {loads[-1]:.2f} s")
                # GPU cells drawn: cells whose tooltip names a GPU.
                cells = page.evaluate("document.querySelector('#heatmap .js-plotly-plot').data[0].text.flat()"
                                      ".filter(t => t && t.includes(' · GPU ')).length")
                assert cells == len(uuids), f"page drew {cells} GPU cells for {len(uuids)} GPUs"

                page.wait_for_selector("#bw-conn[data-state=live]", timeout=30_000)
                # Colour by temperature, then time whole-fleet pushes.
                page.click("#metric")
                page.click("text=GPU temperature (°C)")
                page.wait_for_function("document.getElementById('bw-heatmap-page').dataset.metric === 'gpu_temp'",
                                       timeout=60_000)
                page.wait_for_function("BW.heatmapStats.applied > 0", timeout=30_000)
                updates, e2e = [], []
                for i in range(args.updates):
                    marker = MARKER_C + 10 * i
                    t0 = time.perf_counter()
                    post_s = push_all(server, token, hosts, uuids, marker)
                    # painted: this push's own values are on the grid (customdata: each cell's formatted value;
                    # z holds colours clamped to the metric's range). Half the fleet, not all of it: the simulator
                    # beside spreads each tick's requests over its 10 s, and a GPU it reports after the push shows
                    # the simulator's newer value instead, so "every cell" never came when the paint took longer
                    # than the next tick's start (most runs at a 2-3 s paint). No simulated GPU reaches 150 °C, so
                    # a cell with this push's marker was painted from this push.
                    page.wait_for_function(
                        "document.querySelector('#heatmap .js-plotly-plot').data[0].customdata.flat()"
                        f".filter(t => typeof t === 'string' && /: {int(marker) // 10}\\d[ .]/.test(t)).length"
                        f" >= {len(uuids) // 2}", timeout=30_000)
                    e2e.append(time.perf_counter() - t0)
                    ms, n = page.evaluate("[BW.heatmapStats.lastApplyMs, BW.heatmapStats.lastCells]")
                    updates.append(ms)
                    say(f"push {i + 1}/{args.updates}: {n:,} cells applied in {ms:.0f} ms "
                        f"(ingest POST {post_s:.2f} s, POST start → painted {e2e[-1]:.2f} s)")
                # Baseline: the same change delivered the way a page without deltas would get it,
                # a full reload of the grid and values through the Dash callback, then a redraw.
                baseline = []
                for _ in range(args.updates):
                    before = page.evaluate("BW.heatmapStats.renders")
                    t0 = page.evaluate("performance.now()")
                    page.evaluate("dash_clientside.set_props('heatmap-reload', {data: Date.now()})")
                    page.wait_for_function(f"BW.heatmapStats.renders > {before}", timeout=60_000)
                    baseline.append(page.evaluate("performance.now()") - t0)
                    say(f"baseline full reload: {baseline[-1]:.0f} ms")
                browser.close()
    finally:
        drop_database(url)

    first, update, base = median(loads), median(updates), median(baseline)
    say(f"full reload (baseline) median {base:.0f} ms; patch path {update:.0f} ms "
        f"({base / update:.1f}× faster); ingest → painted median {median(e2e):.2f} s")
    paint = median(e2e)
    ok = (cold <= COLD_RENDER_TARGET_S and first <= FIRST_RENDER_TARGET_S and update <= UPDATE_TARGET_MS
          and paint <= INGEST_TO_PAINT_TARGET_S)
    print(f"RESULT heatmap cold_first_render_s={cold:.2f} first_render_s={first:.2f} update_ms={update:.0f} "
          f"ingest_to_paint_s={paint:.2f} target=cold<={COLD_RENDER_TARGET_S},warm<={FIRST_RENDER_TARGET_S},"
          f"update_ms<={UPDATE_TARGET_MS:.0f},ingest_to_paint_s<={INGEST_TO_PAINT_TARGET_S} gpus={len(uuids)} "
          f"beside={'simulator' if args.beside else 'idle'} baseline_reload_ms={base:.0f} "
          f"cold_runs_s={'/'.join(f'{c:.2f}' for c in colds)} "
          f"{'PASS' if ok else 'FAIL'}", flush=True)


if __name__ == "__main__":
    main()
