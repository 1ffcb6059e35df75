/* Fabric page: the leaf × spine matrix, the worst links, the Clos graph and its details panel,
 * kept live by /ws/fabric/.
 *
 * The Dash app `fabric` (dashboard/dash_apps/fabric.py) loads `fabric_matrix` for the picked
 * metric and `fabric_graph` with a preset place for every switch. fabricMatrix draws one Plotly
 * heatmap from the matrix (a cell per leaf × spine pair that shares a cable; no cable, no cell)
 * plus a marker on every cell whose link is unhealthy in the graph; fabricGraph hands the graph's
 * elements to Cytoscape. Once both are drawn the page subscribes with its metric. The consumer
 * sends everything once ("full") and then, per telemetry tick, only the cells and edges whose
 * values changed: fabricApply patches the matrix with one restyle and the graph's edges in place
 * (their Cytoscape data, which the stylesheet maps to colour, dash and width), recomputes the
 * worst links and redraws the details panel. A push naming a pair or edge the page has not drawn reloads both.
 * Once a metric's matrix is on screen, the page's root (#bw-fabric-page) says which: data-metric.
 *
 * Colours: cividis for the matrix (grey = a cable with no reading); Okabe-Ito for link states,
 * each also with its own dash pattern, marker symbol and name, so no state rests on colour alone.
 */
(function () {
  "use strict";
  var BW = (window.BW = window.BW || {});
  var NO_DATA = "#bdbdbd";
  var CIVIDIS = ["#00224e", "#123570", "#3b496c", "#575d6d", "#707173", "#8a8678", "#a59c74",
                 "#c3b369", "#e1cc55", "#fee838"];
  var BAND = 0.05;  // share of the colour axis below the range for "no data"
  var SEP = "\u0001";  // joins a leaf and a spine name into one key
  var STATE_RANK = { down: 0, errors: 1, congested: 2, ok: 3, "no data": 4 };
  var SYMBOLS = { down: "square-open", errors: "triangle-up-open", congested: "x-thin-open" };
  var WORST = 10;
  var TICK_LABELS_MAX = 48;  // switch names on the axes while they fit; rail labels beyond
  var DETAIL_LINKS_MAX = 80;
  var TEXTURE_EDGES = 2000;

  var st = {
    matrix: null, view: null, metric: null, row: new Map(), col: new Map(), cz: null, cd: null,
    graph: null, styles: {}, nodes: new Map(), edges: new Map(), adj: new Map(), pairEdge: new Map(),
    edgePair: new Map(),
    selected: null, socket: null, queue: [],
    ready: { matrix: false, graph: false }, subscribed: null
  };
  var stats = (BW.fabricStats = {
    applied: 0, lastCells: 0, lastEdges: 0, lastApplyMs: null, matrixMs: null, matrixRenderedAt: null,
    graphMs: null, graphRenderedAt: null, graphElements: 0
  });

  /* --- Helpers ------------------------------------------------------------------------------ */

  /* A dash_html_components element; `type` as the HTML tag ("td"), which Dash capitalises ("Td"). */
  function h(type, props, children) {
    var p = Object.assign({}, props || {});
    if (children !== undefined) p.children = children;
    return { type: type.charAt(0).toUpperCase() + type.slice(1), namespace: "dash_html_components", props: p };
  }

  function fmtNum(v) {
    if (v === null || v === undefined) return "—";
    var a = Math.abs(v);
    if (a === 0) return "0";
    if (a >= 1e6) return (v / 1e6).toFixed(2) + " M";
    if (a >= 1e4) return (v / 1e3).toFixed(1) + " k";
    if (a >= 100) return v.toFixed(0);
    if (a >= 1) return v.toFixed(1);
    return v.toPrecision(2);
  }

  function fmtValue(v, unit) {
    if (v === null || v === undefined) return "no data";
    if (unit === "%") return v.toFixed(1) + " %";
    return fmtNum(v) + " " + unit;
  }

  function searchUrl(name) { return "/search/?q=" + encodeURIComponent(name); }

  function cyInstance() {
    var el = document.getElementById("fabric-graph");
    return el && el._cyreg ? el._cyreg.cy : null;
  }

  /* The matrix of st.metric is on screen. */
  function matrixShown() {
    st.ready.matrix = true;
    document.getElementById("bw-fabric-page").dataset.metric = st.metric;
  }

  function matrixDiv() {
    var outer = document.getElementById("fabric-matrix");
    return outer && outer.querySelector(".js-plotly-plot");
  }

  /* --- The graph's index: switches, edges, and the edge of each leaf × spine pair ----------- */

  function indexGraph(payload) {
    if (st.graph === payload) return;
    st.graph = payload;
    st.styles = payload.styles || {};
    st.nodes = new Map(); st.edges = new Map(); st.adj = new Map();
    st.pairEdge = new Map(); st.edgePair = new Map();
    payload.elements.forEach(function (e) {
      var d = e.data;
      if (d.source === undefined) { if (d.role) { st.nodes.set(d.id, d); st.adj.set(d.id, []); } return; }
      st.edges.set(d.id, d);
    });
    st.edges.forEach(function (d) {
      var a = st.nodes.get(d.source), b = st.nodes.get(d.target);
      if (a) st.adj.get(d.source).push(d);
      if (b) st.adj.get(d.target).push(d);
      if (a && b && a.role === "leaf" && b.role === "spine") {
        var key = a.label + SEP + b.label;
        st.pairEdge.set(key, d);
        st.edgePair.set(d.id, key);
      }
    });
  }

  function troubled(nodeId) {
    return (st.adj.get(nodeId) || []).some(function (d) { return STATE_RANK[d.state] < 3; });
  }

  /* --- The matrix ---------------------------------------------------------------------------- */

  function toColour(v) {
    var view = st.view, lo = view.range[0], hi = view.range[1];
    if (v === null || v === undefined) return st.axis.noData;
    v = Math.min(hi, Math.max(lo, v));
    return view.scale === "log" ? Math.log10(v) : v;
  }

  function colourAxis(view) {
    var lo = view.range[0], hi = view.range[1];
    if (view.scale === "log") { lo = Math.log10(lo); hi = Math.log10(hi); }
    var band = (hi - lo) * BAND / (1 - BAND);
    var stops = [[0, NO_DATA], [BAND * 0.9, NO_DATA]];
    CIVIDIS.forEach(function (c, i) { stops.push([BAND + (1 - BAND) * i / (CIVIDIS.length - 1), c]); });
    stops[stops.length - 1][0] = 1;
    st.axis = { zmin: lo - band, zmax: hi, noData: lo - band / 2 };
    return { zmin: st.axis.zmin, zmax: st.axis.zmax, colorscale: stops, showscale: false };
  }

  function tickLabel(view, v) {
    return view.scale === "log" ? fmtNum(v).replace(" ", "") : String(v);
  }

  function drawLegend(m, view) {
    var box = document.getElementById("fabric-legend");
    if (!box) return;
    var lo = view.range[0], hi = view.range[1];
    var mid = view.scale === "log" ? Math.pow(10, (Math.log10(lo) + Math.log10(hi)) / 2) : (lo + hi) / 2;
    var grad = CIVIDIS.map(function (c, i) { return c + " " + (100 * i / (CIVIDIS.length - 1)).toFixed(1) + "%"; });
    var swatch = function (style, label) {
      return '<span class="bw-legend-item"><span class="bw-swatch" style="' + style + '"></span>' + BW.esc(label) + "</span>";
    };
    var html = '<span class="bw-legend-title">' + BW.esc(view.label + " (" + m.unit + ")") + "</span>" +
      '<span class="bw-legend-scale"><span class="bw-gradient" style="background:linear-gradient(to right,' +
      grad.join(",") + ')"></span><span class="bw-legend-ticks"><span>' + (view.scale === "log" ? "≤ " : "") +
      BW.esc(tickLabel(view, lo)) + "</span><span>" + BW.esc(tickLabel(view, mid)) + (view.scale === "log" ? " (log)" : "") +
      "</span><span>" + BW.esc(tickLabel(view, hi)) + "+</span></span></span>" +
      swatch("background:" + NO_DATA, "no data") + swatch("background:#fff", "no cable");
    ["congested", "errors", "down"].forEach(function (s) {
      var style = st.styles[s] || {};
      html += '<span class="bw-legend-item"><span class="bw-marker" style="color:' + (style.colour || "#000") + '">' +
        { congested: "✕", errors: "△", down: "□" }[s] + "</span>" + BW.esc("link " + s) + "</span>";
    });
    box.innerHTML = html;
  }

  function cellText(i, j) {
    var m = st.matrix, leaf = m.leaves[i], spine = m.spines[j], n = m.links[i][j];
    var rail = m.leaf_rails[i];
    var edge = st.pairEdge.get(leaf + SEP + spine);
    return "<b>" + BW.esc(leaf) + " ↔ " + BW.esc(spine) + "</b><br>" + (rail === null ? "no rail" : "rail " + rail) + " · " +
      n + " link" + (n === 1 ? "" : "s") + "<br>" + BW.esc(st.view.label) + ": <b>" + fmtValue(m.z[i][j], m.unit) + "</b>" +
      (edge ? "<br>link state: " + BW.esc(edge.state) : "");
  }

  function markerTrace() {
    var x = [], y = [], sym = [], col = [], text = [];
    st.pairEdge.forEach(function (d, key) {
      if (STATE_RANK[d.state] > 2) return;
      var parts = key.split(SEP), i = st.row.get(parts[0]), j = st.col.get(parts[1]);
      if (i === undefined || j === undefined) return;
      x.push(j); y.push(i); sym.push(SYMBOLS[d.state]);
      col.push((st.styles[d.state] || {}).colour || "#000");
      text.push("<b>" + BW.esc(parts[0]) + " ↔ " + BW.esc(parts[1]) + "</b><br>link " + BW.esc(d.state));
    });
    var size = Math.max(7, Math.min(14, st.cellPx || 10));
    return { type: "scatter", mode: "markers", x: x, y: y, text: text, hovertemplate: "%{text}<extra></extra>",
             marker: { symbol: sym, color: col, size: size, line: { width: 2, color: col } }, showlegend: false };
  }

  function railGroups(rails) {
    var groups = [], start = 0;
    for (var k = 1; k <= rails.length; k++) {
      if (k === rails.length || rails[k] !== rails[start]) { groups.push([start, k - 1, rails[start]]); start = k; }
    }
    return groups;
  }

  function axisLayout(names, rails, isX) {
    var a = { showgrid: false, zeroline: false, range: [-0.5, names.length - 0.5], fixedrange: false,
              ticks: "", tickfont: { size: 10 } };
    if (names.length <= TICK_LABELS_MAX) {
      a.tickvals = names.map(function (_, k) { return k; });
      a.ticktext = names;
    } else {
      var groups = railGroups(rails);
      a.tickvals = groups.map(function (g) { return (g[0] + g[1]) / 2; });
      a.ticktext = groups.map(function (g) { return g[2] === null ? "no rail" : "rail " + g[2]; });
    }
    a.title = { text: isX ? "spines" : "leaves", standoff: 6, font: { size: 12 } };
    if (!isX) a.autorange = "reversed";
    return a;
  }

  function separators(m) {
    var shapes = [];
    var line = { color: "#39424e", width: 1 };
    railGroups(m.leaf_rails).slice(1).forEach(function (g) {
      shapes.push({ type: "line", xref: "paper", x0: 0, x1: 1, yref: "y", y0: g[0] - 0.5, y1: g[0] - 0.5, line: line });
    });
    railGroups(m.spine_rails).slice(1).forEach(function (g) {
      shapes.push({ type: "line", yref: "paper", y0: 0, y1: 1, xref: "x", x0: g[0] - 0.5, x1: g[0] - 0.5, line: line });
    });
    return shapes;
  }

  function emptyFigure(text) {
    return { data: [], layout: { height: 240, xaxis: { visible: false }, yaxis: { visible: false },
      annotations: [{ text: text, showarrow: false, x: 0.5, y: 0.5, xref: "paper", yref: "paper", font: { size: 15 } }] } };
  }

  function buildMatrix() {
    var m = st.matrix, L = m.leaves.length, S = m.spines.length, i, j;
    st.row = new Map(m.leaves.map(function (n, k) { return [n, k]; }));
    st.col = new Map(m.spines.map(function (n, k) { return [n, k]; }));
    var axis = colourAxis(st.view);
    st.cz = new Array(L); st.cd = new Array(L); st.dirty = [];
    for (i = 0; i < L; i++) {
      st.cz[i] = new Array(S).fill(null); st.cd[i] = new Array(S).fill(null);
      for (j = 0; j < S; j++) {
        if (m.links[i][j] > 0) { st.cz[i][j] = toColour(m.z[i][j]); st.cd[i][j] = cellText(i, j); }
      }
    }
    var rowPx = Math.max(1, Math.min(30, 640 / Math.max(L, 1)));
    st.cellPx = rowPx;
    var longest = Math.max.apply(null, m.leaves.map(function (n) { return n.length; }).concat([6]));
    var trace = Object.assign({ type: "heatmap", z: st.cz, customdata: st.cd, hoverongaps: false,
                                hovertemplate: "%{customdata}<extra></extra>", xgap: S <= 64 ? 1 : 0,
                                ygap: L <= 64 ? 1 : 0 }, axis);
    drawLegend(m, st.view);
    return {
      data: [trace, markerTrace()],
      layout: {
        height: Math.max(Math.round(L * rowPx), 120) + 76,
        margin: { l: L <= TICK_LABELS_MAX ? longest * 6.5 + 16 : 64, r: 12, t: 12, b: 64 },
        uirevision: m.metric, xaxis: axisLayout(m.spines, m.spine_rails, true),
        yaxis: axisLayout(m.leaves, m.leaf_rails, false), shapes: separators(m),
        plot_bgcolor: "#ffffff", paper_bgcolor: "#ffffff", hoverlabel: { align: "left" }
      }
    };
  }

  /* Worst pairs by the metric, worst first; ties in matrix order (as the selector ranks them). */
  function worstFromMatrix() {
    var m = st.matrix, out = [];
    for (var i = 0; i < m.leaves.length; i++) {
      for (var j = 0; j < m.spines.length; j++) {
        var v = m.z[i][j];
        if (v !== null && v !== undefined && m.links[i][j] > 0) out.push([v, i, j]);
      }
    }
    out.sort(function (a, b) { return b[0] - a[0] || a[1] - b[1] || a[2] - b[2]; });
    return out.slice(0, WORST).map(function (w) {
      return { leaf: m.leaves[w[1]], spine: m.spines[w[2]], rail: m.leaf_rails[w[1]], value: w[0],
               links: m.links[w[1]][w[2]] };
    });
  }

  function stateBadge(state) {
    var style = st.styles[state] || {};
    return h("span", { className: "bw-link-state", "data-state": state }, [
      h("span", { className: "bw-line-swatch", style: { background: lineBackground(style) } }), state]);
  }

  function lineBackground(style) {
    if (!style.dash) return style.colour || NO_DATA;
    var on = style.dash[0], off = style.dash[1];
    return "repeating-linear-gradient(90deg, " + style.colour + " 0 " + on + "px, transparent " + on + "px " +
      (on + off) + "px)";
  }

  function worstList(worst) {
    if (!worst.length) return h("p", { className: "bw-empty" }, "No link has a current reading.");
    var m = st.matrix;
    var rows = worst.map(function (w, k) {
      var edge = st.pairEdge.get(w.leaf + SEP + w.spine);
      return h("tr", { key: w.leaf + SEP + w.spine }, [
        h("td", { className: "is-num" }, String(k + 1)),
        h("td", { className: "bw-pair", title: w.links + " cable" + (w.links === 1 ? "" : "s") }, [
          h("a", { href: searchUrl(w.leaf) }, w.leaf), " ↔ ", h("a", { href: searchUrl(w.spine) }, w.spine)]),
        h("td", { className: "is-num" }, w.rail === null || w.rail === undefined ? "—" : String(w.rail)),
        h("td", { className: "is-num" }, fmtValue(w.value, m.unit)),
        h("td", {}, edge ? stateBadge(edge.state) : "—")
      ]);
    });
    return h("table", { className: "bw-table bw-worst-table" }, [
      h("thead", {}, h("tr", {}, [h("th", {}, "#"), h("th", {}, "Leaf ↔ spine"), h("th", {}, "Rail"),
        h("th", { title: st.view.label + " (" + m.unit + ")" }, "Value"), h("th", {}, "Link state")])),
      h("tbody", {}, rows)
    ]);
  }

  function worstNote() {
    return "By " + st.view.label + " (" + st.matrix.unit + "), over the minute from " +
      st.matrix.rate_bucket.slice(11, 16) + " UTC. Names open search.";
  }

  /* --- The graph's details panel -------------------------------------------------------------- */

  function stateCounts() {
    var counts = {};
    st.edges.forEach(function (d) { counts[d.state] = (counts[d.state] || 0) + 1; });
    return Object.keys(STATE_RANK).filter(function (s) { return counts[s]; }).map(function (s) {
      var n = counts[s];
      var text = " " + n.toLocaleString("en") + " switch pair" + (n === 1 ? "" : "s");
      return h("li", { "data-state": s }, [stateBadge(s), text]);
    });
  }

  function linkRow(d, otherId) {
    var other = st.nodes.get(otherId) || { label: otherId, role: "" };
    return h("tr", { key: d.id }, [
      h("td", { title: other.role + " switch" }, other.label),
      h("td", {}, stateBadge(d.state)),
      h("td", { className: "is-num" }, fmtValue(d.util_pct, "%")),
      h("td", { className: "is-num" }, (d.links - d.links_down) + " / " + d.links),
      h("td", { className: "is-num" }, fmtNum(d.errors_per_s)),
      h("td", { className: "is-num" }, fmtNum(d.xmit_wait_per_s))
    ]);
  }

  function linkTable(rows) {
    return h("table", { className: "bw-table bw-links-table" }, [
      h("thead", {}, h("tr", {}, [h("th", {}, "Peer"), h("th", {}, "State"), h("th", {}, "Util."),
        h("th", { title: "cables up / cables" }, "Up"), h("th", { title: "errors per second, both ends" }, "Err/s"),
        h("th", { title: "PortXmitWait ticks per second, lower switch's uplinks" }, "Wait/s")])),
      h("tbody", {}, rows)
    ]);
  }

  function switchDetails(node) {
    var links = (st.adj.get(node.id) || []).map(function (d) { return [d, d.source === node.id ? d.target : d.source]; });
    links.sort(function (a, b) {
      return STATE_RANK[a[0].state] - STATE_RANK[b[0].state] || (b[0].util_pct || 0) - (a[0].util_pct || 0);
    });
    var shown = links.slice(0, DETAIL_LINKS_MAX);
    return [
      h("h3", {}, [node.label, " ", h("span", { className: "bw-muted" }, node.role + " switch")]),
      h("dl", { className: "bw-kv" }, [
        h("dt", {}, "Rail"), h("dd", {}, node.rail === null || node.rail === undefined ? "—" : String(node.rail)),
        h("dt", {}, "Rack"), h("dd", {}, node.rack || "—"),
        h("dt", {}, "Hosts cabled"), h("dd", {}, String(node.nodes || 0)),
        h("dt", {}, "Switch links"), h("dd", {}, String(links.length))
      ]),
      linkTable(shown.map(function (l) { return linkRow(l[0], l[1]); })),
      links.length > shown.length ? h("p", { className: "bw-muted bw-small" },
        "… and " + (links.length - shown.length) + " more, healthiest last.") : null,
      h("p", { className: "bw-small" }, h("a", { href: searchUrl(node.label) }, "Search for " + node.label))
    ];
  }

  function edgeDetails(d) {
    var a = st.nodes.get(d.source) || { label: d.source }, b = st.nodes.get(d.target) || { label: d.target };
    return [
      h("h3", {}, [a.label + " ↔ " + b.label]),
      h("p", {}, stateBadge(d.state)),
      h("dl", { className: "bw-kv" }, [
        h("dt", {}, "Utilization"), h("dd", {}, fmtValue(d.util_pct, "%")),
        h("dt", {}, "Cables up"), h("dd", {}, (d.links - d.links_down) + " of " + d.links),
        h("dt", {}, "Errors"), h("dd", {}, fmtValue(d.errors_per_s, "errors/s")),
        h("dt", {}, "PortXmitWait"), h("dd", {}, fmtValue(d.xmit_wait_per_s, "ticks/s"))
      ]),
      h("p", { className: "bw-small" }, [h("a", { href: searchUrl(a.label) }, a.label), " · ",
        h("a", { href: searchUrl(b.label) }, b.label)])
    ];
  }

  function focus(sel) {
    var cy = cyInstance();
    if (!cy) return;
    cy.batch(function () {
      cy.$(".bw-focus").removeClass("bw-focus");
      if (!sel) return;
      var ele = cy.getElementById(sel.id);
      if (!ele || ele.empty()) return;
      ele.addClass("bw-focus");
      if (sel.kind === "node") ele.connectedEdges().addClass("bw-focus");
    });
  }

  /* --- Live changes ------------------------------------------------------------------------- */

  function subscribe() {
    if (!st.ready.matrix || !st.ready.graph) return;
    if (!st.socket) {
      var root = document.getElementById("bw-fabric-page");
      st.socket = BW.live(root.dataset.liveUrl, {
        onOpen: function (api) { st.subscribed = st.metric; api.send({ subscribe: st.metric }); },
        onMessage: function (msg) {
          st.queue.push(msg);
          BW.setStore("fabric-live", { n: stats.applied + st.queue.length, at: msg._received });
        }
      });
    } else if (st.subscribed !== st.metric) {
      st.subscribed = st.metric;
      st.socket.send({ subscribe: st.metric });
    }
  }

  var EDGE_FIELDS = ["state", "util_pct", "links", "links_down", "errors_per_s", "xmit_wait_per_s"];

  /* Edges first, whatever the metric: a message for a metric the page has left still moves the graph. */
  function applyEdges(edges, touched) {
    var cy = cyInstance(), unknown = false, changed = 0;
    if (!edges || !edges.id) return { unknown: false, changed: 0 };
    var run = function () {
      for (var k = 0; k < edges.id.length; k++) {
        var d = st.edges.get(edges.id[k]);
        if (!d) { unknown = true; continue; }
        var patch = {}, any = false;
        EDGE_FIELDS.forEach(function (f) {
          if (f in edges && d[f] !== edges[f][k]) { patch[f] = edges[f][k]; any = true; }
        });
        if (!any) continue;
        Object.assign(d, patch);
        changed++;
        var pair = st.edgePair.get(d.id);
        if (pair && st.cz) {
          var parts = pair.split(SEP), i = st.row.get(parts[0]), j = st.col.get(parts[1]);
          if (i !== undefined && j !== undefined) markDirty(i, j);
        }
        touched.add(d.source); touched.add(d.target);
        var ele = cy && cy.getElementById(d.id);
        if (ele && !ele.empty()) ele.data(patch);
      }
      touched.forEach(function (id) {
        var n = cy && cy.getElementById(id);
        if (n && !n.empty()) n.toggleClass("bw-trouble", troubled(id));
      });
    };
    if (cy) cy.batch(run); else run();
    return { unknown: unknown, changed: changed };
  }

  function applyCells(cells) {
    var m = st.matrix, unknown = false, changed = 0;
    if (!cells || !cells.leaf) return { unknown: false, changed: 0 };
    for (var k = 0; k < cells.leaf.length; k++) {
      var i = st.row.get(cells.leaf[k]), j = st.col.get(cells.spine[k]);
      if (i === undefined || j === undefined || !(m.links[i][j] > 0)) { unknown = true; continue; }
      if (m.z[i][j] === cells.value[k]) continue;
      m.z[i][j] = cells.value[k];
      markDirty(i, j);
      changed++;
    }
    return { unknown: unknown, changed: changed };
  }

  /* Cells whose colour or tooltip must be redrawn: [i, j] pairs flattened; null for all. */
  function markDirty(i, j) { if (st.dirty) st.dirty.push(i, j); }

  function refreshCell(i, j) {
    if (st.matrix.links[i][j] > 0) { st.cz[i][j] = toColour(st.matrix.z[i][j]); st.cd[i][j] = cellText(i, j); }
  }

  /* Cells changed since the last pass (st.dirty, or null for every cell) are recoloured when a pass starts;
   * one restyle for both traces (undefined leaves an attribute of that trace as it is). */
  var restyle = BW.restyler(function () {
    var m = st.matrix, i, j, k;
    if (st.dirty === null) {
      for (i = 0; i < m.leaves.length; i++) for (j = 0; j < m.spines.length; j++) refreshCell(i, j);
    } else {
      for (k = 0; k < st.dirty.length; k += 2) refreshCell(st.dirty[k], st.dirty[k + 1]);
    }
    st.dirty = [];
    var mk = markerTrace();
    return [{
      z: [st.cz.slice(), undefined], customdata: [st.cd.slice(), undefined], x: [undefined, mk.x], y: [undefined, mk.y],
      text: [undefined, mk.text], "marker.symbol": [undefined, mk.marker.symbol],
      "marker.color": [undefined, mk.marker.color], "marker.line.color": [undefined, mk.marker.line.color]
    }, [0, 1]];
  });

  function redraw(all) {
    var gd = matrixDiv();
    if (!gd || !st.matrix || !st.cz) return;
    if (all) st.dirty = null;
    restyle(gd, function () { gd.dataset.applied = String(stats.applied); });
  }

  function applyOne(msg) {
    if (msg.type === "error") { window.dash_clientside.set_props("fabric-note", { children: msg.message }); return false; }
    if (msg.type !== "fabric") return false;
    var touched = new Set();
    var e = applyEdges(msg.edges, touched);
    var unknown = e.unknown || (msg.removed && msg.removed.length > 0);
    var c = { changed: 0, unknown: false };
    if (msg.metric === st.metric && st.ready.matrix) c = applyCells(msg.cells);
    if (unknown || c.unknown) window.dash_clientside.set_props("fabric-reload", { data: Date.now() });
    stats.applied += 1;
    stats.lastCells = c.changed;
    stats.lastEdges = e.changed;
    stats.lastApplyMs = performance.now() - (msg._received || performance.now());
    return c.changed > 0 || e.changed > 0;
  }

  /* --- Clientside callbacks ----------------------------------------------------------------- */

  var dc = (window.dash_clientside = window.dash_clientside || {});
  dc.breakwater = Object.assign(dc.breakwater || {}, {
    fabricMatrix: function (payload, graph) {
      var nu = window.dash_clientside.no_update;
      if (graph) indexGraph(graph);
      if (!payload) return [nu, nu, nu, nu];
      if (payload.matrix === st.matrix) {
        // Only the graph is new: its states change the markers and tooltips, not the figure.
        if (st.ready.matrix && st.matrix.leaves.length) redraw(true);
        return [nu, worstList(worstFromMatrix()), nu, nu];
      }
      var t0 = performance.now();
      st.matrix = payload.matrix; st.view = payload.view; st.metric = payload.matrix.metric;
      st.ready.matrix = false;
      var m = st.matrix;
      if (!m.leaves.length || !m.spines.length) {
        var box = document.getElementById("fabric-legend");
        if (box) box.innerHTML = "";
        matrixShown();
        stats.matrixRenderedAt = performance.now();
        subscribe();
        return [emptyFigure("No leaf or spine switches yet. They appear once a topology import names them."),
                h("p", { className: "bw-empty" }, "No links yet."), "", ""];
      }
      var figure = buildMatrix(), z = figure.data[0].z, builtWith = st.graph;
      stats.matrixBuildMs = performance.now() - t0;
      requestAnimationFrame(function wait() {
        var gd = matrixDiv();
        if (!gd || !gd.data || !gd.data.length || gd.data[0].z !== z) { requestAnimationFrame(wait); return; }
        requestAnimationFrame(function () {
          stats.matrixMs = performance.now() - t0;
          stats.matrixRenderedAt = performance.now();
          matrixShown();
          if (st.graph !== builtWith) redraw(true);  // the graph's states came in while it was drawn
          subscribe();
        });
      });
      var linked = m.links.reduce(function (n, row) { return n + row.filter(function (x) { return x > 0; }).length; }, 0);
      var note = m.leaves.length + " leaves × " + m.spines.length + " spines, " + linked.toLocaleString("en") +
        " cabled pairs; rates of the minute from " + m.rate_bucket.slice(11, 16) + " UTC";
      return [figure, worstList(m.worst), worstNote(), note];
    },

    fabricGraph: function (payload) {
      var nu = window.dash_clientside.no_update;
      if (!payload) return nu;
      var t0 = performance.now();
      indexGraph(payload);
      st.ready.graph = false;
      var elements = payload.elements.map(function (e) {
        if (e.data.source !== undefined || !e.data.role) return e;
        return Object.assign({}, e, { classes: troubled(e.data.id) ? "bw-trouble" : "" });
      });
      var want = elements.length;
      stats.graphElements = want;
      stats.graphBuildMs = performance.now() - t0;
      requestAnimationFrame(function wait() {
        var cy = cyInstance();
        if (!cy || cy.elements().length !== want) { requestAnimationFrame(wait); return; }
        stats.graphAddedMs = performance.now() - t0;
        // dash-cytoscape does not pass Cytoscape's textureOnViewport option on. With thousands of
        // edges a pan or zoom frame takes ~250 ms redrawing them all, ~50 ms from the cached
        // texture (measured at 16k GPUs); the full drawing follows once the view settles.
        if (cy.edges().length > TEXTURE_EDGES) cy.renderer().textureOnViewport = true;
        cy.fit(undefined, 24);
        cy.one("render", function () {
          stats.graphMs = performance.now() - t0;
          stats.graphRenderedAt = performance.now();
          st.ready.graph = true;
          subscribe();
        });
        cy.forceRender();
      });
      return elements;
    },

    fabricDetails: function (graph, tapNode, tapEdge) {
      if (graph) indexGraph(graph);
      var ctx = window.dash_clientside.callback_context;
      var trig = ctx && ctx.triggered && ctx.triggered.length ? ctx.triggered[0].prop_id : "";
      if (trig === "fabric-graph.tapNodeData" && tapNode && tapNode.role) st.selected = { kind: "node", id: tapNode.id };
      else if (trig === "fabric-graph.tapEdgeData" && tapEdge) st.selected = { kind: "edge", id: tapEdge.id };
      if (!st.graph) return window.dash_clientside.no_update;
      focus(st.selected);
      var sel = st.selected;
      if (sel && sel.kind === "node" && st.nodes.has(sel.id)) return switchDetails(st.nodes.get(sel.id));
      if (sel && sel.kind === "edge" && st.edges.has(sel.id)) return edgeDetails(st.edges.get(sel.id));
      if (!st.nodes.size) {
        return h("p", { className: "bw-empty" }, "No switches yet. They appear once a topology import names them.");
      }
      return [h("h3", {}, "Switch pairs by state"), h("ul", { className: "bw-state-counts" }, stateCounts()),
              h("p", { className: "bw-muted bw-small" }, "Click a switch for its links, or a line for that pair.")];
    },

    fabricApply: function () {
      var nu = window.dash_clientside.no_update;
      if (!st.queue.length) return nu;
      var batch = st.queue, any = false;
      st.queue = [];
      batch.forEach(function (msg) { if (applyOne(msg)) any = true; });
      if (any && st.ready.matrix && st.matrix && st.matrix.leaves.length) {
        redraw();
        window.dash_clientside.set_props("fabric-worst", { children: worstList(worstFromMatrix()) });
      }
      return stats.applied;
    }
  });
})();
