"""bench/tour: four faults on a live simulated cluster, and every page walked as an operator and a tenant.

1. The stack as `./dev up` runs it, on a scratch database: daphne, a Celery worker and beat (on the bench's
   own queue), the alerting defaults wired to a local receiver, the demo tenants, and the simulator at
   2,048 GPUs with a 10 s interval. Nothing is tuned for the bench.
2. Four faults, planted by the simulator's scenarios (their ground truth names the host, GPU, port and the
   instant): a GPU off the bus (XID 79, then silence), a GPU that simply stops reporting, a node down, and a
   degraded fabric port. They are staggered so that each one's watch window is its own.
3. For each fault, the pages about its entity are opened in Chromium before it happens; from the fault's
   instant each is polled (a live page without reload, any other reloaded) until it shows the fault's state:
   an element `data-health="<state>"` that names the entity (or is the entity page's own), else the state's
   word in the entity's row or the page's heading; fleet counts must rise in that state.
4. Every page, operator and tenant, is then visited once: screenshots to docs/tour/ (1280 wide; a few also
   360 wide), console errors, CSP violations, axe-core's serious and critical violations, sideways scrolling
   at 360 px; and the fleet page's severity counts are compared with the alerts list and the API.

Ends with `RESULT tour pages=<n> faults=<k> shown_failed=<a>/<b> max_show_s=<s> counts_agree=<yes|no>
console_errors=<n> csp_violations=<n> axe_serious=<n> overflow_360=<n> PASS|FAIL`; the (fault, page, seconds)
table goes to var/tour/ as JSON and text.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from _common import (
    LOG_DIR,
    REPO,
    drop_database,
    procs,
    recreate_database,
    say,
    scratch_database_url,
    setup_django,
)

SHOW_WITHIN_S = 30.0
SCENARIO_SPEED = 30  # fallen-off-bus's 5 minutes of PCIe replays play in 10 s
OUT_DIR = REPO / "var" / "tour"
SHOTS = REPO / "docs" / "tour"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
# What each fault's state may be called: the health model's states, and the words a page may use instead.
STATES = {"gpu-off-bus": ("failed",), "gpu-silent": ("stale", "failed"), "node-down": ("stale", "failed"),
          "port-degraded": ("degraded", "failed")}
WORDS = {"failed": r"\bfailed\b", "stale": r"\bstale\b|\bno data\b", "degraded": r"\bdegraded\b"}
NARROW_PAGES = ("fleet", "alerts", "node", "portal-health")


# ------------------------------------------------------------------------------------------ processes
def hms(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S UTC")


def _manage(*args: str) -> str:
    out = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, check=True, capture_output=True, text=True)
    return out.stdout


def start_stack(stack: ExitStack, tmp: Path, specs: list[str], gpus: int, interval: int) -> str:
    """Configure the scratch database as `./dev up` does and start every process; returns the base URL."""
    from alerts.receiver import Receiver

    receiver = stack.enter_context(Receiver(secret=(tmp / "secret").read_text().strip()))
    say("alerting defaults, operator login, demo tenants, collector token")
    _manage("ensure_operator", "--username", "operator", "--password-file", str(tmp / "operator_password"))
    _manage("alerts_defaults", "--receiver-url", receiver.url(), "--secret-file", str(tmp / "secret"))
    _manage("tenancy_demo", "--password-dir", str(tmp))
    (tmp / "token").write_text(_manage("create_collector_token", "tour", "--replace", "--quiet").strip())
    daphne = procs.daphne(log=LOG_DIR / "bench-tour-daphne.log").start()
    stack.callback(daphne.stop, 20)
    queue = os.environ["CELERY_QUEUE"]
    for name, argv in (("worker", procs.worker_argv(queue, f"{queue}@%h", concurrency=2)),
                       ("alerts-worker", procs.worker_argv(queue, f"{queue}-alerts@%h", concurrency=1,
                                                           alerts_only=True)),
                       ("beat", procs.beat_argv(tmp / "celerybeat-schedule"))):
        stack.callback(procs.Child(name, argv, log=LOG_DIR / f"bench-tour-{name}.log").start().stop, 20)
    daphne.wait_port(timeout=60)
    base = daphne.url
    scenario_args = [a for s in specs for a in ("--scenario", s)]
    sim = procs.Child("simulator", procs.simulator_argv(
        base, "--token-file", str(tmp / "token"), "--gpus", str(gpus), "--interval", str(interval),
        "--scenario-speed", str(SCENARIO_SPEED), "--truth", str(tmp / "truth.jsonl"), *scenario_args),
        log=LOG_DIR / "bench-tour-simulate.log").start()
    stack.callback(sim.stop, 20)
    say(f"daphne on {base}, Celery worker and beat, simulator ({gpus} GPUs every {interval} s); "
        "logs in var/log/bench-tour-*")
    return base


def scenario_specs(first_min: float, stagger_s: int) -> list[str]:
    """The four faults, each failing at a tick boundary `stagger_s` after the one before."""
    off_bus_lead = 300 / SCENARIO_SPEED / 60  # fallen-off-bus fails 5 scenario minutes after its start
    starts = [first_min + k * stagger_s / 60 for k in range(4)]
    starts[0] -= off_bus_lead

    def minutes(m: float) -> str:
        # Rounded up: a start a hair before its tick boundary would push the fault to the next tick.
        return f"{math.ceil(m * 1e6) / 1e6:.6f}"

    return [f"{name}@{minutes(m)}" for name, m in zip(
        ("fallen-off-bus", "gpu-silent", "node-down", "port-degraded"), starts, strict=True)]


def read_truth(path: Path, timeout: float = 240.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # The file also declares the simulator's latent defects and injected faults ({"defect": ...}):
        # the tour's four faults are its scenario lines.
        lines = [json.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []
        if len(scenarios := [x for x in lines if "scenario" in x]) >= 4:
            return scenarios
        time.sleep(1)
    raise RuntimeError(f"the simulator wrote no ground truth within {timeout:.0f} s; "
                       "see var/log/bench-tour-simulate.log")


# ----------------------------------------------------------------------------------------- the entities
@dataclass
class Pair:
    """One page that is about one fault's entity, and when (if ever) it showed the fault's state."""

    fault: str
    page: str
    url: str
    tokens: list[str]
    own: bool = False  # the entity's own page: its heading's state counts
    count: str = ""  # fleet: the data-bind prefix whose counts must rise
    user: str = "operator"
    shown_s: float | None = None
    live: bool = False
    seen: str = ""  # what the page showed instead, at the end of the watch

    @property
    def ok(self) -> bool:
        return self.shown_s is not None and self.shown_s <= SHOW_WITHIN_S


@dataclass
class Fault:
    name: str
    truth: dict
    at: float  # epoch seconds of the fault
    pairs: list[Pair] = field(default_factory=list)


def job_on(host: str, at: float) -> tuple[str, str] | None:
    """(job key, Slurm account) of the job running on `host` at epoch `at`, if any."""
    from django.db.models import Q

    from telemetry.models import Allocation

    when = datetime.fromtimestamp(at, UTC)
    a = (Allocation.objects.filter(node__hostname=host, start__lte=when)
         .filter(Q(end__isnull=True) | Q(end__gte=when)).select_related("job").order_by("-start").first())
    return (f"{a.job.source}:{a.job.external_id}", a.job.account) if a else None


def tenant_login(account: str) -> tuple[str, str] | None:
    """(portal slug, demo username) of the tenant that owns a Slurm account."""
    from tenancy.demo import TENANTS, USERS

    if account not in TENANTS:
        return None
    root = TENANTS[account][1] or account
    user = next((u.username for u in USERS if u.tenant in (account, root)), None)
    return (account, user) if user else None


def pairs_for(fault: Fault) -> list[Pair]:
    """The pages that are about this fault's entity."""
    t, name = fault.truth, fault.name
    host = t["host"]
    if name == "port-degraded":
        return port_pairs(name, t)
    uuid = t["entity"] if t["entity_kind"] == "gpu" else t["details"]["gpu_uuids"][0]
    token = [uuid] if t["entity_kind"] == "gpu" else [host]
    kind = "gpus" if t["entity_kind"] == "gpu" else "nodes"
    pairs = [Pair(name, "fleet", "/", [], count=f"{kind}.by_health."),
             Pair(name, "racks", "/racks/", [host, uuid]),
             Pair(name, "node", f"/nodes/{host}/", token, own=t["entity_kind"] == "node"),
             Pair(name, "gpu", f"/gpus/{uuid}/", [uuid], own=True),
             Pair(name, "search", f"/search/?q={host}", [host, uuid]),
             Pair(name, "alerts", "/alerts/", [host, uuid])]
    job = job_on(host, fault.at - 15)
    if job:
        key, account = job
        pairs += [Pair(name, "job", f"/jobs/{key}/", [host, uuid], own=True),
                  # The list holds 50 jobs a page, and a job its node's failure ended sorts among the
                  # ended ones: an operator looks it up, as here, by its key in the list's search.
                  Pair(name, "jobs", f"/jobs/?q={key}", [key.split(":")[1]])]
        if (login := tenant_login(account)) is not None:
            slug, user = login
            pairs.append(Pair(name, "portal-health", f"/portal/{slug}/health/", [uuid, host], user=user))
    return pairs


def port_pairs(name: str, t: dict) -> list[Pair]:
    from telemetry.models import Port

    owner, port_name = t["entity"].split(":", 1)
    port = Port.objects.filter(node__hostname=owner, name=port_name).first()
    tokens = [t["entity"], t["details"]["peer"]]
    pairs = [Pair(name, "fabric", "/fabric/", tokens), Pair(name, "node", f"/nodes/{owner}/", [port_name]),
             Pair(name, "alerts", "/alerts/", tokens + [owner])]
    if port is not None:
        pairs.append(Pair(name, "port", f"/ports/{port.id}/", tokens, own=True))
    return pairs


# -------------------------------------------------------------------------------------------- the browser
CHECK_JS = """([tokens, states, words, own]) => {
  const st = new Set(states), re = new RegExp(words, 'i');
  const names = el => tokens.some(t => el.textContent.includes(t)
      || el.getAttributeNames().some(a => (el.getAttribute(a) || '').includes(t)));
  for (const el of document.querySelectorAll('[data-health]')) {
    if (!st.has(el.dataset.health)) continue;
    if (names(el) || (own && !el.closest('tr, li, table'))) return 'data-health=' + el.dataset.health;
    const row = el.closest('tr, li, [data-uuid], [data-host]');
    if (row && names(row)) return 'data-health=' + el.dataset.health + ' in row';
  }
  for (const row of document.querySelectorAll('tr, li')) {
    if (tokens.length && names(row) && re.test(row.innerText)) return 'text in row: ' + row.innerText.slice(0, 80);
  }
  // A job the scheduler ended because its node failed shows the hardware fault in its own state.
  for (const el of document.querySelectorAll('[data-state="node_fail"]')) {
    const row = el.closest('tr, li');
    if (row && names(row) && (st.has('failed') || st.has('stale'))) return 'job state node_fail in row';
  }
  const head = document.querySelector('.bw-page-head') || document.querySelector('h1');
  if (own && head && re.test(head.innerText)) return 'text in heading';
  return '';
}"""
SEEN_JS = """([tokens]) => {
  const out = [];
  for (const row of document.querySelectorAll('tr, li')) {
    if (tokens.some(t => row.innerText.includes(t))) { out.push(row.innerText.replace(/\\s+/g, ' ').slice(0, 100)); }
    if (out.length) break;
  }
  const head = document.querySelector('.bw-page-head') || document.querySelector('h1');
  const hs = [...document.querySelectorAll('[data-health]')].slice(0, 3).map(e => e.dataset.health);
  return (out[0] || (head ? head.innerText.replace(/\\s+/g, ' ').slice(0, 100) : '(no heading)'))
    + (hs.length ? ' [data-health: ' + hs.join(',') + ']' : ' [no data-health]');
}"""
COUNTS_JS = """(prefix) => {
  const out = {};
  for (const el of document.querySelectorAll('[data-bind^="' + prefix + '"]')) {
    const key = el.dataset.bind.slice(prefix.length).split('.')[0];
    const n = parseInt((el.textContent || '').replace(/[^0-9]/g, ''), 10);
    if (!Number.isNaN(n)) out[key] = n;
  }
  return out;
}"""
CSP_INIT = ("document.addEventListener('securitypolicyviolation', "
            "e => window.bwCsp(e.violatedDirective + ' ' + (e.blockedURI || '')));")


class Browser:
    """Chromium with one signed-in context per user; collects console errors and CSP violations."""

    def __init__(self, pw, base: str, passwords: dict[str, str]):
        self.base, self.passwords = base, passwords
        self.browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS, headless=True)
        self.contexts: dict[str, object] = {}
        self.console_errors: list[str] = []
        self.csp: list[str] = []

    def context(self, user: str):
        if user not in self.contexts:
            ctx = self.browser.new_context(viewport={"width": 1280, "height": 800})
            page = ctx.new_page()
            page.goto(f"{self.base}/login/")
            page.fill("input[name=username]", user)
            page.fill("input[name=password]", self.passwords[user])
            page.click("form.bw-form button[type=submit]")
            page.wait_for_load_state()
            page.close()
            self.contexts[user] = ctx
        return self.contexts[user]

    def open(self, user: str, path: str):
        page = self.context(user).new_page()
        page.expose_binding("bwCsp", lambda source, text: self.csp.append(f"{source['page'].url}: {text}"))
        page.add_init_script(CSP_INIT)
        page.bw_ws = False
        page.on("websocket", lambda ws: setattr(page, "bw_ws", True))
        page.on("console", lambda m: self._console(page, m))
        page.goto(self.base + path, wait_until="load", timeout=60_000)
        return page

    def _console(self, page, msg) -> None:
        if msg.type == "error" and "Content Security Policy" not in msg.text:
            self.console_errors.append(f"{page.url}: {msg.text[:200]}")

    def close(self) -> None:
        self.browser.close()


# -------------------------------------------------------------------------------------------- watching
def watch(browser: Browser, fault: Fault, watch_s: float) -> None:
    """Open the fault's pages before it happens, then poll them until each shows its state."""
    states = STATES[fault.name]
    words = "|".join(WORDS[s] for s in states)
    pages = []
    for pair in fault.pairs:
        try:
            page = browser.open(pair.user, pair.url)
        except Exception as exc:  # a page that does not load is a pair not shown; say why
            pair.seen = f"did not load: {str(exc).splitlines()[0][:100]}"
            continue
        base = page.evaluate(COUNTS_JS, pair.count) if pair.count else {}
        pages.append((pair, page, base))
    say(f"{fault.name}: {len(pages)} pages open, fault at {hms(fault.at)}; waiting")
    time.sleep(max(0.0, fault.at - time.time()))
    last_reload = time.time()
    while pages and time.time() < fault.at + watch_s:
        reload = time.time() - last_reload >= 5
        for pair, page, base in list(pages):
            pair.live = page.bw_ws
            if reload and not pair.live:
                page.reload(wait_until="load", timeout=60_000)
            how = _shown(page, pair, states, words, base)
            if how:
                pair.shown_s = time.time() - fault.at
                pair.seen = how
                say(f"  {fault.name} shown on {pair.page} after {pair.shown_s:.1f} s ({how})")
                pages.remove((pair, page, base))
                page.close()
        last_reload = time.time() if reload else last_reload
        time.sleep(1)
    for pair, page, base in pages:
        pair.seen = _seen(page, pair, base)
        say(f"  {fault.name} NOT shown on {pair.page} within {watch_s:.0f} s: {pair.seen}")
        page.close()


def _shown(page, pair: Pair, states, words: str, base: dict) -> str:
    try:
        if pair.count:
            now = page.evaluate(COUNTS_JS, pair.count)
            risen = [s for s in states if now.get(s, 0) > base.get(s, 0)]
            return f"{pair.count}{risen[0]} {base.get(risen[0], 0)} -> {now[risen[0]]}" if risen else ""
        return page.evaluate(CHECK_JS, [pair.tokens, list(states), words, pair.own])
    except Exception:  # a page mid-navigation: try again on the next poll
        return ""


def _seen(page, pair: Pair, base: dict) -> str:
    try:
        if pair.count:
            return f"counts {base} -> {page.evaluate(COUNTS_JS, pair.count)}"
        return page.evaluate(SEEN_JS, [pair.tokens])
    except Exception as exc:
        return f"unreadable: {str(exc)[:80]}"


# ---------------------------------------------------------------------------------------------- the tour
@dataclass
class Visit:
    user: str
    name: str
    path: str
    status: int = 0
    axe_serious: int = 0
    overflow_360: bool = False
    rules: list[str] = field(default_factory=list)


def tour_pages(faults: list[Fault]) -> list[tuple[str, str, str]]:
    """(user, name, path) of every page, the fault's entities filling the detail pages."""
    from alerts.models import Alert, Notification
    from tenancy.models import Invoice

    off_bus = faults[0].truth
    node_down, port = faults[2].truth, next((p for p in faults[3].pairs if p.page == "port"), None)
    job = next((p for f in faults for p in f.pairs if p.page == "job"), None)
    op = [("fleet", "/"), ("racks", "/racks/"), ("nvlink", "/nvlink/"), ("fabric", "/fabric/"), ("power", "/power/"),
          ("jobs", "/jobs/"), ("node", f"/nodes/{node_down['host']}/"), ("gpu", f"/gpus/{off_bus['entity']}/"),
          ("search", f"/search/?q={off_bus['host']}"), ("anomalies", "/anomalies/"),
          ("health-gpus-failed", "/health/gpus/failed/"), ("health-nodes-stale", "/health/nodes/stale/"),
          ("reliability", "/reliability/"), ("alerts", "/alerts/"), ("alert-rules", "/alerts/rules/"),
          ("silences", "/alerts/silences/"), ("routing", "/alerts/routing/"), ("channels", "/alerts/channels/"),
          ("remediation", "/remediation/"), ("audit", "/audit/"), ("chargeback", "/chargeback/")]
    if port:
        op.append(("port", port.url))
    if job:
        op.append(("job", job.url))
    if alert := Alert.objects.order_by("-id").first():
        op.append(("alert", f"/alerts/{alert.id}/"))
    if note := Notification.objects.order_by("-id").first():
        op.append(("notification", f"/alerts/notifications/{note.id}/"))
    if invoice := Invoice.objects.order_by("-id").first():
        op.append(("chargeback-invoice", f"/chargeback/invoices/{invoice.number}/"))
    pages = [("operator", n, p) for n, p in op]
    tenant = next((p for f in faults for p in f.pairs if p.page == "portal-health"), None)
    slug, user = (tenant.url.split("/")[2], tenant.user) if tenant else ("llm-core", "llm-dev")
    for n, p in (("portal", f"/portal/{slug}/"), ("portal-jobs", f"/portal/{slug}/jobs/"),
                 ("portal-invoices", f"/portal/{slug}/invoices/"), ("portal-health", f"/portal/{slug}/health/")):
        pages.append((user, n, p))
    pages.append(("anonymous", "login", "/login/"))
    return pages


def visit(browser: Browser, user: str, name: str, path: str, checks) -> Visit:
    """One page as `user`: a 1280-wide screenshot (a 360-wide one for a few), then the shared page checks."""
    v = Visit(user, name, path)
    tag = "operator" if user == "operator" else "tenant" if user != "anonymous" else "anonymous"
    say(f"tour: {tag} {name} {path}")
    ctx = browser.context(user) if user != "anonymous" else browser.browser.new_context(
        viewport={"width": 1280, "height": 800})
    page = ctx.new_page()
    watch_page, page_checks = checks
    watch_page(page)
    resp = page.goto(browser.base + path, wait_until="load", timeout=60_000)
    v.status = resp.status if resp else 0
    page.wait_for_timeout(1500)  # Dash apps and live pages draw after load
    page.screenshot(path=str(SHOTS / f"{tag}-{name}.png"))
    narrow = (lambda p: p.screenshot(path=str(SHOTS / f"{tag}-{name}-360.png"))) if name in NARROW_PAGES else None
    found = page_checks(page, on_narrow=narrow)
    v.axe_serious, v.rules = found["axe_serious"], [r.split(":")[0] for r in found["axe_violations"]]
    v.overflow_360 = found["overflow_360"] > 0
    browser.console_errors += [f"{path}: {e[:200]}" for e in found["console_errors"]]
    browser.csp += [f"{path}: {e[:200]}" for e in found["csp_violations"]]
    page.close()
    if user == "anonymous":
        ctx.close()
    return v


def load_checks():
    """The checks every page must pass, shared with the browser tests (tests/browser_checks.py)."""
    from tests.browser_checks import page_checks, watch

    return watch, page_checks


# --------------------------------------------------------------------------------------------- counts
def counts_agree(browser: Browser) -> tuple[bool, str]:
    """Fleet's severity counts against the alerts list's and its health counts against the API's."""
    page = browser.open("operator", "/")
    page.wait_for_timeout(1500)
    fleet_sev = (page.evaluate(COUNTS_JS, "alerts.by_severity.")
                 or page.evaluate(COUNTS_JS, "faults.by_severity."))
    fleet_health = page.evaluate(COUNTS_JS, "gpus.by_health.")
    api_path, api = fleet_api(page, browser.base)
    page.goto(browser.base + "/alerts/", wait_until="load")
    rows = page.evaluate("""() => [...document.querySelectorAll('#bw-open-alerts tr.bw-alert-row')]
        .map(r => (r.querySelector('td') || r).innerText.trim().toLowerCase())""")
    page.close()
    alerts_sev: dict[str, int] = {}
    for sev in rows:
        alerts_sev[sev] = alerts_sev.get(sev, 0) + 1
    api_health = _find_counts(api, set(fleet_health)) if api is not None else None
    sev_ok = {k: v for k, v in fleet_sev.items() if v} == alerts_sev
    health_ok = api_health is not None and api_health == fleet_health
    why = (f"fleet severities {fleet_sev} vs alerts list {alerts_sev}; fleet GPU health {fleet_health} vs API "
           f"{api_path or '(no fleet summary endpoint in /api/v1/openapi.json)'} {api_health}")
    return sev_ok and health_ok, why


def fleet_api(page, base: str) -> tuple[str, dict | None]:
    """The health counts endpoint (operationId fleetHealth in the OpenAPI document), and its answer."""
    try:
        paths = page.request.get(base + "/api/v1/openapi.json").json().get("paths", {})
    except Exception:
        return "", None
    path = next((p for p, ops in paths.items() if ops.get("get", {}).get("operationId") == "fleetHealth"), "")
    if not path:
        return "", None
    resp = page.request.get(base + "/api/v1" + path)
    return path, resp.json() if resp.ok else None


def _find_counts(doc, keys: set[str]) -> dict | None:
    """The first object in `doc` mapping the fleet's health states to counts (or to {count: n})."""
    if isinstance(doc, dict):
        if keys and keys <= set(doc):
            return {k: (v.get("count") if isinstance(v, dict) else v) for k, v in doc.items() if k in keys}
        for v in doc.values():
            if (found := _find_counts(v, keys)) is not None:
                return found
    if isinstance(doc, list):
        for v in doc:
            if (found := _find_counts(v, keys)) is not None:
                return found
    return None


# --------------------------------------------------------------------------------------------- report
def report(faults: list[Fault], visits: list[Visit], browser: Browser, agree: tuple[bool, str], wall: float) -> None:
    pairs = [p for f in faults for p in f.pairs]
    print(f"\n{'fault':<14} {'page':<14} {'live':<5} {'seconds':>8}  shown as / seen instead")
    for p in pairs:
        secs = f"{p.shown_s:.1f}" if p.shown_s is not None else "—"
        print(f"{p.fault:<14} {p.page:<14} {'yes' if p.live else 'no':<5} {secs:>8}  {p.seen[:110]}")
    a, b = sum(p.ok for p in pairs), len(pairs)
    shown = [p.shown_s for p in pairs if p.shown_s is not None]
    max_show = max(shown) if len(shown) == len(pairs) and shown else math.inf
    axe = -1 if any(v.axe_serious < 0 for v in visits) else sum(v.axe_serious for v in visits)
    overflow = sum(v.overflow_360 for v in visits)
    print(f"\n{'user':<13} {'page':<20} {'status':>6} {'axe':>4} {'360':>4}  rules")
    for v in visits:
        print(f"{v.user:<13} {v.name:<20} {v.status:>6} {v.axe_serious:>4} {'wide' if v.overflow_360 else 'ok':>4}"
              f"  {','.join(v.rules)[:90]}")
    for label, items in (("console error", browser.console_errors), ("CSP violation", browser.csp)):
        for line in items[:8]:
            say(f"{label}: {line}")
    say(f"counts: {agree[1]}")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    doc = {"pairs": [asdict(p) for p in pairs], "visits": [asdict(v) for v in visits], "counts": agree[1],
           "console_errors": browser.console_errors, "csp_violations": browser.csp, "wall_s": round(wall, 1)}
    (OUT_DIR / "tour.json").write_text(json.dumps(doc, indent=1))
    say(f"table in {OUT_DIR / 'tour.json'}; screenshots in {SHOTS}; wall {wall:.0f} s")
    passed = (a == b and max_show <= SHOW_WITHIN_S and agree[0] and not browser.console_errors and not browser.csp
              and axe == 0 and overflow == 0)
    max_text = f"{max_show:.1f}" if math.isfinite(max_show) else "inf"
    print(f"RESULT tour pages={len(visits)} faults={len(faults)} shown_failed={a}/{b} max_show_s={max_text} "
          f"counts_agree={'yes' if agree[0] else 'no'} console_errors={len(browser.console_errors)} "
          f"csp_violations={len(browser.csp)} axe_serious={axe} overflow_360={overflow} "
          f"{'PASS' if passed else 'FAIL'}", flush=True)


# ------------------------------------------------------------------------------------------------ main
def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=2048)
    ap.add_argument("--interval", type=int, default=10)
    ap.add_argument("--first-fault-min", type=float, default=2.0, help="first fault, minutes after the first tick")
    ap.add_argument("--stagger", type=int, default=70, help="seconds between faults (a multiple of the interval)")
    ap.add_argument("--watch", type=float, default=55.0, help="seconds each fault's pages are watched")
    ap.add_argument("--keep", action="store_true", help="keep the scratch database for inspection")
    return ap.parse_args()


def run(stack: ExitStack, tmp: Path, url: str, args) -> None:
    from playwright.sync_api import sync_playwright

    (tmp / "secret").write_text(os.urandom(16).hex())
    (tmp / "operator_password").write_text(os.urandom(12).hex())
    specs = scenario_specs(args.first_fault_min, args.stagger)
    base = start_stack(stack, tmp, specs, args.gpus, args.interval)
    truths = read_truth(tmp / "truth.jsonl")
    names = ["gpu-off-bus", "gpu-silent", "node-down", "port-degraded"]
    faults = [Fault(n, t, datetime.fromisoformat(t["fails_at"]).timestamp())
              for n, t in zip(names, truths, strict=True)]
    for f in faults:
        say(f"fault {f.name}: {f.truth['entity_kind']} {f.truth['entity']} on {f.truth['host']} "
            f"at {hms(f.at)} (in {f.at - time.time():.0f} s)")
    passwords = {p.name.removeprefix("demo_").removesuffix("_password"): p.read_text().strip()
                 for p in tmp.glob("demo_*_password")}
    passwords["operator"] = (tmp / "operator_password").read_text().strip()
    started = time.time()
    pw = stack.enter_context(sync_playwright())
    browser = Browser(pw, base, passwords)
    stack.callback(browser.close)
    for f in faults:
        time.sleep(max(0.0, f.at - 30 - time.time()))  # open the pages half a minute before
        f.pairs = pairs_for(f)
        say(f"{f.name}: watching {', '.join(p.page for p in f.pairs)}")
        watch(browser, f, args.watch)
    SHOTS.mkdir(parents=True, exist_ok=True)
    checks = load_checks()
    visits = [visit(browser, u, n, p, checks) for u, n, p in tour_pages(faults)]
    report(faults, visits, browser, counts_agree(browser), time.time() - started)


def main() -> None:
    args = parse_args()
    # The bench's own Celery queue and channel prefix: a `./dev up` or a test run on the same Redis never
    # takes its tasks. Children (daphne, worker, beat) inherit these.
    os.environ["CELERY_QUEUE"] = f"bench-tour-{os.getpid()}"
    os.environ["BREAKWATER_CHANNEL_PREFIX"] = f"benchtour{os.getpid()}"
    os.environ["OUTBOUND_URL_ALLOWLIST"] = "127.0.0.1"
    os.environ["DEBUG"] = "false"
    os.environ["LOG_LEVEL"] = "WARNING"
    # Playwright's sync API runs an event loop in this thread; the bench's ORM reads are plain sync calls.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    # A TERM (a CI timeout, `kill`) unwinds like a Ctrl-C, so every child is stopped.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    url = scratch_database_url("tour")
    recreate_database(url)
    setup_django(url)
    try:
        with tempfile.TemporaryDirectory(prefix="bw-tour-") as tmpdir, ExitStack() as stack:
            run(stack, Path(tmpdir), url, args)
    except KeyboardInterrupt:
        say("interrupted; every process this bench started is stopped")
        sys.exit(130)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            drop_database(url)


if __name__ == "__main__":
    main()
