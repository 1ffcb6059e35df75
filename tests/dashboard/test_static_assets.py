"""plotly.js: one pinned cartesian bundle for every page (scripts/js-assets.txt, dashboard.staticfiles).

The pages draw scatter, bar and heatmap traces only; the cartesian bundle holds those at a third of the full
bundle's bytes. These tests fail when the plotly Python package moves to another plotly.js (bump the pin), when a
page starts drawing a trace the bundle lacks, or when a Dash graph would load the full bundle again.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.staticfiles import finders
from plotly.offline import get_plotlyjs_version

from dashboard.staticfiles import DASH_ASSET_VERSION, PLOTLY_JS_PATH, PLOTLY_JS_URL, PLOTLY_JS_VERSION
from tests import personas

REPO = Path(__file__).resolve().parents[2]
FULL_BUNDLE = Path(get_plotlyjs_version.__code__.co_filename).parents[1] / "package_data" / "plotly.min.js"
TRACE = re.compile(r'moduleType:"trace",name:"(\w+)"')
# A figure's trace type as the code writes it: `type: "bar"` (JavaScript) or `"type": "bar"` (Python, JSON).
NAMED_TYPE = re.compile(r'''["']?type["']?\s*:\s*["'](\w+)["']''')


def _bundle() -> str:
    path = finders.find(PLOTLY_JS_PATH)
    assert path, f"{PLOTLY_JS_PATH} is missing: ./dev fetches it (scripts/fetch-js-assets)"
    return Path(path).read_text()


def test_the_pinned_bundle_is_the_plotly_packages_version_and_is_fetched():
    assert PLOTLY_JS_VERSION == get_plotlyjs_version()
    assert re.match(rf"/\*\*\s*\* plotly\.js \(cartesian - minified\) v{re.escape(PLOTLY_JS_VERSION)}\b", _bundle())
    assert PLOTLY_JS_URL == f"/static/{PLOTLY_JS_PATH}?v={PLOTLY_JS_VERSION}"


def test_every_trace_type_the_pages_draw_is_in_the_bundle():
    every_trace = set(TRACE.findall(FULL_BUNDLE.read_text()))
    assert {"scatter", "heatmap", "bar", "scattergl", "sankey"} <= every_trace  # the pattern still finds traces
    sources = [*(REPO / "dashboard").rglob("*.py"), *(REPO / "dashboard" / "static").rglob("*.js"),
               *(REPO / "templates").rglob("*.html"), *(REPO / "telemetry" / "selectors").rglob("*.py"),
               *(REPO / "tenancy").rglob("*.py"), *(REPO / "anomaly").rglob("*.py")]
    drawn = {name for path in sources for name in NAMED_TYPE.findall(path.read_text()) if name in every_trace}
    assert {"scatter", "heatmap", "bar"} <= drawn
    assert drawn <= set(TRACE.findall(_bundle())), "a page draws a trace the cartesian bundle lacks"


@pytest.fixture
def operator(client):
    return personas.signed_in(personas.operator("assets-operator"), client)


@pytest.mark.django_db
def test_dash_graphs_load_the_pinned_bundle_and_other_suites_keep_their_version(operator):
    plotly = operator.get("/django_plotly_dash/app/heatmap/_dash-component-suites/plotly/package_data/plotly.min.js")
    assert plotly.status_code == 302 and plotly["Location"] == PLOTLY_JS_URL
    react = operator.get("/django_plotly_dash/app/heatmap/_dash-component-suites/dash/deps/react@18.3.1.min.js")
    assert react.status_code == 302 and react["Location"].endswith(f"?v={DASH_ASSET_VERSION}")
    assert "plotly" not in react["Location"]


@pytest.mark.django_db
def test_a_page_loads_only_the_component_libraries_its_app_uses(operator):
    def scripts(path):
        return " ".join(re.findall(r'<script src="([^"]+)"', operator.get(path).content.decode()))

    racks, fabric = scripts("/racks/"), scripts("/fabric/")
    assert "dash_renderer" in racks and "dash_core_components" in racks
    assert "dash_cytoscape" not in racks  # 0.5 MB that only the fabric page draws with
    assert "dash_cytoscape" in fabric


def test_a_missing_bundle_is_a_system_check_error(settings, tmp_path):
    from django.core import checks

    assert [m for m in checks.run_checks(tags=[checks.Tags.staticfiles]) if m.id == "breakwater.E001"] == []
    settings.STATICFILES_DIRS = [REPO / "dashboard" / "static", ("vendor", tmp_path)]  # nothing fetched there
    errors = [m for m in checks.run_checks(tags=[checks.Tags.staticfiles]) if m.id == "breakwater.E001"]
    assert len(errors) == 1 and PLOTLY_JS_PATH in errors[0].msg and "fetch-js-assets" in errors[0].hint
