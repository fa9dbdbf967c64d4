// The report page: findings, uPlot time series with the findings' time ranges shaded, and a
// d3-flame-graph per rank and phase. Data: the JSON in #report-data (otel_gpu/report/data.py).
"use strict";
window.reportErrors = [];
window.addEventListener("error", (e) => {
  window.reportErrors.push(String(e.message));
  const box = document.getElementById("errors");
  if (box) { box.textContent = "page errors: " + window.reportErrors.join("; "); box.dataset.count = window.reportErrors.length; }
});

const D = JSON.parse(document.getElementById("report-data").textContent);
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
// a phase has one colour in every report ("unphased" a neutral grey); other series are coloured by group (GPU, rank)
const PHASE_COLORS = { data_wait: "#ff7f0e", forward: "#1f77b4", backward: "#2ca02c", optimizer: "#9467bd",
                       checkpoint: "#8c564b", eval: "#17becf", "collective wait": "#bcbd22", unphased: "#c7c7c7" };
const SAVE_SHADE = "rgba(140, 86, 75, 0.16)", FINDING_SHADE = "rgba(198, 40, 40, 0.10)";

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const k of kids) e.append(k);
  return e;
}

function scaled(v, units, base) {
  let i = 0;
  while (Math.abs(v) >= base && i < units.length - 1) { v /= base; i++; }
  return v.toFixed(Math.abs(v) < 10 ? 2 : 0) + " " + units[i];
}

function human(v, unit) {
  if (v == null || Number.isNaN(v)) return "";
  if (unit === "share") return (100 * v).toFixed(1) + "%";
  if (unit === "B/s") return scaled(v, ["B/s", "kB/s", "MB/s", "GB/s", "TB/s"], 1000);
  if (unit === "B") return scaled(v, ["B", "KiB", "MiB", "GiB", "TiB"], 1024);
  if (unit === "W") return v.toFixed(0) + " W";
  if (unit === "Hz") return scaled(v, ["Hz", "kHz", "MHz", "GHz"], 1000);
  if (unit === "s") return v < 1 ? (1000 * v).toFixed(1) + " ms" : v.toFixed(2) + " s";
  return String(+v.toPrecision(4));
}

// seconds since time 0 (the first training step), as the time axis reads
function since(t, t0) {
  const d = t - t0, a = Math.abs(d);
  if (a < 120) return (Math.round(d * 10) / 10) + " s";
  const m = Math.floor(a / 60), sec = Math.round(a - 60 * m);
  return (d < 0 ? "-" : "") + m + " min" + (sec ? " " + sec + " s" : "");
}

function when(t) { return new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC"; }

function findings() {
  const box = document.getElementById("findings");
  box.dataset.count = D.findings.length;
  if (!D.findings.length) box.append(el("p", {}, D.diagnosis_note || "No findings."));
  D.findings.forEach((f, i) => {
    const axis = (D.plots[0] || {}).axis;   // time 0 of the plots, so a range can be found on them
    const rel = (a, b) => (axis ? ` (${since(a, axis.t0)} to ${since(b, axis.t0)})` : "");
    const ranges = (f.ranges || []).map(([a, b]) => when(a).slice(11, 19) + "-" + when(b).slice(11, 19) + rel(a, b))
      .join(", ");
    box.append(el("div", { class: "finding " + f.severity, "data-rule": f.rule },
      el("div", { class: "title" }, `${i + 1}. [${f.severity}] ${f.title}`),
      el("div", { class: "detail" }, "Seen: " + f.seen),
      el("div", { class: "detail" }, "Why: " + f.why),
      el("div", { class: "detail" }, "Do: " + f.action),
      ranges ? el("div", { class: "detail" }, "When: " + ranges + " (shaded on the plots)") : ""));
  });
}

function shadeRanges(u, bands) {
  const ctx = u.ctx, top = u.bbox.top, h = u.bbox.height;
  const band = (a, b, style) => {
    const x0 = u.valToPos(a, "x", true), x1 = u.valToPos(b, "x", true);
    ctx.fillStyle = style;
    ctx.fillRect(x0, top, Math.max(2, x1 - x0), h);
  };
  ctx.save();
  for (const b of bands || []) band(b.from, b.to, SAVE_SHADE);
  for (const f of D.findings) for (const [a, b] of f.ranges || []) band(a, b, FINDING_SHADE);
  ctx.restore();
}

function seriesColor(p, s, groups) {
  if (p.id === "phases" && s.label in PHASE_COLORS) return PHASE_COLORS[s.label];
  return COLORS[groups.indexOf(s.group) % COLORS.length];
}

// time-axis ticks at round numbers of seconds since time 0 (about one per 110 px)
function ticksSince(t0, width) {
  const steps = [0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 43200, 86400];
  return (u, i, min, max) => {
    const want = (max - min) / Math.max(2, width / 110);
    const inc = steps.find((x) => x >= want) || steps[steps.length - 1];
    const out = [];
    for (let k = Math.ceil((min - t0) / inc - 1e-9); t0 + k * inc <= max + 1e-9; k++) out.push(t0 + k * inc);
    return out;
  };
}

function plotsNote(box) {
  const a = (D.plots[0] || {}).axis;
  if (!a) return;
  const t0 = when(a.t0).slice(11, 19);
  const text = a.basis === "first step"
    ? `Time 0 is the first training step (${t0} UTC)` + (a.startup_s >= 0.5
      ? `; the ${a.startup_s.toFixed(1)} s of start-up before it (imports, loading, set-up) are left out of the plots.` : ".")
    : `No training step recorded: time 0 is the start of the recording (${t0} UTC).`;
  const saves = (D.plots[0].bands || []).length;
  box.append(el("p", { class: "plots-note", id: "plots-note", "data-t0": a.t0, "data-startup": a.startup_s },
    text + " Each value is drawn over the interval it describes (a step per export interval, not a point at" +
    " its export time). Shaded: " + (saves ? `checkpoint saves (brown, ${saves}), ` : "") + "findings' time ranges (red)."));
}

// the running sum of stacked series at each point (null where the series itself has no value)
function runningSums(series) {
  const acc = series.length ? series[0].values.map(() => 0) : [];
  return series.map((s) => s.values.map((v, i) => (v == null ? null : (acc[i] += v))));
}

function plots() {
  const box = document.getElementById("plots");
  const width = Math.min(1160, document.body.clientWidth - 40 || 1100);
  plotsNote(box);
  for (const p of D.plots) {
    const points = p.series.reduce((n, s) => n + s.values.filter((v) => v != null).length, 0);
    const div = el("div", { class: "plot", id: "plot-" + p.id, "data-series": p.series.length, "data-points": points,
                            "data-bands": (p.bands || []).length }, el("h3", {}, p.title));
    box.append(div);
    if (!points) { div.append(el("div", { class: "empty" }, p.empty || "no data recorded for this plot")); continue; }
    const t0 = p.axis ? p.axis.t0 : p.x[0];
    // a stacked plot draws running sums, the top one first so each fill shows as its own band; its
    // legend and hover show each series' own value (the data's), not the sum drawn
    const drawn = p.stacked ? runningSums(p.series) : p.series.map((s) => s.values);
    const series = p.stacked ? [...p.series].reverse() : p.series;
    if (p.stacked) drawn.reverse();
    const groups = [...new Set(p.series.map((s) => s.group))];
    const opts = {
      width, height: 230,
      series: [{ label: "time", value: (u, v) => (v == null ? "" : when(v) + " (" + since(v, t0) + ")") }, ...series.map((s) => {
        const color = seriesColor(p, s, groups);
        return { label: s.label, stroke: color, width: 1.5, dash: s.dash ? [6, 4] : undefined,
                 fill: p.stacked ? color : undefined, spanGaps: false,
                 value: (u, v, si, i) => (p.stacked ? (i == null ? "" : human(s.values[i], p.unit)) : human(v, p.unit)),
                 paths: uPlot.paths.stepped({ align: 1 }), points: { show: false } };
      })],
      scales: { x: { time: false, range: [p.x[0], p.x[p.x.length - 1]] },
                ...(p.unit === "share" ? { y: { range: [0, p.stacked ? 1 : null] } } : {}) },
      axes: [{ splits: ticksSince(t0, width), values: (u, vals) => vals.map((v) => since(v, t0)) },
             { size: 80, values: (u, vals) => vals.map((v) => human(v, p.unit)) }],
      hooks: { drawClear: [(u) => shadeRanges(u, p.bands)] },
    };
    new uPlot(opts, [p.x, ...drawn], div);
  }
}

// ---- flame graphs ----
const F = D.flames;

// a tree as the data holds it, flat in preorder (name index, value, number of children per frame),
// as d3's nested nodes; loops, not recursion: a recursive job's stack can be thousands of frames deep
function unpack(flat) {
  const root = { name: F.names[flat[0]], value: flat[1], children: [] };
  const open = [[root, flat[2]]];   // frames whose children are still to come, with how many
  for (let i = 3; i < flat.length; i += 3) {
    while (open[open.length - 1][1] === 0) open.pop();
    const parent = open[open.length - 1];
    parent[1]--;
    const node = { name: F.names[flat[i]], value: flat[i + 1], children: [] };
    parent[0].children.push(node);
    open.push([node, flat[i + 2]]);
  }
  return root;
}

// add tree b (a fresh unpack, not used again) into tree a, frames of the same name merged
function mergeInto(a, b) {
  const todo = [[a, b]];
  while (todo.length) {
    const [x, y] = todo.pop();
    x.value += y.value;
    for (const c of y.children) {
      const same = x.children.find((k) => k.name === c.name);
      if (same) todo.push([same, c]); else x.children.push(c);
    }
  }
}

// the trees of `rank` and `phase` ("all": any) in `trees`, found by "rank|phase" key (a name may hold "|")
function chosen(trees, rank, phase) {
  const out = [];
  // "all" phases: the CPU samples only (GPU time by launching code, F.gpu_phase, is another measure)
  const phases = phase === "all" ? F.phases.filter((p) => p !== F.gpu_phase) : [phase];
  for (const r of rank === "all" ? F.ranks : [rank]) for (const p of phases) {
    if (Object.prototype.hasOwnProperty.call(trees, r + "|" + p)) out.push(trees[r + "|" + p]);
  }
  return out;
}

function flameTree(rank, phase, own) {
  const root = { name: "total", value: 0, children: [] };
  const sets = own ? [F.trees, F.own_trees || {}] : [F.trees];
  for (const trees of sets) for (const t of chosen(trees, rank, phase)) mergeInto(root, unpack(t));
  return root;
}

function seconds(v) { return F.unit === "nanoseconds" ? v / 1e9 : v; }

let chart = null;

function drawFlame() {
  const rank = document.getElementById("flame-rank").value, phase = document.getElementById("flame-phase").value;
  const own = document.getElementById("flame-own").checked;
  const tree = flameTree(rank, phase, own);
  const ownTotal = own ? 0 : chosen(F.own_trees || {}, rank, phase).reduce((n, t) => n + t[1], 0);
  const native = new Set((F.native || []).map((i) => F.names[i]));
  const box = document.getElementById("flame");
  box.dataset.rank = rank;
  box.dataset.phase = phase;
  box.dataset.own = own ? "1" : "0";
  box.dataset.total = seconds(tree.value).toFixed(6);
  box.dataset.ownLeftOut = seconds(ownTotal).toFixed(6);
  box.dataset.native = tree.children.filter((c) => native.has(c.name)).map((c) => c.name).join("|");
  document.getElementById("flame-total").textContent =
    `${seconds(tree.value).toFixed(2)} s of ${phase === F.gpu_phase ? "GPU time" : "samples"} (rank ${rank}, phase ${phase})` +
    (ownTotal ? `; otel-gpu's own threads, ${seconds(ownTotal).toFixed(2)} s, left out` : "");
  box.innerHTML = "";
  if (!tree.value) { box.append(el("div", { class: "empty" }, "no samples for this rank and phase")); return; }
  const total = tree.value;
  chart = flamegraph().width(Math.min(1160, document.body.clientWidth - 40 || 1100)).cellHeight(18)
    .transitionDuration(0).minFrameSize(1).sort(true)
    .label((d) => `${d.data.name}: ${seconds(d.value).toFixed(3)} s (${(100 * d.value / total).toFixed(1)}%)`);
  d3.select(box).datum(tree).call(chart);
  const view = new URLSearchParams(location.hash.slice(1)).get("view");
  location.hash = "rank=" + encodeURIComponent(rank) + "&phase=" + encodeURIComponent(phase) + (own ? "&own=1" : "") +
    (view ? "&view=" + view : "");
}

function flames() {
  const rankSel = document.getElementById("flame-rank"), phaseSel = document.getElementById("flame-phase");
  const ownBox = document.getElementById("flame-own");
  for (const r of ["all", ...F.ranks]) rankSel.append(el("option", { value: r }, r));
  for (const p of ["all", ...F.phases]) phaseSel.append(el("option", { value: p }, p));
  const want = new URLSearchParams(location.hash.slice(1));
  if (F.ranks.includes(want.get("rank"))) rankSel.value = want.get("rank");
  if (F.phases.includes(want.get("phase"))) phaseSel.value = want.get("phase");
  ownBox.checked = want.get("own") === "1";
  rankSel.addEventListener("change", drawFlame);
  phaseSel.addEventListener("change", drawFlame);
  ownBox.addEventListener("change", drawFlame);
  document.getElementById("flame-search").addEventListener("input", (e) => chart && chart.search(e.target.value));
  document.getElementById("flame-reset").addEventListener("click", () => chart && chart.resetZoom());
  drawFlame();
  if (want.get("view") === "flame") {   // the flame graph alone (a link to share, a screenshot)
    for (const id of ["sec-summary", "sec-findings", "sec-plots"]) document.getElementById(id).style.display = "none";
  }
}

findings();
plots();
flames();
document.body.dataset.ready = "1";
