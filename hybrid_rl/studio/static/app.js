// hybrid_rl studio: the page's state, checks, export, import and runs (the widgets: form.js).
"use strict";
let schema = null, texts = {}, timer = null;
const byId = (id) => document.getElementById(id);
// Every request carries the token's cookie (set by the URL the studio printed); without it the
// server answers 401 and the page says how to get in.
function answer(r) {
  return r.json().then((out) => {
    if (r.status === 401) byId("access-error").textContent = out.error;
    return out;
  });
}
const post = (url, body) => fetch(url, {method: "POST", headers: {"Content-Type": "application/json"},
                                       body: JSON.stringify(body)}).then(answer);
const get = (url) => fetch(url).then(answer);

// The form: the beginner view groups its handful of keys by section; the expert view shows those
// "Essentials" first, then every section of the config (collapsed below the top level).
function report(key) {
  return (text) => { texts[key] = text; clearTimeout(timer); timer = setTimeout(check, 250); };
}

function section(parent, title, doc, open) {
  const d = document.createElement("details"); d.open = open; d.className = "section";
  const summary = document.createElement("summary"); summary.textContent = title;
  d.append(summary);
  if (doc) d.append(renderHelp(doc));
  parent.append(d);
  return d;
}

function groupLabel(key) {
  const g = schema.groups.find((g) => g.key === key);
  return g ? g.label : "General";
}

function render() {
  const expert = document.querySelector("input[name=view]:checked").value === "expert";
  const form = byId("form"); form.innerHTML = "";
  const value = (f) => (f.key in texts ? texts[f.key] : f.default);
  const beginner = schema.fields.filter((f) => schema.beginner.includes(f.key));
  if (!expert) {  // the essentials, by top-level section
    const boxes = {};
    for (const f of beginner) {
      const top = f.key.split(".")[0];
      boxes[top] ??= section(form, groupLabel(top), "", true);
      boxes[top].append(fieldRow(f, value(f), report(f.key)));
    }
  } else {
    const essentials = section(form, "Essentials", "The keys a first run needs; every other key below.", true);
    for (const f of beginner) essentials.append(fieldRow(f, value(f), report(f.key)));
    const boxes = {"": form};
    const box = (key) => {  // nested sections, as the YAML nests them
      if (key in boxes) return boxes[key];
      const parent = key.includes(".") ? box(key.slice(0, key.lastIndexOf("."))) : form;
      const g = schema.groups.find((g) => g.key === key);
      boxes[key] = section(parent, groupLabel(key), g ? g.doc : "", !key.includes("."));
      boxes[key].dataset.section = key;
      return boxes[key];
    };
    for (const f of schema.fields) if (!schema.beginner.includes(f.key)) box(f.group).append(fieldRow(f, value(f), report(f.key)));
  }
  check();
}

let checks = 0;
async function check() {  // only the newest answer counts: answers may arrive out of order
  const mine = ++checks;
  const paths = {};
  for (const f of schema.fields) if (f.path_role) paths[f.key] = f.key in texts ? texts[f.key] : f.default;
  const [out, found] = await Promise.all([post("/api/check", {values: texts}), post("/api/paths", {values: paths})]);
  if (mine !== checks) return;
  show(out.errors || {});
  for (const el of document.querySelectorAll("[data-path-for]")) {
    const p = (found.paths || {})[el.dataset.pathFor];  // a path outside the studio's folders: "refused"
    el.textContent = p ? (p.state === "ok" ? "\u2713 " : ["missing", "refused"].includes(p.state) ? "\u2717 " : "") + p.message : "";
    el.dataset.state = p ? p.state : "";
  }
}

function show(errors) {
  for (const el of document.querySelectorAll("[data-error-for]")) el.textContent = errors[el.dataset.errorFor] || "";
  const shown = new Set([...document.querySelectorAll("[data-error-for]")].map((el) => el.dataset.errorFor));
  const rest = Object.entries(errors).filter(([k]) => !shown.has(k)).map(([k, m]) => m);
  byId("form-error").textContent = rest.join(" ");
  byId("export").disabled = byId("launch").disabled = Object.keys(errors).length > 0;
}

async function exportConfig() {
  const out = await post("/api/export", {values: texts});
  show(out.errors);
  byId("command").textContent = out.command || ""; byId("yaml").textContent = out.yaml || "";
  const link = byId("download");
  if (link.href) URL.revokeObjectURL(link.href);
  link.hidden = !out.yaml;
  if (out.yaml) link.href = URL.createObjectURL(new Blob([out.yaml], {type: "application/yaml"}));
}

let runId = null, watchDir = null, poller = null;
async function poll() {
  const out = runId ? await get(`/api/runs/${runId}`) : await get(`/api/watch?run_dir=${encodeURIComponent(watchDir)}`);
  if (out.error) { byId("run-state").textContent = out.error; return; }
  showRun(out);
  if (window.studioTimeline) studioTimeline.poll(out.run_dir);  // the step timeline (timeline.js)
}

function startPolling() { clearInterval(poller); poll(); poller = setInterval(poll, 2000); }

// A run that executes code (a reward file, a tool's YAML, trust_remote_code) starts only once the
// user has seen its paths: the server answers them in "confirm", and the launch repeats them.
async function launch(confirmCode) {
  const out = await post("/api/runs", {values: texts, confirm_code: confirmCode || []});
  show(out.errors || {});
  if (out.confirm) {
    const list = out.confirm.map((c) => `${c.key}: ${c.path}\n    (${c.what})`).join("\n");
    if (window.confirm(`This run executes code from:\n${list}\n\nLaunch it?`)) launch(out.confirm.map((c) => c.path));
    return;
  }
  if (out.error && !Object.keys(out.errors || {}).length) byId("form-error").textContent = out.error;
  if (out.id) { runId = out.id; byId("watch-dir").value = out.run_dir; startPolling(); }
}

async function load(kind) {
  const out = await post("/api/import", {text: byId("import-text").value, kind});
  if (out.error) { byId("form-error").textContent = out.error; return; }
  texts = out.values; render();
}

get("/api/schema").then((s) => {
  if (!s.fields) return;  // refused: the access message is shown
  schema = s;
  for (const name of Object.keys(s.presets)) byId("preset").add(new Option(name, name));
  byId("preset").addEventListener("change", (e) => { texts = {...schema.presets[e.target.value]}; render(); });
  for (const r of document.querySelectorAll("input[name=view]")) r.addEventListener("change", render);
  byId("export").addEventListener("click", exportConfig);
  byId("launch").addEventListener("click", () => launch());
  byId("watch").addEventListener("click", () => { runId = null; watchDir = byId("watch-dir").value; startPolling(); });
  byId("stop").addEventListener("click", () => post(`/api/runs/${runId}/stop`, {}));
  byId("import-yaml").addEventListener("click", () => load("yaml"));
  byId("import-command").addEventListener("click", () => load("command"));
  render();
});
