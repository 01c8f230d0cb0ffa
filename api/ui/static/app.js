// The built-in dashboard: a device list filtered by device ID prefix
// and by attribute (Prometheus matchers, sent as match=), with silent
// devices marked, firing and pending alerts above the list and on each
// device's page (GET /api/v1/rules?type=alert), and per-device charts
// drawn with uPlot from GET /v1/devices/{device}/aggregates. No build
// step: this file is served as it is.
(function () {
  "use strict";

  // Each window is charted with an interval that gives at most 720
  // buckets, so one aggregates request draws it. Intervals of 1m and
  // more are multiples of the usual rollup intervals (1m, 1h), which
  // then answer them.
  var WINDOWS = {
    "1h": { ms: 3600e3, interval: "10s", intervalMs: 10e3, refresh: 10e3 },
    "24h": { ms: 86400e3, interval: "2m", intervalMs: 120e3, refresh: 30e3 },
    "7d": { ms: 7 * 86400e3, interval: "15m", intervalMs: 900e3, refresh: 60e3 },
    "30d": { ms: 30 * 86400e3, interval: "1h", intervalMs: 3600e3, refresh: 60e3 },
    // Past -retention only rollups (-rollups) hold a device's values.
    "1y": { ms: 365 * 86400e3, interval: "1d", intervalMs: 86400e3, refresh: 300e3 }
  };
  var LIST_REFRESH = 10e3;
  var PAGE = 100;
  // The token lives in sessionStorage: this tab only, gone when it
  // closes, never in a cookie or a URL.
  var TOKEN_KEY = "telemetryd.token";
  // The silence threshold (seconds) is a preference, not a secret: it is
  // kept in localStorage once it is changed from the default.
  var SILENCE_KEY = "telemetryd.silence";
  var DEFAULT_SILENCE = "600";
  // The list shows at most this many attributes of a device; the rest
  // are counted ("+3 more") and named in the tooltip.
  var LIST_ATTRS = 6;

  var $ = function (sel) { return document.querySelector(sel); };
  var timer = null;
  var charts = {};     // value name -> uPlot
  // whole: the charts show the whole window even when the data covers
  // a small part of it (fitRange).
  var state = { device: null, window: "1h", info: null, whole: false };

  // Earlier versions kept the token in localStorage; it does not belong
  // there, so it is removed.
  try { localStorage.removeItem(TOKEN_KEY); } catch (e) { /* storage off */ }

  function token() {
    try { return sessionStorage.getItem(TOKEN_KEY) || ""; } catch (e) { return ""; }
  }

  function setStatus(text, isError) {
    var s = $("#status");
    s.textContent = text;
    s.className = isError ? "error" : "";
  }

  // AuthError is a 401 or 403: the page shows the sign-in form.
  function AuthError(status, message) {
    this.status = status;
    this.message = message;
  }

  // ApiError is any other non-2xx answer; detail is the server's message.
  function ApiError(status, message) {
    this.status = status;
    this.detail = message;
    this.message = status + " " + message;
  }

  // api fetches a JSON path with the tab's token, if any.
  function api(path) {
    var headers = { Accept: "application/json" };
    var t = token();
    if (t) headers.Authorization = "Bearer " + t;
    return fetch(path, { headers: headers, credentials: "omit" }).then(function (res) {
      return res.text().then(function (text) {
        var body = null;
        try { body = text ? JSON.parse(text) : null; } catch (e) { body = null; }
        if (res.ok) return body;
        var msg = body && body.error && body.error.message ? body.error.message : res.statusText;
        if (res.status === 401 || res.status === 403) throw new AuthError(res.status, msg);
        throw new ApiError(res.status, msg);
      });
    });
  }

  // fail shows err: the sign-in form for 401 and 403, else the status line.
  function fail(err) {
    if (err instanceof AuthError) {
      showSignIn(err);
      return;
    }
    setStatus(err.message || String(err), true);
  }

  // ---- sign-in ----

  function show(view) {
    ["#signin-view", "#devices-view", "#device-view", "#unknown-view"].forEach(function (v) {
      $(v).hidden = v !== view;
    });
    $("#signout").hidden = !token();
  }

  function showSignIn(err) {
    stop();
    var msg = "";
    if (err && err.status === 401 && token()) {
      msg = "The token was not accepted (401): it is wrong, or it was revoked. Check it and sign in again.";
      try { sessionStorage.removeItem(TOKEN_KEY); } catch (e) { /* storage off */ }
    } else if (err && err.status === 403) {
      msg = "This token is valid but may not read here (403): " + err.message;
    }
    var box = $("#signin-error");
    box.textContent = msg;
    box.hidden = !msg;
    setStatus(msg ? "not signed in" : "sign in to see the devices", !!msg);
    show("#signin-view");
    $("#token").focus();
  }

  $("#signin").addEventListener("submit", function (ev) {
    ev.preventDefault();
    var t = $("#token").value.trim();
    if (!t) return;
    try {
      sessionStorage.setItem(TOKEN_KEY, t);
    } catch (e) {
      $("#signin-error").textContent = "This browser does not let the page keep the token (sessionStorage is off).";
      $("#signin-error").hidden = false;
      return;
    }
    $("#token").value = "";
    api("/v1/devices?limit=1").then(function () {
      $("#signin-error").hidden = true;
      route();
    }).catch(fail);
  });

  $("#signout").addEventListener("click", function () {
    try { sessionStorage.removeItem(TOKEN_KEY); } catch (e) { /* storage off */ }
    resetCharts();
    showSignIn(null);
  });

  // ---- helpers ----

  // span writes s seconds as the page does: "40 s", "12 min", "3 h", "2 d".
  function span(s) {
    if (s < 90) return s + " s";
    if (s < 5400) return Math.round(s / 60) + " min";
    if (s < 129600) return Math.round(s / 3600) + " h";
    return Math.round(s / 86400) + " d";
  }

  function silentSeconds(iso) { return Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000)); }

  function ago(iso) { return span(silentSeconds(iso)) + " ago"; }

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // seenAt is the time of lastSeen in ms since the epoch, or null for a
  // device that has sent no reading yet (its attributes were set first,
  // so its lastSeen is the zero time).
  function seenAt(iso) {
    var t = Date.parse(iso || "");
    return isNaN(t) || t <= 0 ? null : t;
  }

  function silenceSeconds() { return Number($("#silence").value); }

  function silenceText() { return $("#silence").selectedOptions[0].textContent; }

  // isSilent tells whether a device's last reading is older than the
  // silence threshold.
  function isSilent(lastSeen) {
    var t = seenAt(lastSeen);
    return t !== null && Date.now() - t > silenceSeconds() * 1000;
  }

  // goDuration writes whole seconds as a Go duration: 600 -> "10m".
  function goDuration(sec) {
    if (sec % 3600 === 0) return sec / 3600 + "h";
    if (sec % 60 === 0) return sec / 60 + "m";
    return sec + "s";
  }

  // silentNote fills box with why a silent device is silent: a
  // "silent" label, for how long, and the threshold it is over, as in
  // "silent 12 min (threshold 10 min)". The threshold is the page's
  // "silent after" choice, compared with this browser's clock.
  function silentNote(box, lastSeen) {
    box.textContent = "";
    box.appendChild(el("span", { "class": "badge silent-badge" }, "silent"));
    box.appendChild(document.createTextNode(" "));
    box.appendChild(el("span", { "class": "silent-for" }, span(silentSeconds(lastSeen))));
    box.appendChild(document.createTextNode(" "));
    box.appendChild(el("span", { "class": "threshold" }, "(threshold " + silenceText() + ")"));
    box.title = "No reading since " + lastSeen + " by this browser's clock: longer than the " + silenceText() +
      " chosen in \u201csilent after\u201d on the device list.";
  }

  // seenCell fills td with how long ago the device was last seen or,
  // when it is silent, for how long and against which threshold (the
  // row's colour is not the only sign).
  function seenCell(td, lastSeen) {
    if (seenAt(lastSeen) === null) {
      td.appendChild(el("span", { "class": "ago" }, "no readings yet"));
      return;
    }
    if (isSilent(lastSeen)) {
      silentNote(td, lastSeen);
      return;
    }
    td.title = lastSeen;
    td.appendChild(el("span", { "class": "ago" }, ago(lastSeen)));
  }

  // attrChips lists a device's attributes in ul, sorted by name, at most
  // max of them (0: all) and "+N more" naming the rest in its tooltip.
  // With onPick each attribute is a button that calls onPick(name, value).
  function attrChips(ul, attrs, max, onPick) {
    var names = Object.keys(attrs || {}).sort();
    var shown = max && names.length > max ? names.slice(0, max - 1) : names;
    shown.forEach(function (k) {
      var li = el("li", { "class": "attr", "data-name": k, title: k + "=" + attrs[k] });
      var box = li;
      if (onPick) {
        box = el("button", { type: "button", "aria-label": "filter by " + k + "=" + attrs[k],
          title: k + "=" + attrs[k] + " (add to the filter)" });
        box.addEventListener("click", function () { onPick(k, attrs[k]); });
        li.appendChild(box);
      }
      box.appendChild(el("span", { "class": "attr-name" }, k));
      box.appendChild(document.createTextNode("="));
      box.appendChild(el("span", { "class": "attr-value" }, attrs[k]));
      ul.appendChild(li);
    });
    if (shown.length < names.length) {
      var rest = names.slice(shown.length);
      ul.appendChild(el("li", { "class": "attr more", title: rest.map(function (k) { return k + "=" + attrs[k]; }).join("\n") },
        "+" + rest.length + " more"));
    }
    return names.length;
  }

  // splitMatchers splits text at the commas outside quotes.
  function splitMatchers(text) {
    var parts = [], cur = "", quote = "";
    for (var i = 0; i < text.length; i++) {
      var c = text.charAt(i);
      if (quote) {
        cur += c;
        if (c === "\\" && quote !== "`" && i + 1 < text.length) cur += text.charAt(++i);
        else if (c === quote) quote = "";
      } else if (c === '"' || c === "'" || c === "`") {
        quote = c;
        cur += c;
      } else if (c === ",") {
        parts.push(cur);
        cur = "";
      } else {
        cur += c;
      }
    }
    parts.push(cur);
    return parts.map(function (p) { return p.trim(); }).filter(function (p) { return p !== ""; });
  }

  // selector turns the attribute filter as typed into a Prometheus
  // selector. Text in braces is sent as it is; otherwise each
  // comma-separated name<op>value has its value quoted, so
  // "fleet=East, model=~F-.*" is {fleet="East",model=~"F-.*"}. A part
  // that is not of that form, or whose value starts with a quote, is
  // passed on unchanged, for the server to say what is wrong with it.
  function selector(text) {
    text = text.trim();
    if (!text || text.charAt(0) === "{") return text;
    return "{" + splitMatchers(text).map(function (part) {
      var m = part.match(/^([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*([\s\S]*)$/);
      if (!m || /^["'`]/.test(m[3])) return part;
      return m[1] + m[2] + JSON.stringify(m[3]);
    }).join(",") + "}";
  }

  function valueChips(td, latest) {
    Object.keys(latest || {}).sort().forEach(function (k) {
      td.appendChild(el("span", { "class": "kv" }, k + "=" + JSON.stringify(latest[k])));
    });
  }

  // ---- device list ----

  var listNext = "";
  var listMatch = "";     // the attribute filter as typed (in the hash as match=)
  var listHash = "#/";    // the list's hash, for the device view's way back
  var listSeq = 0;        // answers to older requests are dropped

  // listQuery is the query of GET /v1/devices for the list's filters.
  function listQuery(append) {
    var prefix = $("#filter").value.trim();
    var sel = selector(listMatch);
    var q = "?limit=" + PAGE;
    if (prefix) q += "&prefix=" + encodeURIComponent(prefix);
    if (sel) q += "&match=" + encodeURIComponent(sel);
    if ($("#silent-only").checked) q += "&silent_for=" + goDuration(silenceSeconds());
    if (append && listNext) q += "&cursor=" + encodeURIComponent(listNext);
    return { q: q, prefix: prefix, sel: sel };
  }

  function deviceRow(d) {
    var tr = el("tr", { "data-device": d.device });
    var a = el("a", { href: "#/device/" + encodeURIComponent(d.device) }, d.device);
    var td = el("td");
    td.appendChild(a);
    alertBadges(td, d.device);
    tr.appendChild(td);
    var seen = el("td", { "class": "seen" });
    seenCell(seen, d.lastSeen);
    tr.appendChild(seen);
    var attrs = el("td", { "class": "attributes" });
    var ul = el("ul", { "class": "attrs", "aria-label": "attributes of " + d.device });
    if (attrChips(ul, d.attributes, LIST_ATTRS, addMatcher)) attrs.appendChild(ul);
    tr.appendChild(attrs);
    var vals = el("td");
    valueChips(vals, d.latest);
    tr.appendChild(vals);
    if (isSilent(d.lastSeen)) tr.classList.add("silent");
    return tr;
  }

  // emptyText says why the list is empty.
  function emptyText(lq) {
    var why = [];
    if (lq.prefix) why.push("whose ID starts with \u201c" + lq.prefix + "\u201d");
    if (lq.sel) why.push("matching " + lq.sel);
    if ($("#silent-only").checked) why.push("silent for more than " + silenceText());
    return why.length ? "No device " + why.join(", ") + "." : "No devices have sent readings yet.";
  }

  // listRefused shows the server's reason for refusing the filters (a
  // 400, such as a matcher it cannot parse) instead of a list.
  function listRefused(lq, err) {
    var box = $("#match-error");
    box.textContent = (lq.sel ? "The server refused the filter " + lq.sel : "The server refused the filter") +
      " (" + err.status + "): " + err.detail;
    box.hidden = false;
    $("#match").setAttribute("aria-invalid", "true");
    $("#devices").hidden = true;
    $("#no-devices").hidden = true;
    $("#more").hidden = true;
    $("#devices tbody").textContent = "";
    listNext = "";
    $("#device-count").textContent = "";
    setStatus("filter refused", true);
  }

  function loadDevices(append) {
    var lq = listQuery(append);
    var seq = ++listSeq;
    return Promise.all([api("/v1/devices" + lq.q), loadAlerts()]).then(function (res) {
      var body = res[0];
      if (seq !== listSeq) return;
      show("#devices-view");
      drawAlerts($("#alerts"), alerts.list, true, "No alert is firing or pending.");
      $("#match-error").hidden = true;
      $("#match").removeAttribute("aria-invalid");
      var tbody = $("#devices tbody");
      if (!append) tbody.textContent = "";
      body.devices.forEach(function (d) { tbody.appendChild(deviceRow(d)); });
      listNext = body.next || "";
      $("#more").hidden = !listNext;
      var n = tbody.children.length;
      var silent = tbody.querySelectorAll("tr.silent").length;
      $("#devices").hidden = n === 0;
      $("#no-devices").textContent = emptyText(lq);
      $("#no-devices").hidden = n > 0;
      var count = n + (listNext ? "+" : "") + (n === 1 ? " device" : " devices") + (silent ? ", " + silent + " silent for more than " + silenceText() : "");
      if ($("#device-count").textContent !== count) $("#device-count").textContent = count; // announced when it changes
      setStatus("updated " + new Date().toLocaleTimeString());
    }).catch(function (err) {
      if (seq !== listSeq) return;
      if (err instanceof ApiError && err.status === 400) {
        show("#devices-view");
        listRefused(lq, err);
        return;
      }
      fail(err);
    });
  }

  // addMatcher adds name=value to the attribute filter and applies it.
  function addMatcher(name, value) {
    var text = $("#match").value.trim();
    var v = /^[A-Za-z0-9_.:\/+-]+$/.test(value) ? value : JSON.stringify(value);
    if (text.charAt(0) === "{" && text.charAt(text.length - 1) === "}") {
      text = text.slice(0, -1).trim() + (text.length > 2 ? "," : "") + name + "=" + JSON.stringify(value) + "}";
    } else {
      text = (text ? text + ", " : "") + name + "=" + v;
    }
    $("#match").value = text;
    applyListFilters();
  }

  // applyListFilters puts the attribute filter and the silent-only
  // toggle in the hash (so the list can be linked, and Back returns to
  // it) and loads the list.
  function applyListFilters() {
    var p = new URLSearchParams();
    var m = $("#match").value.trim();
    if (m) p.set("match", m);
    if ($("#silent-only").checked) p.set("silent", "1");
    var h = p.toString() ? "#/?" + p.toString() : "#/";
    if (h === (location.hash || "#/")) {
      listMatch = m;
      loadDevices(false);
      return;
    }
    location.hash = h;
  }


  // ---- alerts ----

  // The alerting rules and their pending and firing alerts, from
  // GET /api/v1/rules?type=alert (Prometheus' shape). Without alerting
  // rules (-rules) the page shows nothing of them; when they cannot be
  // read the rest of the page still works and the alerts box says why.
  var alerts = { rules: 0, list: [], error: null };

  var STATE_ORDER = { firing: 0, pending: 1 };

  function loadAlerts() {
    return api("/api/v1/rules?type=alert").then(function (body) {
      var rules = 0, list = [];
      ((body && body.data && body.data.groups) || []).forEach(function (g) {
        (g.rules || []).forEach(function (r) {
          if (r.type !== "alerting") return;
          rules++;
          (r.alerts || []).forEach(function (a) {
            if (a.state in STATE_ORDER) list.push({ rule: r, alert: a });
          });
        });
      });
      list.sort(function (x, y) {
        return STATE_ORDER[x.alert.state] - STATE_ORDER[y.alert.state] ||
          Date.parse(x.alert.activeAt) - Date.parse(y.alert.activeAt) ||
          (x.rule.name < y.rule.name ? -1 : x.rule.name > y.rule.name ? 1 : 0);
      });
      alerts = { rules: rules, list: list, error: null };
    }).catch(function (err) {
      if (err instanceof AuthError) throw err;
      alerts = { rules: alerts.rules, list: [], error: err };
    });
  }

  function alertsOf(dev) {
    return alerts.list.filter(function (x) { return x.alert.labels.device === dev; });
  }

  function fmtValue(s) {
    var v = Number(s);
    return isNaN(v) ? s : fmtNum(v);
  }

  // sinceText says how long an alert has been active: "firing, active
  // 12 min" or, for a pending one, how much of its for has passed:
  // "pending 40 s of 10 min".
  function sinceText(x) {
    var active = span(silentSeconds(x.alert.activeAt));
    if (x.alert.state === "pending" && x.rule.duration) return "pending " + active + " of " + span(Math.round(x.rule.duration));
    return "active " + active;
  }

  // alertRow is one alert: its state, name (and severity), device (a
  // link to its page, unless on it), summary, how long, and value; its
  // other labels are in the name's tooltip.
  function alertRow(x, withDevice) {
    var a = x.alert, lb = a.labels || {}, an = a.annotations || {};
    var tr = el("tr", { "class": "alert " + a.state, "data-alert": x.rule.name, "data-state": a.state, "data-device": lb.device || "" });
    var st = el("td");
    st.appendChild(el("span", { "class": "badge state-badge " + a.state }, a.state));
    tr.appendChild(st);
    var other = Object.keys(lb).sort().filter(function (k) { return k !== "alertname" && k !== "device"; });
    var name = el("td", { "class": "alert-name", title: other.map(function (k) { return k + "=" + lb[k]; }).join("\n") });
    name.appendChild(el("strong", {}, x.rule.name));
    if (lb.severity) name.appendChild(el("span", { "class": "kv severity" }, lb.severity));
    tr.appendChild(name);
    if (withDevice) {
      var d = el("td");
      if (lb.device) d.appendChild(el("a", { href: "#/device/" + encodeURIComponent(lb.device) }, lb.device));
      tr.appendChild(d);
    }
    tr.appendChild(el("td", { "class": "summary" }, an.summary || an.description || ""));
    tr.appendChild(el("td", { "class": "ago", title: "active since " + a.activeAt }, sinceText(x)));
    tr.appendChild(el("td", { "class": "value" }, fmtValue(a.value)));
    return tr;
  }

  // drawAlerts fills box (a table with a tbody, a count and a "none"
  // line) with list; the box is hidden when there are no alerting rules.
  function drawAlerts(box, list, withDevice, noneText) {
    box.hidden = alerts.rules === 0 && !alerts.error;
    var tbody = box.querySelector("tbody");
    tbody.textContent = "";
    list.forEach(function (x) { tbody.appendChild(alertRow(x, withDevice)); });
    box.querySelector("table").hidden = list.length === 0;
    var none = box.querySelector(".none");
    none.hidden = list.length > 0;
    none.textContent = alerts.error ? "The alerts could not be read: " + alerts.error.message : noneText;
    var firing = list.filter(function (x) { return x.alert.state === "firing"; }).length;
    var count = box.querySelector(".count");
    if (count) {
      var c = firing + " firing, " + (list.length - firing) + " pending \u00b7 " + alerts.rules +
        (alerts.rules === 1 ? " alerting rule" : " alerting rules");
      if (count.textContent !== c) count.textContent = c;
    }
  }

  // alertBadges marks a device's row with its alerts' names.
  function alertBadges(td, dev) {
    alertsOf(dev).forEach(function (x) {
      td.appendChild(document.createTextNode(" "));
      td.appendChild(el("span", { "class": "badge alert-badge " + x.alert.state,
        title: x.rule.name + " " + x.alert.state + " since " + x.alert.activeAt }, x.rule.name));
    });
  }

  // ---- device view ----

  function isNumeric(v) { return typeof v === "number" || typeof v === "boolean"; }

  function numericNames(latest) {
    return Object.keys(latest || {}).filter(function (k) { return isNumeric(latest[k]); }).sort();
  }

  function textNames(latest) {
    return Object.keys(latest || {}).filter(function (k) { return !isNumeric(latest[k]); }).sort();
  }

  // NotKnown is a device the list does not have (or the token cannot see).
  function NotKnown(dev) { this.device = dev; }

  function loadInfo(dev) {
    return api("/v1/devices?limit=1&prefix=" + encodeURIComponent(dev)).then(function (body) {
      var d = body.devices[0];
      if (!d || d.device !== dev) throw new NotKnown(dev);
      return d;
    });
  }

  // windowRange is the time range and interval of window w, ending at
  // the bucket that holds now.
  function windowRange(w) {
    var to = Math.ceil(Date.now() / w.intervalMs) * w.intervalMs;
    return { from: to - w.ms, to: to, interval: w.interval, intervalMs: w.intervalMs };
  }

  // loadAggregates fetches every bucket of range for names, following
  // next.
  function loadAggregates(dev, range, names) {
    var url = "/v1/devices/" + encodeURIComponent(dev) + "/aggregates?fn=count,min,max,avg,last" +
      "&interval=" + range.interval + "&from=" + range.from + "&to=" + range.to +
      "&fields=" + names.map(encodeURIComponent).join(",");
    var all = [];
    function page(u, n) {
      return api(u).then(function (body) {
        all = all.concat(body.buckets);
        if (body.next && n < 10) return page("/v1/devices/" + encodeURIComponent(dev) + "/aggregates?cursor=" + encodeURIComponent(body.next), n + 1);
        return { from: range.from, to: range.to, intervalMs: range.intervalMs, url: url, buckets: all };
      });
    }
    return page(url, 0);
  }

  // When a device's data covers at most 1/FIT_RATIO of the window, the
  // charts fit their time axis to it: a range 1.5 times the data (at
  // least FIT_MIN_MS), ending at now when the data is recent, in the
  // shortest interval of FINE (seconds) that gives at most FIT_BUCKETS
  // buckets. Ten seconds of data in the last hour is then ten seconds
  // of a one-minute axis, not a dot at the edge of an hour.
  var FIT_RATIO = 6, FIT_MIN_MS = 60e3, FIT_BUCKETS = 240;
  var FINE = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400];

  function hasData(v) { return !!v && v.count !== 0 && v.avg !== undefined && v.avg !== null; }

  // dataSpan is the time from the first bucket with data to the end of
  // the last one, and the number of readings in res.
  function dataSpan(res) {
    var lo = Infinity, hi = -Infinity, n = 0;
    res.buckets.forEach(function (b) {
      var most = 0;
      Object.keys(b.values).forEach(function (k) {
        if (hasData(b.values[k])) most = Math.max(most, b.values[k].count || 1);
      });
      if (!most) return;
      var t = Date.parse(b.start);
      lo = Math.min(lo, t);
      hi = Math.max(hi, t + res.intervalMs);
      n += most;
    });
    return lo < hi ? { from: lo, to: hi, readings: n } : null;
  }

  // fitRange is the range to chart res's data in when it covers a small
  // part of res's range, or null.
  function fitRange(res) {
    var d = dataSpan(res);
    if (!d) return null;
    var view = res.to - res.from, covered = d.to - d.from;
    if (covered * FIT_RATIO > view) return null;
    var width = Math.max(covered * 1.5, FIT_MIN_MS);
    var from, to;
    if (res.to - d.to <= width / 2) { // recent: the axis ends at now
      to = res.to;
      from = Math.min(to - width, d.from - covered / 4);
    } else {
      from = d.from - (width - covered) / 2;
      to = d.to + (width - covered) / 2;
    }
    from = Math.max(from, res.from);
    to = Math.min(to, res.to);
    var sec = FINE[FINE.length - 1];
    for (var i = 0; i < FINE.length; i++) {
      if (FINE[i] * 1000 * FIT_BUCKETS >= to - from) { sec = FINE[i]; break; }
    }
    var ms = Math.min(sec * 1000, res.intervalMs);
    from = Math.floor(from / ms) * ms;
    to = Math.ceil(to / ms) * ms;
    if (from === res.from && to === res.to) return null;
    return { from: from, to: to, interval: goDuration(ms / 1000), intervalMs: ms };
  }

  // loadView loads window w for names, fitted to the data (fitRange,
  // at most twice) unless whole is set. res.fit tells whether it was.
  function loadView(dev, w, names, whole) {
    function step(range, n) {
      return loadAggregates(dev, range, names).then(function (res) {
        res.fit = n > 0;
        var next = !whole && n < 2 ? fitRange(res) : null;
        return next ? step(next, n + 1) : res;
      });
    }
    return step(windowRange(w), 0);
  }

  // columns turns buckets into uPlot data for one name: a full grid of
  // bucket starts. A bucket without data is null, a gap in the line,
  // except inside a run of empty buckets no longer than twice the
  // device's usual spacing: those are undefined, which uPlot joins over,
  // so a device that sends once a minute charted at 10 s buckets is a
  // line, and a line breaks only where the device was silent for longer
  // than usual. isolated counts the buckets with data that still stand
  // alone. A number is drawn as its average with a min-max band; a
  // boolean as a step line of its max (true when it was true at any
  // time in the bucket); a state (whole numbers, at most STATES of
  // them in view, steady within nine in ten buckets) as a step line of
  // its last value.
  var STATES = 8;
  function columns(res, name, isBool) {
    var byStart = {};
    res.buckets.forEach(function (b) {
      if (hasData(b.values[name])) byStart[Date.parse(b.start)] = b.values[name];
    });
    var xs = [], avg = [], min = [], max = [], last = [], count = [], at = [];
    var distinct = {}, whole = true, steady = 0;
    for (var t = res.from; t < res.to; t += res.intervalMs) {
      var v = byStart[t];
      xs.push(t / 1000);
      avg.push(v ? v.avg : null);
      min.push(v ? v.min : null);
      max.push(v ? v.max : null);
      last.push(v && v.last !== undefined ? v.last : null);
      count.push(v ? v.count : 0);
      if (v) {
        at.push(xs.length - 1);
        if (v.min === v.max) steady++;
        [v.min, v.max, v.last].forEach(function (x) {
          if (x === undefined || x === null) return;
          if (x !== Math.round(x)) whole = false;
          distinct[x] = true;
        });
      }
    }
    var states = Object.keys(distinct).map(Number).sort(function (a, b) { return a - b; });
    var kind = isBool ? "bool" : (at.length && whole && states.length <= STATES && steady >= 0.9 * at.length ? "state" : "number");
    var ys = kind === "bool" ? max.slice() : kind === "state" ? last.slice() : avg;
    var steps = [];
    for (var i = 1; i < at.length; i++) steps.push(at[i] - at[i - 1]);
    if (steps.length >= 2) {
      steps.sort(function (a, b) { return a - b; });
      var span = 2 * steps[Math.floor(steps.length / 2)];
      for (i = 1; i < at.length; i++) {
        if (at[i] - at[i - 1] > 1 && at[i] - at[i - 1] <= span) {
          for (var j = at[i - 1] + 1; j < at[i]; j++) ys[j] = min[j] = max[j] = undefined;
        }
      }
    }
    var isolated = 0;
    for (i = 0; i < ys.length; i++) if (isolatedAt(ys, i)) isolated++;
    return {
      data: kind === "number" ? [xs, ys, min, max] : [xs, ys],
      kind: kind, states: states, points: at.length, isolated: isolated, intervalMs: res.intervalMs, lastSeen: null,
      avg: avg, min: min, max: max, last: last, count: count, lastAt: at.length ? at[at.length - 1] : -1
    };
  }

  // isolatedAt tells whether ys[i] has a value and a gap (null, not a
  // joined undefined) or the edge on both sides.
  function isolatedAt(ys, i) {
    return ys[i] != null && (i === 0 || ys[i - 1] === null) && (i === ys.length - 1 || ys[i + 1] === null);
  }

  // endAt tells whether ys[i] has a value and a gap or the edge on
  // either side: the end of a line, or a point on its own.
  function endAt(ys, i) {
    return ys[i] != null && (i === 0 || ys[i - 1] === null || i === ys.length - 1 || ys[i + 1] === null);
  }

  // SPARSE is the number of points in view up to which every point is
  // marked.
  var SPARSE = 40;

  // markedPoints picks, for uPlot's points filter, the buckets drawn as
  // markers: every one when there are few, else those where the line
  // ends or that stand alone, which a line alone cannot show; a dense
  // line stays a plain line.
  function markedPoints(u, si) {
    var ys = u.data[si], out = [], n = 0, i;
    for (i = 0; i < ys.length; i++) if (ys[i] != null) n++;
    for (i = 0; i < ys.length; i++) if (ys[i] != null && (n <= SPARSE || endAt(ys, i))) out.push(i);
    return out.length ? out : null;
  }

  // markers lists where markedPoints draws, in canvas pixels.
  function markers(u) {
    var out = [];
    (markedPoints(u, 1) || []).forEach(function (i) {
      out.push({ x: Math.round(u.valToPos(u.data[0][i], "x", true)), y: Math.round(u.valToPos(u.data[1][i], "y", true)) });
    });
    return out;
  }

  function fmtNum(v) {
    if (v === null || v === undefined) return "--";
    return Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(6)));
  }

  function fmtBool(v) { return v >= 0.5 ? "true" : "false"; }

  function fmtTime(ms, long) {
    var d = new Date(ms);
    return long ? d.toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" }) : d.toLocaleTimeString();
  }

  // nearestData is the bucket with data nearest to i, or -1.
  function nearestData(cols, i) {
    for (var d = 0; d < cols.count.length; d++) {
      if (i - d >= 0 && cols.count[i - d] > 0) return i - d;
      if (i + d < cols.count.length && cols.count[i + d] > 0) return i + d;
    }
    return -1;
  }

  // legendText is what the legend under a chart says: hovered, the
  // values of bucket i (the one under the cursor) and its start;
  // else the last value (i is the last bucket with data) and when it
  // came: the device's last reading when that is in the bucket, else
  // the bucket's start.
  function legendText(cols, i, long, hover) {
    if (i < 0) return "no readings in view";
    var start = cols.data[0][i] * 1000;
    var inBucket = cols.lastSeen !== null && cols.lastSeen >= start && cols.lastSeen < start + cols.intervalMs;
    var at = fmtTime(!hover && inBucket ? cols.lastSeen : start, long);
    var n = cols.count[i];
    if (cols.kind === "bool") {
      var trues = Math.round(cols.avg[i] * n);
      return hover ?
        at + ": " + (trues ? "true" : "false") + " (true in " + trues + " of " + n + (n === 1 ? " reading)" : " readings)") :
        "last " + fmtBool(cols.last[i]) + " at " + at;
    }
    if (cols.kind === "state") {
      return (hover ? at + ": last " : "last ") + fmtNum(cols.last[i]) + (hover ? "" : " at " + at) +
        (cols.min[i] !== cols.max[i] ? " (min " + fmtNum(cols.min[i]) + ", max " + fmtNum(cols.max[i]) + ")" : "");
    }
    if (hover) {
      return at + ": avg " + fmtNum(cols.avg[i]) + (n > 1 ? " (min " + fmtNum(cols.min[i]) + ", max " + fmtNum(cols.max[i]) + ", " + n + " readings)" : "");
    }
    return "last " + fmtNum(cols.last[i]) + " at " + at;
  }

  var BLUE = "#2962ff";

  // chartOpts are a chart's uPlot options; meta.cols is the chart's
  // data as columns made it, replaced at each refresh.
  function chartOpts(width, meta, onCursor) {
    var cols = meta.cols;
    var points = { show: false, filter: markedPoints, size: 7, width: 1, stroke: BLUE, fill: BLUE };
    var series = [{}];
    var y = {};
    var yAxis = { size: 60 };
    if (cols.kind === "number") {
      series.push(
        { label: "avg", stroke: BLUE, width: 1.5, points: points },
        { label: "min", stroke: "#9aa5b1", width: 1, dash: [4, 3], points: { show: false } },
        { label: "max", stroke: "#9aa5b1", width: 1, dash: [4, 3], points: { show: false } });
    } else {
      series.push({ label: cols.kind === "bool" ? "max" : "last", stroke: BLUE, width: 2, points: points,
        fill: cols.kind === "bool" ? "rgba(41, 98, 255, 0.12)" : undefined, paths: uPlot.paths.stepped({ align: 1 }) });
    }
    if (cols.kind === "bool") {
      y = { range: [-0.15, 1.15] };
      yAxis.splits = function () { return [0, 1]; };
      yAxis.values = function (u, vals) { return vals.map(fmtBool); };
    } else if (cols.kind === "state") {
      y = { range: function () {
        var s = meta.cols.states.length ? meta.cols.states : [0];
        return [s[0] - 0.5, s[s.length - 1] + 0.5];
      } };
      yAxis.splits = function () { return meta.cols.states; };
    }
    return {
      title: "",
      width: width,
      height: 220,
      legend: { show: false },
      cursor: { drag: { x: true, y: false } },
      scales: { x: { time: true }, y: y },
      series: series,
      bands: cols.kind === "number" ? [{ series: [3, 2], fill: "rgba(41, 98, 255, 0.08)" }] : [],
      axes: [{}, yAxis],
      hooks: { setCursor: [onCursor] }
    };
  }

  function windowText(w) {
    return { "1h": "the last hour", "24h": "the last 24 hours", "7d": "the last 7 days", "30d": "the last 30 days", "1y": "the last year" }[w];
  }

  // fitText says what part of the window the data covers, when the
  // axis is fitted to it.
  function fitText(res) {
    var d = dataSpan(res);
    if (!d) return "";
    var long = d.to - d.from > 86400e3;
    var where = windowText(state.window);
    if (d.readings === 1) return "One reading in " + where + ", at " + fmtTime(d.from, long) + ": the time axis is fitted to it.";
    var recent = res.to - d.to <= (res.to - res.from) / 2; // as fitRange ends the axis at now
    return recent ?
      "Readings only in the last " + span(Math.round((Date.now() - d.from) / 1000)) + " of " + where + ": the time axis is fitted to them." :
      "Readings only from " + fmtTime(d.from, long) + " to " + fmtTime(d.to, long) + " (" + span(Math.round((d.to - d.from) / 1000)) +
        ") in " + where + ": the time axis is fitted to them.";
  }

  function drawTextValues(latest) {
    var names = textNames(latest);
    var box = $("#text-values");
    var tbody = box.querySelector("tbody");
    tbody.textContent = "";
    names.forEach(function (k) {
      var tr = el("tr", { "data-name": k });
      tr.appendChild(el("td", { "class": "name" }, k));
      tr.appendChild(el("td", {}, String(latest[k])));
      tbody.appendChild(tr);
    });
    box.hidden = names.length === 0;
  }

  function drawAttributes(attrs) {
    var ul = $("#device-attrs ul");
    ul.textContent = "";
    var n = attrChips(ul, attrs, 0);
    ul.hidden = n === 0;
    $("#device-attrs .none").hidden = n > 0;
  }

  function drawCharts() {
    var dev = state.device, w = WINDOWS[state.window];
    var names = numericNames(state.info.latest);
    drawTextValues(state.info.latest);
    $("#no-values").hidden = names.length > 0;
    $(".windows").hidden = names.length === 0;
    if (!names.length) {
      $("#fit").hidden = true;
      setStatus("updated " + new Date().toLocaleTimeString());
      return Promise.resolve();
    }
    return loadView(dev, w, names, state.whole).then(function (res) {
      if (dev !== state.device) return;
      var fit = res.fit ? fitText(res) : "";
      $("#fit").hidden = !fit && !state.whole;
      $("#fit-text").textContent = fit || "The whole of " + windowText(state.window) + " is shown.";
      $("#fit-toggle").textContent = state.whole ? "fit the axis to the data" : "show " + windowText(state.window);
      var long = res.to - res.from > 86400e3;
      var box = $("#charts");
      names.forEach(function (name) {
        var card = box.querySelector('.chart[data-name="' + CSS.escape(name) + '"]');
        if (!card) {
          card = el("div", { "class": "chart", "data-name": name });
          card.appendChild(el("h2", {}, name));
          card.appendChild(el("p", { "class": "empty", hidden: "" }));
          box.appendChild(card);
        }
        var cols = columns(res, name, typeof state.info.latest[name] === "boolean");
        card.setAttribute("data-points", String(cols.points));
        card.setAttribute("data-isolated", String(cols.isolated));
        card.setAttribute("data-window", state.window);
        card.setAttribute("data-src", res.url);
        card.setAttribute("data-kind", cols.kind);
        card.setAttribute("data-fit", res.fit ? "1" : "");
        var empty = card.querySelector(".empty");
        empty.hidden = cols.points > 0;
        empty.textContent = "No data in this window: no " + name + " readings in " + windowText(state.window) +
          " (the device's last reading: " + ago(state.info.lastSeen) + ").";
        card.classList.toggle("no-data", cols.points === 0);
        var legend = card.querySelector(".legend");
        if (!legend) {
          legend = el("p", { "class": "legend", "aria-live": "off" });
          card.appendChild(legend);
        }
        cols.lastSeen = seenAt(state.info.lastSeen);
        var showLegend = function (u) {
          var i = u && u.cursor.idx != null ? nearestData(cols, u.cursor.idx) : -1;
          legend.textContent = legendText(cols, i >= 0 ? i : cols.lastAt, long, i >= 0);
          legend.classList.toggle("hover", i >= 0);
        };
        var u = charts[name];
        if (u && u.kind === cols.kind) {
          u.meta.cols = cols;
          u.setData(cols.data);
        } else {
          if (u) u.destroy();
          var meta = { cols: cols };
          u = new uPlot(chartOpts(Math.max(card.clientWidth - 16, 300), meta, function (uu) { if (uu.showLegend) uu.showLegend(uu); }), cols.data, card);
          u.kind = cols.kind;
          u.meta = meta;
          card.insertBefore(u.root, legend);
          charts[name] = u;
        }
        u.showLegend = showLegend;
        card.uplot = u; // for the console and the page's tests: its scales and data
        card.markers = function () { return markers(u); };
        showLegend(u);
      });
      setStatus("updated " + new Date().toLocaleTimeString());
    });
  }

  function refreshDevice() {
    var dev = state.device;
    return Promise.all([loadInfo(dev), loadAlerts()]).then(function (res) {
      var info = res[0];
      if (dev !== state.device) return;
      show("#device-view");
      drawAlerts($("#device-alerts"), alertsOf(dev), false, "");
      $("#device-alerts").hidden = alertsOf(dev).length === 0;
      state.info = info;
      var never = seenAt(info.lastSeen) === null;
      $("#device-seen").textContent = never ? "no readings yet" : "last seen " + ago(info.lastSeen);
      $("#device-seen").title = never ? "" : info.lastSeen;
      $("#device-silent").hidden = !isSilent(info.lastSeen);
      if (isSilent(info.lastSeen)) silentNote($("#device-silent"), info.lastSeen);
      drawAttributes(info.attributes);
      return drawCharts();
    }).catch(function (err) {
      if (err instanceof NotKnown || (err instanceof ApiError && err.status === 400)) {
        stop();
        resetCharts();
        $("#unknown-text").textContent = err instanceof NotKnown ?
          "No device \u201c" + err.device + "\u201d has sent readings that this server keeps" +
          (token() ? ", or this token may not see it." : ".") :
          "\u201c" + dev + "\u201d is not a device ID: " + err.message;
        setStatus("");
        show("#unknown-view");
        return;
      }
      fail(err);
    });
  }

  function resetCharts() {
    Object.keys(charts).forEach(function (k) { charts[k].destroy(); });
    charts = {};
    $("#charts").textContent = "";
  }

  // ---- routing and refresh ----

  function stop() {
    if (timer) clearInterval(timer);
    timer = null;
  }

  function schedule(fn, every) {
    stop();
    timer = setInterval(fn, every);
  }

  function route() {
    var m = location.hash.match(/^#\/device\/([^?]+)(?:\?w=(\w+))?$/);
    if (m) {
      var dev = decodeURIComponent(m[1]);
      var w = WINDOWS[m[2]] ? m[2] : "1h";
      if (dev !== state.device) resetCharts();
      if (dev !== state.device || w !== state.window) state.whole = false;
      state.device = dev;
      state.window = w;
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
    var lm = location.hash.match(/^#\/\?(.*)$/);
    var params = new URLSearchParams(lm ? lm[1] : "");
    listMatch = (params.get("match") || "").trim();
    $("#match").value = listMatch;
    $("#silent-only").checked = params.get("silent") === "1";
    listHash = lm ? location.hash : "#/";
    $("#back").setAttribute("href", listHash);
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
  $("#fit-toggle").addEventListener("click", function () {
    state.whole = !state.whole;
    resetCharts();
    refreshDevice();
  });
  $("#match-form").addEventListener("submit", function (ev) {
    ev.preventDefault();
    applyListFilters();
  });
  $("#match").addEventListener("input", function () {
    if (!$("#match").value.trim() && listMatch) applyListFilters(); // cleared
  });
  $("#silent-only").addEventListener("change", applyListFilters);
  (function () {
    var saved = null;
    try { saved = localStorage.getItem(SILENCE_KEY); } catch (e) { /* storage off */ }
    var sel = $("#silence");
    sel.value = DEFAULT_SILENCE;
    if (saved && /^[0-9]+$/.test(saved) && sel.querySelector('option[value="' + saved + '"]')) sel.value = saved;
  })();
  $("#silence").addEventListener("change", function () {
    try { localStorage.setItem(SILENCE_KEY, $("#silence").value); } catch (e) { /* storage off */ }
    loadDevices(false);
  });
  window.addEventListener("hashchange", route);
  window.addEventListener("resize", function () {
    Object.keys(charts).forEach(function (k) {
      var card = charts[k].root.parentNode;
      charts[k].setSize({ width: Math.max(card.clientWidth - 16, 300), height: 220 });
    });
  });
  route();
})();
