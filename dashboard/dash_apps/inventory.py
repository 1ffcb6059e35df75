"""Drill-down plots: one field of a GPU or a fabric port over a range, and one field across a node's GPUs.

Three apps, one per page: `gpu_series` (/gpus/<uuid>/), `port_series` (/ports/<id>/) and
`node_series` (/nodes/<hostname>/). Each reads its entity from the page URL (`dcc.Location`),
so one registered app serves every GPU, port or node. The server callback calls `series()` and
returns compact JSON; `drilldown.js` draws the figure in the browser and, while the range ends
at "now", subscribes to `/ws/series/` for the points that arrive after the last one drawn
(`dashboard.consumers.inventory.SeriesConsumer`).

A page URL may carry `?end=<ISO 8601>` to look at a past window; such a plot is not live.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, unquote

from dash import ClientsideFunction, Input, Output, dcc, html
from django.utils import timezone

from dashboard.dash_apps.base import PageDash
from telemetry.fields import COUNTER, KINDS
from telemetry.rollups import INTERVALS
from telemetry.selectors import inventory
from telemetry.series import Series, series

RANGES: dict[str, tuple[timedelta, str]] = {
    "15m": (timedelta(minutes=15), "15 min"),
    "1h": (timedelta(hours=1), "1 h"),
    "6h": (timedelta(hours=6), "6 h"),
    "24h": (timedelta(hours=24), "24 h"),
    "7d": (timedelta(days=7), "7 d"),
    "30d": (timedelta(days=30), "30 d"),
}
DEFAULT_RANGE = "1h"
DEFAULT_FIELDS = {"gpu": "gpu_util", "port": "xmit_data_bytes"}
RESOLUTION_LABELS = {"raw": "raw", "1m": "1 min", "1h": "1 h"}
# Points per line: enough for raw 10-s samples over 6 h (2160) to stay raw.
MAX_POINTS = 2500
GRAPH_CONFIG = {"displaylogo": False, "responsive": True}


# --- Shared with the consumer -------------------------------------------------------------------

def time_str(t: datetime) -> str:
    """UTC without an offset: Plotly's date axis ignores offsets, so the page labels it UTC."""
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def parse_time(text: str) -> datetime | None:
    """An ISO 8601 time (`time_str` output, or with Z / an offset) as aware UTC; None if unreadable."""
    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except (AttributeError, ValueError):
        return None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def unit_of(kind: str, field: str) -> str:
    """The unit a plot of `field` carries: counters are plotted as per-second rates."""
    f = KINDS[kind].by_name[field]
    return f"{f.unit}/s" if f.kind == COUNTER else f.unit


def field_options(kind: str) -> list[dict]:
    """Every stored field of `kind` for the picker, labelled with the unit it is plotted in."""
    return [{"label": f"{f.help} ({unit_of(kind, f.name)})", "value": f.name} for f in KINDS[kind].fields]


def resolution_label(s: Series) -> str:
    """"raw", "1 min", "1 h", and the point spacing where it differs from the table's own."""
    label = RESOLUTION_LABELS[s.resolution]
    if s.step is None:
        return label
    if s.resolution == "raw":
        return f"{label}, a sample every {_duration(s.step)}"
    if s.step != INTERVALS[s.resolution]:
        return f"{label} rollup, {_duration(s.step)} points"
    return f"{label} rollup"


def _duration(step: timedelta) -> str:
    seconds = step.total_seconds()
    if seconds < 120:
        return f"{seconds:g} s"
    if seconds < 7200:
        return f"{seconds / 60:g} min"
    return f"{seconds / 3600:g} h"


def series_points(s: Series) -> dict:
    """x / y (and the min/max band, where given) as plot-ready lists; None marks a gap."""
    out = {"x": [time_str(t) for t, _ in s.points], "y": [v for _, v in s.points], "band": None}
    if s.band is not None:
        out["band"] = {"lo": [lo for lo, _ in s.band], "hi": [hi for _, hi in s.band]}
    return out


def window(search: str | None, range_key: str | None, now: datetime | None = None) -> tuple[datetime, datetime, bool]:
    """(start, end, live) for the range picked and the page's optional `?end=`."""
    span = RANGES.get(range_key or "", RANGES[DEFAULT_RANGE])[0]
    given = parse_qs((search or "").lstrip("?")).get("end")
    # An unescaped "+01:00" offset reaches us as " 01:00".
    end = (parse_time(given[0]) or parse_time("+".join(given[0].rsplit(" ", 1)))) if given else None
    if end is None:
        now = now or timezone.now()
        return now - span, now, True
    return end - span, end, False


# --- Which entity the page shows ---------------------------------------------------------------

def _segment(pathname: str | None, prefix: str) -> str | None:
    parts = [p for p in (pathname or "").split("/") if p]
    return unquote(parts[1]) if len(parts) == 2 and parts[0] == prefix else None


def entity_id(kind: str, pathname: str | None) -> int | None:
    """The GPU / port / node id named by a page path, or None if it names nothing."""
    return inventory.entity_id(kind, _segment(pathname, {"gpu": "gpus", "port": "ports"}.get(kind, "nodes")))


# --- One entity, one field ---------------------------------------------------------------------

def entity_series(kind: str, pathname: str | None, search: str | None, field: str | None,
                  range_key: str | None, *, now: datetime | None = None) -> dict | None:
    """The plot payload of the page's entity, or None when the page names no known entity."""
    ident = entity_id(kind, pathname)
    if ident is None:
        return None
    field = field if field in KINDS[kind].by_name else DEFAULT_FIELDS[kind]
    range_key = range_key if range_key in RANGES else DEFAULT_RANGE
    start, end, live = window(search, range_key, now)
    s = series(kind, ident, field, start, end, max_points=MAX_POINTS)
    spec = KINDS[kind].by_name[field]
    return {
        "kind": kind, "id": ident, "field": field, "label": spec.help, "unit": s.unit, "field_kind": s.kind,
        "range": range_key, "range_s": RANGES[range_key][0].total_seconds(),
        "start": time_str(start), "end": time_str(end), "live": live,
        "resolution": s.resolution, "resolution_label": resolution_label(s),
        "step_s": s.step.total_seconds() if s.step else None,
        **series_points(s),
    }


def _series_app(name: str, kind: str) -> PageDash:
    app = PageDash(name, serve_locally=True)
    app.layout = html.Div(className="bw-dash bw-series", children=[
        dcc.Location(id="url", refresh=False),
        _toolbar(kind, DEFAULT_FIELDS[kind]),
        dcc.Graph(id="series-graph", className="bw-series-graph", config=GRAPH_CONFIG,
                  figure={"data": [], "layout": {"height": 360}}),
        # The plotted window (server callback on the URL, field and range).
        dcc.Store(id="series-data"),
        # Points pushed by the websocket (dash_clientside.set_props from drilldown.js).
        dcc.Store(id="series-live"),
        dcc.Store(id="series-applied"),
        # Bumped by drilldown.js when the consumer says the page fell too far behind: reread.
        dcc.Store(id="series-reload", data=0),
    ])

    @app.callback(Output("series-data", "data"), Input("url", "pathname"), Input("url", "search"),
                  Input("field", "value"), Input("range", "value"), Input("series-reload", "data"))
    def load(pathname, search, field, range_key, _reload):
        """The chosen field of the page's GPU or port over the chosen range."""
        return entity_series(kind, pathname, search, field, range_key)

    app.clientside_callback(
        ClientsideFunction(namespace="breakwater", function_name="seriesFigure"),
        Output("series-graph", "figure"),
        Output("series-resolution", "children"),
        Input("series-data", "data"),
    )
    app.clientside_callback(
        ClientsideFunction(namespace="breakwater", function_name="seriesApply"),
        Output("series-applied", "data"),
        Input("series-live", "data"),
        prevent_initial_call=True,
    )
    return app


def _toolbar(kind: str, default_field: str) -> html.Div:
    return html.Div(className="bw-toolbar", children=[
        html.Label("Field", htmlFor="field"),
        dcc.Dropdown(id="field", options=field_options(kind), value=default_field, clearable=False,
                     searchable=True, className="bw-dropdown"),
        html.Span("Range", className="bw-toolbar-label", id="range-label"),
        dcc.RadioItems(id="range", options=[{"label": label, "value": key} for key, (_, label) in RANGES.items()],
                       value=DEFAULT_RANGE, inline=True, className="bw-range",
                       inputClassName="bw-range-input"),
        html.Span(["Resolution: ", html.Span(id="series-resolution")], className="bw-muted bw-resolution"),
    ])


gpu_app = _series_app("gpu_series", "gpu")
port_app = _series_app("port_series", "port")


# --- A node: one field across its GPUs ---------------------------------------------------------

def node_series(pathname: str | None, search: str | None, field: str | None, range_key: str | None,
                *, now: datetime | None = None) -> dict | None:
    """One line per GPU of the page's node, or None when the page names no known node."""
    node = entity_id("node", pathname)
    if node is None:
        return None
    field = field if field in KINDS["gpu"].by_name else DEFAULT_FIELDS["gpu"]
    range_key = range_key if range_key in RANGES else DEFAULT_RANGE
    start, end, live = window(search, range_key, now)
    traces, resolutions = [], []
    for gpu_id, index, uuid in inventory.node_gpus(node):
        s = series("gpu", gpu_id, field, start, end, max_points=MAX_POINTS)
        if RESOLUTION_LABELS[s.resolution] not in resolutions:  # raw may fall up to 1 min for a busy GPU
            resolutions.append(RESOLUTION_LABELS[s.resolution])
        traces.append({"name": f"GPU {index}" if index is not None else uuid, "uuid": uuid, **series_points(s)})
    return {
        "kind": "node", "id": node, "field": field, "label": KINDS["gpu"].by_name[field].help,
        "unit": unit_of("gpu", field), "field_kind": KINDS["gpu"].by_name[field].kind,
        "range": range_key, "start": time_str(start), "end": time_str(end),
        "live": live, "resolution_label": " / ".join(resolutions) or "no GPUs", "traces": traces,
    }


node_app = PageDash("node_series", serve_locally=True)
node_app.layout = html.Div(className="bw-dash bw-series", children=[
    dcc.Location(id="url", refresh=False),
    _toolbar("gpu", DEFAULT_FIELDS["gpu"]),
    dcc.Graph(id="series-graph", className="bw-series-graph", config=GRAPH_CONFIG,
              figure={"data": [], "layout": {"height": 380}}),
    dcc.Store(id="series-data"),
])


@node_app.callback(Output("series-data", "data"), Input("url", "pathname"), Input("url", "search"),
                   Input("field", "value"), Input("range", "value"))
def load_node(pathname, search, field, range_key):
    """The chosen field of every GPU of the page's node over the chosen range."""
    return node_series(pathname, search, field, range_key)


node_app.clientside_callback(
    ClientsideFunction(namespace="breakwater", function_name="nodeFigure"),
    Output("series-graph", "figure"),
    Output("series-resolution", "children"),
    Input("series-data", "data"),
)
