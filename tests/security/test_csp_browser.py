"""Every operator page type under the enforced Content-Security-Policy, in Debian's Chromium against a real
daphne: not one violation is reported, and each page's Dash app (or its own script) has drawn its content.

Violations are caught twice: a `securitypolicyviolation` listener installed before any page script runs, and
Chromium's console errors ("Refused to …"), which also cover what happens before the listener could see it.
"""

from __future__ import annotations

import re
import time

import pytest
from django.utils import timezone
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from dashboard.security import DASH_RENDERER_LAUNCHER, script_hash
from tests import personas
from tests.tenancy.test_portal import PASSWORD, build_world

COLLECT_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__cspViolations.push(e.violatedDirective + " blocked " + (e.blockedURI || "inline") + " at " +
                              e.sourceFile + ":" + e.lineNumber + " " + (e.sample || ""));
});
"""
DASH_SETTLED = """document.querySelector('#react-entry-point').children.length > 0 &&
  document.querySelectorAll('[data-dash-is-loading="true"]').length === 0"""


def _drawn(stats: str, field: str = "renderedAt") -> str:
    return f"window.BW && BW.{stats} && BW.{stats}.{field} !== null && {DASH_SETTLED}"


# Page, and a JavaScript condition that holds once its content has been drawn in the browser.
OPERATOR_PAGES = [
    # The fleet's websocket going live proves connect-src admits the ws: origin.
    ("/", "document.querySelector('#bw-conn').dataset.state === 'live'"),
    ("/racks/", _drawn("heatmapStats")),
    ("/nvlink/", _drawn("nvlinkStats")),
    ("/fabric/", _drawn("fabricStats", "graphRenderedAt")),
    ("/power/", _drawn("powerStats")),
    ("/jobs/", _drawn("jobsStats") + " && document.querySelectorAll('#jobs-table tbody tr').length > 0"),
    ("/jobs/slurm:101/", _drawn("jobStats")),
    ("/gpus/GPU-node-101-0/", _drawn("seriesStats")),
    ("/nodes/node-101/", _drawn("seriesStats")),
    ("/anomalies/", "document.querySelector('#bw-anom-chart[data-rendered=true] .main-svg') !== null"),
    # No survival model is fitted here (a fit costs seconds): the page says how to fit one. Its plotly.js
    # drawing is the anomalies' and the portal's, the same locally served bundle.
    ("/reliability/", "document.querySelector('#bw-reliability-empty') !== null"),
    ("/alerts/", "document.querySelectorAll('.bw-alert-row').length === 2"),
    # The rule form's field switch is forms.js (it was an inline script): a threshold rule hides xid fields.
    ("/alerts/rules/", "document.querySelector('#bw-rule-form [data-kinds]:not([hidden])') !== null && "
                       "document.querySelector('#bw-rule-form [data-kinds][hidden]') !== null"),
    ("/chargeback/", "document.querySelectorAll('#bw-tenants tr[data-tenant]').length >= 5"),
]
TENANT_PAGES = [("/portal/llm-core/", "document.querySelectorAll('#bw-usage-chart[data-rendered=true] .main-svg, "
                                      "#bw-cost-chart[data-rendered=true] .main-svg').length >= 2")]


class CspVisitor:
    """Opens pages in one tab; collects CSP violations and JavaScript errors, named by page."""

    def __init__(self, page, url: str):
        self.page, self.url, self.path, self.problems = page, url, "", []
        page.add_init_script(COLLECT_VIOLATIONS)
        page.on("pageerror", lambda exc: self.problems.append(f"{self.path}: {exc}"))
        page.on("console", lambda msg: self.problems.append(f"{self.path}: {msg.text}")
                if msg.type == "error" or "Content Security Policy" in msg.text else None)

    def sign_in(self, username: str) -> None:
        self.page.goto(f"{self.url}/login/")
        self.page.fill("input[name=username]", username)
        self.page.fill("input[name=password]", PASSWORD)
        self.page.click("button[type=submit]")
        self.page.wait_for_load_state()

    def visit(self, path: str, drawn: str) -> float:
        self.path = path
        started = time.monotonic()
        response = self.page.goto(f"{self.url}{path}")
        assert response.status == 200, (path, response.status)
        policy = response.headers["content-security-policy"]
        assert "'unsafe-eval'" not in policy and "script-src 'self' 'sha256-" in policy, policy
        try:
            self.page.wait_for_function(f"() => {drawn}", timeout=15_000)
        except PlaywrightTimeout:
            pytest.fail(f"{path} drew nothing within 15 s; problems so far: {self.problems}")
        self.page.wait_for_timeout(200)  # a late chunk or style a callback adds would be reported just after
        self.problems += [f"{path}: {v}" for v in self.page.evaluate("window.__cspViolations")]
        return time.monotonic() - started


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
# Fifteen pages, nine of them Dash apps with ~6 MB of JavaScript: well under a minute on an idle runner, but
# several times that on a shared, overloaded machine, where the suite's default 120 s would cut it off.
@pytest.mark.timeout(300)
def test_every_page_type_renders_under_the_enforced_csp_without_a_violation(asgi_server, browser_page):
    build_world(timezone.now())
    personas.operator("op")
    visitor = CspVisitor(browser_page, asgi_server.url)

    visitor.sign_in("op")
    seconds = {path: visitor.visit(path, drawn) for path, drawn in OPERATOR_PAGES}
    browser_page.context.clear_cookies()
    visitor.sign_in("llm-dev")  # a member of the llm-core tenant
    seconds |= {path: visitor.visit(path, drawn) for path, drawn in TENANT_PAGES}

    print("page seconds:", {p: round(s, 2) for p, s in seconds.items()})
    print("\n".join(visitor.problems))
    assert visitor.problems == []



# --- The header itself, through the test client (fast) -------------------------------------------------


@pytest.fixture
def operator_client(client, django_user_model):
    personas.signed_in(personas.operator("csp-op"), client)
    return client


def _directives(policy: str) -> dict[str, str]:
    return dict(d.strip().split(" ", 1) for d in policy.split(";"))


@pytest.mark.django_db
def test_html_gets_the_policy_with_the_websocket_origin_and_json_gets_none(operator_client):
    page = operator_client.get("/racks/")
    policy = _directives(page["Content-Security-Policy"])
    assert policy["connect-src"] == "'self' ws://testserver"
    assert policy["object-src"] == "'none'" and policy["base-uri"] == "'self'" and policy["default-src"] == "'self'"
    assert "'unsafe-inline'" not in policy["script-src"] and "'unsafe-eval'" not in page["Content-Security-Policy"]
    # Development frames nothing but allows its own origin, like X-Frame-Options SAMEORIGIN there.
    assert page["X-Frame-Options"] == "SAMEORIGIN" and policy["frame-ancestors"] == "'self'"
    api = operator_client.get("/django_plotly_dash/app/heatmap/_dash-layout")
    assert api["Content-Type"].startswith("application/json") and "Content-Security-Policy" not in api
    assert _directives(operator_client.get("/racks/", secure=True)["Content-Security-Policy"])["connect-src"] == (
        "'self' wss://testserver")


@pytest.mark.django_db
def test_every_inline_script_a_dash_page_runs_is_admitted_by_hash(operator_client):
    """django-plotly-dash writes the renderer launcher inline; if its text ever changes, the hash must too.
    Scripts with a src, and JSON data blocks (never executed), need nothing."""
    page = operator_client.get("/racks/")
    inline = [m.group(2) for m in re.finditer(r"<script([^>]*)>(.*?)</script>", page.content.decode(), re.S)
              if "src=" not in m.group(1) and "application/json" not in m.group(1)]
    assert inline == [DASH_RENDERER_LAUNCHER]
    assert all(script_hash(s) in page["Content-Security-Policy"] for s in inline)


@pytest.mark.django_db
def test_report_only_mode_sends_the_report_only_header_with_its_report_uri(operator_client, settings):
    settings.CSP_REPORT_ONLY = True
    settings.CSP_REPORT_URI = "https://csp.example.org/report"
    page = operator_client.get("/racks/")
    assert "Content-Security-Policy" not in page
    assert _directives(page["Content-Security-Policy-Report-Only"])["report-uri"] == "https://csp.example.org/report"


@pytest.mark.django_db
def test_production_frame_ancestors_follow_x_frame_options_deny(operator_client, settings):
    settings.X_FRAME_OPTIONS = "DENY"
    page = operator_client.get("/racks/")
    assert page["X-Frame-Options"] == "DENY"
    assert _directives(page["Content-Security-Policy"])["frame-ancestors"] == "'none'"
