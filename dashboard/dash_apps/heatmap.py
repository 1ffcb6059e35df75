"""The rack heatmap: every GPU a cell at its U position, coloured by a chosen metric."""

from __future__ import annotations

from dash import ClientsideFunction, Input, Output, State, dcc, html

from dashboard.dash_apps.base import PageDash
from telemetry.selectors.racks import DEFAULT_METRIC, METRICS, heatmap_values, metric_choices, rack_grid

app = PageDash("heatmap", serve_locally=True)

app.layout = html.Div(className="bw-dash", children=[
    html.Div(className="bw-toolbar", children=[
        html.Label("Colour by", htmlFor="metric"),
        dcc.Dropdown(id="metric", options=metric_choices(), value=DEFAULT_METRIC, clearable=False,
                     searchable=False, className="bw-dropdown"),
        html.Span(id="heatmap-note", className="bw-muted"),
    ]),
    # Filled by heatmap.js (HTML, not a Plotly colorbar): colour scale, "no data" and empty slots.
    html.Div(id="heatmap-legend", className="bw-legend", role="img", **{"aria-label": "Colour legend"}),
    dcc.Graph(id="heatmap", className="bw-heatmap", config={"displaylogo": False, "responsive": True},
              figure={"data": [], "layout": {"height": 200}}),
    # The whole page: layout, static facts and values (server callback on the metric).
    dcc.Store(id="heatmap-data"),
    # Changes pushed by the websocket (dash_clientside.set_props from heatmap.js).
    dcc.Store(id="heatmap-live"),
    dcc.Store(id="heatmap-applied"),
    # Bumped by heatmap.js when the push names a GPU the page has not drawn: reload the grid.
    dcc.Store(id="heatmap-reload", data=0),
])


@app.callback(Output("heatmap-data", "data"), Input("metric", "value"), Input("heatmap-reload", "data"))
def load(metric, _reload):
    """The grid and the chosen metric's values, aligned with the grid's GPU order."""
    if metric not in METRICS:
        metric = DEFAULT_METRIC
    grid = rack_grid()
    meta = heatmap_values(metric)
    values = meta.pop("values")
    meta["values"] = [values.get(gpu_id) for gpu_id in grid["gpus"]["id"]]
    return {"grid": grid, "metric": meta}


app.clientside_callback(
    ClientsideFunction(namespace="breakwater", function_name="heatmapFigure"),
    Output("heatmap", "figure"),
    Output("heatmap-note", "children"),
    Input("heatmap-data", "data"),
)
app.clientside_callback(
    ClientsideFunction(namespace="breakwater", function_name="heatmapApply"),
    Output("heatmap-applied", "data"),
    Input("heatmap-live", "data"),
    State("metric", "value"),
    prevent_initial_call=True,
)
