// The built-in dashboard: a device list and per-device charts drawn
// with uPlot from GET /v1/devices/{device}/aggregates. No build step:
// this file is served as it is.
(function () {
  "use strict";

  // Each window is charted with an interval that gives at most 720
  // buckets, so one aggregates request draws it.
  var WINDOWS = {
    "1h": { ms: 3600e3, interval: "10s", intervalMs: 10e3, refresh: 10e3 },
    "24h": { ms: 86400e3, interval: "2m", intervalMs: 120e3, refresh: 30e3 },
    "7d": { ms: 7 * 86400e3, interval: "15m", intervalMs: 900e3, refresh: 60e3 },
    "30d": { ms: 30 * 86400e3, interval: "1h", intervalMs: 3600e3, refresh: 60e3 }
  };
  var LIST_REFRESH = 10e3;
  var PAGE = 100;
  var TOKEN_KEY = "telemetryd.token";

  var $ = function (sel) { return document.querySelector(sel); };
  var timer = null;
  var charts = {};     // value name -> uPlot
  var state = { device: null, window: "1h", info: null };

  function setStatus(text, isError) {
    var s = $("#status");
    s.textContent = text;
    s.className = isError ? "error" : "";
  }

  // api fetches a JSON path, sending the saved bearer token if any; on
  // 401 it asks for a token once and retries.
  function api(path, retried) {
    var headers = { Accept: "application/json" };
    var token = localStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;
    return fetch(path, { headers: headers }).then(function (res) {
      if (res.status === 401 && !retried) {
        var t = window.prompt("This telemetryd needs an API token (scope read):");
        if (t) {
          localStorage.setItem(TOKEN_KEY, t.trim());
          return api(path, true);
        }
      }
      return res.json().then(function (body) {
        if (!res.ok) {
          var msg = body && body.error ? body.error.message : res.statusText;
          throw new Error(res.status + " " + msg);
        }
        return body;
      });
    });
  }

  function ago(iso) {
    var s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
    if (s < 90) return s + " s ago";
    if (s < 5400) return Math.round(s / 60) + " min ago";
    if (s < 129600) return Math.round(s / 3600) + " h ago";
    return Math.round(s / 86400) + " d ago";
  }

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function valueChips(td, latest) {
    Object.keys(latest || {}).sort().forEach(function (k) {
      td.appendChild(el("span", { "class": "kv" }, k + "=" + JSON.stringify(latest[k])));
    });
  }

  // ---- device list ----

  var listNext = "";

  function loadDevices(append) {
    var prefix = $("#filter").value.trim();
    var q = "?limit=" + PAGE + (prefix ? "&prefix=" + encodeURIComponent(prefix) : "");
    if (append && listNext) q += "&cursor=" + encodeURIComponent(listNext);
    return api("/v1/devices" + q).then(function (body) {
      var tbody = $("#devices tbody");
      if (!append) tbody.textContent = "";
      body.devices.forEach(function (d) {
        var tr = el("tr", { "data-device": d.device });
        var a = el("a", { href: "#/device/" + encodeURIComponent(d.device) }, d.device);
        var td = el("td");
        td.appendChild(a);
        tr.appendChild(td);
        var seen = el("td", { title: d.lastSeen });
        seen.appendChild(el("span", { "class": "ago" }, ago(d.lastSeen)));
        tr.appendChild(seen);
        var vals = el("td");
        valueChips(vals, d.latest);
        tr.appendChild(vals);
        tbody.appendChild(tr);
      });
      listNext = body.next || "";
      $("#more").hidden = !listNext;
      $("#device-count").textContent = tbody.children.length + (listNext ? "+" : "") + " devices";
      setStatus("updated " + new Date().toLocaleTimeString());
    }).catch(function (err) { setStatus(err.message, true); });
  }

  // ---- device view ----

  function numericNames(latest) {
    return Object.keys(latest || {}).filter(function (k) {
      var v = latest[k];
      return typeof v === "number" || typeof v === "boolean";
    }).sort();
  }

  function loadInfo(dev) {
    return api("/v1/devices?limit=1&prefix=" + encodeURIComponent(dev)).then(function (body) {
      var d = body.devices[0];
      if (!d || d.device !== dev) throw new Error("device " + dev + " is not known");
      return d;
    });
  }

  // loadAggregates fetches every bucket of the window for names,
  // following next.
  function loadAggregates(dev, w, names) {
    var to = Math.ceil(Date.now() / w.intervalMs) * w.intervalMs;
    var from = to - w.ms;
    var url = "/v1/devices/" + encodeURIComponent(dev) + "/aggregates?fn=min,max,avg" +
      "&interval=" + w.interval + "&from=" + from + "&to=" + to +
      "&fields=" + names.map(encodeURIComponent).join(",");
    var all = [];
    function page(u, n) {
      return api(u).then(function (body) {
        all = all.concat(body.buckets);
        if (body.next && n < 10) return page("/v1/devices/" + encodeURIComponent(dev) + "/aggregates?cursor=" + encodeURIComponent(body.next), n + 1);
        return { from: from, to: to, url: url, buckets: all };
      });
    }
    return page(url, 0);
  }

  // columns turns buckets into uPlot data for one name: a full grid of
  // bucket starts with null where the device sent nothing (a gap).
  function columns(res, w, name) {
    var byStart = {};
    res.buckets.forEach(function (b) {
      if (b.values[name]) byStart[Date.parse(b.start)] = b.values[name];
    });
    var xs = [], avg = [], min = [], max = [], points = 0;
    for (var t = res.from; t < res.to; t += w.intervalMs) {
      var v = byStart[t];
      xs.push(t / 1000);
      avg.push(v ? v.avg : null);
      min.push(v ? v.min : null);
      max.push(v ? v.max : null);
      if (v) points++;
    }
    return { data: [xs, avg, min, max], points: points };
  }

  function chartOpts(name, width) {
    return {
      title: "",
      width: width,
      height: 220,
      cursor: { drag: { x: true, y: false } },
      scales: { x: { time: true } },
      series: [
        {},
        { label: "avg", stroke: "#2962ff", width: 1.5, points: { show: false } },
        { label: "min", stroke: "#9aa5b1", width: 1, dash: [4, 3], points: { show: false } },
        { label: "max", stroke: "#9aa5b1", width: 1, dash: [4, 3], points: { show: false } }
      ],
      bands: [{ series: [3, 2], fill: "rgba(41, 98, 255, 0.08)" }],
      axes: [{}, { size: 60 }]
    };
  }

  function drawCharts() {
    var dev = state.device, w = WINDOWS[state.window];
    var names = numericNames(state.info.latest);
    $("#no-values").hidden = names.length > 0;
    if (!names.length) return Promise.resolve();
    return loadAggregates(dev, w, names).then(function (res) {
      if (dev !== state.device) return;
      var box = $("#charts");
      names.forEach(function (name) {
        var card = box.querySelector('[data-name="' + CSS.escape(name) + '"]');
        if (!card) {
          card = el("div", { "class": "chart", "data-name": name });
          card.appendChild(el("h2", {}, name));
          box.appendChild(card);
        }
        var cols = columns(res, w, name);
        card.setAttribute("data-points", String(cols.points));
        card.setAttribute("data-window", state.window);
        card.setAttribute("data-src", res.url);
        if (charts[name]) {
          charts[name].setData(cols.data);
        } else {
          charts[name] = new uPlot(chartOpts(name, Math.max(card.clientWidth - 16, 300)), cols.data, card);
        }
      });
      setStatus("updated " + new Date().toLocaleTimeString());
    });
  }

  function refreshDevice() {
    return loadInfo(state.device).then(function (info) {
      state.info = info;
      $("#device-seen").textContent = "last seen " + ago(info.lastSeen);
      $("#device-seen").title = info.lastSeen;
      return drawCharts();
    }).catch(function (err) { setStatus(err.message, true); });
  }

  function resetCharts() {
    Object.keys(charts).forEach(function (k) { charts[k].destroy(); });
    charts = {};
    $("#charts").textContent = "";
  }

  // ---- routing and refresh ----

  function schedule(fn, every) {
    if (timer) clearInterval(timer);
    timer = setInterval(fn, every);
  }

  function route() {
    var m = location.hash.match(/^#\/device\/([^?]+)(?:\?w=(\w+))?$/);
    if (m) {
      var dev = decodeURIComponent(m[1]);
      var w = WINDOWS[m[2]] ? m[2] : "1h";
      if (dev !== state.device) resetCharts();
      state.device = dev;
      state.window = w;
      $("#devices-view").hidden = true;
      $("#device-view").hidden = false;
      $("#device-title").textContent = dev;
      document.querySelectorAll(".windows button").forEach(function (b) {
        b.classList.toggle("active", b.getAttribute("data-window") === w);
      });
      refreshDevice();
      schedule(refreshDevice, WINDOWS[w].refresh);
      return;
    }
    state.device = null;
    resetCharts();
    $("#device-view").hidden = true;
    $("#devices-view").hidden = false;
    loadDevices(false);
    schedule(function () { loadDevices(false); }, LIST_REFRESH);
  }

  document.querySelectorAll(".windows button").forEach(function (b) {
    b.addEventListener("click", function () {
      location.hash = "#/device/" + encodeURIComponent(state.device) + "?w=" + b.getAttribute("data-window");
    });
  });
  var filterTimer = null;
  $("#filter").addEventListener("input", function () {
    clearTimeout(filterTimer);
    filterTimer = setTimeout(function () { loadDevices(false); }, 250);
  });
  $("#more").addEventListener("click", function () { loadDevices(true); });
  window.addEventListener("hashchange", route);
  window.addEventListener("resize", function () {
    Object.keys(charts).forEach(function (k) {
      var card = charts[k].root.parentNode;
      charts[k].setSize({ width: Math.max(card.clientWidth - 16, 300), height: 220 });
    });
  });
  route();
})();
