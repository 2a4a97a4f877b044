// hybrid_rl studio: a run's step timeline (/api/timeline) as a Gantt chart on a canvas.
// One lane per worker (the trainer's named steps; the decoupled producer's rollout and reward
// stages), a bar per span coloured by its name, over wall time; shaded bands and dashed lines mark
// the training steps; wait_* spans are hatched grey; a span inside another on its lane (wait_batch in
// take_experiences) is drawn inset. Zoom: a step range (the inputs), or drag across the chart to see
// a stretch of time (double-click: the whole range again). app.js calls studioTimeline.poll(run_dir).
"use strict";
(() => {
  const LANE_H = 28, LABEL_W = 118, TOP = 22, AXIS_H = 26;
  const KNOWN = [  // [pattern, colour]: the named steps of docs/observability.md, "Step timeline"
    [/^generate/, "#1a73e8"], [/reward|rm_score/, "#188038"], [/old_log_prob/, "#9334e6"],
    [/ref_log_prob/, "#e37400"], [/values/, "#12b5cb"], [/advantage/, "#f9ab00"],
    [/update_actor/, "#d93025"], [/update_critic/, "#a142f4"], [/validate/, "#795548"],
    [/checkpoint/, "#3c4043"], [/weights/, "#00897b"], [/take_experiences/, "#3949ab"],
    [/dump/, "#8d6e63"]];
  const EXTRA = ["#e91e63", "#7cb342", "#5e35b1", "#00acc1", "#fb8c00", "#6d4c41", "#546e7a", "#c0ca33"];
  const state = {runDir: null, data: null, view: null, drawn: [], busy: false};
  function el(tag, props, ...kids) {  // an element with properties (``dataset`` copied key by key) and children
    const {dataset, ...rest} = props || {}, e = Object.assign(document.createElement(tag), rest);
    Object.assign(e.dataset, dataset || {});
    e.append(...kids);
    return e;
  }

  function colour(name) {
    if (name.startsWith("wait")) return "#bdc1c6";
    const hit = KNOWN.find(([re]) => re.test(name));
    if (hit) return hit[1];
    let h = 0;
    for (const c of name) h = (h * 31 + c.charCodeAt(0)) >>> 0;
    return EXTRA[h % EXTRA.length];
  }

  function build(box) {
    const first = el("input", {id: "timeline-first", type: "number", min: 0, style: "width:5em"});
    const last = el("input", {id: "timeline-last", type: "number", min: 0, style: "width:5em"});
    const show = el("button", {id: "timeline-show", textContent: "Show"});
    const follow = el("button", {id: "timeline-follow", textContent: "Last steps"});
    const info = el("span", {id: "timeline-info", style: "color:#5f6368;font-size:.9em"});
    const canvas = el("canvas", {id: "timeline-canvas", style: "display:block;cursor:crosshair"});
    const tip = el("div", {id: "timeline-tip", style: "position:absolute;display:none;background:#202124;color:#fff;"
      + "font-size:.8em;padding:.2em .5em;border-radius:4px;pointer-events:none;white-space:nowrap"});
    const legend = el("div", {id: "timeline-legend",
                              style: "display:flex;flex-wrap:wrap;gap:.2em 1em;font-size:.85em"});
    const chart = el("div", {style: "position:relative;border:1px solid #dadce0;border-radius:6px;margin:.4em 0"},
                     canvas, tip);
    box.append(el("div", {id: "timeline-controls"}, "steps ", first, " to ", last, " ", show, " ", follow, " ", info),
               chart, legend);
    show.addEventListener("click", () => { state.view = null; refresh(); });
    follow.addEventListener("click", () => { first.value = last.value = ""; state.view = null; refresh(); });
    attachZoom(canvas, tip);
  }

  async function refresh() {
    if (!state.runDir || state.busy) return;
    const params = new URLSearchParams({run_dir: state.runDir});
    for (const key of ["first", "last"]) {
      const value = document.getElementById(`timeline-${key}`).value;
      if (value !== "") params.set(key, value);
    }
    state.busy = true;
    try {
      const out = await fetch(`/api/timeline?${params}`).then((r) => r.json());
      if (out.error) { document.getElementById("timeline-info").textContent = out.error; return; }
      state.data = out;
      draw();
    } finally { state.busy = false; }
  }

  // Each span's depth on its lane: how many spans of the lane enclose it.
  function depths(spans) {
    const out = new Map(), byLane = {};
    for (const s of spans) (byLane[s.worker] ??= []).push(s);
    for (const lane of Object.values(byLane)) {
      lane.sort((a, b) => a.start - b.start || b.end - a.end);
      const open = [];
      for (const s of lane) {
        while (open.length && open[open.length - 1].end <= s.start + 1e-9) open.pop();
        while (open.length && open[open.length - 1].end < s.end - 1e-6) open.pop();  // overlapping, not enclosing
        out.set(s, open.length);
        open.push(s);
      }
    }
    return out;
  }

  function extent(d) {
    const times = d.spans.flatMap((s) => [s.start, s.end]);
    return times.length ? [Math.min(...times), Math.max(...times)] : [0, 1];
  }

  function niceStep(range, target) {
    const raw = range / target, p = 10 ** Math.floor(Math.log10(raw));
    return [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw) || raw;
  }

  function draw() {
    const d = state.data, canvas = document.getElementById("timeline-canvas");
    const info = document.getElementById("timeline-info");
    const shown = d.first === null ? "" : `steps ${d.first}\u2013${d.last} of ${d.max_step}`;
    info.textContent = [d.run ? `the run in ${d.run}` : "", shown, d.message].filter(Boolean).join(" \u00b7 ");
    const width = Math.max(480, canvas.parentElement.clientWidth - 2);
    const height = TOP + LANE_H * Math.max(1, d.lanes.length) + AXIS_H;
    const ratio = window.devicePixelRatio || 1;
    canvas.width = width * ratio; canvas.height = height * ratio;
    canvas.style.width = `${width}px`; canvas.style.height = `${height}px`;
    const g = canvas.getContext("2d");
    g.setTransform(ratio, 0, 0, ratio, 0, 0);
    g.clearRect(0, 0, width, height);
    g.font = "12px system-ui, sans-serif";
    const [t0, t1] = state.view || extent(d);
    const plotW = width - LABEL_W - 10, x = (t) => LABEL_W + ((t - t0) / Math.max(t1 - t0, 1e-9)) * plotW;
    const bottom = TOP + LANE_H * d.lanes.length;
    drawSteps(g, d, x, bottom);
    drawLanes(g, d, x, width);
    drawAxis(g, t0, t1, x, bottom, extent(d)[0]);
    drawLegend(d);
  }

  function drawSteps(g, d, x, bottom) {
    d.steps.forEach((b, i) => {
      const left = Math.max(LABEL_W, x(b.start)), right = x(b.end);
      if (right < LABEL_W) return;
      if (i % 2 === 0) { g.fillStyle = "#f6f8fc"; g.fillRect(left, TOP, Math.max(0, right - left), bottom - TOP); }
      g.strokeStyle = "#9aa0a6"; g.setLineDash([4, 3]);
      for (const t of [b.start, b.end]) {
        if (x(t) < LABEL_W) continue;
        g.beginPath(); g.moveTo(x(t), TOP - 4); g.lineTo(x(t), bottom); g.stroke();
      }
      g.setLineDash([]);
      g.fillStyle = "#3c4043";
      const label = `step ${b.step}${b.done ? "" : " \u2026"}`;
      if (right - left > g.measureText(label).width + 4) g.fillText(label, left + 3, TOP - 7);
    });
  }

  function hatch(g, x0, y0, w, h) {
    g.save(); g.beginPath(); g.rect(x0, y0, w, h); g.clip();
    g.strokeStyle = "#80868b"; g.lineWidth = 1;
    for (let k = -h; k < w; k += 6) { g.beginPath(); g.moveTo(x0 + k, y0 + h); g.lineTo(x0 + k + h, y0); g.stroke(); }
    g.restore();
  }

  function drawLanes(g, d, x, width) {
    const depth = depths(d.spans.filter((s) => s.name !== "step"));
    state.drawn = [];
    d.lanes.forEach((lane, row) => {
      const top = TOP + row * LANE_H;
      g.strokeStyle = "#e8eaed"; g.beginPath(); g.moveTo(0, top + LANE_H); g.lineTo(width, top + LANE_H); g.stroke();
      g.fillStyle = "#202124"; g.fillText(lane, 6, top + LANE_H / 2 + 4);
    });
    const spans = [...depth.keys()].sort((a, b) => depth.get(a) - depth.get(b));  // enclosing bars first
    for (const s of spans) {
      const row = d.lanes.indexOf(s.worker), inset = 3 + 5 * Math.min(depth.get(s), 2);
      const left = Math.max(LABEL_W, x(s.start)), right = Math.min(width - 10, x(s.end));
      if (row < 0 || right < LABEL_W || left > width - 10) continue;
      const box = {x: left, y: TOP + row * LANE_H + inset, w: Math.max(1, right - left), h: LANE_H - 2 * inset};
      g.fillStyle = colour(s.name);
      g.fillRect(box.x, box.y, box.w > 3 ? box.w - 1 : box.w, box.h);  // 1 px apart: back-to-back spans stay two
      if (s.name.startsWith("wait")) hatch(g, box.x, box.y, box.w, box.h);
      state.drawn.push({worker: s.worker, name: s.name, step: s.step, depth: depth.get(s), span: s, ...box});
    }
    drawLabels(g);
  }

  // A bar's name on it where it fits and no bar nested in it covers the text (waits go unlabelled: the legend).
  function drawLabels(g) {
    g.fillStyle = "#fff";
    for (const b of state.drawn) {
      const text = g.measureText(b.name).width + 6;
      if (b.name.startsWith("wait") || b.w <= text) continue;
      const covered = state.drawn.some((o) => o.worker === b.worker && o.depth > b.depth
                                       && o.x < b.x + text && o.x + o.w > b.x);
      if (!covered) g.fillText(b.name, b.x + 3, b.y + b.h / 2 + 4);
    }
  }

  function drawAxis(g, t0, t1, x, bottom, origin) {
    const tick = niceStep(Math.max(t1 - t0, 1e-6), 8);
    g.fillStyle = "#5f6368"; g.strokeStyle = "#5f6368";
    g.beginPath(); g.moveTo(LABEL_W, bottom); g.lineTo(x(t1), bottom); g.stroke();
    for (let t = Math.ceil((t0 - origin) / tick) * tick + origin; t <= t1 + 1e-9; t += tick) {
      g.beginPath(); g.moveTo(x(t), bottom); g.lineTo(x(t), bottom + 4); g.stroke();
      g.fillText(`${+(t - origin).toFixed(3)} s`, x(t) - 8, bottom + 16);
    }
    g.fillText("wall time", 6, bottom + 16);
  }

  function drawLegend(d) {
    const legend = document.getElementById("timeline-legend");
    legend.innerHTML = "";
    for (const name of d.names.filter((n) => n !== "step")) {
      const swatch = el("span", {style: "display:inline-block;width:.9em;height:.9em;margin-right:.3em;"
        + `vertical-align:-.1em;`
        + `background:${colour(name)}` + (name.startsWith("wait") ? ";background-image:repeating-linear-gradient("
        + "45deg,#80868b 0 1px,transparent 1px 5px)" : "")});
      legend.append(el("span", {className: "timeline-name", dataset: {name}}, swatch, name));
    }
  }

  function spanAt(px, py) {
    const hits = state.drawn.filter((b) => px >= b.x && px <= b.x + b.w && py >= b.y && py <= b.y + b.h);
    return hits.sort((a, b) => b.depth - a.depth)[0];
  }

  function attachZoom(canvas, tip) {
    let from = null;
    const at = (e) => { const r = canvas.getBoundingClientRect(); return [e.clientX - r.left, e.clientY - r.top]; };
    const time = (px) => {
      const [t0, t1] = state.view || extent(state.data), plotW = canvas.clientWidth - LABEL_W - 10;
      return t0 + ((px - LABEL_W) / plotW) * (t1 - t0);
    };
    canvas.addEventListener("mousedown", (e) => { from = at(e)[0]; });
    canvas.addEventListener("mouseup", (e) => {
      const to = at(e)[0];
      if (from !== null && Math.abs(to - from) > 5 && state.data) {
        state.view = [time(Math.min(from, to)), time(Math.max(from, to))];
        draw();
      }
      from = null;
    });
    canvas.addEventListener("dblclick", () => { state.view = null; if (state.data) draw(); });
    canvas.addEventListener("mousemove", (e) => {
      const [px, py] = at(e), hit = spanAt(px, py);
      tip.style.display = hit ? "block" : "none";
      if (!hit) return;
      const s = hit.span, dot = " \u00b7 ";
      const extra = ["batch", "version"].filter((k) => k in s).map((k) => `${dot}${k} ${s[k]}`).join("");
      tip.textContent = `${s.name}${dot}${s.worker}${dot}step ${s.step}${dot}${(s.end - s.start).toFixed(3)} s${extra}`;
      tip.style.left = `${Math.min(px + 12, canvas.clientWidth - 260)}px`; tip.style.top = `${py + 14}px`;
    });
    canvas.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  }

  // Called at every poll of the run (app.js): a new folder resets the range; a zoomed view stays.
  function poll(runDir) {
    const box = document.getElementById("timeline");
    if (!box) return;
    if (!document.getElementById("timeline-canvas")) build(box);
    if (runDir !== state.runDir) { state.runDir = runDir; state.view = null; }
    refresh();
  }

  window.studioTimeline = {poll, refresh, state, colour};
})();
