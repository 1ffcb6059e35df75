/* The reliability page: draws the server-built Plotly figures (Kaplan-Meier curves, hazard
 * ratios) found in the #bw-reliability-figures JSON, keyed by the id of the element to fill. */
(function () {
  "use strict";
  var source = document.getElementById("bw-reliability-figures");
  if (!source || !window.Plotly) {
    return;
  }
  var figures = JSON.parse(source.textContent);
  var config = {responsive: true, displaylogo: false, modeBarButtonsToRemove: ["select2d", "lasso2d"]};
  Object.keys(figures).forEach(function (id) {
    var el = document.getElementById(id);
    if (el) {
      window.Plotly.newPlot(el, figures[id].data, figures[id].layout, config).then(function () {
        el.setAttribute("data-rendered", "true");
      });
    }
  });
})();
