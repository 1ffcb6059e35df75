/* Accessible names and roles that Dash 4's own components leave out, set on every page (base.html).
 *
 * Dash's components take no aria-* props, so the pages cannot pass them in; this fills them in after the
 * renderer has drawn a component, and again whenever it draws one anew:
 *   1. dcc.Dropdown: keyboard focus goes to a read-only input marked aria-hidden, so a screen reader hears
 *      nothing where the focus is. It becomes a named combobox (the field's <label> and its current value),
 *      its expanded state mirrored from the button that opens the list.
 *   2. dcc.RadioItems: drawn as a listbox of role=option <label>s that each hold a radio input (an
 *      interactive control inside another, with no name for the group). It becomes a radiogroup named by
 *      the label just before it; the radios inside carry the state themselves.
 * React writes an attribute only when its own value for it changes, so these stay once set.
 */
(function () {
  "use strict";

  function ensureId(el, fallback) {
    if (!el.id) el.id = fallback;
    return el.id;
  }

  /* The visible label of a control: <label for=id>, else the label-like element just before it. */
  function labelOf(control) {
    if (control.id) {
      var byFor = document.querySelector('label[for="' + CSS.escape(control.id) + '"]');
      if (byFor) return byFor;
    }
    var prev = control.previousElementSibling;
    if (prev && (prev.tagName === "LABEL" || /label/.test(prev.className))) return prev;
    return null;
  }

  function fixDropdown(target) {
    var button = target.parentElement && target.parentElement.querySelector("button[aria-haspopup]");
    if (!button) return;
    target.removeAttribute("aria-hidden");
    target.setAttribute("role", "combobox");
    target.setAttribute("aria-haspopup", "listbox");
    target.setAttribute("aria-expanded", button.getAttribute("aria-expanded") || "false");
    var ids = [];
    var label = labelOf(button) || labelOf(target.parentElement);
    if (label) ids.push(ensureId(label, button.id + "-label"));
    var value = button.id && document.getElementById(button.id + "-value");
    if (value) ids.push(value.id);
    if (ids.length) target.setAttribute("aria-labelledby", ids.join(" "));
  }

  function fixRadioItems(group) {
    group.setAttribute("role", "radiogroup");
    group.querySelectorAll('[role="option"]').forEach(function (option) {
      option.removeAttribute("role");
      option.removeAttribute("aria-selected");
    });
    var label = labelOf(group);
    if (label && !group.hasAttribute("aria-labelledby")) {
      group.setAttribute("aria-labelledby", ensureId(label, (group.id || "bw-radio") + "-label"));
    }
  }

  function fix(root) {
    root.querySelectorAll(".dash-dropdown-focus-target[aria-hidden]").forEach(fixDropdown);
    root.querySelectorAll('.dash-radioitems[role="listbox"]').forEach(fixRadioItems);
  }

  function mirrorExpanded(button) {
    var target = button.parentElement && button.parentElement.querySelector(".dash-dropdown-focus-target");
    if (target) target.setAttribute("aria-expanded", button.getAttribute("aria-expanded") || "false");
  }

  function start() {
    fix(document);
    new MutationObserver(function (records) {
      var again = false;
      records.forEach(function (r) {
        // Only the dropdown's own button: the target's copy of the state must not echo back here.
        if (r.type === "attributes") { if (r.target.matches("button[aria-haspopup]")) mirrorExpanded(r.target); }
        else if (r.addedNodes.length) again = true;
      });
      if (again) fix(document);
    }).observe(document.body, { childList: true, subtree: true, attributes: true,
                                attributeFilter: ["aria-expanded"] });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
