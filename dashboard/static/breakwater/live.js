/* A live page's websocket: connect, keep the header's status dot true, reconnect by itself.
 *
 * BW.live(path, {onMessage, onOpen}) opens ws(s)://host/path, calls onOpen(socket) after every
 * (re)connect, so a page re-sends its subscription, and onMessage(obj) for every JSON message.
 * After a close it retries with jittered exponential backoff (1 s doubling to 30 s), which
 * spreads the reconnects of every open page after a server restart. Close code 4401 means the
 * session ended: the page goes to the login page instead of retrying. No polling anywhere.
 */
(function () {
  "use strict";
  var BW = (window.BW = window.BW || {});
  var MIN_DELAY_MS = 1000;
  var MAX_DELAY_MS = 30000;
  var CLOSE_UNAUTHENTICATED = 4401;

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
        var wait = delay / 2 + Math.random() * delay / 2;
        delay = Math.min(delay * 2, MAX_DELAY_MS);
        setConn("offline", "Offline, retrying in " + Math.ceil(wait / 1000) + " s");
        setTimeout(connect, wait);
      };
    }

    connect();
    return api;
  };

  /* Hand a pushed message to a Dash app: set it into a dcc.Store, whose clientside callback
   * applies it. Call only once the app has rendered (the renderer defines set_props). */
  BW.setStore = function (id, data) {
    window.dash_clientside.set_props(id, { data: data });
  };
})();
