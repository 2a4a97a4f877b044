// hybrid_rl studio: the form's widgets, chosen from each field's type in /api/schema.
// Every widget reports the text the command line would take (`key=<text>`), or true/false for a
// checkbox; the server reads it by the field's kind, so nothing here knows a config key.
"use strict";

const fieldId = (key) => "f-" + key.replaceAll(".", "--");

// Help text: the docstrings' reStructuredText inline literals (``x``), links (`text <url>`_) and bare
// URLs, built as DOM nodes (never innerHTML: a docstring is text).
function renderHelp(text) {
  const box = document.createElement("div"); box.className = "help";
  const pattern = /``([^`]+)``|`([^`<]+?)\s*<(https?:[^>]+)>`_|(https?:\/\/[^\s)>,]+)|`([^`]+)`/g;
  let last = 0, m;
  while ((m = pattern.exec(text)) !== null) {
    box.append(text.slice(last, m.index));
    if (m[1] !== undefined || m[5] !== undefined) {
      const code = document.createElement("code"); code.textContent = m[1] ?? m[5]; box.append(code);
    } else {
      const a = document.createElement("a"); a.href = m[3] ?? m[4]; a.textContent = m[2] ?? m[4];
      a.target = "_blank"; a.rel = "noopener"; box.append(a);
    }
    last = pattern.lastIndex;
  }
  box.append(text.slice(last));
  return box;
}

// "[a, 'b c', 3]" -> ["a", "'b c'", "3"]: split at top-level commas (quotes and brackets respected).
function listItems(text) {
  const s = String(text ?? "").trim();
  if (!s.startsWith("[") || !s.endsWith("]")) return s && s !== "null" ? [s] : [];
  const body = s.slice(1, -1), items = [];
  let depth = 0, quote = null, cur = "";
  for (const ch of body) {
    if (quote) { if (ch === quote) quote = null; cur += ch; continue; }
    if (ch === "'" || ch === '"') quote = ch;
    else if ("[{".includes(ch)) depth++;
    else if ("]}".includes(ch)) depth--;
    else if (ch === "," && depth === 0) { items.push(cur.trim()); cur = ""; continue; }
    cur += ch;
  }
  if (cur.trim()) items.push(cur.trim());
  return items;
}

// An item in Hydra's list grammar: as typed when already quoted or plainly safe, else single-quoted.
const quoteItem = (item) => /^(['"]).*\1$/.test(item) || /^[\w.\/*@?+%$-]+$/.test(item) ? item : `'${item.replaceAll("'", "\\'")}'`;

function listEditor(f, value, report) {
  const box = document.createElement("div"); box.className = "list-editor"; box.id = fieldId(f.key);
  box.dataset.key = f.key;
  const items = listItems(value);
  const read = () => "[" + [...box.querySelectorAll("input.item")].map((i) => i.value.trim()).filter((v) => v !== "")
    .map(quoteItem).join(", ") + "]";
  const emit = () => report(read());
  box.readValue = read;  // the "none" toggle re-reads the items when it is unchecked
  const addRow = (text) => {
    const row = document.createElement("div");
    const input = document.createElement("input"); input.type = "text"; input.className = "item"; input.value = text;
    input.addEventListener("input", emit);
    const remove = document.createElement("button"); remove.type = "button"; remove.textContent = "\u2212";
    remove.title = "remove this item"; remove.addEventListener("click", () => { row.remove(); emit(); });
    row.append(input, remove); box.insertBefore(row, add);
  };
  const add = document.createElement("button"); add.type = "button"; add.textContent = "+ add"; add.className = "add";
  add.addEventListener("click", () => { addRow(""); box.querySelector("div:last-of-type input")?.focus(); });
  box.append(add);
  items.forEach(addRow);
  return box;
}

function plainInput(f, value, report) {
  let input;
  if (f.choices) {
    input = document.createElement("select");
    for (const c of f.choices) input.add(new Option(c, c));
    input.value = value;
    if (input.selectedIndex < 0) input.selectedIndex = 0;  // unset (null): the first choice once "none" is unchecked
  } else if (f.kind === "bool") {
    input = document.createElement("input"); input.type = "checkbox"; input.checked = value === true || value === "true";
  } else if (f.kind === "int" || f.kind === "float") {
    input = document.createElement("input"); input.type = "number"; input.step = f.kind === "int" ? "1" : "any";
    input.value = value === "null" ? "" : value;
    if (f.bounds) setRange(input, f);
  } else if (f.kind === "dict" || (f.kind === "any" && !f.path_role)) {
    input = document.createElement("textarea"); input.rows = 2; input.value = value;
    input.placeholder = "YAML, e.g. {key: 1} or [a, b]";
  } else {
    input = document.createElement("input"); input.type = "text"; input.value = value === "null" ? "" : value;
  }
  input.id = fieldId(f.key); input.dataset.key = f.key;
  // an emptied free-form field (e.g. data.train_files) means unset, as its null default shows empty
  const read = () => (input.type === "checkbox" ? input.checked : f.kind === "any" && input.value === "" ? "null" : input.value);
  input.addEventListener(input.tagName === "SELECT" || input.type === "checkbox" ? "change" : "input", () => report(read()));
  input.readValue = read;
  return input;
}

// The field's declared range on its number input: min/max (an open end of an int field moves to the
// next integer; of a float field it stays, and the check's message tells the end itself is refused).
function setRange(input, f) {
  const b = f.bounds, int = f.kind === "int";
  if (b.low !== null) input.min = String(int && b.low_open ? Math.floor(b.low) + 1 : b.low);
  if (b.high !== null) input.max = String(int && b.high_open ? Math.ceil(b.high) - 1 : b.high);
  input.title = "must be " + b.rule;
}

// ">= 1" as "\u2265 1", for the label.
const rangeText = (rule) => rule.replace(">=", "\u2265").replace("<=", "\u2264");

// The widget of one field: its input (by type), a "none" toggle for optional fields, and for path
// fields a line saying whether what it names exists. `report(text)` gets every edit.
function widget(f, value, report) {
  const box = document.createElement("div"); box.className = "widget";
  const isNull = value === "null" || value === null;
  const input = f.kind === "list" ? listEditor(f, isNull ? "[]" : value, report) : plainInput(f, isNull ? "" : value, report);
  if (f.default === "null" && "placeholder" in input && !input.placeholder) input.placeholder = "null (unset)";
  box.append(input);
  if (f.optional) {
    const toggle = document.createElement("label"); toggle.className = "none-toggle";
    const none = document.createElement("input"); none.type = "checkbox"; none.id = "none-" + fieldId(f.key).slice(2);
    none.checked = isNull;
    const setDisabled = () => { for (const el of input.querySelectorAll ? [input, ...input.querySelectorAll("input,button")] : [input]) el.disabled = none.checked; };
    none.addEventListener("change", () => { setDisabled(); report(none.checked ? "null" : input.readValue()); });
    toggle.append(none, " none");
    box.append(toggle);
    setDisabled();
  }
  if (f.path_role) {
    const status = document.createElement("span"); status.className = "path-status"; status.dataset.pathFor = f.key;
    box.append(status);
  }
  return box;
}

// One row of the form: label (human, with the dotted key small), widget, help, the check's message.
function fieldRow(f, value, report) {
  const row = document.createElement("div"); row.className = "field"; row.dataset.field = f.key;
  const label = document.createElement("label"); label.htmlFor = fieldId(f.key);
  const name = document.createElement("span"); name.className = "label"; name.textContent = f.label;
  const key = document.createElement("code"); key.className = "key"; key.textContent = f.key;
  label.append(name, key);
  if (f.bounds) {
    const range = document.createElement("span"); range.className = "range"; range.dataset.rangeFor = f.key;
    range.textContent = rangeText(f.bounds.rule);
    label.append(range);
  }
  const error = document.createElement("div"); error.className = "error"; error.dataset.errorFor = f.key;
  row.append(label, widget(f, value, report), renderHelp(f.doc), error);
  return row;
}
