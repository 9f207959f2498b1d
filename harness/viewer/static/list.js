/* The exported run list: filters, sorts and pages the runs in the browser, over the data files beside the page
   (window.VIEWER_MANIFEST names them; each adds its runs to window.RUNS). Text goes in with textContent only. */
(function () {
  "use strict";
  var manifest = window.VIEWER_MANIFEST || { files: [], total: 0, page_size: 50 };
  var state = { page: 1, sort: "started", desc: false, loaded: 0 };
  var SORT_KEYS = { started: "seq", failed_checks: "failed_checks" };  /* judged failures only: not-judged count 0 */
  window.RUNS = window.RUNS || [];

  function value(id) { var el = document.getElementById(id); return el ? el.value : ""; }
  function checked(id) { var el = document.getElementById(id); return !!(el && el.checked); }
  function scored(outcome) { return ["pass", "task_failed", "turn_limit", "token_limit"].indexOf(outcome) >= 0; }
  function decimal(v) { return typeof v === "number" && Number.isInteger(v) ? v.toFixed(1) : v; }  // 0 as Python writes 0.0
  function cellKey(r) { return JSON.stringify([r.scenario, r.model, r.temperature, r.tool_mode, r.parser, r.stream, r.think]); }

  function failingCells(runs) {
    var cells = {};
    runs.forEach(function (r) {
      if (!scored(r.outcome)) { return; }
      var key = cellKey(r);
      cells[key] = (cells[key] === undefined ? true : cells[key]) && r.outcome !== "pass";
    });
    return cells;
  }

  function matches(r, cells) {
    var fields = ["scenario", "model", "temperature", "tool_mode", "parser", "stream", "repetition", "outcome"];
    for (var i = 0; i < fields.length; i++) {
      var want = value("f-" + fields[i]);
      if (want !== "" && String(r[fields[i]]) !== want && !(fields[i] === "temperature" && Number(want) === r.temperature)) { return false; }
    }
    if (value("f-mode") && r.failure_modes.indexOf(value("f-mode")) < 0) { return false; }
    if (value("f-check") && r.failed_checks.indexOf(value("f-check")) < 0) { return false; }
    if (checked("f-failed") && !(scored(r.outcome) && r.outcome !== "pass")) { return false; }
    if (checked("f-every") && cells[cellKey(r)] !== true) { return false; }
    return true;
  }

  function sortValue(r, key) {
    var v = r[SORT_KEYS[key] || key];
    if (key === "failed_checks") { return v.length; }
    return v === null || v === undefined ? "" : v;
  }

  function counted(names) {  /* a Map: a name such as "constructor" is no property of it already */
    var counts = new Map();
    names.forEach(function (n) { counts.set(n, (counts.get(n) || 0) + 1); });
    return Array.from(counts, function (e) { return e[0] + (e[1] > 1 ? " \u00d7" + e[1] : ""); }).join(", ");
  }

  function cell(tr, text, cls) {
    var td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "" : String(text);
    if (cls) { td.className = cls; }
    tr.appendChild(td);
    return td;
  }

  function row(r) {
    var tr = document.createElement("tr");
    tr.className = "outcome-" + String(r.outcome).replace(/[^a-z_]/g, "");
    cell(tr, r.scenario); cell(tr, r.model, "model"); cell(tr, decimal(r.temperature)); cell(tr, r.tool_mode); cell(tr, r.parser);
    cell(tr, r.stream ? "on" : "off"); cell(tr, r.repetition); cell(tr, r.outcome, "outcome");
    if (!r.judged) {  /* the run did not finish (even when no check ran): as the served list and the run line say */
      var td = cell(tr, "not judged", "unjudged");
      td.title = "checks not judged (the run did not finish)" + (r.unjudged_checks.length ? ": " + counted(r.unjudged_checks) : "");
    } else { cell(tr, counted(r.failed_checks)); }
    cell(tr, r.failure_modes.join(", "));
    cell(tr, r.turns, "num"); cell(tr, r.tokens, "num");
    var a = document.createElement("a");
    a.className = "open";
    a.href = "runs/" + encodeURIComponent(r.page) + ".html";
    a.textContent = String(r.run_id).slice(0, 12);
    a.title = String(r.run_id);
    cell(tr, "").appendChild(a);
    return tr;
  }

  function pagerButton(label, id, page) {
    var b = document.createElement("button");
    b.type = "button"; b.id = id; b.textContent = label;
    b.addEventListener("click", function () { state.page = page; render(); });
    return b;
  }

  function render() {
    var runs = window.RUNS;
    var cells = checked("f-every") ? failingCells(runs) : {};
    var shown = runs.filter(function (r) { return matches(r, cells); });
    shown.sort(function (x, y) {
      var a = sortValue(x, state.sort), b = sortValue(y, state.sort);
      var c = a < b ? -1 : a > b ? 1 : 0;
      return (state.desc ? -c : c) || x.seq - y.seq;
    });
    var size = manifest.page_size, pages = Math.max(1, Math.ceil(shown.length / size));
    state.page = Math.min(state.page, pages);
    var tbody = document.querySelector("#runs tbody");
    tbody.textContent = "";
    shown.slice((state.page - 1) * size, state.page * size).forEach(function (r) { tbody.appendChild(row(r)); });
    var loading = state.loaded < manifest.files.length ? " (loading data file " + (state.loaded + 1) + " of " + manifest.files.length + "…)" : "";
    document.getElementById("status").firstChild.textContent =
      shown.length.toLocaleString("en") + " run" + (shown.length === 1 ? "" : "s") + " match; page " + state.page + " of " + pages + loading + ". ";
    var pager = document.getElementById("pager");
    pager.textContent = "";
    if (state.page > 1) { pager.appendChild(pagerButton("← previous", "prev", state.page - 1)); }
    if (state.page < pages) { pager.appendChild(pagerButton("next →", "next", state.page + 1)); }
    document.querySelectorAll("#runs th a[data-sort]").forEach(function (a) {
      var key = a.getAttribute("data-sort");
      a.textContent = a.textContent.replace(/ [▲▼]$/, "") + (key === state.sort ? (state.desc ? " ▼" : " ▲") : "");
    });
  }

  function load(i) {
    if (i >= manifest.files.length) { render(); return; }
    var s = document.createElement("script");
    s.src = manifest.files[i];
    s.onload = function () { state.loaded = i + 1; if (i === 0 || i + 1 === manifest.files.length) { render(); } load(i + 1); };
    s.onerror = function () { document.getElementById("status").firstChild.textContent = "Could not load " + manifest.files[i] + ". "; };
    document.body.appendChild(s);
  }

  document.getElementById("filters").addEventListener("submit", function (e) { e.preventDefault(); state.page = 1; render(); });
  document.querySelectorAll("#runs th a[data-sort]").forEach(function (a) {
    a.addEventListener("click", function (e) {
      e.preventDefault();
      var key = a.getAttribute("data-sort");
      state.desc = key === state.sort ? !state.desc : false;
      state.sort = key; state.page = 1; render();
    });
  });
  if (manifest.files.length) { load(0); } else { state.loaded = 0; render(); }
})();
