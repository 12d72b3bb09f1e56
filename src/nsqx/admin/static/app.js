/* nsqadmin (nsqx): actions with confirmation and CSRF token, topic filter, charts drawn as
 * inline SVG from /api/graphs, the live counter. No framework, no build step. */
(function () {
  "use strict";
  var body = document.body;
  var BASE = body.dataset.basePath || "";
  var COOKIE = body.dataset.csrfCookie || "nsqadmin_csrf";
  var SAMPLE = parseFloat(body.dataset.sampleInterval || "0");

  function csrfToken() {
    var parts = document.cookie ? document.cookie.split("; ") : [];
    for (var i = 0; i < parts.length; i++) {
      var kv = parts[i].split("=");
      if (kv[0] === COOKIE) return decodeURIComponent(kv.slice(1).join("="));
    }
    return "";
  }

  function flash(msg, kind) {
    var el = document.getElementById("flash");
    if (!el) return;
    el.textContent = msg;
    el.className = "alert " + (kind || "alert-danger");
  }

  function api(method, path, payload) {
    var opts = {
      method: method,
      credentials: "same-origin",
      headers: { "Accept": "application/vnd.nsq; version=1.0", "X-CSRF-Token": csrfToken() }
    };
    if (payload !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(payload);
    }
    return fetch(BASE + path, opts).then(function (r) {
      return r.text().then(function (t) {
        var data = {};
        try { data = t ? JSON.parse(t) : {}; } catch (e) { data = { message: t }; }
        if (!r.ok) throw new Error((data && data.message) || ("HTTP " + r.status));
        return data;
      });
    });
  }

  /* ---------------------------------------------------------------- actions */
  function onAction(ev) {
    var btn = ev.target.closest("button[data-action]");
    if (!btn) return;
    var d = btn.dataset;
    if (d.confirm && !window.confirm(d.confirm)) return;
    var req;
    if (d.action === "delete") req = api("DELETE", d.api);
    else if (d.action === "tombstone") req = api("DELETE", d.api, { topic: d.topic });
    else req = api("POST", d.api, { action: d.action });
    btn.disabled = true;
    req.then(function (data) {
      if (data && data.message) sessionStorage.setItem("nsqadmin-flash", data.message);
      if (d.next) window.location.assign(d.next || "/");
      else window.location.reload();
    }).catch(function (err) {
      btn.disabled = false;
      flash(d.action + " failed: " + err.message);
    });
  }
  document.addEventListener("click", onAction);

  var pending = sessionStorage.getItem("nsqadmin-flash");
  if (pending) {
    sessionStorage.removeItem("nsqadmin-flash");
    flash(pending, "alert-warning");
  }

  var form = document.getElementById("create-form");
  if (form) {
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var topic = form.elements.topic.value.trim();
      var channel = form.elements.channel ? form.elements.channel.value.trim() : "";
      var what = channel ? "channel " + topic + "/" + channel : "topic " + topic;
      if (!window.confirm("Create " + what + "?")) return;
      api("POST", "/api/topics", { topic: topic, channel: channel }).then(function () {
        window.location.reload();
      }).catch(function (err) { flash("create failed: " + err.message); });
    });
  }

  /* ---------------------------------------------------------------- cluster: create */
  var ccreate = document.getElementById("cluster-create-form");
  if (ccreate) {
    ccreate.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var f = ccreate.elements;
      /* sent as typed: nsqadmin validates (400 INVALID_...) and lookupd decides */
      var payload = { topic: f.topic.value.trim(), partitions: f.partitions.value.trim(),
        replicas: f.replicas.value.trim(), ordered: f.ordered.checked };
      var what = "topic " + payload.topic + " with " + payload.partitions + " partition(s)" +
        (payload.replicas ? " x " + payload.replicas + " replicas" : "") +
        (payload.ordered ? ", ordered" : "");
      if (!window.confirm("Create " + what + "?")) return;
      var btn = ccreate.querySelector("button[type=submit]");
      btn.disabled = true;
      api("POST", ccreate.dataset.api, payload).then(function (data) {
        var leaders = (data.partitions || []).map(function (p) {
          return p.partition + "->" + p.leader;
        });
        sessionStorage.setItem("nsqadmin-flash", "created " + what + " - leaders " +
          leaders.join(", "));
        window.location.reload();
      }).catch(function (err) {
        btn.disabled = false;
        flash("create failed: " + err.message);
      });
    });
  }

  /* ---------------------------------------------------------------- reset offset */
  var reset = document.getElementById("reset-form");
  if (reset) {
    var els = reset.elements;
    var showFields = function () {
      var k = els.kind.value;
      els.time.classList.toggle("hidden", k !== "time");
      els.offset.classList.toggle("hidden", k !== "offset");
    };
    els.kind.addEventListener("change", showFields);
    showFields();
    reset.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var k = els.kind.value, position, what;
      if (k === "time") {
        var t = Date.parse(els.time.value);  /* datetime-local: the browser's time zone */
        if (!els.time.value || isNaN(t)) { flash("reset: give a time"); return; }
        position = "timestamp:" + Math.floor(t / 1000);
        what = "the first message at or after " + new Date(t).toString();
      } else if (k === "offset") {
        if (!/^[0-9]+$/.test(els.offset.value)) { flash("reset: give an offset"); return; }
        position = "msgcount:" + els.offset.value;
        what = "offset " + els.offset.value;
      } else {
        position = k;
        what = k === "earliest" ? "the oldest kept message" : "the end of the log";
      }
      var payload = { action: "reset", position: position };
      if (els.partition.value !== "") payload.partition = parseInt(els.partition.value, 10);
      if (els.node.value) payload.node = els.node.value;
      var where = els.node.value ? " on " + els.node.value : " on every node";
      if (!window.confirm("Reset channel " + reset.dataset.topic + "/" + reset.dataset.channel +
          " to " + what + where + "? Messages in flight are forgotten and everything from " +
          "there is delivered again.")) return;
      var btn = reset.querySelector("button[type=submit]");
      btn.disabled = true;
      api("POST", reset.dataset.api, payload).then(function (data) {
        var parts = (data.results || []).map(function (r) {
          return r.node + ": offset " + r.offset + (r.clamped ? " (clamped to the oldest kept)" : "");
        });
        var msg = "reset done - " + parts.join(", ");
        if (data.message) msg += " - " + data.message;
        sessionStorage.setItem("nsqadmin-flash", msg);
        window.location.reload();
      }).catch(function (err) {
        btn.disabled = false;
        flash("reset failed: " + err.message);
      });
    });
  }

  /* ---------------------------------------------------------------- route changes */
  Array.prototype.forEach.call(document.querySelectorAll("form.route-change"), function (f) {
    f.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var op = f.dataset.op, v = { action: op };
      Array.prototype.forEach.call(f.elements, function (el) {
        if (el.name) v[el.name] = el.value.trim();  /* as typed: nsqd checks them */
      });
      var what = op === "split" ? "Split partition " + v.partition + " at logical partition " + v.at
        : op === "merge" ? "Merge partitions " + v.a + " and " + v.b
        : "Move partition " + v.partition + " to node " + v.node;
      if (!window.confirm(what + " (topic " + f.dataset.topic + ")? A new route version is " +
          "committed; ordered consumers follow it at the command message.")) return;
      var btn = f.querySelector("button[type=submit]");
      btn.disabled = true;
      api("POST", f.dataset.api, v).then(function (data) {
        var msg = op + " done - route version " + data.version + " on " + data.node;
        if (data.message) msg += " - " + data.message;
        sessionStorage.setItem("nsqadmin-flash", msg);
        window.location.reload();
      }).catch(function (err) {
        btn.disabled = false;
        flash(op + " failed: " + err.message);  /* nsqd's refusal, as it said it */
      });
    });
  });

  /* ---------------------------------------------------------------- filter */
  var filter = document.getElementById("filter");
  if (filter) {
    var rows = Array.prototype.slice.call(document.querySelectorAll("#topics-table tbody tr"));
    filter.addEventListener("input", function () {
      var f = filter.value.toLowerCase();
      rows.forEach(function (tr) {
        tr.classList.toggle("hidden", f !== "" && tr.dataset.topic.toLowerCase().indexOf(f) < 0);
      });
    });
  }

  /* ---------------------------------------------------------------- charts */
  var SVGNS = "http://www.w3.org/2000/svg";
  var COLORS = ["#2b6cb0", "#c53030", "#2f855a", "#b7791f", "#6b46c1", "#319795"];

  function el(name, attrs, text) {
    var n = document.createElementNS(SVGNS, name);
    for (var k in attrs) n.setAttribute(k, attrs[k]);
    if (text !== undefined) n.textContent = text;
    return n;
  }

  function fmt(v) {
    if (v === null || v === undefined) return "–";
    var a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(1) + "G";
    if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(1) + "k";
    if (a >= 100 || v === Math.round(v)) return String(Math.round(v));
    return v.toFixed(1);
  }

  function hhmm(ts) {
    var d = new Date(ts * 1000);
    return ("0" + d.getHours()).slice(-2) + ":" + ("0" + d.getMinutes()).slice(-2) + ":" +
      ("0" + d.getSeconds()).slice(-2);
  }

  function draw(fig, data) {
    var metric = fig.dataset.metric;
    var target = fig.querySelector(".chart-body");
    var series = (data.series || {})[metric] || {};
    var ts = data.timestamps || [];
    var names = Object.keys(series);
    var W = 400, H = 150, L = 44, R = 8, T = 8, B = 20;
    var max = 0, have = 0;
    names.forEach(function (n) {
      series[n].forEach(function (v) { if (v !== null) { have++; if (v > max) max = v; } });
    });
    target.textContent = "";
    if (ts.length < 2 || !have) {
      var s = document.createElement("span");
      s.className = "muted";
      s.textContent = "collecting samples…";
      target.appendChild(s);
      return;
    }
    if (max <= 0) max = 1;
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, preserveAspectRatio: "none",
      role: "img", "aria-label": metric });
    var t0 = ts[0], t1 = ts[ts.length - 1], span = Math.max(t1 - t0, 1);
    function x(t) { return L + (W - L - R) * (t - t0) / span; }
    function y(v) { return T + (H - T - B) * (1 - v / max); }
    for (var g = 0; g <= 2; g++) {
      var gv = max * g / 2;
      svg.appendChild(el("line", { x1: L, x2: W - R, y1: y(gv), y2: y(gv), stroke: "#e2e8f0" }));
      svg.appendChild(el("text", { x: L - 4, y: y(gv) + 3, "text-anchor": "end" }, fmt(gv)));
    }
    svg.appendChild(el("text", { x: L, y: H - 5 }, hhmm(t0)));
    svg.appendChild(el("text", { x: W - R, y: H - 5, "text-anchor": "end" }, hhmm(t1)));
    var legend = document.createElement("div");
    legend.className = "legend";
    var shown = names.length > 2 ? names : names.filter(function (n) { return n === "*"; });
    shown.forEach(function (n, i) {
      var pts = [], path = "";
      series[n].forEach(function (v, j) {
        if (v === null) { if (pts.length) { path += "M" + pts.join("L"); pts = []; } return; }
        pts.push(x(ts[j]).toFixed(1) + "," + y(v).toFixed(1));
      });
      if (pts.length) path += "M" + pts.join("L");
      if (!path) return;
      var color = COLORS[i % COLORS.length];
      svg.appendChild(el("path", { d: path, fill: "none", stroke: color,
        "stroke-width": n === "*" ? 2 : 1.2, "vector-effect": "non-scaling-stroke" }));
      var last = null;
      for (var k = series[n].length - 1; k >= 0; k--) { if (series[n][k] !== null) { last = series[n][k]; break; } }
      var item = document.createElement("span");
      item.textContent = "■ " + (n === "*" ? "total" : n) + " " + fmt(last) + "  ";
      item.style.color = color;
      legend.appendChild(item);
    });
    target.appendChild(svg);
    fig.dataset.last = JSON.stringify((series["*"] || []).slice(-1)[0]);
    var old = fig.querySelector(".legend");
    if (old) old.remove();
    fig.appendChild(legend);
  }

  function loadCharts() {
    var figs = document.querySelectorAll("figure.chart[data-src]");
    figs.forEach(function (fig) {
      fetch(fig.dataset.src, { credentials: "same-origin" }).then(function (r) {
        return r.ok ? r.json() : null;
      }).then(function (data) { if (data) draw(fig, data); }).catch(function () {});
    });
    if (figs.length && SAMPLE > 0) setTimeout(loadCharts, Math.max(SAMPLE, 2) * 1000);
  }
  loadCharts();

  /* ---------------------------------------------------------------- trace timeline */
  // marks sit at their time along the bar (set here: the CSP allows no inline style)
  document.querySelectorAll(".trace-mark[data-left]").forEach(function (m) {
    m.style.left = m.dataset.left + "%";
  });

  /* ---------------------------------------------------------------- counter */
  var counter = document.getElementById("counter");
  if (counter) {
    var shownNum = -1, target = 0, step = 0, lastAt = 0, lastTotal = -1;
    var rateEl = document.getElementById("counter-rate");
    var render = function () {
      if (shownNum < target) {
        shownNum = Math.min(target, shownNum + step);
        counter.textContent = Math.floor(shownNum).toLocaleString("en-US");
        requestAnimationFrame(render);
      }
    };
    var poll = function () {
      fetch(counter.dataset.src, { credentials: "same-origin" }).then(function (r) {
        return r.json();
      }).then(function (data) {
        var total = 0;
        var stats = data.stats || {};
        Object.keys(stats).forEach(function (k) { total += stats[k].message_count; });
        counter.dataset.total = String(total);
        var now = Date.now();
        if (shownNum < 0 || total < shownNum) {
          shownNum = target = total;
          counter.textContent = total.toLocaleString("en-US");
        } else if (total > target) {
          target = total;
          step = Math.max(1, (target - shownNum) / 60);
          requestAnimationFrame(render);
        }
        if (lastTotal >= 0 && now > lastAt) {
          rateEl.textContent = ((total - lastTotal) * 1000 / (now - lastAt)).toFixed(1) + " msgs/s";
        }
        lastTotal = total; lastAt = now;
        if (data.message) flash(data.message, "alert-warning");
      }).catch(function (err) { flash("counter: " + err.message); })
        .then(function () { setTimeout(poll, 2000); });
    };
    poll();
  }
})();
