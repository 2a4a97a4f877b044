// hybrid_rl studio: a run's charts (uPlot, served from the package), status line, samples and console.
// What to chart comes from /api/schema's "charts"; a progress report (/api/runs/<id>, /api/watch)
// holds one run or several runs of one folder, drawn over each other.
"use strict";

const PALETTE = ["#1a73e8", "#d93025", "#188038", "#9334e6", "#e37400", "#12b5cb", "#c5221f", "#5f6368"];
const DASHES = [null, [8, 4], [2, 3], [8, 3, 2, 3]];  // after each round of the palette, the next dash
const studioCharts = {};  // title -> uPlot instance (read by the browser test)
window.studioCharts = studioCharts;

// The series of one chart: [{label, points: [[step, value]...]}] for each run and each matching key.
function chartSeries(spec, runs) {
  const out = [];
  for (const run of runs) {
    const keys = new Set();
    for (const m of run.metrics) for (const k of Object.keys(m))
      if (spec.keys.some((want) => (want.endsWith("/") ? k.startsWith(want) : k === want))) keys.add(k);
    for (const key of [...keys].sort()) {
      const points = run.metrics.filter((m) => typeof m[key] === "number").map((m) => [m.step, m[key]]);
      if (points.length) out.push({label: runs.length > 1 ? `${run.name} \u00b7 ${key}` : key, points});
    }
  }
  return out;
}

// The i-th series' line: the palette's colours, then again dashed, so no two of 32 series look alike.
function seriesStyle(i) {
  const dash = DASHES[Math.floor(i / PALETTE.length) % DASHES.length];
  return dash ? {stroke: PALETTE[i % PALETTE.length], dash} : {stroke: PALETTE[i % PALETTE.length]};
}

// uPlot's aligned columns: the union of steps, each series null where it has no value.
function aligned(series) {
  const steps = [...new Set(series.flatMap((s) => s.points.map((p) => p[0])))].sort((a, b) => a - b);
  const index = new Map(steps.map((s, i) => [s, i]));
  return [steps, ...series.map((s) => {
    const column = new Array(steps.length).fill(null);
    for (const [step, value] of s.points) column[index.get(step)] = value;
    return column;
  })];
}

function chartOptions(spec, series, width) {
  return {
    title: spec.title, width, height: 220,
    scales: {x: {time: false}},
    axes: [{label: "step", stroke: "#5f6368", grid: {stroke: "#eee"}, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]},
           {label: spec.y_label, stroke: "#5f6368", grid: {stroke: "#eee"}, size: 60}],
    series: [{label: "step"}, ...series.map((s, i) => ({
      label: s.label, ...seriesStyle(i), width: 2, spanGaps: true,
      points: {show: true, size: 5}, value: (u, v) => (v == null ? "\u2013" : (+v.toPrecision(4)).toString()),
    }))],
    legend: {live: true},
  };
}

function drawCharts(runs) {
  const box = byId("charts");
  const width = Math.max(320, Math.floor((box.clientWidth || 1200) / 2) - 24);
  for (const spec of schema.charts) {
    const series = chartSeries(spec, runs);
    let holder = box.querySelector(`[data-chart="${spec.title}"]`);
    const signature = series.map((s) => s.label).join("|");
    if (!holder) {
      holder = document.createElement("div"); holder.className = "chart"; holder.dataset.chart = spec.title;
      box.append(holder);
    }
    holder.hidden = series.length === 0;
    if (!series.length) continue;
    if (studioCharts[spec.title] && holder.dataset.signature === signature) {
      studioCharts[spec.title].setData(aligned(series));  // same series: new points only
      continue;
    }
    studioCharts[spec.title]?.destroy();
    holder.replaceChildren();
    holder.dataset.signature = signature;
    studioCharts[spec.title] = new uPlot(chartOptions(spec, series, width), aligned(series), holder);
  }
}

function clock(seconds) {
  if (seconds == null) return "?";
  const s = Math.round(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  const m = Math.round(s / 60);
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

function statusText(out) {
  const s = out.status || {};
  const state = runId ? (out.running ? "running" : `finished (exit ${out.returncode})`) : "watching";
  const parts = [state, `step ${s.step ?? 0}${s.total != null ? ` of ${s.total}` : ""}`, `elapsed ${clock(s.elapsed_s)}`];
  if (s.s_per_step != null) parts.push(`${s.s_per_step.toFixed(1)} s/step`);
  if (s.eta_s != null && s.step < s.total && (!runId || out.running)) parts.push(`ETA ${clock(s.eta_s)}`);
  if ((out.runs || []).length > 1) {  // the status, samples and console are the first run's
    parts[0] = `${out.runs[0].name}: ${parts[0]}`;
    parts.push(`${out.runs.length} runs overlaid`);
  }
  return parts.join(" \u00b7 ") + ` \u2014 ${out.run_dir}`;
}

function cell(row, text, tag = "td") {
  const td = document.createElement(tag); td.textContent = String(text); row.append(td); return td;
}

function showSamples(samples) {  // model output is text, never HTML
  const table = byId("samples"); table.replaceChildren();
  if (!samples.length) return;
  const head = table.insertRow(); for (const h of ["step", "prompt", "response", "score"]) cell(head, h, "th");
  for (const s of samples) {
    const row = table.insertRow();
    cell(row, s.step);
    const prompt = String(s.prompt ?? "");  // the end of the prompt: the question, not the system text
    cell(row, prompt.length > 240 ? "\u2026" + prompt.slice(-240) : prompt).className = "text";
    cell(row, s.response ?? "").className = "text";
    cell(row, s.score ?? "");
  }
}

function showRun(out) {
  byId("run-state").textContent = statusText(out);
  byId("stop").disabled = !(runId && out.running);
  drawCharts(out.runs && out.runs.length ? out.runs : [{name: "run", metrics: out.metrics}]);
  showSamples(out.samples || []);
  byId("console").textContent = (out.console || []).join("\n");
}
