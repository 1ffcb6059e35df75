"""The search box in a real browser, by keyboard only: header box → results page → a result's page."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from telemetry.topology import do_import_topology, load_topology_file
from tests.conftest import save_screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PASSWORD = "correct-horse-battery"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"


@pytest.fixture
def cluster(db):
    get_user_model().objects.create_superuser("op", "op@example.com", PASSWORD)
    do_import_topology(load_topology_file(FIXTURES / "good.yaml"))


def _tab_to(page, element_id: str, limit: int = 60) -> None:
    """Press Tab until `element_id` has the focus, as a keyboard user would."""
    for _ in range(limit):
        if page.evaluate("document.activeElement && document.activeElement.id") == element_id:
            return
        page.keyboard.press("Tab")
    raise AssertionError(f"Tab never reached #{element_id}")


def test_header_search_to_results_to_page_by_keyboard(cluster, asgi_server, browser_page):
    page = browser_page
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(f"{asgi_server.url}/login/?next=/search/")
    page.fill("input[name=username]", "op")
    page.fill("input[name=password]", PASSWORD)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{asgi_server.url}/search/", wait_until="load")

    _tab_to(page, "bw-q")
    page.keyboard.type("gpu-000")
    page.keyboard.press("Enter")
    page.wait_for_url("**/search/?q=gpu-000")
    assert page.inner_text("h1") == "Search"
    assert page.inner_text("#bw-results-node").lower() == "nodes 3"  # CSS upper-cases headings
    links = page.eval_on_selector_all("[data-kind=node] a", "els => els.map(e => e.getAttribute('href'))")
    assert links == ["/nodes/gpu-0001/", "/nodes/gpu-0002/", "/nodes/gpu-0003/"]
    assert page.locator("[data-kind=node] .bw-badge").first.inner_text() == "No data"
    save_screenshot(page, "search-results")

    # On to the first result, by keyboard: its page opens.
    page.focus("#bw-search-q")
    page.keyboard.press("Tab")  # the Search button
    page.keyboard.press("Tab")  # the kinds' summary: "Nodes 3"
    page.keyboard.press("Tab")  # the first result
    assert page.evaluate("document.activeElement.getAttribute('href')") == "/nodes/gpu-0001/"
    page.keyboard.press("Enter")
    page.wait_for_url("**/nodes/gpu-0001/", wait_until="load")

    # An exact match goes straight to its page.
    _tab_to(page, "bw-q")
    page.keyboard.type("gpu-0001 gpu 2")
    page.keyboard.press("Enter")
    page.wait_for_url("**/gpus/GPU-167d8376-ee13-fca4-938a-a05167c43cdc/")
    assert not [e for e in errors if "Content Security Policy" in e], errors
