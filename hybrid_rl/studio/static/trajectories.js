// hybrid_rl studio: the trajectory viewer. A run's dump folders and steps (/api/trajectories), a
// step's prompt groups (/api/trajectories/step), a group's responses side by side and one response's
// tokens coloured by mask, log-prob, entropy, advantage or the rollout-training log-prob gap
// (/api/trajectories/group). Model output is text, never HTML. Uses get() and byId() of app.js.
"use strict";

const traj = {run: "", folders: [], folder: null, step: null, groups: [], group: null, row: 0, mode: "mask",
              sort: "order", timer: null};
window.trajectoryState = traj;  // read by the browser test

const TRAJ_SORTS = {  // [label, key of a group, key of a response, direction]
  order: ["dump order", null, null, 0],
  reward: ["lowest reward", "score_mean", "score", 1],
  longest: ["longest", "length_max", "length", -1],
  mismatch: ["highest mismatch", "mismatch_max", "mismatch", -1],
};
const TRAJ_MODES = {  // [label, the detail's values key (null: the mask), what the colour says]
  mask: ["mask", null, "model / tool / environment"],
  log_prob: ["log-prob", "log_prob", "white: certain, red: unlikely (the training log-prob, else the rollout's)"],
  entropy: ["entropy", "entropy", "white: 0, purple: the row's highest"],
  advantage: ["advantage", "advantage", "red: negative, green: positive"],
  gap: ["log-prob gap", "gap", "rollout \u2212 training log-prob: red below, blue above"],
};

function trajEl(tag, text, cls) {
  const el = document.createElement(tag);
  if (text != null) el.textContent = String(text);
  if (cls) el.className = cls;
  return el;
}
const trajNum = (v, digits = 3) => (v == null ? "\u2013" : (+v.toFixed(digits)).toString());
const trajQuery = (extra) => new URLSearchParams({run_dir: traj.run, ...extra}).toString();

function trajSorted(items, groupLevel) {
  const [, groupKey, rowKey, dir] = TRAJ_SORTS[traj.sort];
  const key = groupLevel ? groupKey : rowKey;
  if (!key) return items.slice();
  const value = (x) => (x[key] == null ? (dir > 0 ? Infinity : -Infinity) : x[key]);
  return items.slice().sort((a, b) => dir * (value(a) - value(b)));
}

function trajControls(box) {
  const bar = trajEl("div"); bar.id = "traj-controls";
  const run = trajEl("input"); run.id = "traj-run"; run.type = "text"; run.size = 50;
  run.placeholder = "a run folder (empty: the one watched above)";
  const open = trajEl("button", "Open"); open.id = "traj-open";
  const select = (id, label) => {
    const s = trajEl("select"); s.id = id;
    const l = trajEl("label", label + " "); l.append(s); bar.append(l); return s;
  };
  bar.append(run, open);
  const folder = select("traj-folder", "dumps"), step = select("traj-step", "step"), sort = select("traj-sort", "sort");
  for (const [name, [label]] of Object.entries(TRAJ_SORTS)) sort.add(new Option(label, name));
  const follow = trajEl("label"); const check = trajEl("input"); check.type = "checkbox"; check.id = "traj-follow";
  check.checked = true; follow.append(check, " follow the run (newest step)"); bar.append(follow);
  box.append(bar, Object.assign(trajEl("p"), {id: "traj-error"}), Object.assign(trajEl("p"), {id: "traj-notes"}));
  for (const id of ["traj-groups", "traj-group-head", "traj-cards", "traj-modes", "traj-tokens", "traj-turns"]) {
    const d = trajEl("div"); d.id = id; box.append(d);
  }
  byId("traj-tokens").hidden = true;
  open.addEventListener("click", () => trajOpen(run.value.trim() || byId("watch-dir").value.trim()));
  folder.addEventListener("change", () => { traj.folder = folder.value; trajFillSteps(true); });
  step.addEventListener("change", () => { traj.step = step.value; trajLoadStep(); });
  sort.addEventListener("change", () => { traj.sort = sort.value; trajShowGroups(); if (traj.group) trajShowGroup(); });
}

function trajFail(out) {
  byId("traj-error").textContent = out && out.error ? out.error : "";
  return !!(out && out.error);
}

async function trajOpen(run) {
  Object.assign(traj, {run, folders: [], folder: null, step: null, groups: [], group: null, row: 0});
  byId("traj-run").value = run;
  for (const id of ["traj-groups", "traj-group-head", "traj-cards", "traj-modes", "traj-tokens", "traj-turns"])
    byId(id).replaceChildren();
  byId("traj-tokens").hidden = true;
  await trajList();
  clearInterval(traj.timer);
  traj.timer = setInterval(() => { if (byId("traj-follow").checked) trajList(); }, 5000);
}

// The folders and their steps; while following, a new newest step is opened as it appears.
async function trajList() {
  const out = await get(`/api/trajectories?${trajQuery({})}`);
  if (trajFail(out)) return;
  byId("traj-notes").textContent = (out.notes || []).join(" \u00b7 ");
  const before = JSON.stringify(traj.folders);
  traj.folders = out.folders;
  const select = byId("traj-folder");
  if (JSON.stringify(out.folders.map((f) => f.name)) !== JSON.stringify([...select.options].map((o) => o.value))) {
    select.replaceChildren(...out.folders.map((f) => new Option(f.name, f.name)));
  }
  if (!out.folders.some((f) => f.name === traj.folder)) traj.folder = out.folders.length ? out.folders[0].name : null;
  select.value = traj.folder ?? "";
  if (before !== JSON.stringify(traj.folders)) trajFillSteps(byId("traj-follow").checked || traj.step == null);
}

function trajFillSteps(newest) {
  const folder = traj.folders.find((f) => f.name === traj.folder);
  const steps = folder ? folder.steps.map(String) : [];
  const select = byId("traj-step");
  select.replaceChildren(...steps.map((s) => new Option(s, s)));
  const step = newest || !steps.includes(traj.step) ? steps[steps.length - 1] ?? null : traj.step;
  select.value = step ?? "";
  if (step !== traj.step || newest) { traj.step = step; if (step != null) trajLoadStep(); }
}

async function trajLoadStep() {
  const out = await get(`/api/trajectories/step?${trajQuery({folder: traj.folder, step: traj.step})}`);
  if (trajFail(out)) return;
  traj.groups = out.groups;
  trajShowGroups();
  const keep = traj.group && traj.groups.some((g) => g.uid === traj.group.uid) ? traj.group.uid : null;
  const first = trajSorted(traj.groups, true)[0];
  if (keep || first) trajLoadGroup(keep || first.uid, keep ? traj.row : 0);
}

function trajRow(table, cells, cls) {
  const tr = table.insertRow(); if (cls) tr.className = cls;
  for (const [text, c] of cells) tr.append(trajEl(tr.parentNode.tagName === "THEAD" ? "th" : "td", text, c));
  return tr;
}

function trajShowGroups() {
  const table = trajEl("table", null, "traj"); table.id = "traj-group-table";
  const head = table.createTHead().insertRow();
  for (const h of ["group (uid)", "responses", "mean score", "advantage sum", "longest", "max mismatch", "prompt"])
    head.append(trajEl("th", h));
  const body = table.createTBody();
  for (const g of trajSorted(traj.groups, true)) {
    const tail = g.input.length > 120 ? "\u2026" + g.input.slice(-120) : g.input;
    const tr = trajRow(body, [[g.uid], [g.rows.length], [trajNum(g.score_mean)], [trajNum(g.advantage_sum, 4)],
                              [g.length_max], [trajNum(g.mismatch_max, 4)], [tail.replace(/\s+/g, " "), "text"]], "pick");
    tr.dataset.uid = g.uid;
    if (traj.group && traj.group.uid === g.uid) tr.classList.add("chosen");
    tr.addEventListener("click", () => trajLoadGroup(g.uid, 0));
  }
  byId("traj-groups").replaceChildren(table);
}

async function trajLoadGroup(uid, row) {
  const out = await get(`/api/trajectories/group?${trajQuery({folder: traj.folder, step: traj.step, uid})}`);
  if (trajFail(out)) return;
  traj.group = out; traj.row = Math.min(row, out.rows.length - 1);
  byId("traj-notes").textContent = (out.notes || []).join(" \u00b7 ");
  for (const tr of document.querySelectorAll("#traj-group-table tbody tr")) tr.classList.toggle("chosen", tr.dataset.uid === uid);
  trajShowGroup();
}

function trajShowGroup() {
  const g = traj.group, head = byId("traj-group-head");
  const advantages = g.rows.map((r) => r.advantage).filter((a) => a != null);
  const sum = advantages.reduce((a, b) => a + b, 0);
  head.replaceChildren(trajEl("b", `${traj.folder} \u00b7 step ${g.step} \u00b7 group ${g.uid}: ${g.rows.length} responses`),
                       trajEl("span", ` \u00b7 ground truth ${JSON.stringify(g.gts)} \u00b7 advantages sum to ${trajNum(sum, 6)}`));
  const prompt = trajEl("details"); prompt.append(trajEl("summary", "prompt"), trajEl("pre", g.input)); head.append(prompt);
  const cards = [];
  for (const r of trajSorted(g.rows, false)) {
    const card = trajEl("div", null, "traj-card"); card.dataset.row = r.row;
    const facts = trajEl("div", null, "facts");
    const adv = trajEl("span", trajNum(r.advantage, 4), r.advantage > 0 ? "pos" : r.advantage < 0 ? "neg" : "");
    adv.dataset.advantage = r.advantage ?? "";
    const pairs = [["row", r.row], ["score", trajNum(r.score)], ["advantage", adv], ["tokens", `${r.length} (${r.model_tokens} model)`],
                   ["mismatch", trajNum(r.mismatch, 4)]];
    if (r.observations) pairs.push(["observations", r.observations]);
    for (const [k, v] of pairs) facts.append(trajEl("b", k), v instanceof Node ? v : trajEl("span", v));
    card.append(facts, trajEl("pre", r.output));
    card.addEventListener("click", () => { traj.row = g.rows.indexOf(r); trajShowGroup(); });
    if (g.rows.indexOf(r) === traj.row) card.classList.add("chosen");
    cards.push(card);
  }
  byId("traj-cards").replaceChildren(...cards);
  trajShowRow();
}

// The colour of one token's value, scaled within the row; null: the role's own colour (CSS).
function trajColour(mode, v, scale) {
  if (v == null || mode === "mask") return null;
  const mix = (rgb, t) => `rgba(${rgb}, ${Math.max(0, Math.min(1, t)).toFixed(3)})`;
  if (mode === "log_prob") return mix("217, 48, 37", -v / 5);
  if (mode === "entropy") return mix("147, 52, 230", scale ? v / scale : 0);
  const t = scale ? v / scale : 0;  // advantage, gap: diverging around 0
  if (mode === "gap") return t >= 0 ? mix("26, 115, 232", t) : mix("217, 48, 37", -t);
  return t >= 0 ? mix("24, 128, 56", t) : mix("217, 48, 37", -t);
}

function trajModes(r) {
  const box = byId("traj-modes"); box.replaceChildren(trajEl("b", "colour by"));
  for (const [name, [label, key]] of Object.entries(TRAJ_MODES)) {
    const l = trajEl("label"), input = trajEl("input");
    input.type = "radio"; input.name = "traj-mode"; input.value = name;
    input.disabled = key != null && r.values[key] == null;  // the dump lacks it (e.g. no old-log-prob pass)
    if (input.disabled && traj.mode === name) traj.mode = "mask";
    input.checked = traj.mode === name;
    input.addEventListener("change", () => { traj.mode = name; trajShowRow(); });
    l.append(input, " " + label); box.append(l);
  }
  const legend = trajEl("span"); legend.id = "traj-legend";
  if (traj.mode === "mask") {
    for (const role of ["model", "tool", "environment"]) {
      const s = trajEl("span", null, "swatch"); s.style.background = `var(--${role})`; legend.append(s, role);
    }
  } else legend.textContent = TRAJ_MODES[traj.mode][2];
  box.append(legend);
}

function trajShowRow() {
  const r = traj.group.rows[traj.row];
  trajModes(r);
  const key = TRAJ_MODES[traj.mode][1], values = key ? r.values[key] : null;
  const finite = (values || []).filter((v, i) => v != null && r.roles[i] === "model").map(Math.abs);
  const scale = finite.length ? Math.max(...finite) : 0;
  const tokens = byId("traj-tokens"); tokens.hidden = false;
  tokens.replaceChildren(...r.ids.map((id, i) => {
    const piece = r.pieces ? r.pieces[i] : `[${id}]`;
    const span = trajEl("span", piece, piece === "" ? "tok empty" : "tok");
    span.dataset.role = r.roles[i]; span.dataset.i = i;
    const colour = r.roles[i] === "model" ? trajColour(traj.mode, values ? values[i] : null, scale) : null;
    if (colour) span.style.backgroundColor = colour;
    const facts = [`#${i} id ${id} ${JSON.stringify(piece)}`, `mask ${r.mask[i]} (${r.roles[i]})`];
    for (const [name, column] of Object.entries(r.values)) if (column) facts.push(`${name} ${trajNum(column[i], 4)}`);
    span.title = facts.join("\n");
    return span;
  }));
  trajShowTurns(r);
}

function trajShowTurns(r) {
  const box = byId("traj-turns"); box.replaceChildren();
  if (r.turns.length < 2 && !Object.keys(r.agent).length) return;
  box.append(trajEl("b", `turns (${r.turns.length})`));
  if (Object.keys(r.agent).length) box.append(trajEl("pre", JSON.stringify(r.agent)));
  for (const t of r.turns) {
    const div = trajEl("div", null, "turn"); div.dataset.role = t.role;
    div.append(trajEl("div", `${t.role} \u00b7 tokens ${t.start}\u2013${t.end}`), trajEl("pre", t.text));
    for (const c of t.calls || []) {
      const text = c.error ? `tool call error: ${c.error}` : `tool call ${c.name}(${JSON.stringify(c.arguments)})`;
      div.append(trajEl("div", text, c.error ? "call bad" : "call"));
    }
    box.append(div);
  }
}

trajControls(byId("trajectories"));
