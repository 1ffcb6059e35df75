/* Facility pages: NVLink domains (/nvlink/) and power and cooling (/power/), kept live by /ws/facility/.
 *
 * NVLink. The Dash app `nvlink` loads the selector's domains as columns (dashboard/dash_apps/
 * facility.py `nvlink_payload`): a static part (domains; per GPU its domain, host, index, uuid)
 * named by a layout id, and per GPU its state and one array per counter. nvlinkRender lays the
 * domains out as blocks of cells, one cell per GPU, in one Plotly heatmap: domains in error
 * first (outlined), then OK, then no data, each group labelled with its count. The colour picker
 * only recolours (no server call); tooltips are built for the GPU under the pointer, so the
 * figure carries colour values only. Once drawn, the page subscribes with its layout id; the
 * consumer answers with every value once and then only what changed, by position, in parts
 * (daphne caps a websocket message at 1 MiB). Messages queue here and "nvlink-live" carries a
 * counter. Changed cells are patched and restyled in place; a domain that changes state moves
 * to its group, which redraws the figure; a new layout (GPUs added or moved) reloads the payload.
 * Once a metric's grid is on screen, the page's root (#bw-nvlink-page) says which: data-metric.
 *
 * Power. The Dash app `power` loads `power_overview` and `pue_series`; powerRender draws rack
 * draw against cap (bars grouped by hall row, a tick per cap, over-cap racks hatched, annotated
 * and listed in a callout), the row and hall totals, the cooling loops and PUE now. The consumer
 * sends changed racks, totals, loops and PUE; the page redraws from its merged state (a few
 * hundred racks: Plotly.react diffs it). The PUE chart reloads once a new rollup bucket is due.
 *
 * Cards and tables are HTML strings set into their boxes (`tag`, `fill`), not Dash components.
 * Colours: cividis for values, Okabe-Ito for categories; state is always also said in words.
 */
(function () {
  "use strict";
  var BW = (window.BW = window.BW || {});
  var NO_DATA = "#bdbdbd";
  var CIVIDIS = ["#00224e", "#123570", "#3b496c", "#575d6d", "#707173", "#8a8678", "#a59c74",
                 "#c3b369", "#e1cc55", "#fee838"];
  var VERMILLION = "#d55e00", ORANGE = "#e69f00", BLUE = "#0072b2", SKY = "#56b4e9", GREEN = "#009e73";
  var STATE_COLOUR = { errors: VERMILLION, ok: GREEN, "no data": "#8d99a6" };
  var STATE_WORDS = { errors: "In error", ok: "OK", "no data": "No data" };
  var BAND = 0.04;  // share of the colour axis for the "no data" band below the range

  /* --- Shared helpers ---------------------------------------------------------------------- */

  /* An HTML element as a string: attribute values are escaped here, `inner` is HTML already
   * (pass text through BW.esc). Tables and cards go into their boxes as HTML rather than as Dash
   * components: the Dash renderer walks every component a callback returns, and a few hundred
   * table cells cost it seconds. */
  function tag(name, attrs, inner) {
    var a = "";
    Object.keys(attrs || {}).forEach(function (k) {
      var v = attrs[k];
      if (v !== undefined && v !== null && v !== false && v !== "") a += " " + k + '="' + BW.esc(v) + '"';
    });
    return "<" + name + a + ">" + (Array.isArray(inner) ? inner.join("") : (inner === undefined ? "" : inner)) + "</" + name + ">";
  }

  /* Fill the box `id` with `markup`, only when it changed. */
  function fill(id, markup) {
    var box = document.getElementById(id);
    if (!box || box.dataset.markup === markup) return;
    if (BW.patch) BW.patch.morphInner(box, markup);  // in place: focus and scroll inside the box survive
    else box.innerHTML = markup;
    box.dataset.markup = markup;
  }

  /* A rate or value with at most 3 significant digits, or "—". */
  function num(v, unit) {
    if (v === null || v === undefined) return "—";
    var a = Math.abs(v), text;
    if (v === 0) text = "0";
    else if (a >= 1000) text = Math.round(v).toLocaleString("en");
    else if (a >= 1) text = String(Number(v.toPrecision(3)));
    else text = String(Number(v.toPrecision(2)));
    return text + (unit ? " " + unit : "");
  }

  function power(w) {
    if (w === null || w === undefined) return "—";
    if (Math.abs(w) >= 1e6) return (w / 1e6).toFixed(2) + " MW";
    return (w / 1e3).toFixed(1) + " kW";
  }

  function pct(p) { return p === null || p === undefined ? "—" : p.toFixed(p >= 99.5 && p < 100 ? 1 : 0) + " %"; }

  function plotTime(iso) { return iso.replace(/(Z|[+-]\d\d:\d\d)$/, ""); }  // UTC wall time for Plotly

  function utc(iso, seconds) {
    if (!iso) return "—";
    var s = new Date(iso).toISOString();
    return s.slice(0, 10) + " " + s.slice(11, seconds ? 19 : 16) + " UTC";
  }

  function triggered() {
    var ctx = window.dash_clientside.callback_context;
    return (ctx && ctx.triggered ? ctx.triggered : []).map(function (t) { return t.prop_id.split(".")[0]; });
  }

  function emptyFigure(text, height) {
    return { data: [], layout: { height: height || 160, xaxis: { visible: false }, yaxis: { visible: false },
      margin: { l: 10, r: 10, t: 10, b: 10 }, plot_bgcolor: "#ffffff", paper_bgcolor: "#ffffff",
      annotations: [{ text: text, showarrow: false, x: 0.5, y: 0.5, xref: "paper", yref: "paper",
                      font: { size: 14, color: "#5f6b78" } }] } };
  }

  function graphDiv(id) {
    var outer = document.getElementById(id);
    return outer && outer.querySelector(".js-plotly-plot");
  }

  function tile(key, state, count, label) {
    return tag("div", { "class": "bw-tile" + (count ? "" : " is-zero"), "data-tile": key,
                        style: "--tile-colour:" + (STATE_COLOUR[state] || "#5f6b78") }, [
      tag("div", { "class": "bw-tile-count" }, count.toLocaleString("en")),
      tag("div", { "class": "bw-tile-label" }, BW.esc(label))
    ]);
  }

  function gpuHref(uuid) { return "/gpus/" + encodeURIComponent(uuid) + "/"; }

  /* Open the page's websocket once; later calls re-send the subscription. */
  function subscribeOnce(holder, rootId, message) {
    if (!holder.socket) {
      var root = document.getElementById(rootId);
      holder.socket = BW.live(root.dataset.liveUrl, {
        onOpen: function (api) { api.send(message()); },
        onMessage: function (msg) {
          holder.pending.push(msg);
          BW.setStore(holder.store, { n: ++holder.received, at: msg._received });
        }
      });
    } else {
      holder.socket.send(message());
    }
  }

  /* ========================================================================================= */
  /* NVLink domains                                                                            */
  /* ========================================================================================= */

  var LOG_MIN = -3, LOG_MAX = 1;  // error rates on a log scale: 0.001/s .. 10/s
  var MAX_COLUMNS = 143;  // cells across at most: 16 blocks of 8 GPUs with a blank column between
  var MAX_OUTLINES = 150;  // outlined domains in error (Plotly redraws shapes on every restyle)
  var MAX_BLOCK_LABELS = 48;  // name each block while there are this few

  var METRICS = {
    errors_per_s: { label: "NVLink errors, all kinds", unit: "errors/s", log: true,
                    value: function (v, i) { return v.errors_per_s[i]; } },
    crc: { label: "CRC errors (flit + data)", unit: "errors/s", log: true,
           value: function (v, i) { return sum2(v.nvlink_crc_flit_errors[i], v.nvlink_crc_data_errors[i], 1); } },
    nvlink_replay_errors: { label: "Replays", unit: "errors/s", log: true,
                            value: function (v, i) { return v.nvlink_replay_errors[i]; } },
    nvlink_recovery_errors: { label: "Recoveries", unit: "errors/s", log: true,
                              value: function (v, i) { return v.nvlink_recovery_errors[i]; } },
    throughput: { label: "Throughput, TX + RX", unit: "GB/s", log: false,
                  value: function (v, i) { return sum2(v.nvlink_tx_bps[i], v.nvlink_rx_bps[i], 1e-9); } },
    nvlink_bandwidth: { label: "Bandwidth counter", unit: "counts/s", log: false,
                        value: function (v, i) { return v.nvlink_bandwidth[i]; } }
  };

  function sum2(a, b, scale) {
    if ((a === null || a === undefined) && (b === null || b === undefined)) return null;
    return ((a || 0) + (b || 0)) * scale;
  }

  var nv = { payload: null, cols: null, metric: "errors_per_s", groups: null, pos: null, cell: null,
             z: null, tipGpu: -1, W: 0, H: 0, axis: null, socket: null, pending: [], received: 0, store: "nvlink-live",
             ready: false, clickBound: false };
  var nvStats = (BW.nvlinkStats = { renderedAt: null, payloadAt: null, builtAt: null, builds: 0, messages: 0, applied: 0,
                                     lastCells: 0, lastApplyMs: null });

  /* The value columns by field name (views on the payload's arrays, so patches land in both). */
  function columns(p) {
    var cols = {};
    p.fields.forEach(function (f, k) { cols[f] = p.gpus.v[k]; });
    return cols;
  }

  function domainValue(d, field) { return d.v[nv.payload.fields.indexOf(field)]; }

  /* Domains with GPUs in drawn order: in error, OK, no data; by name within a group (a domain
   * moves only when its state changes). Declared domains without GPUs are only counted. */
  function groups(p) {
    var out = { errors: [], ok: [], "no data": [], empty: 0 }, counts = new Array(p.domains.length).fill(0);
    p.static.domain.forEach(function (d) { counts[d] += 1; });
    p.domains.forEach(function (d, i) {
      if (!counts[i]) { out.empty += 1; return; }
      out[d.state].push(i);
    });
    var name = function (i) { return p.static.domains[i].name; };
    ["errors", "ok", "no data"].forEach(function (s) {
      out[s].sort(function (a, b) { return name(a) < name(b) ? -1 : name(a) > name(b) ? 1 : 0; });
    });
    out.counts = counts;
    return out;
  }

  function sameOrder(a, b) {
    if (!a || !b) return false;
    return ["errors", "ok", "no data"].every(function (s) {
      return a[s].length === b[s].length && a[s].every(function (v, i) { return v === b[s][i]; });
    });
  }

  /* Cells: each domain a block `slot` GPUs wide, blocks in lines, a labelled band per group. */
  function place(p, g, cellPx) {
    var members = p.domains.map(function () { return []; });
    p.static.domain.forEach(function (d, i) { members[d].push(i); });
    var maxN = 1;
    g.counts.forEach(function (n) { if (n > maxN) maxN = n; });
    var slot = Math.min(8, maxN);
    var perLine = Math.max(1, Math.floor((MAX_COLUMNS + 1) / (slot + 1)));
    var biggest = Math.max(g.errors.length, g.ok.length, g["no data"].length, 1);
    var blocksAcross = Math.min(perLine, biggest);
    var W = blocksAcross * (slot + 1) - 1;
    var px = cellPx(W);
    var labelRows = Math.max(1, Math.ceil(18 / px));
    var blockLabels = g.errors.length + g.ok.length + g["no data"].length <= MAX_BLOCK_LABELS;
    var y = 0, pos = new Array(p.static.uuid.length), blocks = [], bands = [];
    ["errors", "ok", "no data"].forEach(function (state) {
      var list = g[state];
      if (!list.length) return;
      bands.push({ state: state, y: y, count: list.length });
      y += labelRows;
      for (var start = 0; start < list.length; start += blocksAcross) {
        var line = list.slice(start, start + blocksAcross), lineH = 1;
        if (blockLabels) y += labelRows;
        line.forEach(function (d, k) {
          var n = members[d].length, rows = Math.ceil(n / slot), x0 = k * (slot + 1);
          lineH = Math.max(lineH, rows);
          blocks.push({ domain: d, x0: x0, y0: y, w: Math.min(n, slot), h: rows, state: state });
          members[d].forEach(function (gpu, j) { pos[gpu] = [y + Math.floor(j / slot), x0 + (j % slot)]; });
        });
        y += lineH + 1;
      }
    });
    return { W: Math.max(W, 1), H: Math.max(y - 1, 1), pos: pos, blocks: blocks, bands: bands, px: px,
             labelRows: labelRows, blockLabels: blockLabels };
  }

  /* The colour axis: the metric's range (log10 for error rates) with a grey band below it. */
  function colourAxis(metric) {
    var m = METRICS[metric], lo, hi, ticks;
    if (m.log) {
      lo = LOG_MIN; hi = LOG_MAX;
      ticks = ["0", "0.01", "0.1", "1", "10+"];
    } else {
      var top = 0, v = nv.cols, n = nv.payload.static.uuid.length;
      for (var i = 0; i < n; i++) { var x = m.value(v, i); if (x !== null && x > top) top = x; }
      hi = top > 0 ? Number(top.toPrecision(2)) : 1;
      if (hi < top) hi = Number((hi * 1.1).toPrecision(2));
      lo = 0;
      ticks = ["0", num(hi / 2), num(hi) + "+"];
    }
    var band = (hi - lo) * BAND / (1 - BAND), stops = [[0, NO_DATA], [BAND * 0.95, NO_DATA]];
    CIVIDIS.forEach(function (c, i) { stops.push([BAND + (1 - BAND) * i / (CIVIDIS.length - 1), c]); });
    stops[stops.length - 1][0] = 1;
    return { lo: lo, hi: hi, noData: lo - band / 2, zmin: lo - band, zmax: hi, stops: stops, ticks: ticks, log: m.log };
  }

  function colourValue(axis, v) {
    if (v === null || v === undefined) return axis.noData;
    if (axis.log) return v <= 0 ? LOG_MIN : Math.min(LOG_MAX, Math.max(LOG_MIN, Math.log10(v)));
    return Math.min(axis.hi, Math.max(axis.lo, v));
  }

  function drawLegend(metric, axis) {
    var box = document.getElementById("nvlink-legend");
    if (!box) return;
    var m = METRICS[metric];
    var grad = CIVIDIS.map(function (c, i) { return c + " " + (100 * i / (CIVIDIS.length - 1)).toFixed(1) + "%"; });
    box.innerHTML = '<span class="bw-legend-title">' + BW.esc(m.label + " (" + m.unit + (m.log ? ", log scale" : "") + ")") +
      '</span><span class="bw-legend-scale"><span class="bw-gradient" style="background:linear-gradient(to right,' +
      grad.join(",") + ')"></span><span class="bw-legend-ticks">' +
      axis.ticks.map(function (t) { return "<span>" + BW.esc(t) + "</span>"; }).join("") + "</span></span>" +
      '<span class="bw-legend-item"><span class="bw-swatch" style="background:' + NO_DATA + '"></span>no data</span>' +
      '<span class="bw-legend-item"><span class="bw-swatch bw-swatch-outline"></span>domain in error (outlined)</span>';
  }

  function gpuLines(i) {
    var v = nv.cols, state = nv.payload.states[nv.payload.gpus.state[i]];
    if (state === "no data") return "<br>State: <b>No data</b> (no NVLink readings in the rate's minute)";
    var e = function (f) { return num(v[f][i], "errors/s"); };
    return "<br>State: <b>" + STATE_WORDS[state] + "</b>" +
      "<br>CRC flit " + e("nvlink_crc_flit_errors") + " · CRC data " + e("nvlink_crc_data_errors") +
      "<br>Replays " + e("nvlink_replay_errors") + " · Recoveries " + e("nvlink_recovery_errors") +
      "<br>Bandwidth counter " + num(v.nvlink_bandwidth[i], "counts/s") +
      "<br>TX " + num(v.nvlink_tx_bps[i] === null ? null : v.nvlink_tx_bps[i] / 1e9, "GB/s") +
      " · RX " + num(v.nvlink_rx_bps[i] === null ? null : v.nvlink_rx_bps[i] / 1e9, "GB/s");
  }

  function gpuText(i) {
    var s = nv.payload.static, d = s.domains[s.domain[i]];
    return "<b>" + BW.esc(s.hosts[s.host[i]]) + " · GPU " + s.index[i] + "</b><br>" + BW.esc(s.uuid[i]) +
      "<br>Domain <b>" + BW.esc(d.name) + "</b> (" + d.kind + (d.implicit ? ", from its node" : "") +
      (d.rack ? " · rack " + BW.esc(d.rack) : "") + ")";
  }

  function cellPx(W) {
    var gd = document.getElementById("nvlink-grid"), width = (gd && gd.offsetWidth) || 1100;
    return Math.max(6, Math.min(26, Math.floor((width - 20) / W)));
  }

  function bandLabel(b) {
    var gpus = 0;
    nv.groups[b.state].forEach(function (d) { gpus += nv.payload.domains[d].gpus_with_errors; });
    return "<b>" + STATE_WORDS[b.state] + "</b> · " + b.count.toLocaleString("en") + " domain" + (b.count === 1 ? "" : "s") +
      (b.state === "errors" ? " · " + gpus.toLocaleString("en") + " GPU" + (gpus === 1 ? "" : "s") + " with errors" : "");
  }

  function buildFigure() {
    var p = nv.payload, n = p.static.uuid.length;
    nv.groups = groups(p);
    var L = place(p, nv.groups, cellPx);
    var axis = (nv.axis = colourAxis(nv.metric)), m = METRICS[nv.metric];
    var W = L.W, H = L.H, z = new Array(H), y;
    for (y = 0; y < H; y++) z[y] = new Array(W).fill(null);
    var cell = new Int32Array(W * H).fill(-1);
    for (var i = 0; i < n; i++) {
      var at = L.pos[i];
      if (!at) continue;
      z[at[0]][at[1]] = colourValue(axis, m.value(nv.cols, i));
      cell[at[0] * W + at[1]] = i;
    }
    Object.assign(nv, { z: z, pos: L.pos, cell: cell, W: W, H: H });
    var shapes = [], notes = [];
    L.blocks.forEach(function (b) {
      if (b.state === "errors" && shapes.length < MAX_OUTLINES) {
        shapes.push({ type: "rect", xref: "x", yref: "y", x0: b.x0 - 0.5, x1: b.x0 + b.w - 0.5, y0: b.y0 - 0.5,
                      y1: b.y0 + b.h - 0.5, line: { color: VERMILLION, width: 2.5 } });
      }
      if (L.blockLabels) {
        notes.push({ x: b.x0 - 0.5, y: b.y0 - 0.5, xref: "x", yref: "y", xanchor: "left", yanchor: "bottom",
                     text: BW.esc(p.static.domains[b.domain].name), showarrow: false, font: { size: 11, color: "#39424e" } });
      }
    });
    L.bands.forEach(function (b) {
      notes.push({ x: -0.5, y: b.y + L.labelRows / 2 - 0.5, xref: "x", yref: "y", xanchor: "left", yanchor: "middle",
                   text: bandLabel(b), showarrow: false, font: { size: 13, color: b.state === "errors" ? "#8b1c1c" : "#1c2530" } });
    });
    drawLegend(nv.metric, axis);
    nvStats.builds += 1;
    return {
      // No text or customdata: 16k tooltips are built on hover (showTip), which keeps the
      // build, the first plot and every restyle to the colour values alone.
      data: [{ type: "heatmap", z: z, zmin: axis.zmin, zmax: axis.zmax, colorscale: axis.stops, showscale: false,
               hoverongaps: false, hoverinfo: "none", xgap: L.px >= 10 ? 1 : 0, ygap: L.px >= 10 ? 1 : 0 }],
      layout: {
        height: Math.round(H * L.px) + 16, margin: { l: 8, r: 8, t: 8, b: 8 }, uirevision: p.layout,
        xaxis: { visible: false, range: [-0.5, W - 0.5], scaleanchor: "y", scaleratio: 1, constrain: "domain", fixedrange: true },
        yaxis: { visible: false, range: [H - 0.5, -0.5], fixedrange: false },
        shapes: shapes, annotations: notes, plot_bgcolor: "#ffffff", paper_bgcolor: "#ffffff", hoverlabel: { align: "left" }
      }
    };
  }

  /* --- Summary and the list of domains in error -------------------------------------------- */

  function nvSummary() {
    var p = nv.payload, b = p.by_state, gpusWithErrors = 0;
    p.domains.forEach(function (d) { gpusWithErrors += d.gpus_with_errors; });
    return tile("errors", "errors", b.errors, "domains in error") + tile("ok", "ok", b.ok, "domains OK") +
      tile("no-data", "no data", b["no data"], "domains with no data") +
      tile("gpus-with-errors", gpusWithErrors ? "errors" : "ok", gpusWithErrors, "GPUs with NVLink errors");
  }

  var ERROR_ROWS = 25;

  function worstGpu(d) {
    var best = -1, top = -1, s = nv.payload.static, v = nv.cols.errors_per_s;
    for (var i = 0; i < s.domain.length; i++) {
      if (s.domain[i] === d && v[i] !== null && v[i] > top) { top = v[i]; best = i; }
    }
    return best;
  }

  function nvErrors() {
    var p = nv.payload, list = nv.groups ? nv.groups.errors.slice() : [];
    if (!list.length) {
      return tag("p", { "class": "bw-muted" }, BW.esc(p.static.uuid.length
        ? "No NVLink domain has errors: no recovery and fewer than 10 CRC and replay errors a minute on every GPU."
        : "No GPUs yet. They appear here as soon as telemetry or a topology import names them."));
    }
    var rate = function (d) { return domainValue(d, "errors_per_s") || 0; };
    list.sort(function (a, b) { return rate(p.domains[b]) - rate(p.domains[a]); });
    var e = function (d, f) { return BW.esc(num(domainValue(d, f), "/s")); };
    var num2 = function (v) { return tag("td", { "class": "is-num" }, v); };
    var rows = list.slice(0, ERROR_ROWS).map(function (di) {
      var d = p.domains[di], sd = p.static.domains[di], w = worstGpu(di), s = p.static;
      var crc = sum2(domainValue(d, "nvlink_crc_flit_errors"), domainValue(d, "nvlink_crc_data_errors"), 1);
      return tag("tr", { "data-domain": sd.name, "class": "bw-error-row" }, [
        tag("td", {}, tag("span", { "class": "bw-badge bw-badge-error" }, "errors") + " " + tag("b", {}, BW.esc(sd.name))),
        tag("td", {}, BW.esc(sd.kind + (sd.rack ? " · " + sd.rack : ""))),
        num2(d.gpus_with_errors + " of " + d.gpus), num2(e(d, "errors_per_s")), num2(BW.esc(num(crc, "/s"))),
        num2(e(d, "nvlink_replay_errors")), num2(e(d, "nvlink_recovery_errors")),
        tag("td", {}, w < 0 ? "—" : tag("a", { href: gpuHref(s.uuid[w]), title: s.uuid[w] },
                                       BW.esc(s.hosts[s.host[w]] + " · GPU " + s.index[w])))
      ]);
    });
    var head = ["Domain", "Kind", "GPUs with errors", "All errors", "CRC", "Replays", "Recoveries", "Worst GPU"];
    return tag("table", { "class": "bw-table bw-nvlink-errors" }, [
      tag("thead", {}, tag("tr", {}, head.map(function (c, i) {
        return tag("th", { scope: "col", "class": i >= 2 && i <= 6 ? "is-num" : "" }, BW.esc(c));
      }))),
      tag("tbody", {}, rows)
    ]) + (list.length > ERROR_ROWS ? tag("p", { "class": "bw-muted bw-small" }, "and " + (list.length - ERROR_ROWS) +
      " more domains in error, outlined at the top of the grid.") : "");
  }

  function nvPanels() {
    fill("nvlink-summary", nvSummary());
    fill("nvlink-errors", nvErrors());
  }

  function nvNote() {
    var p = nv.payload, g = nv.groups, parts = [p.static.uuid.length.toLocaleString("en") + " GPUs in " +
      (p.domains.length - g.empty).toLocaleString("en") + " domains"];
    if (g.empty) parts.push(g.empty + " declared domain" + (g.empty === 1 ? "" : "s") + " without GPUs");
    parts.push("rates as of " + utc(p.generated_at, true));
    return parts.join(" · ");
  }

  /* --- Live: patch cells in place, one restyle at a time ----------------------------------- */

  var restyle = BW.restyler(function () { return [{ z: [nv.z.slice()] }, [0]]; });

  function patch(i) {
    var at = nv.pos[i];
    if (!at) return;
    nv.z[at[0]][at[1]] = colourValue(nv.axis, METRICS[nv.metric].value(nv.cols, i));
    if (nv.tipGpu === i) showTip(i);
  }

  /* Applies one message (see dashboard/consumers/facility.py) to the payload; returns "rebuild",
   * "patched" (with the changed GPUs' positions added to `changed`) or "" when it was not ours. */
  function nvApply(msg, changed) {
    var p = nv.payload;
    if (msg.type !== "nvlink") return "";
    if (msg.reload) {
      if (msg.layout !== p.layout) window.dash_clientside.set_props("nvlink-reload", { data: Date.now() });
      return "";
    }
    if (msg.layout !== p.layout) return "";
    var j, k;
    if (msg.full) {
      for (j = 0; j < msg.state.length; j++) {
        var i = msg.offset + j, differs = msg.state[j] !== p.gpus.state[i];
        p.gpus.state[i] = msg.state[j];
        for (k = 0; k < p.fields.length; k++) {
          if (msg.v[k][j] !== p.gpus.v[k][i]) { differs = true; p.gpus.v[k][i] = msg.v[k][j]; }
        }
        if (differs) changed.add(i);
      }
    } else {
      Object.keys(msg.gpus).forEach(function (name) {
        var pos = msg.gpus[name][0], values = msg.gpus[name][1];
        var col = name === "state" ? p.gpus.state : p.gpus.v[p.fields.indexOf(name)];
        if (!col) return;
        for (j = 0; j < pos.length; j++) { col[pos[j]] = values[j]; changed.add(pos[j]); }
      });
    }
    if (Array.isArray(msg.domains)) p.domains = msg.domains;
    else if (msg.domains) Object.keys(msg.domains).forEach(function (key) { p.domains[Number(key)] = msg.domains[key]; });
    if (msg.by_state) p.by_state = msg.by_state;
    if (msg.generated_at) p.generated_at = msg.generated_at;
    if (!sameOrder(groups(p), nv.groups)) return "rebuild";
    // A linear scale follows the largest value: a new maximum rescales every cell.
    if (!METRICS[nv.metric].log && changed.size && colourAxis(nv.metric).hi !== nv.axis.hi) return "rebuild";
    return "patched";
  }

  function nvSubscription() {
    nv.subscribed = nv.payload.layout;
    return { subscribe: "nvlink", layout: nv.payload.layout };
  }

  /* After the graph holds `z` and the browser painted it: bind clicks, then (first time) subscribe. */
  function whenDrawn(z, then) {
    requestAnimationFrame(function wait() {
      var gd = graphDiv("nvlink-grid");
      if (!gd || !gd.data || !gd.data.length || gd.data[0].z !== z) { requestAnimationFrame(wait); return; }
      requestAnimationFrame(function () { then(gd); });
    });
  }

  function gpuAt(pt) {
    if (!pt || !pt.pointIndex) return -1;
    return nv.cell[pt.pointIndex[0] * nv.W + pt.pointIndex[1]];
  }

  /* The tooltip: an HTML box beside the pointer, filled for the one GPU under it. */
  function showTip(i, ev) {
    var box = document.getElementById("nvlink-tip");
    if (!box) {
      box = document.createElement("div");
      box.id = "nvlink-tip";
      box.className = "bw-tip";
      box.setAttribute("role", "tooltip");
      document.body.appendChild(box);
    }
    box.innerHTML = gpuText(i) + gpuLines(i);
    box.hidden = false;
    nv.tipGpu = i;
    if (ev) {
      var left = ev.clientX + 14, top = ev.clientY + 14, w = box.offsetWidth, h = box.offsetHeight;
      if (left + w > window.innerWidth - 8) left = ev.clientX - w - 14;
      if (top + h > window.innerHeight - 8) top = ev.clientY - h - 14;
      box.style.left = (left + window.scrollX) + "px";
      box.style.top = (top + window.scrollY) + "px";
    }
  }

  function hideTip() {
    var box = document.getElementById("nvlink-tip");
    if (box) box.hidden = true;
    nv.tipGpu = -1;
  }

  function bindClick(gd) {
    if (nv.clickBound || !gd.on) return;
    nv.clickBound = true;
    gd.on("plotly_hover", function (ev) {
      var i = gpuAt(ev.points && ev.points[0]);
      if (i >= 0) showTip(i, ev.event); else hideTip();
    });
    gd.on("plotly_unhover", hideTip);
    gd.on("plotly_click", function (ev) {
      var i = gpuAt(ev.points && ev.points[0]);
      if (i >= 0) location.assign(gpuHref(nv.payload.static.uuid[i]));
    });
  }

  function nvRendered(fig) {
    var first = !nv.ready, metric = nv.metric;
    var done = function (gd) {
      if (gd) bindClick(gd);
      nv.ready = true;
      document.getElementById("bw-nvlink-page").dataset.metric = metric;
      // First draw, or a reload for a new layout: (re)subscribe with the layout now drawn.
      if (first || nv.subscribed !== nv.payload.layout) subscribeOnce(nv, "bw-nvlink-page", nvSubscription);
      if (nvStats.renderedAt === null) nvStats.renderedAt = performance.now();
    };
    if (!fig.data.length) requestAnimationFrame(function () { done(null); });
    else whenDrawn(fig.data[0].z, done);
  }

  function nvFigure() {
    if (!nv.payload.static.uuid.length) {
      nv.groups = groups(nv.payload);
      var box = document.getElementById("nvlink-legend");
      if (box) box.innerHTML = "";
      return emptyFigure("No GPUs yet. They appear here as soon as telemetry or a topology import names them.", 200);
    }
    var fig = buildFigure();
    if (nvStats.builtAt === null) nvStats.builtAt = performance.now();
    return fig;
  }

  /* ========================================================================================= */
  /* Power and cooling                                                                         */
  /* ========================================================================================= */

  var NEAR_CAP_PCT = 90;
  var RACK_NAMES_MAX = 48;  // rack names on the axis while they fit; row labels above
  var OVER_NOTES_MAX = 12;
  var CATEGORIES = [
    ["ok", "Within cap", BLUE], ["near", "≥ 90 % of cap", ORANGE], ["over", "Over cap", VERMILLION],
    ["nocap", "No cap set", SKY]
  ];

  var pw = { data: null, series: null, socket: null, pending: [], received: 0, store: "power-live", ready: false,
             seriesAt: 0, reloadAsked: 0 };
  var pwStats = (BW.powerStats = { renderedAt: null, payloadAt: null, builtAt: null, applied: 0, lastRacks: 0 });

  function category(r) {
    if (r.draw_w === null) return "nodata";
    if (!r.cap_w) return "nocap";
    if (r.pct_of_cap > 100) return "over";
    return r.pct_of_cap >= NEAR_CAP_PCT ? "near" : "ok";
  }

  var SOURCE_WORDS = { pdu: "PDUs", power_shelf: "power shelf", gpus: "GPUs only (reads low)" };

  function rackTip(r) {
    var c = category(r);
    return "<b>" + BW.esc(r.name) + "</b> · " + BW.esc(r.hall) + " · row " + BW.esc(r.row) +
      "<br>Draw <b>" + power(r.draw_w) + "</b>" + (r.cap_w ? " of " + power(r.cap_w) + " cap (" + pct(r.pct_of_cap) + ")" : ", no cap set") +
      (c === "over" ? "<br><b>OVER CAP</b> by " + power(r.draw_w - r.cap_w) : "") +
      "<br>Source: " + (r.source ? SOURCE_WORDS[r.source] : "no reading") +
      "<br>PDUs reporting " + r.pdus_reporting + " of " + r.pdus + " · GPUs reporting " + r.gpus_reporting + " of " + r.gpus;
  }

  function overCap() {
    return pw.data.racks.filter(function (r) { return category(r) === "over"; })
      .sort(function (a, b) { return b.pct_of_cap - a.pct_of_cap; });
  }

  function racksFigure() {
    var racks = pw.data.racks;
    if (!racks.length) return emptyFigure("No racks yet. They appear here once a topology import places them.", 200);
    var x = 0, prev = null, rows = [], xs = [];
    racks.forEach(function (r) {
      var key = r.site + "\u0000" + r.hall + "\u0000" + r.row;
      if (prev !== null && key !== prev) x += 1;
      if (key !== prev) rows.push({ label: r.hall + " · " + r.row, x0: x, x1: x });
      rows[rows.length - 1].x1 = x;
      xs.push(x++);
      prev = key;
    });
    var data = [];
    CATEGORIES.forEach(function (c) {
      var idx = racks.map(function (r, i) { return category(r) === c[0] ? i : -1; }).filter(function (i) { return i >= 0; });
      if (!idx.length) return;
      data.push({ type: "bar", name: c[1], x: idx.map(function (i) { return xs[i]; }),
                  y: idx.map(function (i) { return racks[i].draw_w / 1e3; }),
                  customdata: idx.map(function (i) { return rackTip(racks[i]); }), width: 0.8,
                  marker: { color: c[2], line: { color: c[0] === "over" ? "#7a2e00" : c[2], width: c[0] === "over" ? 1.5 : 0 },
                            pattern: c[0] === "over" ? { shape: "/", fillmode: "overlay", fgcolor: "#ffffff", fgopacity: 0.7,
                                                          size: 8, solidity: 0.25 } : undefined },
                  hovertemplate: "%{customdata}<extra></extra>" });
    });
    var missing = racks.map(function (r, i) { return r.draw_w === null ? i : -1; }).filter(function (i) { return i >= 0; });
    if (missing.length) {
      data.push({ type: "scatter", mode: "markers", name: "No reading", x: missing.map(function (i) { return xs[i]; }),
                  y: missing.map(function () { return 0; }), customdata: missing.map(function (i) { return rackTip(racks[i]); }),
                  marker: { symbol: "x-thin-open", size: 9, color: "#5f6b78", line: { width: 2 } },
                  hovertemplate: "%{customdata}<extra></extra>" });
    }
    var capped = racks.map(function (r, i) { return r.cap_w ? i : -1; }).filter(function (i) { return i >= 0; });
    var gd = document.getElementById("power-racks"), width = (gd && gd.offsetWidth) || 1100;
    var barPx = Math.max(4, Math.min(40, (width - 90) / Math.max(x, 1) * 0.8));
    if (capped.length) {
      data.push({ type: "scatter", mode: "markers", name: "Cap", x: capped.map(function (i) { return xs[i]; }),
                  y: capped.map(function (i) { return racks[i].cap_w / 1e3; }),
                  customdata: capped.map(function (i) { return BW.esc(racks[i].name) + " cap " + power(racks[i].cap_w); }),
                  marker: { symbol: "line-ew-open", size: barPx, color: "#000000", line: { width: 3, color: "#000000" } },
                  hovertemplate: "%{customdata}<extra></extra>" });
    }
    var named = racks.length <= RACK_NAMES_MAX;
    var notes = named ? rows.map(function (row) {
      return { x: (row.x0 + row.x1) / 2, y: 1, xref: "x", yref: "paper", yanchor: "bottom", showarrow: false,
               text: "<b>" + BW.esc(row.label) + "</b>", font: { size: 12, color: "#39424e" } };
    }) : [];
    overCap().slice(0, OVER_NOTES_MAX).forEach(function (r) {
      var i = racks.indexOf(r);
      notes.push({ x: xs[i], y: Math.max(r.draw_w, r.cap_w) / 1e3, xref: "x", yref: "y", text: "<b>over cap</b>",
                   showarrow: true, arrowhead: 2, ax: 0, ay: -26, font: { color: "#8b1c1c", size: 11 },
                   arrowcolor: VERMILLION, bgcolor: "#ffffff" });
    });
    return { data: data, layout: {
      height: 380, margin: { l: 60, r: 10, t: named ? 40 : 16, b: named ? 70 : 90 }, barmode: "overlay", bargap: 0.2,
      hovermode: "closest", uirevision: "racks",
      xaxis: named ? { tickvals: xs, ticktext: racks.map(function (r) { return r.name; }), tickangle: racks.length > 12 ? -45 : 0,
                       range: [-0.7, x - 0.3], showgrid: false }
                   : { tickvals: rows.map(function (r) { return (r.x0 + r.x1) / 2; }), ticktext: rows.map(function (r) { return r.label; }),
                       tickangle: -60, tickfont: { size: 10 }, range: [-0.7, x - 0.3], showgrid: false },
      yaxis: { title: { text: "Draw (kW)" }, rangemode: "tozero", gridcolor: "#eef1f4" },
      annotations: notes, showlegend: true,
      legend: { orientation: "h", x: 0, xanchor: "left", y: -0.02, yref: "container", yanchor: "bottom" },
      plot_bgcolor: "#ffffff", paper_bgcolor: "#ffffff", hoverlabel: { align: "left" }
    } };
  }

  function card(kind, title, big, small, lines, share) {
    var inner = tag("h2", {}, BW.esc(title)) + tag("p", { "class": "bw-big" }, BW.esc(big) + (small ? " " + tag("small", {}, BW.esc(small)) : ""));
    if (share !== undefined) {
      inner += tag("div", { "class": "bw-bar" }, tag("div", { "class": "bw-bar-fill" + (share > 100 ? " is-over" : ""),
        style: "width:" + (share === null ? "0" : Math.min(100, share).toFixed(1) + "%") }));
    }
    lines.forEach(function (l) { inner += tag("p", { "class": "bw-bar-label" }, BW.esc(l)); });
    return tag("div", { "class": "bw-card", "data-card": kind }, inner);
  }

  function powerSummary() {
    var d = pw.data, t = d.total, over = overCap(), near = d.racks.filter(function (r) { return category(r) === "near"; }).length;
    var loops = d.cooling_loops, live = loops.filter(function (l) { return !l.stale; });
    var warm = null;
    live.forEach(function (l) { if (l.return_c !== null && (warm === null || l.return_c > warm.return_c)) warm = l; });
    return [
      card("total", "Total draw", power(t.draw_w), "",
           [(t.pct_of_cap === null ? "No share of cap: no rack has both a draw and a cap"
                                   : pct(t.pct_of_cap) + " of cap, over the racks with both"),
            "Caps " + power(t.cap_w) + " · " + t.racks_reporting + " of " + t.racks + " racks reporting"], t.pct_of_cap),
      card("pue", "PUE now", d.pue === null ? "—" : d.pue.toFixed(2), d.pue === null ? "" : "facility ÷ IT",
           d.pue === null ? ["No complete meter: PUE needs a facility power reading and a draw for every rack it covers."]
                          : ["Facility " + power(d.facility_w) + " · IT " + power(d.it_w),
                             "from " + d.pue_devices + " of " + d.pue_devices_reporting + " meters reporting"]),
      card("overcap", "Racks over cap", String(over.length), over.length ? "over" : "",
           [near + " more at ≥ " + NEAR_CAP_PCT + " % of cap"]),
      card("cooling", "Cooling loops", String(loops.length), loops.length ? (live.length + " reporting") : "",
           [warm ? "Warmest return " + num(warm.return_c, "°C") + " (" + warm.name + ")" : "No fresh loop readings"])
    ].join("");
  }

  function overcapCallout() {
    var over = overCap();
    if (!over.length) return "";
    var items = over.slice(0, 20).map(function (r) {
      return tag("li", { "data-rack": r.name }, tag("b", {}, BW.esc(r.name)) + BW.esc(" (" + r.hall + " · row " + r.row + "): " +
        power(r.draw_w) + " of " + power(r.cap_w) + " cap, " + pct(r.pct_of_cap) + ", " + power(r.draw_w - r.cap_w) +
        " over · from " + (SOURCE_WORDS[r.source] || "—")));
    });
    return tag("div", { "class": "bw-callout", id: "power-overcap-list" }, [
      tag("h2", {}, tag("span", { "class": "bw-badge bw-badge-error" }, "over cap") + " " +
                    BW.esc(over.length + " rack" + (over.length === 1 ? " is" : "s are") + " drawing more than " +
                        (over.length === 1 ? "its" : "their") + " power cap")),
      tag("ul", {}, items),
      over.length > 20 ? tag("p", { "class": "bw-muted" }, "and " + (over.length - 20) + " more") : ""
    ]);
  }

  function shareCell(p) {
    return tag("td", { "class": "bw-share" }, [
      tag("span", { "class": "bw-minibar" }, tag("span", { "class": "bw-minibar-fill" + (p > 100 ? " is-over" : ""),
        style: "width:" + (p === null ? "0" : Math.min(100, p).toFixed(1) + "%") })),
      tag("span", { "class": "is-num" }, BW.esc(pct(p) + (p > 100 ? " over" : "")))
    ]);
  }

  function totalsRow(kind, label, t) {
    return tag("tr", { "class": "bw-total-" + kind, "data-place": label }, [
      tag(kind === "hall" || kind === "site" ? "th" : "td", { scope: kind === "row" ? "" : "row" }, BW.esc(label)),
      tag("td", { "class": "is-num" }, t.racks_reporting + " of " + t.racks),
      tag("td", { "class": "is-num" }, BW.esc(power(t.draw_w))),
      tag("td", { "class": "is-num" }, BW.esc(power(t.cap_w))),
      shareCell(t.pct_of_cap)
    ]);
  }

  function totalsTable() {
    var d = pw.data;
    if (!d.racks.length) return tag("p", { "class": "bw-empty" }, "No racks yet.");
    var body = [], sites = new Set(d.halls.map(function (x) { return x.site; }));
    d.halls.forEach(function (hall) {
      body.push(totalsRow("hall", hall.hall + (sites.size > 1 ? " (" + hall.site + ")" : ""), hall));
      d.rows.filter(function (r) { return r.site === hall.site && r.hall === hall.hall; }).forEach(function (r) {
        body.push(totalsRow("row", "row " + r.row, r));
      });
    });
    return tag("table", { "class": "bw-table bw-totals" }, [
      tag("thead", {}, tag("tr", {}, ["Hall · row", "Racks reporting", "Draw", "Cap", "Share of cap"].map(function (c, i) {
        return tag("th", { scope: "col", "class": i && i < 4 ? "is-num" : "" }, BW.esc(c));
      }))),
      tag("tbody", {}, body),
      tag("tfoot", {}, totalsRow("site", "All racks", d.total))
    ]);
  }

  function loopsFigure() {
    var loops = pw.data.cooling_loops;
    if (!loops.length) return emptyFigure("No cooling loops in the topology.", 120);
    var names = loops.map(function (l) { return l.name; }), lx = [], ly = [];
    loops.forEach(function (l) {
      if (l.supply_c !== null && l.return_c !== null) { lx.push(l.supply_c, l.return_c, null); ly.push(l.name, l.name, null); }
    });
    var tip = loops.map(function (l) {
      return "<b>" + BW.esc(l.name) + "</b>" + (l.stale ? " · <b>no fresh reading</b>" : "") + "<br>Supply " + num(l.supply_c, "°C") +
        " · return " + num(l.return_c, "°C") + " · ΔT " + num(l.delta_t_c, "K") + "<br>Flow " + num(l.flow_lpm, "L/min") +
        "<br>Cools " + l.racks.length + " rack" + (l.racks.length === 1 ? "" : "s");
    });
    var marker = function (colour, symbol) { return { color: colour, size: 10, symbol: symbol, line: { color: "#ffffff", width: 1 } }; };
    var data = [
      { type: "scatter", mode: "lines", x: lx, y: ly, line: { color: "#8d99a6", width: 3 }, hoverinfo: "skip", showlegend: false },
      { type: "scatter", mode: "markers", name: "Supply (°C)", x: loops.map(function (l) { return l.supply_c; }), y: names,
        customdata: tip, marker: marker(BLUE, "circle"), hovertemplate: "%{customdata}<extra></extra>" },
      { type: "scatter", mode: "markers", name: "Return (°C)", x: loops.map(function (l) { return l.return_c; }), y: names,
        customdata: tip, marker: marker(VERMILLION, "diamond"), hovertemplate: "%{customdata}<extra></extra>" },
      { type: "bar", orientation: "h", name: "Flow (L/min)", x: loops.map(function (l) { return l.flow_lpm; }), y: names,
        xaxis: "x2", yaxis: "y", customdata: tip, marker: { color: SKY }, hovertemplate: "%{customdata}<extra></extra>" }
    ];
    return { data: data, layout: {
      height: Math.max(150, 70 + 24 * loops.length), margin: { l: 110, r: 10, t: 10, b: 60 }, hovermode: "closest",
      uirevision: "loops",
      xaxis: { domain: [0, 0.62], title: { text: "Coolant temperature (°C)" }, gridcolor: "#eef1f4", zeroline: false },
      xaxis2: { domain: [0.7, 1], title: { text: "Flow (L/min)" }, anchor: "y", rangemode: "tozero", gridcolor: "#eef1f4" },
      yaxis: { autorange: "reversed", type: "category" },
      legend: { orientation: "h", x: 0, y: -0.02, yref: "container", yanchor: "bottom" },
      plot_bgcolor: "#ffffff", paper_bgcolor: "#ffffff", hoverlabel: { align: "left" }
    } };
  }

  function loopsTable() {
    var loops = pw.data.cooling_loops;
    if (!loops.length) return tag("p", { "class": "bw-empty" }, "No cooling loops in the topology.");
    var head = ["Loop", "Racks", "Supply", "Return", "ΔT", "Flow", "Pumps", "Facility power", "Reading"];
    var n = function (text, title) { return tag("td", { "class": "is-num", title: title }, BW.esc(text)); };
    return tag("table", { "class": "bw-table bw-loops" }, [
      tag("thead", {}, tag("tr", {}, head.map(function (c, i) {
        return tag("th", { scope: "col", "class": i > 0 && i < 8 ? "is-num" : "" }, BW.esc(c));
      }))),
      tag("tbody", {}, loops.map(function (l) {
        return tag("tr", { "data-loop": l.name, "class": l.stale ? "is-stale" : "" }, [
          tag("th", { scope: "row" }, BW.esc(l.name)), n(String(l.racks.length), l.racks.join(", ")),
          n(num(l.supply_c, "°C")), n(num(l.return_c, "°C")), n(num(l.delta_t_c, "K")), n(num(l.flow_lpm, "L/min")),
          n(power(l.pump_w)), n(power(l.facility_w)),
          tag("td", {}, l.stale ? tag("span", { "class": "bw-badge bw-badge-stale" }, BW.esc(l.time ? "stale since " + utc(l.time) : "never reported"))
                                : BW.esc(utc(l.time, true)))
        ]);
      }))
    ]);
  }

  function pwApply(msg) {
    if (msg.type !== "power") return false;
    if (msg.full) {
      var data = Object.assign({}, msg);
      delete data.type; delete data.full; delete data.seq; delete data._received;
      pw.data = data;
      pwStats.lastRacks = data.racks.length;
    } else {
      var byId = new Map(pw.data.racks.map(function (r, i) { return [r.id, i]; }));
      (msg.racks || []).forEach(function (r) { if (byId.has(r.id)) pw.data.racks[byId.get(r.id)] = r; });
      ["rows", "halls", "total", "cooling_loops"].forEach(function (k) { if (k in msg) pw.data[k] = msg[k]; });
      if (msg.pue) Object.assign(pw.data, msg.pue);
      pw.data.generated_at = msg.generated_at;
      pwStats.lastRacks = (msg.racks || []).length;
    }
    pwStats.applied += 1;
    return true;
  }

  /* Rendered = the racks chart holds this figure and the browser painted it; then subscribe. */
  function pwRendered(fig) {
    var x = fig.data.length ? fig.data[0].x : null;
    requestAnimationFrame(function wait() {
      var gd = graphDiv("power-racks");
      if (!gd || !gd._fullLayout || (x && !(gd.data && gd.data.length && gd.data[0].x === x))) {
        requestAnimationFrame(wait);
        return;
      }
      requestAnimationFrame(function () {
        if (!pw.ready) { pw.ready = true; subscribeOnce(pw, "bw-power-page", function () { return { subscribe: "power" }; }); }
        if (pwStats.renderedAt === null) pwStats.renderedAt = performance.now();
      });
    });
  }

  /* --- PUE over time ----------------------------------------------------------------------- */

  var RANGE_WORDS = { "1h": "last hour", "24h": "last 24 hours", "7d": "last 7 days" };

  function pueFigure() {
    var s = pw.series;
    if (!s) return emptyFigure("Loading PUE…", 280);
    var data = [], any = s.y.some(function (v) { return v !== null; });
    if (any) {
      data.push({ type: "scatter", mode: s.y.length > 200 ? "lines" : "lines+markers", name: "PUE", x: s.x.map(plotTime), y: s.y,
                  connectgaps: false, line: { color: BLUE, width: 2 }, marker: { size: 4 },
                  hovertemplate: "%{x|%Y-%m-%d %H:%M} UTC<br>PUE %{y:.3f}<extra></extra>" });
    }
    if (pw.data && pw.data.pue !== null) {
      data.push({ type: "scatter", mode: "markers", name: "Now", x: [plotTime(pw.data.generated_at)], y: [pw.data.pue],
                  marker: { color: VERMILLION, size: 10, symbol: "diamond" },
                  hovertemplate: "Now: PUE %{y:.3f}<extra></extra>" });
    }
    if (!data.length) return emptyFigure("No PUE in the " + RANGE_WORDS[s.range] + ": it needs a facility power reading and every covered rack's PDUs.", 280);
    return { data: data, layout: {
      height: 300, margin: { l: 60, r: 10, t: 10, b: 50 }, hovermode: "closest", uirevision: "pue:" + s.range,
      xaxis: { type: "date", title: { text: "Time (UTC)" }, range: [plotTime(s.x[0]), plotTime(pw.data ? pw.data.generated_at : s.x[s.x.length - 1])] },
      yaxis: { title: { text: "PUE (facility ÷ IT power)" }, gridcolor: "#eef1f4", zeroline: false },
      legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
      plot_bgcolor: "#ffffff", paper_bgcolor: "#ffffff"
    } };
  }

  function pueNote() {
    var s = pw.series;
    if (!s) return "";
    var step = s.step_s >= 3600 ? (s.step_s / 3600) + " h" : (s.step_s / 60) + " min";
    return "One point per " + step + " (" + (s.resolution === "1h" ? "hourly" : "1-minute") + " rollup) over the " + RANGE_WORDS[s.range];
  }

  /* A new rollup bucket is due once a step has passed since the series was read: ask for it,
   * at most once per step (no timer: only when a push arrives). */
  function maybeReloadSeries() {
    if (!pw.series || !pw.seriesAt) return;
    var due = pw.seriesAt + pw.series.step_s * 1000;
    if (Date.now() >= due && pw.reloadAsked < due) {
      pw.reloadAsked = due;
      window.dash_clientside.set_props("pue-reload", { data: Date.now() });
    }
  }

  /* ========================================================================================= */

  var dc = (window.dash_clientside = window.dash_clientside || {});
  dc.breakwater = Object.assign(dc.breakwater || {}, {
    nvlinkRender: function (data, metric, _live) {
      var nu = window.dash_clientside.no_update, which = triggered();
      if (metric && METRICS[metric]) nv.metric = metric;
      var rebuild = false;
      if (which.indexOf("nvlink-data") >= 0 || (!nv.payload && data)) {
        if (nvStats.payloadAt === null) nvStats.payloadAt = performance.now();
        nv.payload = data; nv.cols = columns(data); nv.pending = [];
        rebuild = true;
      }
      if (!nv.payload) return [nu, nu];
      if (which.indexOf("nvlink-metric") >= 0) rebuild = true;
      var patched = new Set(), received = null, live = which.indexOf("nvlink-live") >= 0;
      if (live) {
        var any = false;
        nv.pending.splice(0).forEach(function (msg) {
          var how = nv.groups ? nvApply(msg, patched) : "";
          if (!how) return;
          any = true;
          received = msg._received;
          nvStats.messages += 1;
          if (how === "rebuild") rebuild = true;
        });
        if (!any) return [nu, nu];
      }
      if (rebuild) {
        var fig = nvFigure();
        nvRendered(fig);
        if (live) { nvStats.applied += 1; nvStats.lastCells = -1; }
        nvPanels();
        return [fig, nvNote()];
      }
      var gd = graphDiv("nvlink-grid");
      if (patched.size && gd && nv.z) {
        patched.forEach(patch);
        var at = received || performance.now(), cells = patched.size;
        restyle(gd, function (drawnAt) {
          nvStats.applied += 1; nvStats.lastCells = cells; nvStats.lastApplyMs = drawnAt - at;
        });
      } else if (live) {
        nvStats.applied += 1; nvStats.lastCells = 0;
      }
      nvPanels();
      return [nu, nvNote()];
    },

    powerRender: function (data, _live) {
      var nu = window.dash_clientside.no_update, which = triggered();
      if (which.indexOf("power-data") >= 0 || (!pw.data && data)) {
        if (pwStats.payloadAt === null) pwStats.payloadAt = performance.now();
        pw.data = data; pw.pending = [];
      }
      if (!pw.data) return [nu, nu];
      if (which.indexOf("power-live") >= 0) {
        var changed = false;
        pw.pending.splice(0).forEach(function (msg) { changed = pwApply(msg) || changed; });
        if (!changed) return [nu, nu];
        maybeReloadSeries();
      }
      var racks = racksFigure();
      pwRendered(racks);
      fill("power-summary", powerSummary());
      fill("power-overcap", overcapCallout());
      fill("power-totals", totalsTable());
      fill("power-loops-table", loopsTable());
      var out = [racks, loopsFigure()];
      if (pwStats.builtAt === null) pwStats.builtAt = performance.now();
      return out;
    },

    pueRender: function (series, _live, _range) {
      var nu = window.dash_clientside.no_update, which = triggered();
      if (which.indexOf("pue-series") >= 0 || (!pw.series && series)) { pw.series = series; pw.seriesAt = Date.now(); }
      if (!pw.series) return [emptyFigure("Loading PUE…", 280), ""];
      if (which.length === 1 && which[0] === "power-live" && !pw.data) return [nu, nu];
      return [pueFigure(), pueNote()];
    }
  });
})();
