/* Fleet page: keeps the server-rendered numbers live over /ws/fleet/.
 *
 * The server renders every number first, so the page is right without JavaScript. This file
 * then (1) opens the websocket with BW.live (live.js: reconnect with jittered backoff, the
 * header's status dot), (2) re-renders every [data-bind] element from each pushed summary with
 * the same formats the template uses, and (3) ticks the "newest sample" age every second from the
 * server-computed age plus local elapsed time, so a wrong browser clock cannot skew it. The
 * consumer (dashboard/consumers/fleet.py) sends the whole summary on connect and on every
 * publish; the page sends nothing. No polling.
 */
(function () {
  "use strict";
  var BW = window.BW;

  var root = document.querySelector("[data-live-url]");
  var initial = document.getElementById("bw-fleet-summary");
  if (!root || !initial) return;

  var age = { seconds: null, at: 0, staleAfter: Infinity };

  function group(v, digits) {
    return v.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
  }

  // Must match the template filters in fleet.html.
  var FORMATS = {
    int: function (v) { return group(Math.round(v), 0); },
    dec1: function (v) { return group(v, 1); },
    dec2: function (v) { return group(v, 2); },
    pct: function (v) { return v.toFixed(1) + "%"; },
    kw: function (v) { return group(v, 1) + " kW"; },
    time: function (v) { return v.slice(0, 10) + " " + v.slice(11, 19) + " UTC"; },
    text: String
  };

  // Must match the rows fleet.html renders.
  var LISTS = {
    "faults.newest": function (events) {
      if (!events.length) return '<tr class="bw-empty"><td colspan="6">No fault events.</td></tr>';
      return events.map(function (ev) {
        var uuid = ev.gpu_uuid.length > 16 ? ev.gpu_uuid.slice(0, 15) + "…" : ev.gpu_uuid;
        var what = (ev.kind === "xid" ? "XID " + ev.code : ev.kind) + (ev.count > 1 ? " ×" + ev.count : "");
        return "<tr><td>" + BW.esc(ev.last_seen.slice(11, 19)) + '</td><td><a href="/nodes/' + encodeURIComponent(ev.host) +
          '/">' + BW.esc(ev.host) + '</a></td><td><a href="/gpus/' + encodeURIComponent(ev.gpu_uuid) + '/">' + BW.esc(uuid) +
          "</a></td><td>" + BW.esc(what) + "</td><td>" + BW.esc(ev.meaning) + '</td><td><span class="bw-sev bw-sev-' +
          BW.esc(ev.severity) + '">' + BW.esc(ev.severity) + "</span></td></tr>";
      }).join("");
    },
    "anomalies.top": function (rows) {
      if (!rows.length) return '<tr class="bw-empty"><td colspan="5">No open anomalies.</td></tr>';
      return rows.map(function (a) {
        var id = a.label.length > 24 ? a.label.slice(0, 23) + "…" : a.label;
        var entity = a.url ? '<a href="' + BW.esc(a.url) + '">' + BW.esc(id) + "</a>" : BW.esc(id);
        var shown = a.host && a.entity_kind !== "rack" && a.entity_kind !== "port";
        var host = shown ? ' <span class="bw-muted">' + BW.esc(a.host) + "</span>" : "";
        return "<tr><td>" + BW.esc(a.started_at.slice(11, 19)) + "</td><td>" + entity + host + "</td><td>" +
          BW.esc(a.kind_label) + "</td><td>" + BW.esc(a.summary) + "</td><td>" + a.score.toFixed(2) + "</td></tr>";
      }).join("");
    },
    "anomalies.at_risk": function (rows) {
      if (!rows.length) return '<tr class="bw-empty"><td colspan="3">No GPU above 5% risk.</td></tr>';
      return rows.map(function (g) {
        var id = g.uuid.length > 24 ? g.uuid.slice(0, 23) + "…" : g.uuid;
        return '<tr><td><a href="' + BW.esc(g.url) + '">' + BW.esc(id) + '</a></td><td><a href="/nodes/' +
          encodeURIComponent(g.host) + '/">' + BW.esc(g.host) + "</a></td><td>" + (g.version === "failed" ? '<span data-health="failed">failed</span>' : Math.round(g.risk * 100) + "%") + "</td></tr>";
      }).join("");
    }
  };

  function formatAge(s) {
    if (s === null) return "no samples yet";
    if (s < 0) return "in the future";
    if (s < 120) return Math.round(s) + " s ago";
    if (s < 7200) return Math.round(s / 60) + " min ago";
    if (s < 172800) return Math.round(s / 3600) + " h ago";
    return Math.round(s / 86400) + " d ago";
  }

  function lookup(obj, path) {
    return path.split(".").reduce(function (o, key) {
      return o === null || o === undefined ? undefined : o[key];
    }, obj);
  }

  function render(summary) {
    root.querySelectorAll("[data-bind]").forEach(function (el) {
      var v = lookup(summary, el.dataset.bind);
      var format = FORMATS[el.dataset.fmt || "text"];
      el.textContent = v === null || v === undefined ? (el.dataset.empty || "—") : format(v);
    });
    root.querySelectorAll("[data-bind-width]").forEach(function (el) {
      var v = lookup(summary, el.dataset.bindWidth);
      el.style.width = (v === null || v === undefined ? 0 : Math.min(100, Math.max(0, v))) + "%";
    });
    root.querySelectorAll("[data-list]").forEach(function (el) {
      var rows = lookup(summary, el.dataset.list);
      if (!Array.isArray(rows) || !LISTS[el.dataset.list]) return;
      // Morphed in place (patch.js): a link the operator focused or text they selected survives the push.
      if (BW.patch) BW.patch.morphInner(el, LISTS[el.dataset.list](rows));
      else el.innerHTML = LISTS[el.dataset.list](rows);
    });
    root.querySelectorAll("[data-zero]").forEach(function (el) {
      el.classList.toggle("is-zero", !lookup(summary, el.dataset.zero));
    });
    var newest = summary.newest_sample || {};
    age = {
      seconds: newest.age_s === undefined ? null : newest.age_s,
      at: performance.now(),
      staleAfter: summary.stale_after_s || Infinity
    };
    tick();
  }

  function tick() {
    var s = age.seconds === null ? null : age.seconds + (performance.now() - age.at) / 1000;
    root.querySelectorAll("[data-age]").forEach(function (el) {
      el.textContent = formatAge(s);
      el.classList.toggle("is-old", s !== null && s > age.staleAfter);
    });
  }

  render(JSON.parse(initial.textContent));
  setInterval(tick, 1000);
  BW.live(root.dataset.liveUrl, {
    onMessage: function (summary) {
      try {
        render(summary);
      } catch (err) {
        console.error("breakwater: bad fleet message", err);
      }
    }
  });
})();
