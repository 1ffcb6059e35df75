/* Approve buttons (form[data-bw-confirm], a GET to the action's confirm page) open that page's impact preview
 * in a modal <dialog> instead of navigating: the server renders the fragment (?partial=1), so the dialog and
 * the no-JS confirm page show the same preview and post the same confirm token.
 * Keyboard: focus moves to the dialog's Cancel (the least destructive choice), Esc or Cancel closes it and
 * focus returns to the button that opened it. Without <dialog> or on a failed fetch, the page navigates. */
(function () {
  "use strict";
  var BW = (window.BW = window.BW || {});
  if (BW.confirmWired) return;  // the script may be included by more than one table on a page
  BW.confirmWired = true;
  var dialog = null, opener = null;

  function ensureDialog() {
    if (dialog) return dialog;
    dialog = document.createElement("dialog");
    dialog.className = "bw-dialog";
    dialog.id = "bw-confirm-dialog";
    document.body.appendChild(dialog);
    dialog.addEventListener("close", function () {  // Esc, Cancel, or the confirm form leaving the page
      dialog.replaceChildren();
      if (opener && document.contains(opener)) opener.focus();
      opener = null;
    });
    dialog.addEventListener("click", function (event) {
      if (event.target.closest(".bw-cancel")) {
        event.preventDefault();
        dialog.close("cancel");
      }
    });
    return dialog;
  }

  function show(url, button) {
    var here = window.location.pathname + window.location.search;
    var sep = url.indexOf("?") < 0 ? "?" : "&";
    fetch(url + sep + "partial=1&next=" + encodeURIComponent(here), { credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (html) {
        var d = ensureDialog();
        d.innerHTML = html;  // our own server's fragment, escaped by its templates
        var title = d.querySelector(".bw-impact-title");
        if (title) d.setAttribute("aria-labelledby", title.id);
        opener = button;
        d.showModal();
        var cancel = d.querySelector(".bw-cancel");
        if (cancel) cancel.focus();
      })
      .catch(function () { window.location.href = url; });
  }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!(form instanceof HTMLFormElement) || !form.hasAttribute("data-bw-confirm")) return;
    if (typeof HTMLDialogElement !== "function") return;
    event.preventDefault();
    show(form.action, event.submitter || form.querySelector("button"));
  });
})();
