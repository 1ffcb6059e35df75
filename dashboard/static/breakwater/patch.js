/* Patch the DOM in place: a live redraw changes only the nodes and text that differ.
 *
 * BW.patch.morphInner(el, html) makes el's children match `html`; BW.patch.morphChildren(el, other) makes
 * them match other's (a freshly built element). Nodes that stay are kept, not replaced, so what the
 * operator is doing survives a push:
 *   - the element with focus, and every form field whose value the user changed, keep their value and
 *     selection (a field's attributes still follow the server, its typed value does not);
 *   - a <select> that has focus (its menu may be open) is not touched at all;
 *   - <details open> stays as the user left it, open or closed;
 *   - scroll boxes keep their scroll offsets (the box element itself is kept);
 *   - CSRF token fields keep the page's token (every masked token of the session is equally valid);
 *   - an element marked data-live-keep (a chart, a Dash app) belongs to another script and is left alone.
 * Children are matched by id, data-key or data-id where they have one (table rows), else by position and
 * tag. Unmatched old nodes are removed, new ones inserted.
 */
(function () {
  "use strict";
  var BW = (window.BW = window.BW || {});
  var FIELDS = { INPUT: 1, TEXTAREA: 1, SELECT: 1 };

  function keyOf(node) {
    if (node.nodeType !== 1) return null;
    if (node.id) return node.nodeName + "#" + node.id;
    var k = node.getAttribute("data-key");
    if (k !== null) return node.nodeName + "@" + k;
    k = node.getAttribute("data-id");
    return k !== null ? node.nodeName + "=" + k : null;
  }

  function touched(el) {
    if (el === document.activeElement) return true;
    if (el.nodeName === "SELECT") {
      return Array.prototype.some.call(el.options, function (o) { return o.selected !== o.defaultSelected; });
    }
    if (el.type === "checkbox" || el.type === "radio") return el.checked !== el.defaultChecked;
    return el.value !== el.defaultValue;
  }

  function keepAttr(el, name) {
    if (name === "open" && el.nodeName === "DETAILS") return true;
    return name === "value" && el.nodeName === "INPUT" && el.name === "csrfmiddlewaretoken";
  }

  function syncAttributes(from, to) {
    var i, a;
    for (i = from.attributes.length - 1; i >= 0; i--) {
      a = from.attributes[i];
      if (!to.hasAttribute(a.name) && !keepAttr(from, a.name)) from.removeAttribute(a.name);
    }
    for (i = 0; i < to.attributes.length; i++) {
      a = to.attributes[i];
      if (from.getAttribute(a.name) !== a.value && !keepAttr(from, a.name)) from.setAttribute(a.name, a.value);
    }
  }

  function morphNode(from, to) {
    if (from.nodeType !== 1) {
      if (from.nodeValue !== to.nodeValue) from.nodeValue = to.nodeValue;
      return;
    }
    if (from.hasAttribute("data-live-keep")) return;
    if (FIELDS[from.nodeName]) {
      var busy = touched(from);
      if (busy && from.nodeName === "SELECT" && from === document.activeElement) return;
      if (busy) {
        // The user's value and selection are not the server's to change; take the rest of the attributes.
        var value = from.value, start = from.selectionStart, end = from.selectionEnd;
        syncAttributes(from, to);
        if (from.value !== value) from.value = value;
        if (start !== null && start !== undefined && from.selectionStart !== start) {
          try { from.setSelectionRange(start, end); } catch (e) { /* not a text field */ }
        }
        return;
      }
      syncAttributes(from, to);
      if (from.nodeName === "INPUT") {
        if (from.type === "checkbox" || from.type === "radio") from.checked = from.defaultChecked;
        else if (from.name !== "csrfmiddlewaretoken") from.value = from.defaultValue;
        return;
      }
      morphChildren(from, to);
      if (from.nodeName === "TEXTAREA") from.value = from.defaultValue;
      return;
    }
    syncAttributes(from, to);
    morphChildren(from, to);
  }

  function morphChildren(from, to) {
    var keyed = {};
    var c;
    for (c = from.firstChild; c; c = c.nextSibling) {
      var k = keyOf(c);
      if (k) keyed[k] = c;
    }
    var cur = from.firstChild;
    var next = to.firstChild;
    while (next) {
      var following = next.nextSibling;  // `next` may move into `from` below
      var key = keyOf(next), match = null;
      if (key) {
        match = keyed[key] || null;
        delete keyed[key];
      } else if (cur && !keyOf(cur) && cur.nodeType === next.nodeType && cur.nodeName === next.nodeName) {
        match = cur;
      }
      if (match) {
        if (match === cur) cur = cur.nextSibling;
        else from.insertBefore(match, cur);
        morphNode(match, next);
      } else {
        from.insertBefore(document.importNode(next, true), cur);
      }
      next = following;
    }
    while (cur) {
      var after = cur.nextSibling;
      from.removeChild(cur);
      cur = after;
    }
  }

  function morphInner(el, html) {
    var tpl = document.createElement("template");
    tpl.innerHTML = html;
    morphChildren(el, tpl.content);
  }

  BW.patch = { morphInner: morphInner, morphChildren: morphChildren };
})();
