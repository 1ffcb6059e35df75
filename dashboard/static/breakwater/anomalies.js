/* The Anomalies page: the event table and the open-per-detector chart, kept live by /ws/anomalies/.
 *
 * The server renders the page for its GET filters (templates/anomalies.html); this script draws
 * the chart from the #bw-anom-figure JSON with the locally served plotly.js, subscribes with the
 * same filters, and redraws the rows and the chart whenever the consumer pushes a changed list.
 * Rows arrive shaped for display (entity names, chips with units, colours: anomaly.display and
 * dashboard.pages.anomalies.display_row),
 * so this file only builds the same markup as templates/partials/anomalies.html, with textContent
 * so every value is escaped. Changing a filter reloads the page (plain GET form), which keeps
 * every view of the list a shareable URL.
 */
(function () {
  "use strict";
  var BW = (window.BW = window.BW || {});
  var root = document.getElementById("bw-anomalies-page");
  if (!root) return;  // the 400 page: a bad filter, nothing to draw

  var stats = (BW.anomaliesStats = { applied: 0, rows: 0, chartDrawn: false });
  var sub = 1;
  var chart = document.getElementById("bw-anom-chart");
  var CONFIG = { responsive: true, displaylogo: false, displayModeBar: false };

  function drawChart(figure) {
    if (!window.Plotly || !chart || !figure) return;
    window.Plotly.react(chart, figure.data, figure.layout, CONFIG).then(function () {
      chart.setAttribute("data-rendered", "true");
      stats.chartDrawn = true;
    });
  }

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (name) {
      if (name === "text") node.textContent = attrs[name];
      else if (name === "style") Object.keys(attrs.style).forEach(function (p) { node.style.setProperty(p, attrs.style[p]); });
      else node.setAttribute(name, attrs[name]);
    });
    (children || []).forEach(function (child) { if (child) node.appendChild(child); });
    return node;
  }

  function link(href, text) {
    return href ? el("a", { href: href, text: text }) : document.createTextNode(text);
  }

  function row(a, columns) {
    var until = a.until_text ? [document.createTextNode(a.until_text)] :
      [el("span", { "class": "bw-anom-open", text: "open" }),
       el("div", { "class": "bw-muted bw-small", text: "seen " + a.last_seen_text })];
    var chips = a.chips.map(function (c) {
      return el("span", { "class": "bw-anom-chip", "data-level": c.level, style: { "--dev": c.colour }, text: c.text });
    });
    var cells = [
      el("td", { "class": "bw-anom-when", title: a.since_title, text: a.since_text }),
      el("td", { "class": "bw-anom-when", title: a.until_title }, until),
      columns.entity ? el("td", a.entity_title ? { "class": "bw-anom-entity", title: a.entity_title } : { "class": "bw-anom-entity" },
        [link(a.url, a.entity_text), el("div", { "class": "bw-muted bw-small", text: a.entity_kind })]) : null,
      columns.host ? el("td", { "class": "bw-anom-when" }, [link(a.host_url, a.host || "—")]) : null,
      el("td", {}, [el("span", { "class": "bw-anom-kind", style: { "--kind": a.colour }, text: a.kind_label })]),
      el("td", { "class": "bw-anom-expl" }, [el("div", { "class": "bw-anom-summary", text: a.summary })].concat(chips)),
      el("td", { "class": "bw-anom-num", text: a.score_text })
    ];
    return el("tr", { "class": "bw-anom-row", "data-id": String(a.id), "data-kind": a.kind,
                      "data-open": a.ended_at ? "false" : "true" }, cells);
  }

  function renderRows(rows) {
    var table = document.getElementById("bw-anom-table");
    var headers = Array.prototype.map.call(table.tHead.rows[0].cells, function (th) { return th.textContent; });
    var columns = { entity: headers.indexOf("Entity") >= 0, host: headers.indexOf("Host") >= 0 };
    var body = document.createElement("tbody");
    rows.forEach(function (a) { body.appendChild(row(a, columns)); });
    // Rows are keyed by data-id: morphing keeps the ones that stay (and any focus inside them) in place.
    if (BW.patch) BW.patch.morphChildren(table.tBodies[0], body);
    else table.replaceChild(body, table.tBodies[0]);
    table.hidden = rows.length === 0;
    document.getElementById("bw-anom-empty").hidden = rows.length > 0;
  }

  function apply(msg) {
    if (msg.type === "error") {
      console.warn("breakwater: anomalies subscription refused:", msg.message);
      return;
    }
    if (msg.type !== "anomalies" || msg.sub !== sub) return;
    renderRows(msg.rows);
    drawChart(msg.figure);
    document.getElementById("bw-anom-open-total").textContent = String(msg.open_total);
    document.getElementById("bw-anom-scored").textContent = msg.scored_text;
    document.getElementById("bw-anom-limited").hidden = !msg.limited;
    stats.applied += 1;
    stats.rows = msg.rows.length;
  }

  // Picking a state or a detector applies it at once; the text box waits for Enter or Apply.
  ["bw-anom-state", "bw-anom-kind"].forEach(function (id) {
    var select = document.getElementById(id);
    if (select) select.addEventListener("change", function () { select.form.submit(); });
  });

  var source = document.getElementById("bw-anom-figure");
  drawChart(source ? JSON.parse(source.textContent) : null);
  BW.live(root.dataset.liveUrl, {
    onOpen: function (api) {
      api.send({ subscribe: "anomalies", sub: sub, state: root.dataset.state, kind: root.dataset.kind, q: root.dataset.q });
    },
    onMessage: apply
  });
})();
