/* Form behaviours that were inline handlers: the Content-Security-Policy runs no inline script, so the
 * templates mark elements with data attributes and this file (loaded on every page) wires them up.
 *   form[data-confirm]     asks before submitting (e.g. deleting an alert rule)
 *   select[data-autosubmit] submits its form on change (e.g. the chargeback period; <noscript> has a button)
 *   #bw-rule-form           shows only the fields the chosen rule kind uses; hidden ones are sent and ignored */
(function () {
  "use strict";
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form instanceof HTMLFormElement && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
      event.preventDefault();
    }
  });
  document.addEventListener("change", function (event) {
    var el = event.target;
    if (el instanceof HTMLSelectElement && el.hasAttribute("data-autosubmit") && el.form) el.form.submit();
  });
  var kind = document.querySelector("#bw-rule-form #id_kind");
  if (!kind) return;
  function sync() {
    document.querySelectorAll("#bw-rule-form [data-kinds]").forEach(function (el) {
      el.hidden = el.dataset.kinds.split(" ").indexOf(kind.value) < 0;
    });
  }
  kind.addEventListener("change", sync);
  sync();
})();
