/* The overview's charts from the #bw-portal-charts JSON: GPU-hours per day stacked busy / idle-held / unmeasured
 * / lost (green, amber, grey, red, with a legend, so colour is not the only cue) and cost per day. */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("bw-portal-charts").textContent);
  var BW = (window.BW = window.BW || {});
  BW.portalCharts = { drawn: 0 };
  if (!window.Plotly) return;
  var CONFIG = { responsive: true, displaylogo: false, displayModeBar: false };
  var LAYOUT = { margin: { l: 50, r: 10, t: 10, b: 40 }, height: 260, barmode: "stack", paper_bgcolor: "rgba(0,0,0,0)",
                 plot_bgcolor: "rgba(0,0,0,0)", legend: { orientation: "h", y: -0.2 }, xaxis: { type: "date" } };
  function bar(name, y, colour) {
    return { type: "bar", name: name, x: data.days, y: y, marker: { color: colour },
             hovertemplate: "%{x|%b %d}: %{y:,.1f} " + name + "<extra></extra>" };
  }
  function done(id) {
    return function () { document.getElementById(id).setAttribute("data-rendered", "true"); BW.portalCharts.drawn += 1; };
  }
  window.Plotly.newPlot("bw-usage-chart", [
    bar("busy", data.busy, "#2e9d5b"), bar("idle-held", data.idle_held, "#e0a100"),
    bar("unmeasured", data.unmeasured, "#8a94a6"), bar("lost", data.lost, "#d64545")
  ], Object.assign({}, LAYOUT, { yaxis: { title: { text: "GPU-hours" }, rangemode: "tozero" } }), CONFIG)
    .then(done("bw-usage-chart"));
  window.Plotly.newPlot("bw-cost-chart", [
    { type: "bar", name: "cost", x: data.days, y: data.cost, marker: { color: "#2f7de1" },
      hovertemplate: "%{x|%b %d}: %{y:,.2f} " + data.currency + "<extra></extra>" }
  ], Object.assign({}, LAYOUT, { showlegend: false, yaxis: { title: { text: data.currency }, rangemode: "tozero" } }),
     CONFIG).then(done("bw-cost-chart"));
})();
