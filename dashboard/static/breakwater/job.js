/* One job's page: header and state history, locality, the gang on the topology, the rank table
 * with its stragglers, and step time per rank; kept live by /ws/jobs/.
 *
 * The Dash app `job` loads `job_detail` for the URL's key and then `job_step_series` for the
 * chosen range; jobRender draws everything from those two payloads. Once both are drawn the page
 * subscribes with the job's key, its last step bucket and the bucket width. The consumer answers
 * with the whole job once, then on each telemetry tick only the ranks whose place, GPU state, step
 * time or straggler flag changed, the job fields, history, gang and locality when they changed,
 * and the step buckets from the page's last one on. Messages queue here ("job-live" carries a
 * counter); the step buckets replace the page's points from their first time on.
 *
 * Colours: cividis for each rank's step time relative to the gang median (dark = as fast as the
 * gang, yellow = slowest), grey for a rank with no step time; stragglers are outlined in Okabe-Ito
 * vermillion and carry a "straggler" badge in the table, so no colour is the only signal.
 */
(function () {
  "use strict";
  var BW = window.BW;
  var U = BW.jobsUtil, h = U.h;
  var VERMILLION = "#d55e00";
  var HIGHLIGHT = ["#d55e00", "#e69f00", "#cc79a7", "#0072b2", "#009e73", "#56b4e9"];  // Okabe-Ito
  var CIVIDIS = ["#00224e", "#123570", "#3b496c", "#575d6d", "#707173", "#8a8678", "#a59c74",
                 "#c3b369", "#e1cc55", "#fee838"];
  var NO_DATA = "#bdbdbd";
  var OTHERS = "#8d99a6";
  var RATIO = [0.9, 1.5];
  var RANGE_MS = { "15m": 9e5, "1h": 36e5, "6h": 216e5 };
  var LABEL_MAX_COLUMNS = 40;  // rank numbers inside the cells while they fit

  var st = { sub: 0, key: null, detail: null, ranks: new Map(), series: null, loaded: false, missing: false,
             socket: null, pending: [], note: "" };
  var stats = (BW.jobStats = { applied: 0, lastRanks: 0, lastSteps: 0, renderedAt: null });

  function compact(list) { return list.filter(function (x) { return x !== null && x !== undefined && x !== ""; }); }
  function plotTime(iso) { return iso.replace(/(Z|[+-]\d\d:\d\d)$/, ""); }  // UTC wall time for Plotly
  function pct(share) { return share === null || share === undefined ? "—" : Math.round(share * 100) + " %"; }

  /* --- State ------------------------------------------------------------------------------- */

  function setDetail(d) {
    st.detail = d;
    st.ranks = new Map(d.ranks.map(function (r) { return [r.rank, r]; }));
    st.key = d.job.key;
  }

  function loadSeries(s) {
    st.series = {
      bucket_s: s.bucket_s, range: s.range, start: s.start, end: s.end,
      ranks: new Map(s.ranks.map(function (r) { return [r.rank, { times: r.times, values: r.step_time_s }]; })),
      gang: { times: s.gang_median.times, values: s.gang_median.step_time_s }
    };
  }

  function merge(old, delta) {
    if (!delta.times.length) return old;
    var first = Date.parse(delta.times[0]), keep = 0;
    old = old || { times: [], values: [] };
    while (keep < old.times.length && Date.parse(old.times[keep]) < first) keep++;
    return { times: old.times.slice(0, keep).concat(delta.times),
             values: old.values.slice(0, keep).concat(delta.step_time_s) };
  }

  function trim(s, from) {
    var i = 0;
    while (i < s.times.length && Date.parse(s.times[i]) < from) i++;
    return i ? { times: s.times.slice(i), values: s.values.slice(i) } : s;
  }

  function lastPoint() {
    var best = null;
    function scan(s) {
      for (var i = s.times.length - 1; i >= 0; i--) {
        if (s.values[i] !== null) {
          var t = Date.parse(s.times[i]);
          if (best === null || t > best) best = t;
          return;
        }
      }
    }
    scan(st.series.gang);
    st.series.ranks.forEach(scan);
    return best;
  }

  function mergeSteps(steps) {
    var s = st.series;
    steps.ranks.forEach(function (r) { s.ranks.set(r.rank, merge(s.ranks.get(r.rank), r)); });
    s.gang = merge(s.gang, steps.gang_median);
    var span = RANGE_MS[s.range], last = lastPoint();
    if (span && last !== null) {
      s.gang = trim(s.gang, last - span);
      s.ranks.forEach(function (v, k) { s.ranks.set(k, trim(v, last - span)); });
    }
    stats.lastSteps = steps.ranks.length;
  }

  function apply(msg) {
    if (msg.sub !== st.sub) return false;
    if (msg.type === "error") { st.note = msg.message; return true; }
    if (msg.type !== "job") return false;
    if (msg.full) {
      setDetail({ job: msg.job, history: msg.history, window: msg.window, ranks: msg.ranks, gang: msg.gang,
                  locality: msg.locality });
      stats.lastRanks = msg.ranks.length;
    } else {
      ["job", "history", "gang", "locality"].forEach(function (k) { if (k in msg) st.detail[k] = msg[k]; });
      (msg.ranks || []).forEach(function (r) { st.ranks.set(r.rank, r); });
      (msg.removed || []).forEach(function (k) { st.ranks.delete(k); });
      st.detail.ranks = Array.from(st.ranks.values()).sort(function (a, b) { return a.rank - b.rank; });
      stats.lastRanks = (msg.ranks || []).length;
    }
    if (msg.steps && st.series) mergeSteps(msg.steps);
    stats.applied += 1;
    return true;
  }

  function subscription() {
    var msg = { subscribe: "job", sub: st.sub, key: st.key };
    if (st.series) {
      var last = lastPoint();
      msg.since = last === null ? st.series.start : new Date(last).toISOString();
      msg.bucket_s = st.series.bucket_s;
    }
    return msg;
  }

  function subscribe() {
    if (!st.socket) {
      var root = document.getElementById("bw-job-page");
      st.socket = BW.live(root.dataset.liveUrl, {
        onOpen: function (api) { api.send(subscription()); },
        onMessage: function (msg) {
          st.pending.push(msg);
          BW.setStore("job-live", { n: stats.applied + st.pending.length, at: msg._received });
        }
      });
      setInterval(function () { BW.setStore("job-clock", Date.now()); }, U.CLOCK_MS);
    } else {
      st.socket.send(subscription());
    }
  }

  /* --- Header, history and locality --------------------------------------------------------- */

  function header(d) {
    var j = d.job, du = U.durations(j, Date.now());
    var facts = [
      ["User", j.user || "—"], ["Tenant", j.tenant || "—"], ["Partition", j.partition || "—"],
      ["QoS", j.qos || "—"], ["Submitted", U.fmtTime(j.submit)], ["Started", U.fmtTime(j.start)],
      ["Ended", U.fmtTime(j.end)], ["Queued", U.fmtDuration(du.queued)], ["Runtime", U.fmtDuration(du.runtime)],
      ["GPUs · nodes", (j.gpu_count % 1 ? j.gpu_count.toFixed(2) : j.gpu_count) + " · " + j.node_count],
      ["Preemptions", String(j.preempt_count)], ["Requeues", String(j.requeue_count)]
    ];
    return compact([
      h("Div", { className: "bw-job-status" }, compact([
        U.stateBadge(j.state, j.state_label, j.colour),
        j.name ? h("Span", { className: "bw-job-name" }, j.name) : null,
        st.note ? h("Span", { className: "bw-error" }, st.note) : null
      ])),
      h("Dl", { className: "bw-job-facts" }, facts.map(function (f) {
        return h("Div", { className: "bw-fact", "data-fact": f[0] }, [h("Dt", {}, f[0]), h("Dd", {}, f[1])]);
      })),
      history(d)
    ]);
  }

  function history(d) {
    var changes = d.history, now = Date.now();
    if (!changes.length) return h("P", { className: "bw-muted" }, "No state changes recorded yet.");
    var ended = d.job.end !== null, segments = changes.map(function (c, i) {
      var t0 = Date.parse(c.time);
      var t1 = i + 1 < changes.length ? Date.parse(changes[i + 1].time) : (ended ? t0 : now);
      var span = Math.max(0, (t1 - t0) / 1000);
      return h("Div", { className: "bw-seg", style: { flexGrow: Math.max(span, 1), background: c.colour },
                        title: c.label + " from " + U.fmtTime(c.time, true) + (t1 > t0 ? " for " + U.fmtDuration(span) : "") });
    });
    return h("Div", { className: "bw-history" }, [
      h("H3", {}, "State history"),
      h("Div", { className: "bw-timeline", role: "img", "aria-label": changes.map(function (c) { return c.label; }).join(", then ") }, segments),
      h("Ol", { className: "bw-history-list" }, changes.map(function (c, i) {
        return h("Li", { key: i }, compact([
          h("Time", { dateTime: c.time }, U.fmtTime(c.time, true)),
          U.stateBadge(c.state, c.label, c.colour),
          c.preemption ? h("Span", { className: "bw-tag" }, "preemption") : null,
          c.requeue ? h("Span", { className: "bw-tag" }, "requeue") : null,
          c.reason ? h("Span", { className: "bw-muted" }, c.reason) : null
        ]));
      }))
    ]);
  }

  function card(kind, title, big, share, note) {
    return h("Div", { className: "bw-card", "data-locality": kind }, compact([
      h("H3", {}, title), h("P", { className: "bw-big" }, big),
      share === undefined ? null : h("Div", { className: "bw-bar" },
        h("Div", { className: "bw-bar-fill", style: { width: share === null ? "0" : Math.round(share * 100) + "%" } })),
      h("P", { className: "bw-bar-label" }, note)
    ]));
  }

  function locality(d) {
    var l = d.locality;
    if (!l.gpus) return [h("P", { className: "bw-muted" }, "No GPUs allocated, so no placement to score.")];
    return [
      card("nvlink", "NVLink", pct(l.nvlink), l.nvlink,
           l.nvlink === null ? "no NVLink domain known for these nodes" : "of the gang in its largest NVLink domain"),
      card("leaf", "Leaf switch", pct(l.leaf), l.leaf,
           l.leaf === null ? "no leaf known for these nodes" : "of the gang under its most common leaf"),
      card("racks", "Racks", String(l.racks), undefined, "racks the gang spans"),
      card("size", "Nodes · GPUs", l.nodes + " · " + l.gpus, undefined, "placed in the topology")
    ];
  }

  function gangLine(d) {
    var g = d.gang, w = d.window;
    var span = w ? Math.round((Date.parse(w.end) - Date.parse(w.start)) / 60000) + " min to " + U.fmtTime(w.end) : "";
    if (!g.ranks_reporting) return "No step times in the " + span + ". Training jobs report them per rank to /api/v1/training.";
    var parts = ["Gang median step " + U.fmtNum(g.median_step_time_s, 3, "s"), "MAD " + U.fmtNum(g.mad_s, 3, "s"),
                 g.threshold_s === null ? "too few ranks to call stragglers" : "straggler above " + U.fmtNum(g.threshold_s, 3, "s"),
                 g.ranks_reporting + " of " + d.ranks.length + " ranks reporting",
                 g.stragglers.length ? g.stragglers.length + " straggler" + (g.stragglers.length > 1 ? "s" : "") +
                   ": rank " + g.stragglers.join(", ") : "no stragglers"];
    return parts.join(" · ") + " (medians over the " + span + ")";
  }

  /* --- The gang on the topology ------------------------------------------------------------- */

  function cmp(a, b) { return a < b ? -1 : a > b ? 1 : 0; }
  function orLast(v) { return v === null || v === undefined ? "\uffff" : v; }

  /* Nodes grouped leaf > rack > NVLink domain, racks one blank column apart. */
  function nodeColumns(placed) {
    var nodes = new Map();
    placed.forEach(function (r) {
      if (!nodes.has(r.host)) nodes.set(r.host, { host: r.host, rack: r.rack, nvl: r.nvlink_domain, leaf: r.leaf, ranks: [] });
      nodes.get(r.host).ranks.push(r);
    });
    var list = Array.from(nodes.values()).sort(function (a, b) {
      return cmp(orLast(a.leaf), orLast(b.leaf)) || cmp(orLast(a.rack), orLast(b.rack)) ||
        cmp(orLast(a.nvl), orLast(b.nvl)) || cmp(a.host, b.host);
    });
    var x = 0;
    list.forEach(function (n, i) {
      if (i && n.rack !== list[i - 1].rack) x += 1;
      n.x = x++;
    });
    return { nodes: list, width: x };
  }

  function runs(nodes, field) {
    var out = [];
    nodes.forEach(function (n) {
      var last = out[out.length - 1];
      if (last && last.value === n[field]) last.x1 = n.x;
      else out.push({ value: n[field], x0: n.x, x1: n.x });
    });
    return out;
  }

  function bands(nodes) {
    var levels = [["Leaf", "leaf"], ["NVLink", "nvl"], ["Rack", "rack"]], shapes = [], notes = [];
    levels.forEach(function (level, i) {
      var off = 12 + (levels.length - 1 - i) * 24;
      notes.push({ x: 0, xref: "paper", xanchor: "right", xshift: -8, y: 1, yref: "paper", yanchor: "bottom",
                   yshift: off - 4, text: "<b>" + level[0] + "</b>", showarrow: false, font: { size: 11, color: "#39424e" } });
      runs(nodes, level[1]).forEach(function (r) {
        shapes.push({ type: "line", xref: "x", yref: "paper", ysizemode: "pixel", yanchor: 1, x0: r.x0 - 0.45,
                      x1: r.x1 + 0.45, y0: off, y1: off, line: { color: "#5f6b78", width: 2 } });
        notes.push({ x: (r.x0 + r.x1) / 2, xref: "x", y: 1, yref: "paper", yanchor: "bottom", yshift: off,
                     text: r.value === null || r.value === undefined ? "unknown" : r.value, showarrow: false,
                     font: { size: 11, color: "#1c2530" } });
      });
    });
    return { shapes: shapes, annotations: notes };
  }

  function tooltip(r) {
    return "<b>Rank " + r.rank + "</b> · " + r.host + " · GPU " + r.gpu_index + (r.straggler ? " · <b>straggler</b>" : "") +
      "<br>Rack " + (r.rack || "—") + " · NVLink " + (r.nvlink_domain || "—") + " · leaf " + (r.leaf || "—") +
      "<br>Util " + U.fmtNum(r.gpu_util, 0, "%") + " · " + U.fmtNum(r.gpu_temp, 0, "°C") + " · " +
      U.fmtNum(r.power_w, 0, "W") + " · " + (r.health_label || r.health) + (r.health_detail ? " (" + r.health_detail + ")" : "") +
      "<br>Step " + U.fmtNum(r.step_time_s, 3, "s") +
      (r.step_time_ratio === null ? "" : " (" + r.step_time_ratio.toFixed(2) + "× gang median)");
  }

  function cividis() {
    return CIVIDIS.map(function (c, i) { return [i / (CIVIDIS.length - 1), c]; });
  }

  function placementHeight(gpusPerNode) { return Math.max(220, gpusPerNode * 32 + 230); }

  /* The graph is responsive (fills its box), so its box gets the figure's height. */
  function placementStyle(fig) { return { height: (fig.layout.height || 220) + "px" }; }

  function placement(d) {
    var placed = d.ranks.filter(function (r) { return r.host; });
    if (!placed.length) {
      return U.emptyFigure(d.job.state === "pending" ? "Not placed yet: the job is waiting in the queue."
                                                     : "No GPU allocations recorded for this job.");
    }
    var cols = nodeColumns(placed), W = cols.width, H = 1, y, x;
    placed.forEach(function (r) { H = Math.max(H, (r.gpu_index || 0) + 1); });
    var z = [], base = [], label = [], tip = [];
    for (y = 0; y < H; y++) {
      z.push(new Array(W).fill(null)); base.push(new Array(W).fill(null));
      label.push(new Array(W).fill("")); tip.push(new Array(W).fill(""));
    }
    var shapes = [], anyMissing = false;
    cols.nodes.forEach(function (n) {
      n.ranks.forEach(function (r, i) {
        y = r.gpu_index === null ? i : r.gpu_index; x = n.x;
        base[y][x] = 0;
        label[y][x] = String(r.rank);
        tip[y][x] = tooltip(r);
        if (r.step_time_ratio === null) anyMissing = true;
        else z[y][x] = Math.min(RATIO[1], Math.max(RATIO[0], r.step_time_ratio));
        if (r.straggler) {
          shapes.push({ type: "rect", xref: "x", yref: "y", x0: x - 0.47, x1: x + 0.47, y0: y - 0.47, y1: y + 0.47,
                        line: { color: VERMILLION, width: 3 } });
        }
      });
    });
    var showText = W <= LABEL_MAX_COLUMNS ? "%{text}" : "";
    var ticks = [];
    for (var t = RATIO[0]; t <= RATIO[1] + 1e-9; t += 0.1) ticks.push(Math.round(t * 10) / 10);
    var band = bands(cols.nodes);
    var data = [
      { type: "heatmap", z: base, text: label, customdata: tip, texttemplate: showText, hovertemplate: "%{customdata}<extra></extra>",
        colorscale: [[0, NO_DATA], [1, NO_DATA]], showscale: false, xgap: 3, ygap: 3, hoverongaps: false, name: "ranks" },
      { type: "heatmap", z: z, text: label, texttemplate: showText, hoverinfo: "skip", zmin: RATIO[0], zmax: RATIO[1],
        colorscale: cividis(), xgap: 3, ygap: 3, hoverongaps: false, name: "step time",
        colorbar: { title: { text: "Step time ÷ gang median (×)", side: "right" }, tickvals: ticks,
                    ticktext: ticks.map(function (v, i) { return (i === ticks.length - 1 ? "≥" : "") + v.toFixed(1) + "×"; }) } },
      { type: "scatter", x: [null], y: [null], mode: "markers", name: "Straggler (outlined)", hoverinfo: "skip", showlegend: true,
        marker: { symbol: "square-open", size: 14, color: VERMILLION, line: { width: 3 } } }
    ];
    if (anyMissing) {
      data.push({ type: "scatter", x: [null], y: [null], mode: "markers", name: "No step time", hoverinfo: "skip", showlegend: true,
                  marker: { symbol: "square", size: 14, color: NO_DATA } });
    }
    var rows = [];
    for (y = 0; y < H; y++) rows.push(y);
    return {
      data: data,
      layout: {
        height: placementHeight(H), margin: { l: 70, r: 10, t: 92, b: 110 }, uirevision: st.key,
        xaxis: { tickvals: cols.nodes.map(function (n) { return n.x; }), ticktext: cols.nodes.map(function (n) { return n.host; }),
                 tickangle: cols.nodes.length > 6 ? -45 : 0, range: [-0.5, W - 0.5], showgrid: false, zeroline: false, fixedrange: false },
        yaxis: { tickvals: rows, ticktext: rows.map(function (i) { return "GPU " + i; }), autorange: "reversed",
                 showgrid: false, zeroline: false },
        shapes: band.shapes.concat(shapes), annotations: band.annotations,
        showlegend: true, legend: { orientation: "h", x: 0, xref: "container", y: 0, yanchor: "bottom", yref: "container" },
        plot_bgcolor: "#ffffff", paper_bgcolor: "#ffffff", hoverlabel: { align: "left" }
      }
    };
  }

  /* --- The rank table ------------------------------------------------------------------------ */

  var RANK_COLUMNS = [["Rank", "is-num"], ["Host", ""], ["GPU", "is-num"], ["Rack", ""], ["NVLink", ""], ["Leaf", ""],
    ["Util", "is-num"], ["Temp", "is-num"], ["Power", "is-num"], ["Health", ""], ["Step time", "is-num"],
    ["÷ median", "is-num"], ["", ""]];

  function rankRow(r) {
    var status = r.straggler ? h("Span", { className: "bw-badge bw-straggler", title: "Median step time above the gang's straggler threshold" }, "straggler")
      : (r.steps ? "" : h("Span", { className: "bw-muted" }, "no steps"));
    var cells = [
      h("Td", { className: "is-num" }, String(r.rank)),
      h("Td", {}, r.host ? h("A", { href: "/nodes/" + encodeURIComponent(r.host) + "/" }, r.host) : "—"),
      h("Td", { className: "is-num" }, r.gpu_uuid ? h("A", { href: "/gpus/" + encodeURIComponent(r.gpu_uuid) + "/", title: r.gpu_uuid },
                                                    String(r.gpu_index)) : (r.gpu_index === null ? "—" : String(r.gpu_index))),
      h("Td", {}, r.rack || "—"), h("Td", {}, r.nvlink_domain || "—"), h("Td", {}, r.leaf || "—"),
      h("Td", { className: "is-num" }, U.fmtNum(r.gpu_util, 0, "%")),
      h("Td", { className: "is-num" }, U.fmtNum(r.gpu_temp, 0, "°C")),
      h("Td", { className: "is-num" }, U.fmtNum(r.power_w, 0, "W")),
      h("Td", {}, h("Span", { className: "bw-health", "data-health": r.health, title: r.health_detail || "",
                              style: { "--health-colour": r.health_colour } },
                    [h("Span", { className: "bw-state-dot", "aria-hidden": "true" }),
                     (r.health_label || r.health) + (r.health_detail ? " · " + r.health_detail : "")])),
      h("Td", { className: "is-num" }, U.fmtNum(r.step_time_s, 3, "s")),
      h("Td", { className: "is-num" }, r.step_time_ratio === null ? "—" : r.step_time_ratio.toFixed(2) + "×"),
      h("Td", {}, status)
    ];
    return h("Tr", { key: r.rank, "data-rank": String(r.rank), className: "bw-rank-row" + (r.straggler ? " is-straggler" : "") }, cells);
  }

  function rankTable(d) {
    if (!d.ranks.length) return h("P", { className: "bw-empty" }, "No ranks: the job holds no GPUs and reported no steps.");
    return h("Table", { className: "bw-table bw-ranks-table" }, [
      h("Thead", {}, h("Tr", {}, RANK_COLUMNS.map(function (c) { return h("Th", { scope: "col", className: c[1] }, c[0]); }))),
      h("Tbody", {}, d.ranks.map(rankRow))
    ]);
  }

  /* --- Step time per rank -------------------------------------------------------------------- */

  function stepsFigure() {
    var s = st.series;
    if (!s) return U.emptyFigure("Loading step times…", 320);
    var stragglers = new Set(st.detail.gang.stragglers), data = [], ox = [], oy = [], oc = [], n = 0;
    s.ranks.forEach(function (v, rank) {
      if (stragglers.has(rank)) return;
      n += 1;
      for (var i = 0; i < v.times.length; i++) { ox.push(plotTime(v.times[i])); oy.push(v.values[i]); oc.push(rank); }
      ox.push(null); oy.push(null); oc.push(null);  // one trace for every other rank, broken between ranks
    });
    if (n) {
      data.push({ type: "scatter", mode: "lines", x: ox, y: oy, customdata: oc, name: "Other ranks (" + n + ")",
                  line: { color: OTHERS, width: 1 }, opacity: 0.55, connectgaps: false,
                  hovertemplate: "Rank %{customdata}: %{y:.3f} s<extra></extra>" });
    }
    if (s.gang.times.length) {
      data.push({ type: "scatter", mode: "lines", x: s.gang.times.map(plotTime), y: s.gang.values, name: "Gang median",
                  line: { color: "#000000", width: 2.5, dash: "dash" }, hovertemplate: "Gang median: %{y:.3f} s<extra></extra>" });
    }
    Array.from(stragglers).sort(function (a, b) { return a - b; }).forEach(function (rank, i) {
      var v = s.ranks.get(rank);
      if (!v) return;
      data.push({ type: "scatter", mode: "lines", x: v.times.map(plotTime), y: v.values, name: "Rank " + rank + " (straggler)",
                  line: { color: HIGHLIGHT[i % HIGHLIGHT.length], width: 2.5 },
                  hovertemplate: "Rank " + rank + " (straggler): %{y:.3f} s<extra></extra>" });
    });
    if (!data.length) return U.emptyFigure("No step times reported in this range.", 320);
    return { data: data, layout: {
      height: 360, margin: { l: 60, r: 10, t: 10, b: 40 }, uirevision: st.key + ":" + s.range, hovermode: "closest",
      xaxis: { type: "date", title: { text: "Time (UTC)" } },
      yaxis: { title: { text: "Step time (s)" }, rangemode: "tozero" },
      legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
      plot_bgcolor: "#ffffff", paper_bgcolor: "#ffffff"
    } };
  }

  /* --- The callback -------------------------------------------------------------------------- */

  function loading() {
    return [h("P", { className: "bw-muted" }, "Loading the job…"), [], U.emptyFigure("Loading…", 200), { height: "200px" },
            "", "", U.emptyFigure("Loading…", 200)];
  }

  function afterRender() {
    U.afterPaint("job-ranks", function () {
      subscribe();
      if (stats.renderedAt === null) stats.renderedAt = performance.now();
    });
  }

  var dc = (window.dash_clientside = window.dash_clientside || {});
  dc.breakwater = Object.assign(dc.breakwater || {}, {
    jobRender: function (data, series, _live, _clock) {
      var nu = window.dash_clientside.no_update, which = U.triggered(), none = [nu, nu, nu, nu, nu, nu, nu];
      if (which.indexOf("job-data") >= 0 || (!st.loaded && data)) {
        if (!data) {
          st.missing = true;
          return [h("P", { className: "bw-error" }, "No such job."), [], U.emptyFigure("", 120), nu, "", "",
                  U.emptyFigure("", 120)];
        }
        setDetail(data);
        st.loaded = true;
        st.sub += 1;
      }
      if (which.indexOf("job-series") >= 0 && series && st.loaded) {
        loadSeries(series);
        st.sub += 1;
        st.pending = [];
        afterRender();
      }
      if (which.indexOf("job-live") >= 0) {
        var changed = false;
        st.pending.splice(0).forEach(function (msg) { changed = apply(msg) || changed; });
        if (!changed) return none;
      }
      if (!st.loaded) return st.missing ? none : loading();
      var d = st.detail;
      if (which.length === 1 && which[0] === "job-clock") return [header(d), nu, nu, nu, nu, nu, nu];
      var fig = placement(d);
      return [header(d), locality(d), fig, placementStyle(fig), gangLine(d), rankTable(d), stepsFigure()];
    }
  });
})();
