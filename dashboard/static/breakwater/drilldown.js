/* Drill-down plots (GPU, port, node pages) and their live updates.
 *
 * seriesFigure(payload) draws the window the Dash callback read (dashboard/dash_apps/inventory.py):
 * one line, with the min/max band at rollup resolutions. Once Plotly has drawn it, and only while
 * the window ends at "now", the page subscribes on /ws/series/ (BW.live reconnects by itself and
 * re-subscribes from the newest point it holds). seriesApply(msg) is the clientside callback of
 * the "series-live" store the socket fills: it appends the pushed points with Plotly.extendTraces,
 * drops those that left the window, breaks the line where the data has a gap, and slides the
 * x-axis along unless the operator zoomed. A GPU page's fault events arrive on the same socket
 * and replace the events table. nodeFigure(payload) draws one line per GPU of a node.
 * While the plot follows the live data, the page's root (#bw-series-page) says which window:
 * data-following="<field>/<range>", set when the subscription for the drawn window is sent.
 *
 * Colours: Okabe-Ito, which stays distinguishable with every common colour-vision deficiency;
 * a node's lines beyond eight also change dash pattern.
 */
(function () {
  "use strict";
  var BW = (window.BW = window.BW || {});
  var LINE = "#0072b2";
  var BAND = "rgba(0, 114, 178, 0.18)";
  var PALETTE = ["#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000"];
  var DASHES = ["solid", "dash", "dot", "dashdot"];
  var GAP_FACTOR = 2.5;  // as telemetry/series.py: points further apart than this many steps have a gap
  var SLIDE_HEADROOM = 0.02;  // share of the window kept right of the newest point while it slides

  var st = { payload: null, socket: null, tag: 0, ready: false, range: null };
  var stats = (BW.seriesStats = { appended: 0, messages: 0, renderedAt: null, subscriptions: 0 });

  function nu() { return window.dash_clientside.no_update; }

  function graphDiv() {
    var outer = document.getElementById("series-graph");
    return outer && outer.querySelector(".js-plotly-plot");
  }

  function ms(x) {  // "YYYY-MM-DD HH:MM:SS[.ffffff]" (UTC), as we and Plotly write dates -> epoch ms
    if (typeof x === "number") return x;
    var m = /^(\d{4}-\d\d-\d\d)(?:[ T](\d\d)(?::(\d\d)(?::(\d\d)(\.\d+)?)?)?)?$/.exec(x);
    if (!m) return NaN;
    var t = Date.parse(m[1] + "T" + (m[2] || "00") + ":" + (m[3] || "00") + ":" + (m[4] || "00") + "Z");
    return t + (m[5] ? Number(m[5]) * 1000 : 0);
  }

  function xstr(t) {  // epoch ms -> the same format, microseconds zero
    return new Date(t).toISOString().replace("T", " ").replace("Z", "000");
  }

  function axisTitle(p) { return p.label + (p.unit ? " (" + p.unit + ")" : ""); }

  function hasData(ys) { return ys.some(function (v) { return v !== null; }); }

  function baseLayout(p, height) {
    return {
      height: height, margin: { l: 72, r: 16, t: 28, b: 48 }, hovermode: "x unified",
      uirevision: [p.kind, p.id, p.field, p.range].join("/"),
      xaxis: { type: "date", title: { text: "Time (UTC)" }, range: [p.start, p.end] },
      yaxis: { title: { text: axisTitle(p) }, rangemode: "tozero", zeroline: false, exponentformat: "SI" },
      legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
      plot_bgcolor: "#ffffff", paper_bgcolor: "#ffffff"
    };
  }

  function noDataNote(text) {
    return [{ text: text, showarrow: false, x: 0.5, y: 0.5, xref: "paper", yref: "paper", font: { size: 14, color: "#5f6b78" } }];
  }

  /* The value line is always the last trace (uid "value"); the band, when there is one, is the
   * two traces before it, so extendTraces appends to every trace with the same x. */
  function seriesTraces(p) {
    var traces = [], shape = p.field_kind === "state" ? "hv" : "linear";
    if (p.band) {
      traces.push({ type: "scatter", mode: "lines", uid: "band-lo", x: p.x.slice(), y: p.band.lo.slice(), name: "min",
                    line: { width: 0, color: BAND, shape: shape }, hoverinfo: "skip", showlegend: false });
      traces.push({ type: "scatter", mode: "lines", uid: "band-hi", x: p.x.slice(), y: p.band.hi.slice(), name: "min–max",
                    line: { width: 0, color: BAND, shape: shape }, fill: "tonexty", fillcolor: BAND, hoverinfo: "skip" });
    }
    traces.push({
      type: "scatter", mode: p.x.length <= 120 ? "lines+markers" : "lines", uid: "value", x: p.x.slice(), y: p.y.slice(),
      name: p.band ? "mean" : p.label, line: { color: LINE, width: 2, shape: shape }, marker: { size: 4, color: LINE },
      connectgaps: false, hovertemplate: "%{y:.4~g} " + (p.unit || "") + "<extra></extra>"
    });
    return traces;
  }

  /* Draw, then subscribe once Plotly holds this payload's points: a push applied while Dash is
   * still plotting would race its redraw. */
  function whenDrawn(p, x, then) {
    requestAnimationFrame(function wait() {
      if (st.payload !== p) return;  // a newer window replaced this one before it was drawn
      var gd = graphDiv();
      var last = gd && gd.data && gd.data[gd.data.length - 1];
      if (!gd || !gd._fullData || !last || last.x !== x) { requestAnimationFrame(wait); return; }
      then(gd);
    });
  }

  function valueTrace(gd) { return gd.data.length - 1; }

  function newestX(gd) {
    var t = gd.data[valueTrace(gd)], i;
    for (i = t.x.length - 1; i >= 0; i--) if (t.y[i] !== null) return t.x[i];
    return null;
  }

  /* Send the page's subscription; the first call opens the socket, whose onOpen (after every
   * reconnect too) calls back here, from the newest point the plot holds by then. */
  function subscribe() {
    var p = st.payload, gd = graphDiv();
    if (!p || !p.live || !gd) return;
    if (!st.socket) {
      st.socket = BW.live(pageRoot().dataset.liveUrl,
                          { onOpen: subscribe, onMessage: onMessage });
      return;
    }
    st.tag += 1;
    stats.subscriptions += 1;
    st.socket.send({ subscribe: {
      kind: p.kind, id: p.id, field: p.field, since: newestX(gd) || p.start, resolution: p.resolution,
      range_s: p.range_s, step_s: p.step_s, events: !!document.getElementById("bw-events"), tag: st.tag
    } });
    if (st.socket.connected) pageRoot().dataset.following = p.field + "/" + p.range;
  }

  function pageRoot() { return document.getElementById("bw-series-page"); }

  function onMessage(msg) {
    stats.messages += 1;
    if (msg.type === "error") { console.error("breakwater: series subscription:", msg.message); return; }
    if (msg.tag !== st.tag) return;  // meant for a window the page no longer shows
    if (msg.type === "events") { renderEvents(msg.events); return; }
    BW.setStore("series-live", msg);
  }

  function notLive() {
    var conn = document.getElementById("bw-conn");
    if (!conn || st.socket) return;
    conn.dataset.state = "static";
    conn.querySelector(".bw-conn-text").textContent = "Past window, not live";
  }

  /* Append `msg`'s points; returns how many. Points older than the window's length behind the
   * newest one are dropped (maxPoints), and the x-axis slides unless the operator moved it. */
  function append(gd, msg) {
    var p = st.payload, vt = valueTrace(gd), xs = msg.x.slice(), n = xs.length;
    var ys = [msg.y.slice()], last = newestX(gd);
    if (msg.band) ys = [msg.band.lo.slice(), msg.band.hi.slice(), ys[0]];
    if (last !== null && p.step_s && ms(xs[0]) - ms(last) > GAP_FACTOR * p.step_s * 1000) {
      xs.unshift(xstr(ms(last) + p.step_s * 1000));  // break the line across the gap
      ys.forEach(function (y) { y.unshift(null); });
    }
    var old = gd.data[vt].x, newest = ms(xs[xs.length - 1]), from = newest - p.range_s * 1000, drop = 0;
    while (drop < old.length && ms(old[drop]) < from) drop++;
    var indices = ys.map(function (_, i) { return vt - ys.length + 1 + i; });
    var update = { x: ys.map(function () { return xs.slice(); }), y: ys };
    window.Plotly.extendTraces(gd, update, indices, old.length - drop + xs.length);
    slide(gd, newest);
    if (gd.layout.annotations && gd.layout.annotations.length) window.Plotly.relayout(gd, { annotations: [] });
    return n;
  }

  function slide(gd, newest) {
    // Plotly rewrites a date range in its own format: compare instants, not strings.
    var r = gd.layout.xaxis.range;
    if (!st.range || !r || Math.abs(ms(r[0]) - ms(st.range[0])) > 1 || Math.abs(ms(r[1]) - ms(st.range[1])) > 1) {
      return;  // the operator zoomed or panned: leave the axis where they put it
    }
    var span = st.payload.range_s * 1000, end = Math.max(ms(st.payload.end), newest + span * SLIDE_HEADROOM);
    st.range = [xstr(end - span), xstr(end)];
    window.Plotly.relayout(gd, { "xaxis.range": st.range.slice() });
  }

  /* The fault-events table, rebuilt from a pushed list (same cells as gpu.html renders). */
  function renderEvents(events) {
    var table = document.getElementById("bw-events"), empty = document.getElementById("bw-events-empty");
    if (!table) return;
    var live = table.tBodies[0];
    var body = document.createElement("tbody");  // built aside, then morphed into the page's (patch.js)
    events.forEach(function (e) {
      var tr = body.insertRow();
      cell(tr, e.last_seen_text, "first " + e.first_seen_text);
      cell(tr, e.fault, e.message || null);
      var badge = document.createElement("span");
      badge.className = "bw-badge";
      badge.style.setProperty("--badge", e.severity_colour);
      badge.textContent = e.severity;
      tr.insertCell().appendChild(badge);
      cell(tr, e.meaning);
      cell(tr, e.action_label);
      cell(tr, String(e.count)).className = "bw-num";
      cell(tr, e.open ? "open" : "cleared " + (e.cleared_reason || ""));
    });
    if (BW.patch) BW.patch.morphChildren(live, body);
    else table.replaceChild(body, live);
    table.hidden = !events.length;
    if (empty) empty.hidden = !!events.length;
    table.dataset.updated = String(Date.now());
  }

  function cell(tr, text, sub) {
    var td = tr.insertCell();
    td.textContent = text;
    if (sub) {
      var div = document.createElement("div");
      div.className = "bw-muted";
      div.textContent = sub;
      td.appendChild(div);
    }
    return td;
  }

  var dc = (window.dash_clientside = window.dash_clientside || {});
  dc.breakwater = Object.assign(dc.breakwater || {}, {
    seriesFigure: function (p) {
      if (!p) return [{ data: [], layout: { height: 120, xaxis: { visible: false }, yaxis: { visible: false },
                        annotations: noDataNote("Nothing to plot: this page names no known entity.") } }, "—"];
      st.payload = p;
      st.ready = false;
      delete pageRoot().dataset.following;  // until this window is drawn and subscribed
      var layout = baseLayout(p, 380);
      st.range = layout.xaxis.range.slice();
      if (!hasData(p.y)) layout.annotations = noDataNote("No data for " + p.label + " in this range yet.");
      layout.showlegend = !!p.band;
      var traces = seriesTraces(p);
      var x = traces[traces.length - 1].x;
      whenDrawn(p, x, function () {
        st.ready = true;
        if (stats.renderedAt === null) stats.renderedAt = performance.now();
        if (p.live) subscribe(); else notLive();
      });
      return [{ data: traces, layout: layout }, p.resolution_label];
    },

    seriesApply: function (msg) {
      var gd = graphDiv();
      if (!msg || !st.ready || !gd || msg.tag !== st.tag) return nu();
      if (msg.type === "reload") {
        window.dash_clientside.set_props("series-reload", { data: Date.now() });
        return nu();
      }
      if (msg.type !== "points" || !msg.x.length) return nu();
      stats.appended += append(gd, msg);
      gd.dataset.appended = String(stats.appended);
      return stats.appended;
    },

    nodeFigure: function (p) {
      if (!p) return [{ data: [], layout: { height: 120, xaxis: { visible: false }, yaxis: { visible: false },
                        annotations: noDataNote("Nothing to plot: this page names no known node.") } }, "—"];
      var layout = baseLayout(p, 400), shape = p.field_kind === "state" ? "hv" : "linear";
      var traces = p.traces.map(function (t, i) {
        return { type: "scatter", mode: "lines", uid: t.uuid, name: t.name, x: t.x, y: t.y, connectgaps: false,
                 customdata: t.x.map(function () { return t.uuid; }),
                 line: { color: PALETTE[i % PALETTE.length], dash: DASHES[Math.floor(i / PALETTE.length) % DASHES.length],
                         width: 1.6, shape: shape },
                 hovertemplate: t.name + ": %{y:.4~g} " + (p.unit || "") + "<extra></extra>" };
      });
      if (!traces.some(function (t) { return hasData(t.y); })) {
        layout.annotations = noDataNote(traces.length ? "No data for " + p.label + " from these GPUs in this range yet."
                                                      : "This node has no GPUs.");
      }
      requestAnimationFrame(function () { if (stats.renderedAt === null) stats.renderedAt = performance.now(); });
      return [{ data: traces, layout: layout }, p.resolution_label];
    }
  });
})();
