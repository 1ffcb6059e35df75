/* A live page's websocket: connect, keep the header's status dot true, reconnect by itself.
 *
 * BW.live(path, {onMessage, onOpen}) opens ws(s)://host/path, calls onOpen(socket) after every
 * (re)connect, so a page re-sends its subscription, and onMessage(obj) for every JSON message.
 * After a close it retries with jittered exponential backoff (1 s doubling to 30 s), which
 * spreads the reconnects of every open page after a server restart. Close code 4401 means the
 * session ended: the page goes to the login page instead of retrying; 4403 (not allowed) stops.
 * No polling anywhere.
 *
 * A server-rendered page with live regions ({% live %} in its template: elements with data-live)
 * subscribes to /ws/page/ by itself once the page has loaded; each pushed region is morphed into
 * the page in place (BW.patch, patch.js), so focus, typed text, open menus and scroll stay put.
 * BW.livePageStats counts what was applied (the browser tests wait on it).
 *
 * BW.restyler(update) is the one way a pushed delta reaches a Plotly figure (see below).
 *
 * BW.esc(text) escapes text for HTML (element content and quoted attribute values) and for Plotly's
 * text (hover templates, annotations): every page script that builds markup from strings uses it.
 * Quotes are written as numeric references, which Plotly decodes too (it knows no &quot;).
 * docs/dashboard.md ("The live-page pattern") says how a live page is put together.
 */
(function () {
  "use strict";
  var BW = (window.BW = window.BW || {});
  var MIN_DELAY_MS = 1000;
  var MAX_DELAY_MS = 30000;
  var CLOSE_UNAUTHENTICATED = 4401;
  var CLOSE_FORBIDDEN = 4403;

  var ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&#34;", "'": "&#39;" };

  BW.esc = function (text) {
    return String(text === null || text === undefined ? "" : text).replace(/[&<>"']/g, function (c) { return ESCAPES[c]; });
  };

  function setConn(state, text) {
    var conn = document.getElementById("bw-conn");
    if (!conn) return;
    conn.dataset.state = state;
    conn.querySelector(".bw-conn-text").textContent = text;
    conn.title = text;
  }

  BW.live = function (path, handlers) {
    var delay = MIN_DELAY_MS;
    var socket = null;
    var api = {
      connected: false,
      send: function (obj) {
        if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(obj));
      }
    };

    function connect() {
      setConn("connecting", "Connecting…");
      var scheme = location.protocol === "https:" ? "wss:" : "ws:";
      socket = new WebSocket(scheme + "//" + location.host + path);
      socket.onopen = function () {
        delay = MIN_DELAY_MS;
        api.connected = true;
        setConn("live", "Live");
        if (handlers.onOpen) handlers.onOpen(api);
      };
      socket.onmessage = function (event) {
        var received = performance.now();
        var msg;
        try {
          msg = JSON.parse(event.data);
        } catch (err) {
          console.error("breakwater: bad live message", err);
          return;
        }
        msg._received = received;
        handlers.onMessage(msg);
      };
      socket.onclose = function (event) {
        api.connected = false;
        if (event.code === CLOSE_UNAUTHENTICATED) {
          location.assign("/login/?next=" + encodeURIComponent(location.pathname + location.search));
          return;
        }
        if (event.code === CLOSE_FORBIDDEN) {
          setConn("offline", "Not allowed");
          return;
        }
        var wait = delay / 2 + Math.random() * delay / 2, retryAt = performance.now() + wait;
        delay = Math.min(delay * 2, MAX_DELAY_MS);
        // The dot counts down to the retry, once a second.
        var countdown = function () {
          setConn("offline", "Offline, retrying in " + Math.max(0, Math.ceil((retryAt - performance.now()) / 1000)) + " s");
        };
        countdown();
        var ticker = setInterval(countdown, 1000);
        setTimeout(function () { clearInterval(ticker); connect(); }, wait);
      };
    }

    connect();
    return api;
  };

  /* The live regions of a server-rendered page: subscribe with the page's own address, morph what comes. */
  BW.livePage = function () {
    var regions = document.querySelectorAll("[data-live]");
    if (!regions.length || !BW.patch) return null;
    var sub = 0;
    var stats = (BW.livePageStats = { applied: 0, regions: 0, error: null, seq: 0 });
    return BW.live("/ws/page/", {
      onOpen: function (api) {
        sub += 1;
        api.send({ subscribe: "page", sub: sub, path: location.pathname + location.search });
      },
      onMessage: function (msg) {
        if (msg.sub !== sub) return;
        if (msg.type === "error") {
          stats.error = msg.status + " " + msg.message;
          console.warn("breakwater: live page refused:", msg.message);
          return;
        }
        if (msg.type !== "regions") return;
        Object.keys(msg.regions).forEach(function (name) {
          var el = document.querySelector('[data-live="' + CSS.escape(name) + '"]');
          if (el) {
            BW.patch.morphInner(el, msg.regions[name]);
            stats.regions += 1;
          }
        });
        stats.applied += 1;
        stats.seq = msg.seq;
        document.dispatchEvent(new CustomEvent("bw:live-regions", { detail: { names: Object.keys(msg.regions) } }));
      }
    });
  };

  // Scripts load at the end of <body>: start once every script (patch.js among them) has run.
  document.addEventListener("DOMContentLoaded", function () { BW.livePage(); });

  /* Hand a pushed message to a Dash app: set it into a dcc.Store, whose clientside callback
   * applies it. Call only once the app has rendered (the renderer defines set_props). */
  BW.setStore = function (id, data) {
    window.dash_clientside.set_props(id, { data: data });
  };

  /* The fast path for deltas, shared by every figure a push patches in place (heatmap, fabric matrix,
   * NVLink grid): one Plotly.restyle at a time. A page patches its arrays, then calls draw(gd, done).
   * `update()` gives the restyle's [attributes, traces] for the figure's state when a pass starts (new
   * outer arrays, so Plotly recomputes the trace: restyle redraws the whole figure either way); changes
   * that land while a pass runs are drawn together by one more pass after it, so a burst of pushes costs
   * two redraws, not one per message. `done(drawnAt)` runs once the pass holding this call's changes has
   * been drawn (performance.now()). */
  BW.restyler = function (update) {
    var drawing = false;
    var waiting = [];
    function pass(gd) {
      if (drawing) return;
      var batch = waiting;
      waiting = [];
      drawing = true;
      var args = update();
      window.Plotly.restyle(gd, args[0], args[1]).then(function () {
        var now = performance.now();
        batch.forEach(function (done) { if (done) done(now); });
      }).finally(function () {
        drawing = false;
        if (waiting.length) pass(gd);
      });
    }
    return function draw(gd, done) {
      waiting.push(done || null);
      pass(gd);
    };
  };
})();
