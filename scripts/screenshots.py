"""Screenshots of the main operator pages of a running Breakwater, for the README.

    ./dev up   # in another terminal, ideally with BW_SIM_ARGS="--scenario straggler --scenario congested-uplink"
    .venv/bin/python scripts/screenshots.py [--server http://127.0.0.1:8000] [--out docs/screenshots]

Logs in as the operator (var/operator_password), opens each page in Debian's Chromium, waits for
its Dash app to settle and saves one PNG per page. The job page is the running job with the most
GPUs (or the one named with --job).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

REPO = Path(__file__).resolve().parent.parent
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
SETTLED = """() => document.querySelector('#react-entry-point') === null ||
  (document.querySelector('#react-entry-point').children.length > 0 &&
   document.querySelectorAll('[data-dash-is-loading="true"]').length === 0)"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default="http://127.0.0.1:8000")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    ap.add_argument("--job", help="job key for the job page (default: the biggest running job)")
    ap.add_argument("--gpu", help="GPU UUID for the GPU page (default: the first one found by search)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    password = (REPO / "var" / "operator_password").read_text().strip()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        # bypass_csp: wait_for_function re-checks its predicate by eval inside the page, which the
        # pages' CSP forbids; the CSP itself is tested by tests/security/test_csp_browser.py.
        page = browser.new_page(viewport={"width": 1440, "height": 900}, bypass_csp=True)
        page.goto(f"{args.server}/login/")
        page.fill("input[name=username]", "operator")
        page.fill("input[name=password]", password)
        page.click("button[type=submit]")
        page.wait_for_url(f"{args.server}/")
        pages = {"fleet": "/", "racks": "/racks/", "nvlink": "/nvlink/", "fabric": "/fabric/", "power": "/power/",
                 "jobs": "/jobs/", "anomalies": "/anomalies/", "reliability": "/reliability/"}
        for name, path in pages.items():
            shoot(page, args, name, path)
        job = args.job or page.evaluate(
            "Array.from(document.querySelectorAll('a')).map(a => a.getAttribute('href'))"
            ".filter(h => h && /^\\/jobs\\/[^/]+\\/$/.test(h))[0]")
        if job:
            shoot(page, args, "job", job if job.startswith("/") else f"/jobs/{job}/")
        page.goto(f"{args.server}/racks/")
        page.wait_for_function("window.BW && BW.heatmapStats && BW.heatmapStats.renderedAt !== null", timeout=30_000)
        # A GPU's UUID from the first tooltip that names one (its third line).
        uuid = args.gpu or page.evaluate("document.querySelector('#heatmap .js-plotly-plot').data[0].text.flat()"
                                         ".find(t => t && t.includes(' · GPU ')).split('<br>')[2]")
        shoot(page, args, "gpu", f"/gpus/{uuid}/")
        browser.close()


def shoot(page, args, name: str, path: str, *, full: bool = False) -> None:
    page.goto(f"{args.server}{path}")
    page.wait_for_function(SETTLED, timeout=30_000)
    time.sleep(1.5)  # the first live push lands
    target = args.out / f"{name}.png"
    page.screenshot(path=str(target), full_page=full, timeout=120_000)
    print(f"{name}: {path} -> {target.relative_to(REPO)}", flush=True)


if __name__ == "__main__":
    main()
