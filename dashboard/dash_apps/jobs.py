"""The Jobs pages' Dash apps: `jobs` (the filterable job list) and `job` (one job's gang).

Server callbacks parse the page's input and call one selector; the tables and figures are built
in the browser (jobs.js, clientside namespace `breakwater`) from the selector's JSON, and then
kept current by the `/ws/jobs/` consumer's changes, which jobs.js sets into the `*-live` stores.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from urllib.parse import unquote

from dash import ClientsideFunction, Input, Output, State, dcc, html
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from dashboard.dash_apps.base import PageDash
from telemetry.models import JobState
from telemetry.selectors import job_detail, job_list, job_step_series

PAGE_SIZE = 50
LIST_FILTERS = ("state", "account", "user", "partition", "q")
STEP_POINTS = 240  # buckets per rank in the step-time chart
STEP_RANGES = {"15m": timedelta(minutes=15), "1h": timedelta(hours=1), "6h": timedelta(hours=6), "all": None}
STEP_RANGE_LABELS = {"15m": "15 min", "1h": "1 h", "6h": "6 h", "all": "Whole run"}
DEFAULT_STEP_RANGE = "1h"


def _field(label: str, control, for_id: str) -> html.Div:
    return html.Div(className="bw-field", children=[html.Label(label, htmlFor=for_id), control])


# --- The job list --------------------------------------------------------------------------------

jobs_app = PageDash("jobs", serve_locally=True)

jobs_app.layout = html.Div(className="bw-dash bw-jobs", children=[
    # The filters live in the address too (/jobs/?q=slurm:1234&state=running), so a filtered list can be
    # linked and reloaded: jobs.js reads them into the controls and writes them back as they change.
    dcc.Location(id="jobs-url", refresh=False),
    html.Div(className="bw-toolbar bw-filters", role="search", children=[
        _field("State", dcc.Dropdown(id="jobs-state", placeholder="Any state", className="bw-dropdown-sm",
                                     options=[{"label": s.label, "value": s.value} for s in JobState]),
               "jobs-state"),
        _field("Tenant", dcc.Dropdown(id="jobs-account", placeholder="Any tenant", className="bw-dropdown-sm"),
               "jobs-account"),
        _field("User", dcc.Input(id="jobs-user", type="text", debounce=True, placeholder="Any user",
                                 className="bw-input"), "jobs-user"),
        _field("Partition", dcc.Dropdown(id="jobs-partition", placeholder="Any partition",
                                         className="bw-dropdown-sm"), "jobs-partition"),
        _field("Search", dcc.Input(id="jobs-q", type="search", debounce=True, className="bw-input bw-input-wide",
                                   placeholder="slurm:1234, id prefix, name, user, tenant"), "jobs-q"),
    ]),
    html.Div(className="bw-pager", children=[
        html.Span(id="jobs-count", className="bw-muted", **{"aria-live": "polite"}),
        html.Button("← Newer", id="jobs-prev", className="bw-page-button", disabled=True),
        html.Button("Older →", id="jobs-next", className="bw-page-button", disabled=True),
    ]),
    html.Div(id="jobs-table", className="bw-table-wrap"),
    # What the list shows: filters and offset (built in the browser from the controls).
    dcc.Store(id="jobs-query"),
    # The selector's page for that query (server callback), then the websocket's changes.
    dcc.Store(id="jobs-data"),
    dcc.Store(id="jobs-live"),
    # Bumped by jobs.js every 30 s: durations of running and pending jobs move with the clock.
    dcc.Store(id="jobs-clock"),
])


def list_query(query: dict | None) -> dict:
    """The filters and offset of a `jobs-query`, cleaned; unknown keys are dropped."""
    query = query or {}
    out = {name: (query.get(name) or "").strip() if isinstance(query.get(name), str) else "" for name in LIST_FILTERS}
    if out["state"] not in JobState.values:  # an address edited by hand: any state, not no jobs at all
        out["state"] = ""
    try:
        out["offset"] = max(0, int(query.get("offset") or 0))
    except (TypeError, ValueError):
        out["offset"] = 0
    return out


@jobs_app.callback(
    Output("jobs-data", "data"),
    Output("jobs-state", "options"),
    Output("jobs-account", "options"),
    Output("jobs-partition", "options"),
    Input("jobs-query", "data"),
)
def load_jobs(query):
    """One page of jobs for the query, and the dropdowns' choices (state counts in the labels)."""
    query = list_query(query)
    data = job_list(**{k: query[k] or None for k in LIST_FILTERS}, limit=PAGE_SIZE, offset=query["offset"])
    data["query"] = {**query, "limit": PAGE_SIZE}
    filters = data["filters"]
    states = [{"label": f"{s['label']} ({s['count']})", "value": s["value"]} for s in filters["states"]]
    if query["state"] in JobState.values and query["state"] not in {s["value"] for s in states}:
        states.append({"label": f"{JobState(query['state']).label} (0)", "value": query["state"]})
    return (data, states, [{"label": a, "value": a} for a in filters["accounts"]],
            [{"label": p, "value": p} for p in filters["partitions"]])


jobs_app.clientside_callback(
    ClientsideFunction(namespace="breakwater", function_name="jobsFromUrl"),
    Output("jobs-state", "value"),
    Output("jobs-account", "value"),
    Output("jobs-user", "value"),
    Output("jobs-partition", "value"),
    Output("jobs-q", "value"),
    # After the first page arrives, not before: a dropdown drops a value its options do not hold yet.
    Input("jobs-data", "data"),
    State("jobs-url", "search"),
)
jobs_app.clientside_callback(
    ClientsideFunction(namespace="breakwater", function_name="jobsQuery"),
    Output("jobs-query", "data"),
    Input("jobs-state", "value"),
    Input("jobs-account", "value"),
    Input("jobs-user", "value"),
    Input("jobs-partition", "value"),
    Input("jobs-q", "value"),
    Input("jobs-prev", "n_clicks"),
    Input("jobs-next", "n_clicks"),
    State("jobs-query", "data"),
)
jobs_app.clientside_callback(
    ClientsideFunction(namespace="breakwater", function_name="jobsRender"),
    Output("jobs-table", "children"),
    Output("jobs-count", "children"),
    Output("jobs-prev", "disabled"),
    Output("jobs-next", "disabled"),
    Input("jobs-data", "data"),
    Input("jobs-live", "data"),
    Input("jobs-clock", "data"),
)


# --- One job -------------------------------------------------------------------------------------

job_app = PageDash("job", serve_locally=True)


def _section(title: str, *children, section_id: str) -> html.Section:
    return html.Section(className="bw-section bw-panel", id=section_id, children=[html.H2(title), *children])


job_app.layout = html.Div(className="bw-dash bw-job", children=[
    dcc.Location(id="url", refresh=False),
    html.Div(id="job-header", className="bw-job-header"),
    _section("Placement", html.Div(id="job-locality", className="bw-cards bw-locality"),
             # Responsive: it fills its box, whose height jobs.js sets from the gang's GPUs per node.
             dcc.Graph(id="job-placement", className="bw-graph", responsive=True, style={"height": "220px"},
                       config={"displaylogo": False}, figure={"data": [], "layout": {}}),
             section_id="job-placement-section"),
    _section("Ranks", html.Div(id="job-gang", className="bw-muted bw-gang"),
             html.Div(id="job-ranks", className="bw-table-wrap"), section_id="job-ranks-section"),
    _section("Step time per rank (compute time where the job reports it)",
             html.Div(className="bw-toolbar", children=[
                 html.Span("Range", className="bw-label"),
                 dcc.RadioItems(id="job-range", value=DEFAULT_STEP_RANGE, inline=True, className="bw-radio",
                                options=[{"label": label, "value": v} for v, label in STEP_RANGE_LABELS.items()]),
             ]),
             dcc.Graph(id="job-steps", className="bw-graph", responsive=True, style={"height": "360px"},
                       config={"displaylogo": False}, figure={"data": [], "layout": {}}),
             section_id="job-steps-section"),
    # The selector's job (server callback on the URL), its step series for the chosen range,
    # and the websocket's changes to both (set by jobs.js).
    dcc.Store(id="job-data"),
    dcc.Store(id="job-series"),
    dcc.Store(id="job-live"),
    dcc.Store(id="job-clock"),
])


def key_from_path(pathname: str | None) -> str | None:
    """The job key in a `/jobs/<key>/` path, or None."""
    parts = [p for p in (pathname or "").split("/") if p]
    if len(parts) != 2 or parts[0] != "jobs":
        return None
    key = unquote(parts[1])
    return key if ":" in key else None


@job_app.callback(Output("job-data", "data"), Input("url", "pathname"))
def load_job(pathname):
    """The job's fields, history, ranks with their place and step statistics, and locality."""
    key = key_from_path(pathname)
    return job_detail(key) if key else None


def step_range(job: dict, range_name: str, now: datetime) -> tuple[datetime, datetime]:
    """[start, end) of the step chart: the chosen span up to now, or up to the job's end."""
    end = parse_datetime(job["end"]) if job.get("end") else now
    end = min(end, now) + timedelta(seconds=1)  # the newest step is inside the half-open range
    span = STEP_RANGES.get(range_name, STEP_RANGES[DEFAULT_STEP_RANGE])
    started = parse_datetime(job["start"]) if job.get("start") else None
    start = end - span if span else (started or end - STEP_RANGES[DEFAULT_STEP_RANGE])
    if started and span and started > start:
        start = started
    return (start, end) if start < end else (end - timedelta(seconds=1), end)


@job_app.callback(Output("job-series", "data"), Input("job-data", "data"), Input("job-range", "value"))
def load_steps(detail, range_name):
    """Step time per rank and the gang median, bucketed to at most STEP_POINTS points."""
    if not detail:
        return None
    start, end = step_range(detail["job"], range_name, timezone.now())
    series = job_step_series(detail["job"]["id"], start, end, max_points=STEP_POINTS)
    if series is not None:
        series["range"] = range_name if range_name in STEP_RANGES else DEFAULT_STEP_RANGE
    return series


job_app.clientside_callback(
    ClientsideFunction(namespace="breakwater", function_name="jobRender"),
    Output("job-header", "children"),
    Output("job-locality", "children"),
    Output("job-placement", "figure"),
    Output("job-placement", "style"),
    Output("job-gang", "children"),
    Output("job-ranks", "children"),
    Output("job-steps", "figure"),
    Input("job-data", "data"),
    Input("job-series", "data"),
    Input("job-live", "data"),
    Input("job-clock", "data"),
)
