"""The facility pages' Dash apps: `nvlink` (GPUs by NVLink domain) and `power` (power and cooling).

Server callbacks call one selector and return its data; facility.js builds the figures in the
browser (clientside namespace `breakwater`) and applies what the `/ws/facility/` consumer pushes
into the `*-live` stores. The NVLink page is the large one (16,384 GPUs in 2,048 domains), so its
payload is reshaped into columns (`nvlink_payload`): the static part (which GPU sits where) once,
and the values as one array per counter, which the consumer's changes then address by position.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from dash import ClientsideFunction, Input, Output, State, dcc, html
from django.utils import timezone

from dashboard.dash_apps.base import PageDash
from telemetry.selectors import nvlink_domains, power_overview, pue_series
from telemetry.selectors.nvlink import DOMAIN_STATES

# Values per GPU and per domain total, in the order of the payload's value columns.
NVLINK_FIELDS = (
    "errors_per_s", "nvlink_crc_flit_errors", "nvlink_crc_data_errors", "nvlink_replay_errors",
    "nvlink_recovery_errors", "nvlink_bandwidth", "nvlink_tx_bps", "nvlink_rx_bps",
)
# Colour-by choices: (value, label); facility.js knows each one's scale and unit.
NVLINK_METRICS = (
    ("errors_per_s", "NVLink errors, all kinds (errors/s)"),
    ("crc", "CRC errors, flit + data (errors/s)"),
    ("nvlink_replay_errors", "Replays (errors/s)"),
    ("nvlink_recovery_errors", "Recoveries (errors/s)"),
    ("throughput", "Throughput, TX + RX (GB/s)"),
    ("nvlink_bandwidth", "Bandwidth counter (counts/s)"),
)
DEFAULT_NVLINK_METRIC = "errors_per_s"
PUE_RANGES = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7)}
PUE_RANGE_LABELS = {"1h": "1 h", "24h": "24 h", "7d": "7 d"}
DEFAULT_PUE_RANGE = "24h"
# 24 h of 1-minute points fit; a week reads the hourly rollup (the selector picks by span).
PUE_MAX_POINTS = 1500


def now() -> datetime:
    """The callbacks' clock (tests pin it)."""
    return timezone.now()


def _totals(totals: dict) -> dict:
    out = {k: totals[k] for k in ("gpus", "gpus_reporting", "gpus_with_errors")}
    out["v"] = [totals[f] for f in NVLINK_FIELDS]
    return out


def nvlink_payload(data: dict) -> dict:
    """`nvlink_domains()` as columns: `static` (domains, and per GPU its domain, host, index and
    uuid, in the selector's order) with a `layout` id that names it, then the changing part:
    per domain its state and totals, per GPU its state and one column per `NVLINK_FIELDS`."""
    gpus = [g for d in data["domains"] for g in d["gpus"]]
    hosts = list(dict.fromkeys(g["host"] for g in gpus))
    host_ix = {h: i for i, h in enumerate(hosts)}
    state_ix = {s: i for i, s in enumerate(DOMAIN_STATES)}
    static = {
        "domains": [{k: d[k] for k in ("name", "kind", "rack", "implicit")} for d in data["domains"]],
        "hosts": hosts,
        "domain": [d_i for d_i, d in enumerate(data["domains"]) for _ in d["gpus"]],
        "host": [host_ix[g["host"]] for g in gpus],
        "index": [g["index"] for g in gpus],
        "uuid": [g["uuid"] for g in gpus],
    }
    return {
        "layout": layout_id(static), "generated_at": data["generated_at"], "units": data["units"],
        "fields": NVLINK_FIELDS, "states": DOMAIN_STATES, "by_state": data["by_state"], "static": static,
        "domains": [{"state": d["state"], **_totals(d["totals"])} for d in data["domains"]],
        "gpus": {"state": [state_ix[g["state"]] for g in gpus], "v": [[g[f] for g in gpus] for f in NVLINK_FIELDS]},
    }


def layout_id(static: dict) -> str:
    """A short name for which GPUs sit where: equal ids mean positions in the columns agree."""
    domains = "\x1e".join(f"{d['name']}\x1f{d['kind']}\x1f{d['rack']}" for d in static["domains"])
    gpus = "\x1e".join(map("{}\x1f{}\x1f{}\x1f{}".format, static["domain"], static["host"], static["index"],
                           static["uuid"]))
    hosts = "\x1e".join(static["hosts"])
    return hashlib.blake2b("\x1d".join((domains, hosts, gpus)).encode(), digest_size=8).hexdigest()


def pue_range(name: str | None, end: datetime) -> tuple[str, datetime, datetime]:
    """The range picker's choice (the default when unknown) as (name, start, end)."""
    name = name if name in PUE_RANGES else DEFAULT_PUE_RANGE
    return name, end - PUE_RANGES[name], end


# --- NVLink domains -----------------------------------------------------------------------------

nvlink_app = PageDash("nvlink", serve_locally=True)

nvlink_app.layout = html.Div(className="bw-dash bw-facility", children=[
    # Domains by state, as counts with words. This box, the list of domains in error and the power
    # page's cards and tables are filled by facility.js as HTML (see its `tag`), not returned as
    # Dash components: the renderer walks every component a callback returns, at seconds a table.
    html.Div(id="nvlink-summary", className="bw-tiles bw-tiles-small", role="status", **{"aria-live": "polite"}),
    html.Section(className="bw-panel", id="nvlink-errors-section", children=[
        html.H2("Domains in error"), html.Div(id="nvlink-errors"),
    ]),
    html.Section(className="bw-panel", id="nvlink-grid-section", children=[
        html.Div(className="bw-toolbar", children=[
            html.Label("Colour by", htmlFor="nvlink-metric"),
            dcc.Dropdown(id="nvlink-metric", value=DEFAULT_NVLINK_METRIC, clearable=False, searchable=False,
                         className="bw-dropdown", options=[{"label": lb, "value": v} for v, lb in NVLINK_METRICS]),
            html.Span(id="nvlink-note", className="bw-muted"),
        ]),
        html.Div(id="nvlink-legend", className="bw-legend", role="img", **{"aria-label": "Colour legend"}),
        dcc.Graph(id="nvlink-grid", className="bw-heatmap", config={"displaylogo": False, "responsive": True},
                  figure={"data": [], "layout": {"height": 200}}),
    ]),
    # The selector's domains (server callback), then the websocket's changes (set by facility.js).
    dcc.Store(id="nvlink-data"),
    dcc.Store(id="nvlink-live"),
    # The server callback's trigger: the page reads once, then follows the websocket (whose first
    # message after a (re)connect carries every value, and the layout when it changed).
    dcc.Store(id="nvlink-reload", data=0),
])


@nvlink_app.callback(Output("nvlink-data", "data"), Input("nvlink-reload", "data"))
def load_nvlink(_reload):
    """Every NVLink domain, its GPUs and their rates, as columns."""
    return nvlink_payload(nvlink_domains(now()))


nvlink_app.clientside_callback(
    ClientsideFunction(namespace="breakwater", function_name="nvlinkRender"),
    Output("nvlink-grid", "figure"),
    Output("nvlink-note", "children"),
    Input("nvlink-data", "data"),
    Input("nvlink-metric", "value"),
    Input("nvlink-live", "data"),
)


# --- Power and cooling --------------------------------------------------------------------------

def _section(title: str, *children, section_id: str) -> html.Section:
    return html.Section(className="bw-panel", id=section_id, children=[html.H2(title), *children])


power_app = PageDash("power", serve_locally=True)

power_app.layout = html.Div(className="bw-dash bw-facility", children=[
    html.Div(id="power-summary", className="bw-cards bw-power-cards"),
    # Racks over their cap, by name and numbers (empty when none).
    html.Div(id="power-overcap", role="alert"),
    _section("Rack power against cap",
             html.P("Each bar is a rack's draw; the black tick is its cap. Racks are grouped by hall row.",
                    className="bw-muted bw-small"),
             dcc.Graph(id="power-racks", className="bw-graph", config={"displaylogo": False, "responsive": True},
                       figure={"data": [], "layout": {"height": 200}}),
             section_id="power-racks-section"),
    _section("Rows and halls", html.Div(id="power-totals", className="bw-table-wrap"),
             section_id="power-totals-section"),
    _section("Cooling loops",
             dcc.Graph(id="power-loops", className="bw-graph", config={"displaylogo": False, "responsive": True},
                       figure={"data": [], "layout": {"height": 120}}),
             html.Div(id="power-loops-table", className="bw-table-wrap"),
             section_id="power-loops-section"),
    _section("PUE over time",
             html.Div(className="bw-toolbar", children=[
                 html.Span("Range", className="bw-label"),
                 dcc.RadioItems(id="pue-range", value=DEFAULT_PUE_RANGE, inline=True, className="bw-radio",
                                options=[{"label": lb, "value": v} for v, lb in PUE_RANGE_LABELS.items()]),
                 html.Span(id="pue-note", className="bw-muted"),
             ]),
             dcc.Graph(id="pue-graph", className="bw-graph", config={"displaylogo": False, "responsive": True},
                       figure={"data": [], "layout": {"height": 280}}),
             section_id="pue-section"),
    # The selector's overview and PUE series (server callbacks), the websocket's changes, and a
    # counter facility.js bumps when a new rollup bucket is due on the PUE chart.
    dcc.Store(id="power-data"),
    dcc.Store(id="pue-series"),
    dcc.Store(id="power-live"),
    dcc.Store(id="power-reload", data=0),
    dcc.Store(id="pue-reload", data=0),
])


@power_app.callback(Output("power-data", "data"), Input("power-reload", "data"))
def load_power(_reload):
    """Rack draw against cap, row and hall totals, cooling loops and PUE now."""
    return power_overview(now())


@power_app.callback(Output("pue-series", "data"), Input("pue-range", "value"), Input("pue-reload", "data"))
def load_pue(range_name, _reload):
    """PUE over the chosen range; the selector picks 1-minute or hourly buckets by its span."""
    name, start, end = pue_range(range_name, now())
    return {**pue_series(start, end, max_points=PUE_MAX_POINTS), "range": name}


power_app.clientside_callback(
    ClientsideFunction(namespace="breakwater", function_name="powerRender"),
    Output("power-racks", "figure"),
    Output("power-loops", "figure"),
    Input("power-data", "data"),
    Input("power-live", "data"),
)
power_app.clientside_callback(
    ClientsideFunction(namespace="breakwater", function_name="pueRender"),
    Output("pue-graph", "figure"),
    Output("pue-note", "children"),
    Input("pue-series", "data"),
    Input("power-live", "data"),
    State("pue-range", "value"),
)
