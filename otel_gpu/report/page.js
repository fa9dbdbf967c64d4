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

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const k of kids) e.append(k);
  return e;
}

function human(v, unit) {
  if (v == null || Number.isNaN(v)) return "";
  if (unit === "share") return (100 * v).toFixed(1) + "%";
  if (unit === "B/s") {
    const u = ["B/s", "kB/s", "MB/s", "GB/s", "TB/s"];
    let i = 0;
    while (Math.abs(v) >= 1000 && i < u.length - 1) { v /= 1000; i++; }
    return v.toFixed(v < 10 ? 2 : 0) + " " + u[i];
  }
  if (unit === "s") return v < 1 ? (1000 * v).toFixed(1) + " ms" : v.toFixed(2) + " s";
  return String(+v.toPrecision(4));
}

function when(t) { return new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC"; }

function findings() {
  const box = document.getElementById("findings");
  box.dataset.count = D.findings.length;
  if (!D.findings.length) box.append(el("p", {}, D.diagnosis_note || "No findings."));
  D.findings.forEach((f, i) => {
    const ranges = (f.ranges || []).map(([a, b]) => when(a).slice(11, 19) + "-" + when(b).slice(11, 19)).join(", ");
    box.append(el("div", { class: "finding " + f.severity, "data-rule": f.rule },
      el("div", { class: "title" }, `${i + 1}. [${f.severity}] ${f.title}`),
      el("div", { class: "detail" }, "Seen: " + f.seen),
      el("div", { class: "detail" }, "Why: " + f.why),
      el("div", { class: "detail" }, "Do: " + f.action),
      ranges ? el("div", { class: "detail" }, "When: " + ranges + " (shaded on the plots)") : ""));
  });
}

function shadeRanges(u) {
  const ctx = u.ctx, top = u.bbox.top, h = u.bbox.height;
  ctx.save();
  ctx.fillStyle = "rgba(198, 40, 40, 0.10)";
  for (const f of D.findings) for (const [a, b] of f.ranges || []) {
    const x0 = u.valToPos(a, "x", true), x1 = u.valToPos(b, "x", true);
    ctx.fillRect(x0, top, Math.max(2, x1 - x0), h);
  }
  ctx.restore();
}

function plots() {
  const box = document.getElementById("plots");
  const width = Math.min(1160, document.body.clientWidth - 40 || 1100);
  for (const p of D.plots) {
    const points = p.series.reduce((n, s) => n + s.values.filter((v) => v != null).length, 0);
    const div = el("div", { class: "plot", id: "plot-" + p.id, "data-series": p.series.length, "data-points": points },
      el("h3", {}, p.title));
    box.append(div);
    if (!points) { div.append(el("div", { class: "empty" }, p.empty || "no data recorded for this plot")); continue; }
    const series = p.stacked ? [...p.series].reverse() : p.series;
    const opts = {
      width, height: 230,
      series: [{ value: (u, v) => (v == null ? "" : when(v)) }, ...series.map((s, i) => {
        const color = COLORS[(p.stacked ? series.length - 1 - i : i) % COLORS.length];
        return { label: s.label, stroke: color, width: 1.5, dash: s.dash ? [6, 4] : undefined,
                 fill: p.stacked ? color : undefined, value: (u, v) => human(v, p.unit), spanGaps: false,
                 points: { show: p.x.length < 60 } };
      })],
      axes: [{}, { size: 80, values: (u, vals) => vals.map((v) => human(v, p.unit)) }],
      scales: p.unit === "share" ? { y: { range: [0, p.stacked ? 1 : null] } } : {},
      hooks: { drawClear: [shadeRanges] },
    };
    new uPlot(opts, [p.x, ...series.map((s) => s.values)], div);
  }
}

// ---- flame graphs ----
const F = D.flames;

function unpack(t) {
  return { name: F.names[t[0]], value: t[1], children: t[2].map(unpack) };
}

function mergeInto(a, b) {
  a.value += b.value;
  for (const c of b.children) {
    const same = a.children.find((x) => x.name === c.name);
    if (same) mergeInto(same, c); else a.children.push(JSON.parse(JSON.stringify(c)));
  }
}

function flameTree(rank, phase) {
  const root = { name: "total", value: 0, children: [] };
  for (const [key, t] of Object.entries(F.trees)) {
    const [r, p] = key.split("|");
    if ((rank === "all" || r === rank) && (phase === "all" || p === phase)) mergeInto(root, unpack(t));
  }
  return root;
}

function seconds(v) { return F.unit === "nanoseconds" ? v / 1e9 : v; }

let chart = null;

function drawFlame() {
  const rank = document.getElementById("flame-rank").value, phase = document.getElementById("flame-phase").value;
  const tree = flameTree(rank, phase);
  const box = document.getElementById("flame");
  box.dataset.rank = rank;
  box.dataset.phase = phase;
  box.dataset.total = seconds(tree.value).toFixed(6);
  document.getElementById("flame-total").textContent =
    `${seconds(tree.value).toFixed(2)} s of samples (rank ${rank}, phase ${phase})`;
  box.innerHTML = "";
  if (!tree.value) { box.append(el("div", { class: "empty" }, "no samples for this rank and phase")); return; }
  const total = tree.value;
  chart = flamegraph().width(Math.min(1160, document.body.clientWidth - 40 || 1100)).cellHeight(18)
    .transitionDuration(0).minFrameSize(1).sort(true)
    .label((d) => `${d.data.name}: ${seconds(d.value).toFixed(3)} s (${(100 * d.value / total).toFixed(1)}%)`);
  d3.select(box).datum(tree).call(chart);
  const view = new URLSearchParams(location.hash.slice(1)).get("view");
  location.hash = "rank=" + encodeURIComponent(rank) + "&phase=" + encodeURIComponent(phase) + (view ? "&view=" + view : "");
}

function flames() {
  const rankSel = document.getElementById("flame-rank"), phaseSel = document.getElementById("flame-phase");
  for (const r of ["all", ...F.ranks]) rankSel.append(el("option", { value: r }, r));
  for (const p of ["all", ...F.phases]) phaseSel.append(el("option", { value: p }, p));
  const want = new URLSearchParams(location.hash.slice(1));
  if (F.ranks.includes(want.get("rank"))) rankSel.value = want.get("rank");
  if (F.phases.includes(want.get("phase"))) phaseSel.value = want.get("phase");
  rankSel.addEventListener("change", drawFlame);
  phaseSel.addEventListener("change", drawFlame);
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
