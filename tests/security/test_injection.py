"""HTML, script and SQL payloads in hostnames, GPU models, Prometheus labels, job names, alert labels, audit notes
and tenant names stay inert everywhere: server-rendered pages show them escaped, the JSON export carries them
verbatim, the CSV exports neutralise spreadsheet formulas (OWASP: a leading '), the database stores the SQL
payloads as text with its tables intact, and the Dash pages in Debian's Chromium (tooltips included) never run
them. Everything arrives through the real APIs (ingest, Prometheus, jobs, Alertmanager, ack) where one exists.
"""

from __future__ import annotations

import csv
import html
import io
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connection

from alerts.models import Alert
from core.models import AuditEntry
from telemetry.actions import do_create_collector_token
from telemetry.models import Gpu, Job, Node
from telemetry.topology import do_import_topology
from tenancy.billing import do_correct_line, do_finalize_invoice, do_generate_invoice
from tenancy.models import Invoice
from tests.tenancy.billing_factories import OCT, card, tenant, usage

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPT = "<script>window.__pwned=1</script>"
IMG = "<img src=x onerror=window.__pwned=1>"
SVG = '"><svg onload=window.__pwned=1>'
SQL = "'; DROP TABLE telemetry_gpu; --"
HYPERLINK = '=HYPERLINK("http://x.example/","click")'
CMD = "=cmd|' /C calc'!A0"
# What must never reach a page unescaped (an element or an attribute that runs script).
RAW_MARKERS = ("<script>window.__pwned", "<img src=x onerror", "<svg onload", "<marquee>")

# A placed node's hostname may hold no space, ':' or '/' (the topology and the URL path forbid them), so its
# payload is a bare element; a hostname that only arrives through ingest carries the full attribute payload.
HOST = 'gpu-"><marquee>'
HOST_SVG = f"gpu-{SVG}"
HOST_SQL = f"gpu-{SQL}"
PROM_HOST = f"prom-{IMG}"
MODEL = f"H100 {IMG}"
TENANT_NAME = f"Acme {SVG}"
ALERT_NAME = f"GpuXid{IMG}"
JOB_ID = "inj-1"
ACCOUNT = f"acct-{SVG}"
DCGM_CAPTURE = Path("dcgm/cncf-k8s-ai-conformance/v1.35_rafay.prom")
PASSWORD = "pw-injection-1"


@pytest.fixture(autouse=True)
def _flushable():
    """The audit log and final invoices refuse TRUNCATE; the flush after this transactional test may
    (tests/conftest.py does this for every test once the lead's line is in)."""
    yield
    with connection.cursor() as cur:
        cur.execute("SET breakwater.allow_truncate = 'on'")


def _api(client, path: str, body, token: str, content_type: str = "application/json"):
    data = body if isinstance(body, str) else json.dumps(body)
    response = client.post(path, data=data, content_type=content_type, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code in (200, 201, 202), (path, response.status_code, response.content[:500])
    return response


def _topology() -> dict:
    nodes = [{"hostname": HOST, "u": 2, "u_height": 4,
              "gpus": [{"index": i, "uuid": f"GPU-inj-{i}", "model": MODEL} for i in range(2)]}]
    racks = [{"name": "r0", "position": 0, "u_height": 16, "nodes": nodes}]
    return {"version": 1, "sites": [{"name": "dc1", "halls": [{"name": "hall-a", "rows": [
        {"name": "row-0", "racks": racks}]}]}]}


def _prometheus_text(shared_data: Path) -> str:
    """One line of a real dcgm-exporter capture with its Hostname and modelName labels swapped for payloads."""
    line = next(ln for ln in (shared_data / DCGM_CAPTURE).read_text().splitlines()
                if ln.startswith("DCGM_FI_DEV_GPU_TEMP{"))
    line = line.replace('modelName="Tesla T4"', 'modelName="' + SCRIPT.replace('"', '\\"') + '"')
    return line.replace('Hostname="ip-10-200-3-41"', f'Hostname="{PROM_HOST}"') + "\n"


def build_world(client, shared_data: Path) -> dict:
    """Every payload in place, through the APIs where the product has one."""
    do_import_topology(_topology())  # topology is imported from a file by the operator (no HTTP API)
    token = do_create_collector_token("injection")
    now = datetime.now(UTC).replace(microsecond=0)
    _api(client, "/api/v1/ingest", {"time": now.isoformat(), "gpus": [
        *({"host": HOST, "uuid": f"GPU-inj-{i}", "index": i, "model": MODEL, "serial": SCRIPT,
           "fields": {"gpu_temp": 60.0 + i, "gpu_util": 90.0}} for i in range(2)),
        {"host": HOST_SQL, "uuid": "GPU-sql-0", "index": 0, "model": SQL, "fields": {"gpu_temp": 50.0}},
        {"host": HOST_SVG, "uuid": "GPU-svg-0", "index": 0, "model": IMG, "fields": {"gpu_temp": 51.0}},
    ]}, token)
    _api(client, "/api/v1/ingest/prometheus", _prometheus_text(shared_data), token, "text/plain")

    acme = tenant("acme")
    acme.name = TENANT_NAME
    acme.save(update_fields=["name"])  # tenants are created by operators in the admin (no API)
    start = (now - timedelta(hours=2)).isoformat()
    job = {"job_id": JOB_ID, "name": SCRIPT, "user": IMG, "account": "acme-acct", "partition": SVG,
           "qos": "normal", "priority": 1, "state": "RUNNING", "submit": start, "start": start, "end": None,
           "nodes": [HOST], "gpus": 2, "restart_count": 0,
           "allocations": [{"node": HOST, "gpu_indexes": [0, 1], "start": start, "end": None}]}
    # A second, pending job whose account is the payload (the jobs page lists accounts as filter options).
    pending = {**job, "job_id": "inj-2", "name": IMG, "account": ACCOUNT, "state": "PENDING", "start": None,
               "nodes": [], "allocations": []}
    _api(client, "/api/v1/jobs", {"source": "slurm", "jobs": [job, pending]}, token)

    alert = {"status": "firing", "labels": {"alertname": ALERT_NAME, "severity": "critical", "Hostname": HOST,
                                            "UUID": "GPU-inj-0", "gpu": "0", "team": SCRIPT},
             "annotations": {"description": SVG, "summary": SQL}, "startsAt": (now - timedelta(minutes=5)).isoformat(),
             "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://prometheus.example/graph", "fingerprint": "f1"}
    _api(client, "/api/v1/alerts/alertmanager", {
        "version": "4", "groupKey": "{}", "truncatedAlerts": 0, "status": "firing", "receiver": "breakwater",
        "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://am.example",
        "alerts": [alert]}, token)

    # Chargeback: usage with formula-looking text, a final October invoice and a correction whose reason is one.
    card("Standard", OCT[0], {("", "", ""): "2.00"})
    usage(acme, Job.objects.get(external_id=JOB_ID), OCT[0] + timedelta(days=3), 2, model=CMD, qos="+1+cmd")
    october = do_finalize_invoice(do_generate_invoice(acme, *OCT, now=OCT[1]).id, "ops", now=OCT[1] + timedelta(days=1))
    do_correct_line(october.lines.first().id, "-1.00", HYPERLINK, "ops")
    return {"tenant": acme, "invoice": october, "draft": Invoice.objects.get(tenant=acme, state="draft"),
            "alert": Alert.objects.get(name=ALERT_NAME), "now": now}


@pytest.fixture
def world(client, shared_data, django_user_model):
    w = build_world(client, shared_data)
    op = django_user_model.objects.create_superuser("op", "op@example.com", PASSWORD)
    client.force_login(op)
    response = client.post(f"/api/v1/alerts/{w['alert'].pk}/ack", data=json.dumps({"note": SVG + SCRIPT}),
                           content_type="application/json")
    assert response.status_code == 200, response.content
    return w


def _assert_inert(path: str, body: str) -> None:
    for marker in RAW_MARKERS:
        assert marker not in body, f"{path}: unescaped {marker!r}"


# --- Stored verbatim, tables intact -------------------------------------------------------------

def test_sql_and_markup_are_stored_verbatim_and_the_tables_survive(world):
    assert Node.objects.filter(hostname=HOST_SQL).exists() and Gpu.objects.get(uuid="GPU-sql-0").model == SQL
    assert Gpu.objects.get(uuid="GPU-inj-0").model == MODEL and Node.objects.filter(hostname=HOST).exists()
    assert Node.objects.filter(hostname=PROM_HOST).exists() and Node.objects.filter(hostname=HOST_SVG).exists()
    job = Job.objects.get(external_id=JOB_ID)
    assert (job.name, job.user, job.partition) == (SCRIPT, IMG, SVG)
    assert Job.objects.get(external_id="inj-2").account == ACCOUNT
    assert world["alert"].labels["team"] == SCRIPT and world["alert"].annotations["summary"] == SQL
    assert AuditEntry.objects.filter(reason=SVG + SCRIPT).exists()
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM telemetry_gpu")
        assert cur.fetchone()[0] == Gpu.objects.count() >= 4


# --- Server-rendered pages and exports --------------------------------------------------------------

def _pages(w: dict) -> dict[str, tuple[str, ...]]:
    """Each page, with the payloads (as text) it must show escaped."""
    slug, number = w["tenant"].slug, w["invoice"].number
    return {
        "/": (), "/racks/": (), "/jobs/": (),  # the jobs table is a Dash app: the browser test covers it
        "/jobs/slurm:inj-2/": (IMG,),
        f"/nodes/{quote(HOST)}/": (HOST,), f"/nodes/{quote(HOST_SQL)}/": (HOST_SQL,),
        f"/nodes/{quote(HOST_SVG)}/": (HOST_SVG,), "/gpus/GPU-svg-0/": (IMG,),
        "/gpus/GPU-inj-0/": (MODEL,), f"/jobs/slurm:{JOB_ID}/": (SCRIPT,),
        f"/search/?q={quote('gpu-')}": (HOST,), f"/search/?q={quote('window.__pwned')}": (SCRIPT,),
        "/alerts/": (ALERT_NAME,), f"/alerts/{w['alert'].pk}/": (ALERT_NAME, SCRIPT, SVG),
        "/audit/": (SVG + SCRIPT, ALERT_NAME), "/chargeback/": (TENANT_NAME, MODEL),
        f"/chargeback/invoices/{number}/": (TENANT_NAME,), f"/chargeback/invoices/{w['draft'].number}/": (HYPERLINK,),
        f"/portal/{slug}/": (TENANT_NAME,), f"/portal/{slug}/jobs/": (TENANT_NAME,),
        f"/portal/{slug}/invoices/": (TENANT_NAME,), f"/portal/{slug}/invoices/{number}/": (TENANT_NAME,),
        f"/portal/{slug}/health/": (HOST, TENANT_NAME), "/alerts/rules/": (),
    }


def test_every_page_shows_the_payloads_escaped(world, client):
    for path, expected in _pages(world).items():
        response = client.get(path)
        assert response.status_code == 200, (path, response.status_code)
        body = response.content.decode()
        _assert_inert(path, body)
        missing = [t for t in expected if html.escape(t) not in body]
        assert not missing, f"{path}: not shown escaped: {missing}"


def test_json_exports_carry_the_payloads_verbatim_as_data(world, client):
    slug, number = world["tenant"].slug, world["invoice"].number
    for path in (f"/chargeback/invoices/{number}.json", f"/portal/{slug}/invoices/{number}.json"):
        response = client.get(path)
        assert response.status_code == 200 and response["Content-Type"].startswith("application/json")
        doc = response.json()
        assert doc["lines"][0]["gpu_model"] == CMD  # data, not markup: JSON is never rendered as HTML
    api = client.get("/api/v1/alerts").json()
    assert any(a["name"] == ALERT_NAME and a["labels"]["team"] == SCRIPT for a in api["alerts"])


def _csv(client, path: str) -> list[dict]:
    response = client.get(path)
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv"), path
    return list(csv.DictReader(io.StringIO(response.content.decode())))


def test_csv_exports_neutralise_spreadsheet_formulas(world, client):
    slug, number = world["tenant"].slug, world["invoice"].number
    nov = world["draft"]
    rows = _csv(client, f"/chargeback/invoices/{number}.csv")
    assert rows[0]["gpu_model"] == "'" + CMD
    correction = next(r for r in _csv(client, f"/chargeback/invoices/{nov.number}.csv") if r["kind"] == "credit")
    assert correction["reason"] == "'" + HYPERLINK and correction["amount"] == "-1.00"  # numbers keep their sign
    start, end = OCT[0].date().isoformat(), OCT[1].date().isoformat()
    usage_rows = _csv(client, f"/chargeback/usage.csv?start={start}&end={end}")
    usage_rows += _csv(client, f"/portal/{slug}/usage.csv?days=3650")
    assert usage_rows and all(r["gpu_model"] == "'" + CMD and r["qos"] == "'+1+cmd" for r in usage_rows)
    for r in rows + usage_rows:
        for column, value in r.items():
            if column not in ("amount", "unit_price", "quantity") and value:
                assert not value.startswith(("=", "+", "-", "@", "\t", "\r")), (column, value)


# --- The Dash pages in a real browser ---------------------------------------------------------------

GD = "document.querySelector('#heatmap .js-plotly-plot')"
PWNED_JS = """() => ({pwned: typeof window.__pwned !== 'undefined',
    injected: document.querySelectorAll(
        'svg[onload], img[onerror], [onload*="__pwned"], [onerror*="__pwned"], marquee').length,
    scripts: [...document.scripts].filter(s => s.textContent.includes('__pwned')).length})"""


def _wait(page, predicate: str, timeout_s: float = 15.0) -> None:
    """Poll a JS predicate with page.evaluate (the pages' CSP forbids the eval wait_for_function uses)."""
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(predicate):
        assert time.monotonic() < deadline, f"timed out waiting for {predicate}"
        page.wait_for_timeout(100)


def _check_browser(page, where: str) -> None:
    state = page.evaluate(PWNED_JS)
    assert state == {"pwned": False, "injected": 0, "scripts": 0}, (where, state)


def _hover(page, cell: tuple[int, int], timeout_s: float = 45.0) -> None:
    """Hover the cell until Plotly shows its label. A live redraw while the pointer rests on the heatmap drops
    the label, and late in a full run the label twice failed to show in 15 s of hovers at one point; so the
    point is found afresh from the current layout and hovered again until the label shows."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    row, col = cell
    deadline = time.monotonic() + timeout_s
    while True:
        x, y = page.evaluate(f"""(() => {{ const gd = {GD}, fl = gd._fullLayout;
            return [fl.xaxis._offset + fl.xaxis.l2p({col}) + gd.getBoundingClientRect().left,
                    fl.yaxis._offset + fl.yaxis.l2p({row}) + gd.getBoundingClientRect().top]; }})()""")
        page.mouse.move(x + 3, y + 3)
        page.mouse.move(x, y)
        try:
            page.wait_for_selector("g.hovertext", timeout=3_000)
            return
        except PlaywrightTimeoutError:
            if time.monotonic() > deadline:
                raise


@pytest.mark.browser
def test_dash_pages_and_tooltips_never_run_the_payloads(world, asgi_server, browser_page):
    # `world` comes first: its API calls use the test client, which cannot run inside Playwright's event loop.
    page = browser_page
    page.goto(f"{asgi_server.url}/racks/")
    page.fill("input[name=username]", "op")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit], input[type=submit]")
    _wait(page, "() => !!(window.BW && BW.heatmapStats && BW.heatmapStats.renderedAt !== null)")
    # The one cell whose tooltip names GPU-inj-0.
    cell = page.evaluate(f"(() => {{ const hits = []; {GD}.data[0].text.forEach((r, y) => r.forEach((t, x) => {{"
                         " if (t && t.split('<br>').includes('GPU-inj-0')) hits.push([y, x]); }));"
                         " return hits.length === 1 ? hits[0] : null; })()")
    assert cell, "no single cell names GPU-inj-0"
    _hover(page, cell)
    tip = page.text_content("g.hovertext")
    _check_browser(page, "racks tooltip")
    assert HOST in tip and MODEL in tip, tip  # shown as text, not swallowed as markup

    # Each Dash page renders the payload as visible text (so it was there to run), and nothing ran.
    for path, text in ((f"/nodes/{quote(HOST)}/", HOST), ("/gpus/GPU-inj-0/", MODEL), ("/jobs/", SCRIPT),
                       ("/jobs/", IMG), (f"/jobs/slurm:{JOB_ID}/", SCRIPT)):
        page.goto(f"{asgi_server.url}{path}")
        _wait(page, f"() => document.body.innerText.includes({json.dumps(text)})")
        _check_browser(page, path)
