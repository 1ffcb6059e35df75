/* Jobs list: the table of jobs, its filters and paging, kept live by /ws/jobs/.
 *
 * Also the helpers the job page (job.js) shares: Dash component builders, formats, state badges.
 *
 * The Dash app `jobs` (dashboard/dash_apps/jobs.py) loads one page of `job_list` for the query
 * that jobsQuery builds from the controls; jobsRender draws it as an HTML table (Dash component
 * JSON, so React escapes every value). Once drawn, the page subscribes to the websocket with
 * the same query; the consumer then sends only rows that changed or appeared, the keys that
 * left the page and the new order when it moved. Messages are queued here and the "jobs-live"
 * store only carries a counter, so two messages landing before Dash runs the callback are both
 * applied. Queued time and runtime come from the job's times and the browser's clock, redrawn
 * every 30 s without asking the server for anything.
 */
(function () {
  "use strict";
  var BW = (window.BW = window.BW || {});
  var CLOCK_MS = 30000;

  /* --- Shared helpers (BW.jobsUtil) --------------------------------------------------------- */

  function h(type, props, children) {
    var p = Object.assign({}, props || {});
    if (children !== undefined) p.children = children;
    return { type: type, namespace: "dash_html_components", props: p };
  }

  function ms(iso) { return iso ? Date.parse(iso) : null; }

  var pad = function (n) { return (n < 10 ? "0" : "") + n; };

  /* "2026-11-30 12:04 UTC"; the console's users span time zones, so UTC everywhere. */
  function fmtTime(iso, withSeconds) {
    if (!iso) return "—";
    var d = new Date(iso);
    return d.getUTCFullYear() + "-" + pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate()) + " " +
      pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + (withSeconds ? ":" + pad(d.getUTCSeconds()) : "") + " UTC";
  }

  /* "11-30 12:04", for a table column headed "(UTC)"; the full time is the cell's title. */
  function fmtShortTime(iso) {
    if (!iso) return "—";
    var d = new Date(iso);
    return pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate()) + " " + pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes());
  }

  /* "45 s", "4 min", "2 h 5 min", "3 d 4 h". */
  function fmtDuration(s) {
    if (s === null || s === undefined || isNaN(s)) return "—";
    s = Math.max(0, Math.round(s));
    if (s < 60) return s + " s";
    var m = Math.floor(s / 60);
    if (m < 60) return m + " min";
    var hr = Math.floor(m / 60);
    if (hr < 24) return hr + " h" + (m % 60 ? " " + (m % 60) + " min" : "");
    var d = Math.floor(hr / 24);
    return d + " d" + (hr % 24 ? " " + (hr % 24) + " h" : "");
  }

  function fmtNum(v, digits, unit) {
    if (v === null || v === undefined) return "—";
    return Number(v).toFixed(digits) + (unit ? " " + unit : "");
  }

  var ENDED = { completed: 1, failed: 1, cancelled: 1, preempted: 1, timeout: 1, node_fail: 1 };

  /* Queued time and runtime at `now`, by the selector's rule (telemetry.selectors.jobs.job_fields). */
  function durations(job, now) {
    var submit = ms(job.submit), start = ms(job.start), end = ms(job.end), queued = null, runtime = null;
    if (submit !== null) {
      var until = start !== null ? start : (job.state === "pending" ? now : end);
      queued = until === null ? null : Math.max(0, (until - submit) / 1000);
    }
    if (start !== null) {
      var stop = end !== null ? end : (ENDED[job.state] ? null : now);
      runtime = stop === null ? null : Math.max(0, (stop - start) / 1000);
    }
    return { queued: queued, runtime: runtime };
  }

  /* A state is never told by colour alone: the dot carries the colour, the label the meaning. */
  function stateBadge(state, label, colour) {
    return h("Span", { className: "bw-state", "data-state": state, style: { "--state-colour": colour } }, [
      h("Span", { className: "bw-state-dot", "aria-hidden": "true" }), label
    ]);
  }

  function jobHref(key) { return "/jobs/" + encodeURIComponent(key) + "/"; }

  function emptyFigure(text, height) {
    return { data: [], layout: { height: height || 160, xaxis: { visible: false }, yaxis: { visible: false },
      margin: { l: 10, r: 10, t: 10, b: 10 }, plot_bgcolor: "#ffffff", paper_bgcolor: "#ffffff",
      annotations: [{ text: text, showarrow: false, x: 0.5, y: 0.5, xref: "paper", yref: "paper",
                      font: { size: 14, color: "#5f6b78" } }] } };
  }

  function triggered() {
    var ctx = window.dash_clientside.callback_context;
    return (ctx && ctx.triggered ? ctx.triggered : []).map(function (t) { return t.prop_id.split(".")[0]; });
  }

  /* Call `fn` once the element `id` is in the page and the browser has painted it. */
  function afterPaint(id, fn) {
    requestAnimationFrame(function wait() {
      if (!document.getElementById(id)) { requestAnimationFrame(wait); return; }
      requestAnimationFrame(fn);
    });
  }

  BW.jobsUtil = { h: h, ms: ms, fmtTime: fmtTime, fmtDuration: fmtDuration, fmtNum: fmtNum, durations: durations,
                  stateBadge: stateBadge, jobHref: jobHref, emptyFigure: emptyFigure, triggered: triggered,
                  afterPaint: afterPaint, CLOCK_MS: CLOCK_MS };

  /* --- The list ------------------------------------------------------------------------------ */

  var st = { sub: 0, query: null, limit: 50, offset: 0, total: 0, rows: new Map(), order: [], loaded: false,
             socket: null, pending: [], clock: null };
  var stats = (BW.jobsStats = { applied: 0, lastRows: 0, renderedAt: null });

  var COLUMNS = [
    ["Job", ""], ["Name", ""], ["User", ""], ["Tenant", ""], ["Partition", ""], ["State", ""],
    ["GPUs", "is-num"], ["Nodes", "is-num"], ["Submitted (UTC)", ""], ["Queued", "is-num"], ["Runtime", "is-num"],
    ["Preempt.", "is-num", "Preemptions (and requeues)"]
  ];

  function row(job, now) {
    var d = durations(job, now);
    var preempt = String(job.preempt_count) + (job.requeue_count ? " · " + job.requeue_count + " requeued" : "");
    var cells = [
      h("Td", {}, h("A", { href: jobHref(job.key), className: "bw-job-key" }, job.key)),
      h("Td", { className: "bw-ellipsis", title: job.name }, job.name || "—"),
      h("Td", {}, job.user || "—"),
      h("Td", {}, job.tenant || "—"),
      h("Td", {}, job.partition || "—"),
      h("Td", {}, [stateBadge(job.state, job.state_label, job.colour)].concat(
        job.gpu_health && job.gpu_health.not_ok ? [" ", h("Span", {
          className: "bw-badge", "data-health": job.gpu_health.health, title: job.gpu_health.health_detail,
          style: { "--badge": job.gpu_health.health_colour } },
          job.gpu_health.not_ok + " GPU" + (job.gpu_health.not_ok > 1 ? "s " : " ") + job.gpu_health.health_label.toLowerCase())] : [])),
      h("Td", { className: "is-num" }, job.gpu_count % 1 ? job.gpu_count.toFixed(2) : String(job.gpu_count)),
      h("Td", { className: "is-num" }, String(job.node_count)),
      h("Td", { className: "bw-nowrap", title: fmtTime(job.submit, true) }, fmtShortTime(job.submit)),
      h("Td", { className: "is-num bw-nowrap" }, fmtDuration(d.queued)),
      h("Td", { className: "is-num bw-nowrap" }, fmtDuration(d.runtime)),
      h("Td", { className: "is-num" }, preempt)
    ];
    return h("Tr", { key: job.key, "data-key": job.key, className: "bw-job-row" }, cells);
  }

  function table() {
    if (!st.order.length) {
      return h("P", { className: "bw-empty" }, st.query && (st.query.state || st.query.account || st.query.user ||
        st.query.partition || st.query.q) ? "No jobs match these filters." :
        "No jobs yet. They appear here as soon as a scheduler sync or the jobs API reports them.");
    }
    var now = Date.now();
    return h("Table", { className: "bw-table bw-jobs-table" }, [
      h("Thead", {}, h("Tr", {}, COLUMNS.map(function (c) {
        return h("Th", { scope: "col", className: c[1], title: c[2] || c[0] }, c[0]);
      }))),
      h("Tbody", {}, st.order.map(function (key) { return row(st.rows.get(key), now); }))
    ]);
  }

  function countText() {
    if (!st.total) return "No jobs";
    var first = st.offset + 1, last = st.offset + st.order.length;
    return "Jobs " + first.toLocaleString("en") + "–" + last.toLocaleString("en") + " of " +
      st.total.toLocaleString("en");
  }

  function load(data) {
    st.query = data.query;
    st.limit = data.query.limit || data.limit;
    st.offset = data.offset;
    st.total = data.total;
    st.rows = new Map(data.jobs.map(function (j) { return [j.key, j]; }));
    st.order = data.jobs.map(function (j) { return j.key; });
    st.loaded = true;
    st.sub += 1;
    st.pending = [];
  }

  function apply(msg) {
    if (msg.type !== "list" || msg.sub !== st.sub) return false;
    (msg.rows || []).forEach(function (r) { st.rows.set(r.key, r); });
    (msg.removed || []).forEach(function (k) { st.rows.delete(k); });
    if (msg.order) st.order = msg.order;
    st.order = st.order.filter(function (k) { return st.rows.has(k); });
    if (typeof msg.total === "number") st.total = msg.total;
    stats.applied += 1;
    stats.lastRows = (msg.rows || []).length;
    return true;
  }

  var FILTERS = ["state", "account", "user", "partition", "q"];

  /* The list filters named in an address's query string; anything else is ignored. */
  function urlFilters(search) {
    var params = new URLSearchParams(search || ""), out = {};
    FILTERS.forEach(function (k) { var v = (params.get(k) || "").trim(); if (v) out[k] = v; });
    return out;
  }

  function subscription() {
    var q = st.query || {};
    return { subscribe: "list", sub: st.sub, state: q.state || "", account: q.account || "", user: q.user || "",
             partition: q.partition || "", q: q.q || "", limit: st.limit, offset: st.offset };
  }

  function subscribe() {
    if (!st.socket) {
      var root = document.getElementById("bw-jobs-page");
      st.socket = BW.live(root.dataset.liveUrl, {
        onOpen: function (api) { api.send(subscription()); },
        onMessage: function (msg) {
          st.pending.push(msg);
          BW.setStore("jobs-live", { n: stats.applied + st.pending.length, at: msg._received });
        }
      });
      st.clock = setInterval(function () { BW.setStore("jobs-clock", Date.now()); }, CLOCK_MS);
    } else {
      st.socket.send(subscription());
    }
  }

  var dc = (window.dash_clientside = window.dash_clientside || {});
  dc.breakwater = Object.assign(dc.breakwater || {}, {
    /* The address's filters into the controls (a linked or reloaded /jobs/?q=…), once, when the first
       page (read with those filters already) has filled the dropdowns' choices. */
    jobsFromUrl: function (data, search) {
      var nu = window.dash_clientside.no_update;
      if (!data || st.urlApplied) return [nu, nu, nu, nu, nu];
      st.urlApplied = true;
      var f = urlFilters(search);
      return [f.state || null, f.account || null, f.user || "", f.partition || null, f.q || ""];
    },

    jobsQuery: function (state, account, user, partition, q, _prev, _next, current) {
      var which = triggered(), offset = current ? current.offset || 0 : 0;
      if (which.indexOf("jobs-prev") >= 0) offset = Math.max(0, offset - st.limit);
      else if (which.indexOf("jobs-next") >= 0) offset = offset + st.limit;
      else offset = 0;  // a filter changed: back to the first page
      var query = { state: state || "", account: account || "", user: user || "", partition: partition || "",
                    q: q || "", offset: offset };
      // The first query, before the controls hold the address's filters, already asks for them, so
      // a linked list is read once, not first unfiltered.
      if (!current) Object.assign(query, urlFilters(location.search));
      if (current && FILTERS.every(function (k) { return (current[k] || "") === query[k]; }) &&
          (current.offset || 0) === offset) {
        return window.dash_clientside.no_update;  // the controls caught up with the address: nothing new
      }
      var params = new URLSearchParams();
      FILTERS.forEach(function (k) { if (query[k]) params.set(k, query[k]); });
      var search = params.toString() ? "?" + params.toString() : "";
      if (search !== location.search) history.replaceState(history.state, "", location.pathname + search);
      return query;
    },

    jobsRender: function (data, _live, _clock) {
      var nu = window.dash_clientside.no_update, which = triggered();
      if (which.indexOf("jobs-data") >= 0 || (!st.loaded && data)) {
        if (!data) return [nu, nu, nu, nu];
        load(data);
        afterPaint("jobs-table", function () {
          subscribe();
          if (stats.renderedAt === null) stats.renderedAt = performance.now();
        });
      } else if (which.indexOf("jobs-live") >= 0) {
        var changed = false;
        st.pending.splice(0).forEach(function (msg) { changed = apply(msg) || changed; });
        if (!changed) return [nu, nu, nu, nu];
      } else if (!st.loaded) {
        return [h("P", { className: "bw-muted" }, "Loading jobs…"), "", true, true];
      }
      return [table(), countText(), st.offset <= 0, st.offset + st.order.length >= st.total];
    }
  });
})();
