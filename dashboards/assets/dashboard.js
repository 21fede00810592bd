/* vmapbench dashboard: filters, sortable tables and the commit comparison. Plain JS over what the
 * page embeds (trace `meta`, data-* attributes, one JSON block), so it all works from file://.
 * The filter state lives in the URL hash (#machine=..&device=..&workload=..) and the navigation
 * links carry it from page to page. */
(function () {
  "use strict";
  var KEYS = ["machine", "device", "workload"];

  function readState() {
    var state = {};
    window.location.hash.replace(/^#/, "").split("&").forEach(function (part) {
      var i = part.indexOf("=");
      if (i < 0) return;
      var key = part.slice(0, i), value = decodeURIComponent(part.slice(i + 1));
      if (KEYS.indexOf(key) >= 0 && value) state[key] = value;
    });
    return state;
  }

  function writeState(state) {
    var parts = KEYS.filter(function (k) { return state[k]; }).map(function (k) {
      return k + "=" + encodeURIComponent(state[k]);
    });
    var hash = parts.length ? "#" + parts.join("&") : "";
    try {
      history.replaceState(null, "", window.location.pathname + window.location.search + hash);
    } catch (err) {
      window.location.hash = hash;
    }
    document.querySelectorAll("a[data-vb-nav]").forEach(function (a) {
      a.setAttribute("href", a.getAttribute("data-vb-nav") + hash);
    });
  }

  function matches(meta, state) {
    if (!meta) return true;
    for (var i = 0; i < KEYS.length; i++) {
      var k = KEYS[i], want = state[k], have = meta[k];
      if (want && have !== undefined && have !== null && have !== "" && String(have) !== want) return false;
    }
    return true;
  }

  function elementMeta(el) {
    return { machine: el.getAttribute("data-machine"), device: el.getAttribute("data-device"),
             workload: el.getAttribute("data-workload") };
  }

  function applyFilters() {
    var state = readState();
    document.querySelectorAll(".vb-f").forEach(function (el) {
      el.classList.toggle("vb-hidden", !matches(elementMeta(el), state));
    });
    document.querySelectorAll(".js-plotly-plot").forEach(function (gd) {
      if (!gd.data || !window.Plotly) return;
      if (!gd._vbVisible) {
        gd._vbVisible = gd.data.map(function (t) { return t.visible === undefined ? true : t.visible; });
      }
      if (!gd._vbLegend) {
        gd._vbLegend = gd.data.map(function (t) { return t.showlegend === undefined ? true : t.showlegend; });
      }
      var visible = gd.data.map(function (t, i) { return matches(t.meta, state) ? gd._vbVisible[i] : false; });
      // Legends kept when filtered: each legend group shows its entry on its first visible trace
      // (the build marks only the group's first trace, which a filter may hide).
      var seen = {};
      var legend = gd.data.map(function (t, i) {
        var group = t.legendgroup || t.name || String(i);
        if (!gd._vbLegend.some(function (on, j) { return on && (gd.data[j].legendgroup || gd.data[j].name) === group; })) return false;
        if (visible[i] !== true || seen[group]) return false;
        seen[group] = true;
        return true;
      });
      var changed = visible.some(function (v, i) {
        var now = gd.data[i].visible === undefined ? true : gd.data[i].visible;
        var shown = gd.data[i].showlegend === undefined ? true : gd.data[i].showlegend;
        return now !== v || shown !== legend[i];
      });
      if (changed) window.Plotly.restyle(gd, { visible: visible, showlegend: legend });
      var card = gd.closest(".vb-card");
      var empty = card && card.querySelector(".vb-nodata");
      if (empty) empty.hidden = visible.some(function (v) { return v === true; });
    });
    if (compare) compare.sync(state);
    var shown = document.querySelectorAll("tr.vb-f:not(.vb-hidden)").length;
    document.body.setAttribute("data-vb-visible-rows", String(shown));
  }

  function setupFilters() {
    var state = readState();
    document.querySelectorAll("select[data-vb-filter]").forEach(function (sel) {
      var key = sel.getAttribute("data-vb-filter");
      if (state[key]) {
        var known = Array.prototype.some.call(sel.options, function (o) { return o.value === state[key]; });
        if (known) sel.value = state[key];
      }
      sel.addEventListener("change", function () {
        var next = readState();
        next[key] = sel.value;
        writeState(next);
        applyFilters();
      });
    });
    writeState(state);
  }

  /* ---- sortable tables: click a header; numbers by their data-sort key, text otherwise ---- */
  function sortKey(cell) {
    if (!cell) return "";
    var key = cell.hasAttribute("data-sort") ? cell.getAttribute("data-sort") : cell.textContent;
    return key.trim();
  }

  function compareKeys(a, b) {
    var x = Number(a), y = Number(b);
    if (!isNaN(x) && !isNaN(y)) return x - y;
    return a.localeCompare(b, undefined, { numeric: true });
  }

  function sortTable(table, index, descending) {
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (r1, r2) {
      var a = sortKey(r1.cells[index]), b = sortKey(r2.cells[index]);
      if (a === "" || b === "") return a === b ? 0 : (a === "" ? 1 : -1);  // blanks last, both ways
      var c = compareKeys(a, b);
      return descending ? -c : c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, i) {
      if (i === index) th.setAttribute("aria-sort", descending ? "descending" : "ascending");
      else th.removeAttribute("aria-sort");
    });
  }

  function setupSorting() {
    document.querySelectorAll("table.vb-sortable").forEach(function (table) {
      if (!table.tHead) return;
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, index) {
        th.addEventListener("click", function () {
          var descending = th.getAttribute("aria-sort") === "ascending" ||
            (!th.hasAttribute("aria-sort") && th.getAttribute("data-sort-default") === "desc");
          sortTable(table, index, descending);
        });
      });
    });
  }

  /* ---- compare: two commits of one machine, built from the embedded JSON ---- */
  function format(value, unit) {
    if (value === null || value === undefined) return "n/a";
    var scales = null;
    if (unit === "seconds") scales = [[1, "s"], [1e-3, "ms"], [1e-6, "µs"], [1e-9, "ns"]];
    else if (unit === "bytes") scales = [[1073741824, "GiB"], [1048576, "MiB"], [1024, "KiB"], [1, "B"]];
    if (scales) {
      for (var i = 0; i < scales.length; i++) {
        if (Math.abs(value) >= scales[i][0] || i === scales.length - 1) {
          return Number((value / scales[i][0]).toPrecision(3)) + " " + scales[i][1];
        }
      }
    }
    var text = String(Number(Number(value).toPrecision(3)));
    if (unit === "x" || unit === "ratio") return text + "×";
    return unit && unit !== "unit" ? text + " " + unit : text;
  }

  /* The change head/base shown for a pair of commits (dashboards/numbers.py `change`): a figure
   * to read and sort by. Its verdict is not made here: the page's data carries every pair's
   * verdicts, judged in Python (dashboards/views/compare.py). */
  function compareChange(base, head) {
    if (!(base.value > 0 && base.lo > 0 && head.value >= 0)) return null;
    var value = head.value / base.value;
    return { value: value, lo: Math.min(head.lo / base.hi, value), hi: Math.max(head.hi / base.lo, value),
             n: Math.min(base.n, head.n) };
  }

  /* Row id -> verdict of a pair of commits of `run`, as the data lists them; rows of both
   * commits listed nowhere are unchanged, those of a metric never judged "not judged". */
  function pairVerdicts(data, run, base, head) {
    var at = {};
    run.commits.forEach(function (c, i) { at[c[0]] = i; });
    var verdicts = {};
    run.never.forEach(function (id) { verdicts[id] = "not judged"; });
    run.verdicts[at[base]][at[head]].forEach(function (ids, k) {
      ids.forEach(function (id) { verdicts[id] = data.called[k]; });
    });
    return function (id) { return verdicts[id] || "unchanged"; };
  }

  function fillSelect(sel, options) {
    sel.innerHTML = "";
    options.forEach(function (o) {
      var opt = document.createElement("option");
      opt.value = o[0];
      opt.textContent = o[1];
      sel.appendChild(opt);
    });
  }

  function cell(tr, text, sortValue, className) {
    var td = document.createElement("td");
    td.textContent = text;
    if (sortValue !== undefined && sortValue !== null) td.setAttribute("data-sort", String(sortValue));
    if (className) td.className = className;
    tr.appendChild(td);
    return td;
  }

  var compare = null;

  function setupCompare() {
    var holder = document.getElementById("vb-compare-data");
    var table = document.getElementById("vb-compare");
    if (!holder || !table) return;
    var data = JSON.parse(holder.textContent);
    var mSel = document.getElementById("vb-cmp-machine");
    var aSel = document.getElementById("vb-cmp-a");
    var bSel = document.getElementById("vb-cmp-b");
    var summary = document.getElementById("vb-cmp-summary");
    var machines = Object.keys(data.machines);
    fillSelect(mSel, machines.map(function (m) { return [m, m]; }));

    function fillCommits() {
      var commits = data.machines[mSel.value].commits;
      fillSelect(aSel, commits);
      fillSelect(bSel, commits);
      aSel.selectedIndex = Math.min(1, commits.length - 1);
      bSel.selectedIndex = 0;
    }

    function values(commit) {
      var v = data.machines[mSel.value].values[commit] || [[], [], [], [], []];
      var map = {};
      for (var i = 0; i < v[0].length; i++) map[v[0][i]] = { value: v[1][i], lo: v[2][i], hi: v[3][i], n: v[4][i] };
      return map;
    }

    function estimateText(e, unit) {
      if (!e || e.value === null) return "n/a";
      var main = format(e.value, unit);
      if (e.n <= 1 || e.lo === e.hi || e.lo === null || e.hi === null) return main;
      return main + " [" + format(e.lo, unit) + ", " + format(e.hi, unit) + "]";
    }

    function render() {
      var a = values(aSel.value), b = values(bSel.value);
      var verdictOf = pairVerdicts(data, data.machines[mSel.value], aSel.value, bSel.value);
      var ids = {};
      Object.keys(a).concat(Object.keys(b)).forEach(function (id) { ids[id] = true; });
      var rank = { slower: 0, faster: 1, unchanged: 2, "not judged": 3, missing: 4 };
      var entries = Object.keys(ids).map(function (id) {
        var row = data.rows[id], ea = a[id], eb = b[id];
        var both = ea !== undefined && eb !== undefined && ea.value !== null && eb.value !== null;
        var delta = both ? compareChange(ea, eb) : null;
        var verdict = !both ? "missing" : verdictOf(id);
        // The most certain change first: how far the interval's near end lies from 1 (log).
        var certainty = delta ? Math.max(Math.log(delta.lo), -Math.log(delta.hi), 0) : 0;
        return { row: row, ea: ea, eb: eb, delta: delta, verdict: verdict, certainty: certainty };
      });
      entries.sort(function (x, y) {
        return (rank[x.verdict] - rank[y.verdict]) || (y.certainty - x.certainty);
      });
      var body = table.tBodies[0];
      body.innerHTML = "";
      var counts = { slower: 0, faster: 0, unchanged: 0, "not judged": 0, missing: 0 };
      entries.forEach(function (e) {
        var tr = document.createElement("tr");
        counts[e.verdict] += 1;
        var kind = e.verdict === "slower" ? "worse" : (e.verdict === "faster" ? "better" : "same");
        tr.className = "vb-f vb-" + kind;
        tr.setAttribute("data-machine", mSel.value);
        tr.setAttribute("data-benchmark", e.row[0]);
        tr.setAttribute("data-params", e.row[1]);
        if (e.row[2]) tr.setAttribute("data-workload", e.row[2]);
        if (e.row[3]) tr.setAttribute("data-device", e.row[3]);
        // The metric alone when the workload has its column; Class.metric otherwise.
        var parts = e.row[0].split(".");
        var name = cell(tr, parts.slice(e.row[2] && parts.length > 2 ? -1 : 1).join("."), null, "vb-bench");
        name.title = e.row[0];
        cell(tr, e.row[9], null);
        cell(tr, e.row[8], null);
        cell(tr, e.row[3] || "", null);
        cell(tr, estimateText(e.ea, e.row[5]), e.ea === undefined ? "" : e.ea.value, "vb-num vb-base");
        cell(tr, estimateText(e.eb, e.row[5]), e.eb === undefined ? "" : e.eb.value, "vb-num vb-head");
        var text = e.delta === null ? "n/a" : estimateText(e.delta, "x");
        cell(tr, text, e.delta === null ? "" : e.delta.value, "vb-num vb-ratio");
        var label = e.verdict === "missing" ? "in one commit only" : e.verdict;
        if (e.row[7] === 1 && e.verdict !== "missing") label += " · gated";
        cell(tr, label, e.verdict, "vb-verdict");
        body.appendChild(tr);
      });
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th) { th.removeAttribute("aria-sort"); });
      summary.textContent = aSel.value === bSel.value
        ? "base and head are the same commit: pick two to compare."
        : counts.slower + " slower, " + counts.faster + " faster, " + counts.unchanged +
          " unchanged, " + counts["not judged"] + " not judged, " + counts.missing + " in one commit only.";
      summary.setAttribute("data-counts", JSON.stringify(counts));
      var state = readState();
      table.querySelectorAll("tr.vb-f").forEach(function (el) {
        el.classList.toggle("vb-hidden", !matches(elementMeta(el), state));
      });
    }

    mSel.addEventListener("change", function () { fillCommits(); render(); });
    aSel.addEventListener("change", render);
    bSel.addEventListener("change", render);
    compare = {
      sync: function (state) {
        if (state.machine && state.machine !== mSel.value && data.machines[state.machine]) {
          mSel.value = state.machine;
          fillCommits();
          render();
        }
      }
    };
    var state = readState();
    if (state.machine && data.machines[state.machine]) mSel.value = state.machine;
    if (machines.length) { fillCommits(); render(); }
  }

  function start() {
    setupFilters();
    setupSorting();
    setupCompare();
    applyFilters();
    window.vbDashboard = { applyFilters: applyFilters, state: readState };
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
