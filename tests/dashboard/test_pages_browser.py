"""Every operator page in a real browser: no errors on an empty cluster, and a layout that fits a
laptop and a wall display. Screenshots of each page at both sizes are kept as artefacts."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from telemetry.topology import do_import_topology
from tests.conftest import save_screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PASSWORD = "correct-horse-battery"
PAGES = ["/", "/racks/", "/nvlink/", "/fabric/", "/power/", "/jobs/", "/anomalies/", "/reliability/", "/search/?q=gpu"]
SIZES = {"laptop": (1366, 768), "wall": (2560, 1440)}

# Dash has finished its first round of callbacks when no component is loading any more.
SETTLED = """() => document.querySelector('#react-entry-point') === null ||
  (document.querySelector('#react-entry-point').children.length > 0 &&
   document.querySelectorAll('[data-dash-is-loading="true"]').length === 0)"""


def _login(page, server) -> None:
    get_user_model().objects.create_superuser("op", "op@example.com", PASSWORD)
    page.goto(f"{server.url}/login/")
    page.fill("input[name=username]", "op")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{server.url}/")


class Visitor:
    """Opens pages in one browser tab and collects every JavaScript error, named by page."""

    def __init__(self, page, server):
        self.page, self.server, self.path, self.errors = page, server, "", []
        page.on("pageerror", lambda exc: self.errors.append(f"{self.path}: {exc}"))
        page.on("console", lambda msg: self.errors.append(f"{self.path}: {msg.text}") if msg.type == "error" else None)

    def visit(self, path: str) -> None:
        self.path = path
        response = self.page.goto(f"{self.server.url}{path}")
        assert response.status == 200, (path, response.status)
        self.page.wait_for_function(SETTLED, timeout=15_000)
        self.page.wait_for_timeout(800)  # clientside figures draw, and their exceptions surface, just after


def test_every_page_works_on_an_empty_cluster(asgi_server, browser_page):
    _login(browser_page, asgi_server)
    visitor = Visitor(browser_page, asgi_server)
    for path in PAGES:
        visitor.visit(path)
    assert visitor.errors == []


def _small_cluster() -> dict:
    racks = [{"name": f"r{k}", "position": k, "u_height": 42, "power_cap_w": 40000, "nodes": [
        {"hostname": f"gpu-{k}{n}", "u": 2 + 8 * n, "u_height": 8,
         "gpus": [{"index": i, "uuid": f"GPU-{k}{n}-{i}", "model": "NVIDIA H100 80GB HBM3"} for i in range(8)]}
        for n in range(2)]} for k in range(4)]
    return {"version": 1, "sites": [{"name": "dc1", "halls": [{"name": "hall-a", "rows": [
        {"name": "row-01", "racks": racks[:2]}, {"name": "row-02", "racks": racks[2:]}]}]}]}


@pytest.mark.parametrize("size", list(SIZES))
def test_pages_fit_laptop_and_wall_displays(asgi_server, browser_page, size):
    do_import_topology(_small_cluster())
    width, height = SIZES[size]
    browser_page.set_viewport_size({"width": width, "height": height})
    _login(browser_page, asgi_server)
    visitor = Visitor(browser_page, asgi_server)
    for path in [*PAGES, "/gpus/GPU-00-0/", "/nodes/gpu-00/"]:
        visitor.visit(path)
        overflow = browser_page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, f"{path} is {overflow}px wider than a {width}px window"
        name = path.strip("/").split("/")[0].split("?")[0] or "fleet"
        save_screenshot(browser_page, f"{name}-{size}")
    assert visitor.errors == []
