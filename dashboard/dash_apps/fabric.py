"""The Fabric page: the leaf × spine matrix of one metric and the switch-level Clos graph.

Two server callbacks, one selector each: `load_matrix` (`fabric_matrix` of the picked metric)
and `load_graph` (`fabric_graph`, with every switch given a fixed place by `place_switches`).
fabric.js draws both in the browser (clientside namespace `breakwater`) and applies what the
`/ws/fabric/` consumer pushes: changed cells, changed edges, a new worst-links list.

Edge states are told apart by line style as well as colour (Okabe-Ito), so no state rests on
colour alone; the matrix uses cividis, readable with every common colour-vision deficiency.
"""

from __future__ import annotations

import math

import dash_cytoscape as cyto
from dash import ClientsideFunction, Input, Output, State, dcc, html

from dashboard.dash_apps.base import PageDash
from telemetry.selectors.fabric import METRICS, fabric_graph, fabric_matrix

DEFAULT_METRIC = "utilization"
# How fabric.js colours each metric. Rates span orders of magnitude (a healthy uplink waits
# ~1e4 ticks/s, a congested one 1e5-1e6), so those scales are logarithmic. A cell whose link
# is unhealthy in the graph also gets a marker (fabric.js), so no state rests on its colour.
METRIC_VIEW: dict[str, dict] = {
    "utilization": {"label": "Utilization", "scale": "linear", "range": [0, 100]},
    "congestion": {"label": "Congestion (PortXmitWait)", "scale": "log", "range": [1e3, 1e6]},
    "errors": {"label": "Errors", "scale": "log", "range": [1e-3, 10]},
}

# Edge states, worst first (the selector's EDGE_STATES). `dash` is Cytoscape's
# line-dash-pattern; the legend draws the same pattern.
EDGE_STYLES: dict[str, dict] = {
    "down": {"colour": "#d55e00", "dash": [2, 4], "label": "down (no traffic)"},
    "errors": {"colour": "#cc79a7", "dash": [4, 3], "label": "errors or flaps"},
    "congested": {"colour": "#e69f00", "dash": [12, 4], "label": "congested"},
    "ok": {"colour": "#0072b2", "dash": None, "label": "ok"},
    "no data": {"colour": "#bdbdbd", "dash": None, "label": "no data"},
}
UNHEALTHY = ("down", "errors", "congested")

# Where switches go (Cytoscape model units): each rail is a plane with its spines in a row above
# its leaves, the rows apart by a share of the plane's width so a wide plane is not a flat strip;
# planes wrap into rows so the picture's aspect stays near that of the graph's box; core switches
# sit in a row above every plane.
SWITCH_DX = 34
TIER_DY_MIN = 180
TIER_DY_SHARE = 0.3
PLANE_GAP_X = 140
PLANE_GAP_Y_MIN = 150
PLANE_GAP_Y_SHARE = 0.12
TARGET_ASPECT = 1.4
# A plane's label grows with the plane, so it stays readable when a large fabric is zoomed out.
RAIL_LABEL_MIN = 14
RAIL_LABEL_SHARE = 0.05
GRAPH_HEIGHT_PX = 640


def metric_choices() -> list[dict]:
    return [{"label": f"{view['label']} ({METRICS[m]})", "value": m} for m, view in METRIC_VIEW.items()]


def _stylesheet() -> list[dict]:
    """Cytoscape styles: shape by tier, colour and dash by state, width by utilization.

    Haystack edges (straight, no arrows) and labels drawn only when zoomed in keep 16k edges
    cheap to draw; healthy edges are faint so the unhealthy ones, wider and on top, stand out.
    """
    sheet = [
        {"selector": "node", "style": {
            "label": "data(label)", "font-size": 9, "min-zoomed-font-size": 7, "text-valign": "bottom",
            "text-margin-y": 3, "color": "#1c2530", "width": 16, "height": 16, "background-color": "#4d5560",
            "border-width": 1, "border-color": "#ffffff"}},
        {"selector": 'node[role = "leaf"]', "style": {"shape": "ellipse"}},
        {"selector": 'node[role = "spine"]', "style": {"shape": "round-rectangle", "width": 22}},
        {"selector": 'node[role = "core"]', "style": {"shape": "diamond", "width": 22, "height": 22}},
        {"selector": "node.bw-trouble", "style": {"border-width": 3, "border-color": "#d55e00"}},
        {"selector": "node.bw-rail", "style": {
            "shape": "rectangle", "background-opacity": 0, "border-width": 0, "width": 1, "height": 1,
            "font-size": "data(size)", "min-zoomed-font-size": 0, "font-weight": "bold", "color": "#5f6b78",
            "text-valign": "top", "text-halign": "right", "events": "no"}},
        {"selector": "edge", "style": {
            "curve-style": "haystack", "haystack-radius": 0, "width": 1, "line-color": "#bdbdbd", "opacity": 0.45}},
        {"selector": "edge[?util_pct]", "style": {"width": "mapData(util_pct, 0, 100, 1, 8)"}},
    ]
    for state, style in EDGE_STYLES.items():
        rule = {"line-color": style["colour"]}
        if style["dash"]:
            rule.update({"line-style": "dashed", "line-dash-pattern": style["dash"]})
        sheet.append({"selector": f'edge[state = "{state}"]', "style": rule})
    bad = ", ".join(f'edge[state = "{s}"]' for s in UNHEALTHY)
    sheet += [
        {"selector": bad, "style": {"opacity": 1, "z-index": 10, "width": 3}},
        {"selector": ", ".join(f'edge[state = "{s}"][?util_pct]' for s in UNHEALTHY),
         "style": {"width": "mapData(util_pct, 0, 100, 3, 9)"}},
        {"selector": "edge.bw-focus", "style": {"opacity": 1, "z-index": 20}},
        {"selector": "node.bw-focus", "style": {"border-width": 3, "border-color": "#000000", "z-index": 20}},
    ]
    return sheet


def _edge_legend() -> html.Div:
    """Each state's line as the graph draws it, with its name; then the width and shape keys."""
    items = [html.Span("Links", className="bw-legend-title")]
    for state, style in EDGE_STYLES.items():
        on, off = style["dash"] or (1, 0)
        line = (f"repeating-linear-gradient(90deg, {style['colour']} 0 {on}px, transparent {on}px {on + off}px)"
                if style["dash"] else style["colour"])
        items.append(html.Span(className="bw-legend-item", **{"data-state": state}, children=[
            html.Span(className="bw-line-swatch", style={"background": line}), style["label"]]))
    items += [
        html.Span("width = utilization (thin 0 %, thick 100 %)", className="bw-legend-item"),
        html.Span("● leaf  ▬ spine  ◆ core; an orange ring marks a switch with an unhealthy link",
                  className="bw-legend-item"),
    ]
    return html.Div(items, className="bw-legend", id="fabric-graph-legend")


app = PageDash("fabric", serve_locally=True)

app.layout = html.Div(className="bw-dash bw-fabric", children=[
    html.Div(className="bw-toolbar", children=[
        html.Label("Colour the matrix by", htmlFor="fabric-metric"),
        dcc.Dropdown(id="fabric-metric", options=metric_choices(), value=DEFAULT_METRIC, clearable=False,
                     searchable=False, className="bw-dropdown"),
        html.Span(id="fabric-note", className="bw-muted", **{"aria-live": "polite"}),
    ]),
    html.Div(className="bw-fabric-top", children=[
        html.Section(className="bw-panel bw-fabric-matrix", children=[
            html.H2("Leaf × spine"),
            # Filled by fabric.js: colour scale with the unit, "no data", "no link", the markers.
            html.Div(id="fabric-legend", className="bw-legend", role="img", **{"aria-label": "Matrix legend"}),
            dcc.Graph(id="fabric-matrix", className="bw-graph", config={"displaylogo": False, "responsive": True},
                      figure={"data": [], "layout": {"height": 200}}),
        ]),
        html.Aside(className="bw-panel bw-fabric-worst", children=[
            html.H2("Worst links"),
            html.P(id="fabric-worst-note", className="bw-muted bw-small"),
            html.Div(id="fabric-worst"),
        ]),
    ]),
    html.Section(className="bw-panel bw-fabric-topology", children=[
        html.H2("Clos topology"),
        html.P("One line per switch pair (all its cables). Click a switch for its links; scroll to zoom.",
               className="bw-muted bw-small"),
        _edge_legend(),
        html.Div(className="bw-fabric-graph-row", children=[
            cyto.Cytoscape(id="fabric-graph", className="bw-fabric-graph", elements=[],
                           layout={"name": "preset", "fit": True, "padding": 24}, stylesheet=_stylesheet(),
                           autoungrabify=True, autoRefreshLayout=False, boxSelectionEnabled=False,
                           minZoom=0.02, maxZoom=4,
                           style={"width": "100%", "height": f"{GRAPH_HEIGHT_PX}px"}),
            html.Div(id="fabric-switch", className="bw-fabric-details", **{"aria-live": "polite"}),
        ]),
    ]),
    dcc.Store(id="fabric-matrix-data"),
    dcc.Store(id="fabric-graph-data"),
    # Changes pushed by the websocket (set by fabric.js), and what applying them returned.
    dcc.Store(id="fabric-live"),
    dcc.Store(id="fabric-applied"),
    # Bumped by fabric.js when a push names a switch or pair the page has not drawn.
    dcc.Store(id="fabric-reload", data=0),
])


@app.callback(Output("fabric-matrix-data", "data"), Input("fabric-metric", "value"), Input("fabric-reload", "data"))
def load_matrix(metric, _reload):
    """The leaf × spine matrix of the picked metric, and how to colour it."""
    if metric not in METRICS:
        metric = DEFAULT_METRIC
    return {"matrix": fabric_matrix(metric), "view": METRIC_VIEW[metric]}


@app.callback(Output("fabric-graph-data", "data"), Input("fabric-reload", "data"))
def load_graph(_reload):
    """The switch graph with every switch placed (preset layout) and the rail labels."""
    return {"elements": place_switches(fabric_graph()), "styles": EDGE_STYLES}


# --- Layout: pure, tested on its own -------------------------------------------------------------

def _tier(role: str) -> str:
    return role if role in ("leaf", "spine") else "core"


def _wrap(widths: list[float], height: float) -> list[list[int]]:
    """Planes (by width) packed left to right into rows, as many rows as bring the whole
    picture's aspect nearest TARGET_ASPECT."""
    total = sum(widths) + PLANE_GAP_X * (len(widths) - 1)
    rows = max(1, min(len(widths), round(math.sqrt(total / (height * TARGET_ASPECT)))))
    target = total / rows
    out: list[list[int]] = [[]]
    used = 0.0
    for i, w in enumerate(widths):
        if out[-1] and used + w > target * 1.05 and len(out) < rows:
            out.append([])
            used = 0.0
        out[-1].append(i)
        used += w + PLANE_GAP_X
    return out


def place_switches(elements: list[dict]) -> list[dict]:
    """`elements` (from `fabric_graph`) with a preset `position` on every switch and a label
    node per rail plane (class ``bw-rail``, no data but `label` and its font `size`).

    Switches group into planes by rail (no rail last), in the selector's order; in each plane
    the spines sit one row above the leaves, both spread over the plane's width; cores sit in
    one row above all planes. Edges come back unchanged.
    """
    planes, cores = _planes([e for e in elements if "source" not in e["data"]])
    keys = sorted(planes, key=lambda r: (r is None, r if isinstance(r, int) else 0, str(r)))
    widths = [max(len(planes[k]["spine"]), len(planes[k]["leaf"]), 1) * SWITCH_DX for k in keys]
    widest = max(widths, default=0)
    tier_dy = max(TIER_DY_MIN, TIER_DY_SHARE * widest)
    plane_h = tier_dy + max(PLANE_GAP_Y_MIN, PLANE_GAP_Y_SHARE * widest)
    placed: list[dict] = []
    top = tier_dy if cores else 0
    x_max = 0.0
    for r, row in enumerate(_wrap(widths, plane_h) if keys else []):
        x0 = 0.0
        for i in row:
            key, width, y0 = keys[i], widths[i], top + r * plane_h
            for tier, y in (("spine", y0), ("leaf", y0 + tier_dy)):
                placed += _spread(planes[key][tier], x0, width, y)
            label = "No rail" if key is None else f"Rail {key}"
            size = round(max(RAIL_LABEL_MIN, RAIL_LABEL_SHARE * width))
            placed.append({"data": {"id": f"rail-{key}", "label": label, "size": size}, "classes": "bw-rail",
                           "position": {"x": x0 - SWITCH_DX / 2, "y": y0 - 30}, "selectable": False})
            x0 += width + PLANE_GAP_X
        x_max = max(x_max, x0 - PLANE_GAP_X)
    placed += _spread(cores, 0.0, max(x_max, len(cores) * SWITCH_DX), 0.0)
    return placed + [e for e in elements if "source" in e["data"]]


def _planes(nodes: list[dict]) -> tuple[dict[object, dict[str, list[dict]]], list[dict]]:
    """{rail: {"spine": [...], "leaf": [...]}} and the core switches, each in the given order."""
    planes: dict[object, dict[str, list[dict]]] = {}
    cores = []
    for n in nodes:
        tier = _tier(n["data"]["role"])
        if tier == "core":
            cores.append(n)
        else:
            planes.setdefault(n["data"]["rail"], {"spine": [], "leaf": []})[tier].append(n)
    return planes, cores


def _spread(nodes: list[dict], x0: float, width: float, y: float) -> list[dict]:
    step = width / max(len(nodes), 1)
    return [{**n, "position": {"x": round(x0 + (k + 0.5) * step, 1), "y": y}} for k, n in enumerate(nodes)]


# --- Clientside: figures, the worst list, details and live changes (fabric.js) -------------------

app.clientside_callback(
    ClientsideFunction(namespace="breakwater", function_name="fabricMatrix"),
    Output("fabric-matrix", "figure"),
    Output("fabric-worst", "children"),
    Output("fabric-worst-note", "children"),
    Output("fabric-note", "children"),
    Input("fabric-matrix-data", "data"),
    Input("fabric-graph-data", "data"),
)
app.clientside_callback(
    ClientsideFunction(namespace="breakwater", function_name="fabricGraph"),
    Output("fabric-graph", "elements"),
    Input("fabric-graph-data", "data"),
)
app.clientside_callback(
    ClientsideFunction(namespace="breakwater", function_name="fabricDetails"),
    Output("fabric-switch", "children"),
    Input("fabric-graph-data", "data"),
    Input("fabric-graph", "tapNodeData"),
    Input("fabric-graph", "tapEdgeData"),
    Input("fabric-applied", "data"),
)
app.clientside_callback(
    ClientsideFunction(namespace="breakwater", function_name="fabricApply"),
    Output("fabric-applied", "data"),
    Input("fabric-live", "data"),
    State("fabric-metric", "value"),
    prevent_initial_call=True,
)
