/* Rack heatmap: draws the grid sent by the Dash callback and applies pushed value changes.
 *
 * heatmapFigure(payload) builds one Plotly heatmap from compact arrays (see
 * telemetry/selectors/racks.py): z holds the colour value of each cell, customdata the
 * formatted value for the tooltip, text the GPU's static facts. heatmapApply(msg) is the
 * clientside callback of the "heatmap-live" store, which the websocket fills: it patches only
 * the cells in the message and restyles the trace, so an update costs the changed cells plus
 * one redraw, not a new page. Colours: cividis (readable with every common colour-vision
 * deficiency) and Okabe-Ito for categories; a GPU with no value is grey, never a colour.
 * Once a metric's grid is on screen, the page's root (#bw-heatmap-page) says which: data-metric.
 */
(function () {
  "use strict";
  var BW = (window.BW = window.BW || {});
  var NO_DATA = "#bdbdbd";
  var CIVIDIS = ["#00224e", "#123570", "#3b496c", "#575d6d", "#707173", "#8a8678", "#a59c74",
                 "#c3b369", "#e1cc55", "#fee838"];
  var CATEGORY_COLOURS = ["#e8eef7", "#d55e00", "#cc79a7", "#e69f00", "#f0e442", "#56b4e9", "#009e73"];
  var EMPTY = "#eef0f3";  // a rack slot with no GPU
  var BAND = 0.04;  // share of the colour axis for each sentinel band below the range

  var st = { payload: null, z: null, cd: null, pos: null, socket: null, metric: null, clickBound: false,
             ready: false };
  var stats = (BW.heatmapStats = { applied: 0, lastApplyMs: null, lastCells: 0, renderedAt: null, renders: 0 });

  function fmt(meta, v) {
    if (v === null || v === undefined) return "no data";
    if (meta.scale === "categorical") return meta.categories[v] || String(v);
    var digits = Math.abs(v) >= 100 ? 0 : 1;
    return v.toFixed(digits) + (meta.unit ? " " + meta.unit : "");
  }

  function valueLine(meta, v) {
    return "<br><b>" + meta.label + ": " + fmt(meta, v) + "</b>";
  }

  /* One colour axis holds three kinds of cell: an empty rack slot (lightest), a GPU with no
   * value (grey) and the metric's range. The two sentinels sit below the range. */
  function colourAxis(meta) {
    var stops = [], ticks, labels, zmin, zmax, title;
    if (meta.scale === "categorical") {
      var n = meta.categories.length, steps = n + 2;
      var colours = [EMPTY, NO_DATA].concat((meta.colours || CATEGORY_COLOURS).slice(0, n));
      colours.forEach(function (c, i) { stops.push([i / steps, c], [(i + 1) / steps, c]); });
      meta._empty = -2; meta._noData = -1;
      zmin = -2.5; zmax = n - 0.5;
      ticks = [-1].concat(meta.categories.map(function (_, i) { return i; }));
      labels = ["no data"].concat(meta.categories);
      title = meta.label;
    } else {
      var lo = meta.range[0], hi = meta.range[1], band = (hi - lo) * BAND / (1 - 2 * BAND);
      zmin = lo - 2 * band; zmax = hi;
      meta._empty = zmin; meta._noData = lo - band;
      stops.push([0, EMPTY], [BAND * 0.9, EMPTY], [BAND, NO_DATA], [2 * BAND * 0.95, NO_DATA]);
      CIVIDIS.forEach(function (c, i) { stops.push([2 * BAND + (1 - 2 * BAND) * i / (CIVIDIS.length - 1), c]); });
      stops[stops.length - 1][0] = 1;  // exactly 1, or Plotly rejects the scale
      ticks = [meta._noData, lo, (lo + hi) / 2, hi];
      labels = ["no data", String(lo), String((lo + hi) / 2), hi + "+"];
      title = meta.label + (meta.unit ? " (" + meta.unit + ")" : "");
    }
    meta._legend = { stops: stops, ticks: ticks, labels: labels, title: title, zmin: zmin, zmax: zmax };
    return { zmin: zmin, zmax: zmax, colorscale: stops, showscale: false };
  }

  /* The legend is HTML beside the toolbar, not a Plotly colorbar: Plotly redraws a colorbar on
   * every restyle, and a tall figure's colorbar is taller than the screen. */
  function drawLegend(meta) {
    var box = document.getElementById("heatmap-legend");
    if (!box) return;
    var L = meta._legend, html = '<span class="bw-legend-title">' + BW.esc(L.title) + "</span>";
    var swatch = function (colour, label) {
      return '<span class="bw-legend-item"><span class="bw-swatch" style="background:' + colour + '"></span>' + BW.esc(label) + "</span>";
    };
    if (meta.scale === "categorical") {
      meta.categories.forEach(function (c, i) { html += swatch((meta.colours || CATEGORY_COLOURS)[i], c); });
    } else {
      var grad = CIVIDIS.map(function (c, i) { return c + " " + (100 * i / (CIVIDIS.length - 1)).toFixed(1) + "%"; });
      html += '<span class="bw-legend-scale"><span class="bw-gradient" style="background:linear-gradient(to right,' +
        grad.join(",") + ')"></span><span class="bw-legend-ticks"><span>' + BW.esc(L.labels[1]) + "</span><span>" +
        BW.esc(L.labels[2]) + "</span><span>" + BW.esc(L.labels[3]) + "</span></span></span>";
    }
    html += swatch(NO_DATA, "no data") + swatch(EMPTY, "empty slot");
    box.innerHTML = html;
  }

  /* Under the Health metric, every GPU that is not OK is also listed as text with its state
   * (data-health), worst first: a screen reader, a search of the page and a test can read what the
   * canvas only draws. */
  var ATTENTION_MAX = 50;
  function drawAttention(meta) {
    var box = document.getElementById("heatmap-attention");
    if (!box) return;
    if (!meta.states) { box.hidden = true; return; }
    var g = st.payload.grid.gpus, rows = [];
    for (var i = 0; i < g.id.length; i++) {
      var v = meta.values[i];
      if (v === null || v === undefined || meta.states[v] === "ok") continue;
      rows.push([v, i]);
    }
    rows.sort(function (a, b) { return a[0] - b[0] || a[1] - b[1]; });
    var html = '<h2 id="heatmap-attention-h">Not OK <span class="bw-muted">' + rows.length + "</span></h2>";
    if (!rows.length) html += '<p class="bw-muted">Every GPU is OK.</p>';
    else {
      html += "<ul>" + rows.slice(0, ATTENTION_MAX).map(function (r) {
        var i = r[1];
        return '<li><a href="/gpus/' + encodeURIComponent(g.uuid[i]) + '/">' + BW.esc(st.payload.grid.hosts[g.host[i]]) +
          " GPU " + g.index[i] + '</a> <span class="bw-badge" data-health="' + meta.states[r[0]] +
          '" style="--badge: ' + meta.colours[r[0]] + '">' + BW.esc(meta.categories[r[0]]) + "</span></li>";
      }).join("") + "</ul>";
      if (rows.length > ATTENTION_MAX) html += '<p class="bw-muted">The first ' + ATTENTION_MAX + ' of ' + rows.length + ".</p>";
    }
    box.hidden = false;
    box.innerHTML = html;
  }

  function colourValue(meta, v) {
    if (v === null || v === undefined) return meta._noData;
    if (meta.scale === "categorical") return v;
    return Math.min(meta.range[1], Math.max(meta.range[0], v));
  }

  function emptyFigure(text) {
    return { data: [], layout: { height: 240, xaxis: { visible: false }, yaxis: { visible: false },
      annotations: [{ text: text, showarrow: false, x: 0.5, y: 0.5, xref: "paper", yref: "paper", font: { size: 15 } }] } };
  }

  /* Plain cells only: Plotly redraws every shape and annotation on each restyle, which at 256
   * racks costs more than the cells, so racks are drawn as light "empty slot" cells with blank
   * columns between them and the row labels are HTML laid over the plot (placeLabels). */
  function buildFigure(payload) {
    var grid = payload.grid, meta = payload.metric, g = grid.gpus, n = g.id.length;
    var W = grid.width, H = grid.height, y, x, i;
    var axis = colourAxis(meta);
    var z = new Array(H), cd = new Array(H), text = new Array(H);
    for (y = 0; y < H; y++) { z[y] = new Array(W).fill(null); cd[y] = new Array(W).fill(""); text[y] = new Array(W).fill(null); }
    grid.racks.forEach(function (r) {
      for (var yy = r.y0; yy < r.y0 + r.h; yy++) {
        for (var xx = r.x0; xx < r.x0 + r.w; xx++) {
          z[yy][xx] = meta._empty;
          text[yy][xx] = "<b>" + r.name + "</b> · U" + (r.y0 + r.h - yy) + "<br>empty";
        }
      }
    });
    var pos = new Map();
    for (i = 0; i < n; i++) {
      y = g.y[i]; x = g.x[i];
      var v = meta.values[i];
      z[y][x] = colourValue(meta, v);
      cd[y][x] = valueLine(meta, v);
      var job = g.job[i] >= 0 ? grid.jobs[g.job[i]] : null;
      var r = g.rack[i] >= 0 ? grid.racks[g.rack[i]] : null;
      text[y][x] = "<b>" + grid.hosts[g.host[i]] + " · GPU " + g.index[i] + "</b><br>" +
        (r ? r.name + " · U" + (r.y0 + r.h - y) : "unplaced") + "<br>" + g.uuid[i] + "<br>" + grid.models[g.model[i]] +
        "<br>" + (job ? "Job " + job.key + (job.name ? " (" + job.name + ")" : "") +
                 (job.tenant ? "<br>Tenant " + job.tenant : "") : "No job");
      pos.set(g.id[i], [y, x, i]);
    }
    st.z = z; st.cd = cd; st.pos = pos;
    drawAttention(meta);
    // Size the plot from the width it gets: a cell is twice as wide as tall (scaleanchor below),
    // so a height taken from anything else leaves bands of white above and below the racks.
    var outer = document.getElementById("heatmap");
    var width = Math.max(320, (outer && outer.clientWidth ? outer.clientWidth : 1200) - 16);
    var rowPx = Math.max(3, Math.min(14, width / Math.max(W, 1) / 2));
    var trace = Object.assign({
      type: "heatmap", z: z, customdata: cd, text: text, hoverongaps: false,
      hovertemplate: "%{text}%{customdata}<extra></extra>"
    }, axis);
    drawLegend(meta);
    return {
      data: [trace],
      layout: {
        height: Math.round(H * rowPx) + 32, margin: { l: 8, r: 8, t: 24, b: 8 }, uirevision: meta.metric,
        // A GPU cell is twice as wide as it is tall whatever the cluster's shape, centred.
        xaxis: { visible: false, range: [-0.5, W - 0.5], scaleanchor: "y", scaleratio: 2, constrain: "domain" },
        yaxis: { visible: false, autorange: "reversed" },
        plot_bgcolor: "#ffffff", paper_bgcolor: "#ffffff", hoverlabel: { align: "left" }
      }
    };
  }

  /* Hall-row labels over the plot, at each panel's top-left cell; redone after zoom or resize. */
  function placeLabels() {
    var gd = graphDiv();
    if (!gd || !gd._fullLayout || !st.payload) return;
    var fl = gd._fullLayout, xa = fl.xaxis, ya = fl.yaxis;
    var box = document.getElementById("bw-heatmap-labels");
    if (!box) {
      box = document.createElement("div");
      box.id = "bw-heatmap-labels";
      box.className = "bw-heatmap-labels";
      box.setAttribute("aria-hidden", "true");
      gd.parentNode.style.position = "relative";
      gd.parentNode.appendChild(box);
    }
    var html = "";
    st.payload.grid.panels.forEach(function (p) {
      var left = xa._offset + xa.l2p(p.x0 - 0.5), top = ya._offset + ya.l2p(p.y0 - 0.5);
      if (left < 0 || left > fl.width || top < 0 || top > fl.height) return;
      html += '<span style="left:' + left.toFixed(1) + "px;top:" + top.toFixed(1) + 'px">' +
        BW.esc(p.label) + "</span>";
    });
    box.innerHTML = html;
  }

  function graphDiv() {
    var outer = document.getElementById("heatmap");
    return outer && outer.querySelector(".js-plotly-plot");
  }

  function bindClick() {
    var gd = graphDiv();
    if (st.clickBound || !gd || !gd.on) return;
    st.clickBound = true;
    gd.on("plotly_relayout", placeLabels);
    gd.on("plotly_afterplot", placeLabels);
    gd.on("plotly_click", function (ev) {
      var p = ev.points && ev.points[0];
      if (!p) return;
      var hit = null;
      st.pos.forEach(function (v) { if (v[0] === p.pointIndex[0] && v[1] === p.pointIndex[1]) hit = v; });
      if (hit) location.assign("/gpus/" + encodeURIComponent(st.payload.grid.gpus.uuid[hit[2]]) + "/");
    });
  }

  // The rows of z and customdata are shared with the figure prop; the pass gives new outer arrays.
  var redraw = BW.restyler(function () { return [{ z: [st.z.slice()], customdata: [st.cd.slice()] }, [0]]; });

  function subscribe() {
    if (!st.socket) {
      var root = document.getElementById("bw-heatmap-page");
      st.socket = BW.live(root.dataset.liveUrl, {
        onOpen: function (api) { api.send({ subscribe: st.metric }); },
        onMessage: function (msg) { BW.setStore("heatmap-live", msg); }
      });
    } else {
      st.socket.send({ subscribe: st.metric });
    }
  }

  var dc = (window.dash_clientside = window.dash_clientside || {});
  dc.breakwater = Object.assign(dc.breakwater || {}, {
    heatmapFigure: function (payload) {
      if (!payload) return [window.dash_clientside.no_update, ""];
      stats.payloadAt = performance.now();
      st.payload = payload;
      st.metric = payload.metric.metric;
      st.ready = false;
      // Rendered = the graph holds this payload's cells and the browser has painted them.
      var z = null;
      requestAnimationFrame(function wait() {
        var gd = graphDiv();
        if (!gd || !gd._fullData || !gd.data || !gd.data.length || gd.data[0].z !== z) { requestAnimationFrame(wait); return; }
        bindClick();
        placeLabels();
        // Subscribe only now: a push applied while Dash is still plotting would race its redraw.
        st.ready = true;
        document.getElementById("bw-heatmap-page").dataset.metric = st.metric;
        subscribe();
        requestAnimationFrame(function () {
          if (stats.renderedAt === null) stats.renderedAt = performance.now();
          stats.renders += 1;
        });
      });
      if (!payload.grid.gpus.id.length) {
        stats.renderedAt = performance.now();
        return [emptyFigure("No GPUs yet. They appear here as soon as telemetry or a topology import names them."), ""];
      }
      var figure = buildFigure(payload);
      stats.builtAt = performance.now();
      z = figure.data[0].z;
      return [figure, payload.metric.note || ""];
    },

    heatmapApply: function (msg) {
      var nu = window.dash_clientside.no_update;
      if (!msg || !st.payload || !st.ready || msg.metric !== st.metric) return nu;
      if (msg.type === "reload") {
        window.dash_clientside.set_props("heatmap-reload", { data: Date.now() });
        return nu;
      }
      var meta = st.payload.metric, g = st.payload.grid.gpus, changed = 0, unknown = false;
      for (var id in msg.values) {
        var p = st.pos.get(Number(id));
        if (!p) { unknown = true; continue; }
        var v = msg.values[id];
        meta.values[p[2]] = v;
        st.z[p[0]][p[1]] = colourValue(meta, v);
        st.cd[p[0]][p[1]] = valueLine(meta, v);
        changed++;
      }
      if (unknown) window.dash_clientside.set_props("heatmap-reload", { data: Date.now() });
      if (changed) drawAttention(meta);
      var gd = graphDiv();
      if (!changed || !gd || !g.id.length) return nu;
      var received = msg._received || performance.now();
      redraw(gd, function (drawnAt) {
        stats.applied += 1;
        stats.lastCells = changed;
        stats.lastApplyMs = drawnAt - received;
        gd.dataset.applied = String(stats.applied);
      });
      return msg.seq || 0;
    }
  });
})();
