"""Checks every console page must pass in a real browser, shared by the browser tests and `bench/tour.py`.

    watch(page)                      # once, before the first page.goto: starts collecting errors and CSP reports
    page.goto(url) ...               # let the page draw
    result = page_checks(page)       # what went wrong on this page since the previous call

`page_checks(page, *, width=360, on_narrow=None) -> dict` returns

    axe_serious      int   axe-core violations of impact serious or critical (each rule counts once)
    axe_violations   list  "<rule> (<impact>): <targets>" for each of those, to say what to fix
    overflow_360     int   pixels the document is wider than a `width`-px window (0: nothing scrolls sideways;
                           a table or chart in its own overflow-x:auto box does not count)
    overflowing      list  the outermost elements sticking out of that window, as CSS-like paths
    clipped          list  boxes that cut their content off (overflow hidden/clip) instead of scrolling it
    console_errors   list  console errors and uncaught exceptions
    csp_violations   list  securitypolicyviolation reports

The narrow check resizes the window to `width` px, calls `on_narrow(page)` there (a screenshot, say), and puts
the window back. axe runs at the page's own size first. Everything runs through the DevTools protocol, which
the pages' CSP does not govern, so pages are checked under the exact policy users get.
"""

from __future__ import annotations

from collections.abc import Callable

from axe_playwright_python.sync_playwright import Axe

# Impacts that fail a page; axe's "moderate" and "minor" are reported by axe itself but do not fail it.
FAILING_IMPACTS = ("serious", "critical")
NARROW_WIDTH = 360

COLLECT_CSP = """
window.__bwCsp = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__bwCsp.push(e.violatedDirective + " blocked " + (e.blockedURI || "inline") + " at " +
                      e.sourceFile + ":" + e.lineNumber);
});
"""

# The outermost elements whose right edge passes the window, outside any box that scrolls or clips them.
OVERFLOWING = """(width) => {
  const path = (el) => {
    const parts = [];
    for (let e = el; e && e !== document.body && parts.length < 4; e = e.parentElement) {
      parts.unshift(e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") +
                    (typeof e.className === "string" && e.className.trim() ?
                     "." + e.className.trim().split(/\\s+/).slice(0, 2).join(".") : ""));
    }
    return parts.join(" > ");
  };
  const boxed = (el) => {
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      if (getComputedStyle(p).overflowX !== "visible") return true;
    }
    return false;
  };
  const out = [];
  for (const el of document.body.querySelectorAll("*")) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.right <= width + 1 || boxed(el)) continue;
    if (out.some((o) => o.contains(el))) continue;
    out.push(el);
  }
  return out.slice(0, 8).map((el) => path(el) + " (right " + Math.round(el.getBoundingClientRect().right) + "px)");
}"""

# Boxes of the page's own layout that hide part of their content: overflow hidden or clip with more content
# than room. Plotly's and Cytoscape's own layers, visually-hidden labels and ellipsised cells (whose full text
# is in their title) hide by design.
CLIPPED = """() => {
  const skip = ".js-plotly-plot, .bw-visually-hidden, [class*='cytoscape'], #fabric-graph, .dash-spinner";
  const out = [];
  for (const el of document.body.querySelectorAll("*")) {
    if (el.closest(skip)) continue;
    const cs = getComputedStyle(el);
    if (cs.textOverflow === "ellipsis" && el.title) continue;
    const hidesX = ["hidden", "clip"].includes(cs.overflowX) && el.scrollWidth > el.clientWidth + 2;
    const hidesY = ["hidden", "clip"].includes(cs.overflowY) && el.scrollHeight > el.clientHeight + 2;
    if (!hidesX && !hidesY || el.clientWidth === 0) continue;
    const cls = typeof el.className === "string" && el.className.trim() ?
      "." + el.className.trim().split(/\\s+/).join(".") : "";
    out.push(el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") + cls + " hides " +
             (hidesX ? (el.scrollWidth - el.clientWidth) + "px across " : "") +
             (hidesY ? (el.scrollHeight - el.clientHeight) + "px down" : ""));
  }
  return out.slice(0, 8);
}"""

_AXE = Axe()


class _Collected:
    """What a watched page reported since the last page_checks."""

    def __init__(self):
        self.console_errors: list[str] = []

    def take(self) -> list[str]:
        taken, self.console_errors = self.console_errors, []
        return taken


def watch(page) -> None:
    """Start collecting console errors, uncaught exceptions and CSP reports on `page` (idempotent).

    Call it before the first navigation: a page's own early errors are otherwise lost."""
    if getattr(page, "_bw_checks", None) is not None:
        return
    collected = page._bw_checks = _Collected()
    page.add_init_script(COLLECT_CSP)
    page.on("pageerror", lambda exc: collected.console_errors.append(f"{page.url}: {exc}"))
    page.on("console", lambda msg: collected.console_errors.append(f"{page.url}: {msg.text}")
            if msg.type == "error" else None)


def axe_violations(page) -> list[str]:
    """axe-core's serious and critical violations on the page as it stands, one line per rule."""
    results = _AXE.run(page, options={"resultTypes": ["violations"]})
    return [f"{v['id']} ({v['impact']}): " + ", ".join(" ".join(n["target"]) for n in v["nodes"][:5])
            for v in results.response["violations"] if v["impact"] in FAILING_IMPACTS]


def narrow_overflow(page, width: int = NARROW_WIDTH, on_narrow: Callable | None = None) -> tuple[int, list[str]]:
    """How far the document outgrows a `width`-px window, and what sticks out; the window is put back after."""
    size = page.viewport_size
    page.set_viewport_size({"width": width, "height": size["height"]})
    try:
        # Responsive charts and the Clos graph redraw some time after the resize event (Plotly debounces it):
        # until then the document is as wide as they were. A real overflow outlasts the wait.
        for _ in range(15):
            page.wait_for_timeout(200)
            extra = page.evaluate("document.documentElement.scrollWidth") - width
            if extra <= 0:
                break
        culprits = page.evaluate(OVERFLOWING, width) if extra > 0 else []
        if on_narrow is not None:
            on_narrow(page)
    finally:
        page.set_viewport_size(size)
    return max(extra, 0), culprits


def page_checks(page, *, width: int = NARROW_WIDTH, on_narrow: Callable | None = None) -> dict:
    """Run every check on the page now open in `page` (see the module docstring for the keys)."""
    watch(page)
    violations = axe_violations(page)
    clipped = page.evaluate(CLIPPED)
    overflow, overflowing = narrow_overflow(page, width, on_narrow)
    return {
        "axe_serious": len(violations), "axe_violations": violations,
        "overflow_360": overflow, "overflowing": overflowing, "clipped": clipped,
        "console_errors": page._bw_checks.take(),
        "csp_violations": page.evaluate("window.__bwCsp ? window.__bwCsp.splice(0) : []"),
    }


FIRST_TABBABLE = """() => [...document.querySelectorAll("a[href], button, input, select, textarea, [tabindex]")]
  .find((el) => el.tabIndex >= 0 && !el.disabled && el.getClientRects().length > 0)"""


def skip_link_works(page) -> tuple[bool, str]:
    """Tab once from a freshly loaded page reaches the skip link; Enter puts focus in <main>.

    A page that puts focus in <main> itself (the login form's autofocused username) has the keyboard user there
    already, and Tab goes on from that field; there the skip link must still be the first stop in tab order.
    Returns (works, what happened), the second for the failure message."""
    if page.evaluate("!!document.activeElement.closest('main')"):
        if not page.evaluate(f"({FIRST_TABBABLE})().classList.contains('bw-skip')"):
            return False, "the skip link is not the first stop in tab order"
        page.focus("a.bw-skip")
    else:
        page.keyboard.press("Tab")
    first = page.evaluate("document.activeElement ? document.activeElement.outerHTML.slice(0, 120) : ''")
    if not page.evaluate("document.activeElement && document.activeElement.classList.contains('bw-skip')"):
        return False, f"Tab focused {first!r}, not the skip link"
    if not page.evaluate("(r => r.top >= 0 && r.left >= 0 && r.width > 1)"
                         "(document.activeElement.getBoundingClientRect())"):
        return False, "the focused skip link is not visible"
    page.keyboard.press("Enter")
    inside = page.evaluate("!!document.activeElement.closest('main')")
    now = page.evaluate("document.activeElement ? document.activeElement.outerHTML.slice(0, 120) : ''")
    return inside, f"Enter left focus on {now!r}"
