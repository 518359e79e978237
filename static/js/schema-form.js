// A form generated from a JSON Schema (the input schemas that GET /api/methods publishes).
//
// schemaForm(objectSchema, {root, omit}) renders one field per property and returns
//   { element, collect({complete}), fill(values), showErrors(fieldErrors, prefix), clearErrors(), isEmpty(),
//     normalize(values) }.
//
// - Handled: string, integer, number, boolean, enum, nullable (anyOf [X, null]), arrays of
//   integers/numbers (comma-separated text), arrays of strings (one per line) and arrays of
//   objects (repeatable rows, e.g. ExtraArg). `$ref: "#/$defs/…"` is resolved against `root`.
//   Anything else gets a text area that takes JSON.
// - Labels come from property names ("gpu_memory_utilization" → "GPU memory utilization"),
//   hints from the description, bounds and default.
// - Each input's name is the property's path: "max_model_len", "extra_args.0.name". A server field
//   error keyed "options.max_model_len" is placed with showErrors(error.fieldErrors, "options").
// - collect() returns {values, errors}: values omit empty fields and fields left at their default
//   (with {complete: true}, only empty fields: what an edit sends to replace every value);
//   errors (path → message) are what cannot be sent at all (not a number, not whole numbers).
//   Bounds are only hinted (and flagged as you type); the server's checks are the authority.
// - fill(values) shows `values` (an object as the server returns it) in the fields; a field
//   whose property is absent goes back to its default (or empty).

import { h } from "./ui.js";

const WORDS = { gpu: "GPU", gpus: "GPUs", id: "ID", ids: "IDs", cpu: "CPU", api: "API", url: "URL", mcp: "MCP", http: "HTTP" };
const UNITS = new Set(["s", "ms"]);
let serial = 0;

// "gpu_memory_utilization" → "GPU memory utilization"; "start_timeout_s" → "Start timeout (s)".
export function readableName(name) {
  const parts = String(name).split("_").filter(Boolean);
  const unit = parts.length > 1 && UNITS.has(parts[parts.length - 1]) ? parts.pop() : null;
  const words = parts.map((w) => WORDS[w] || w);
  if (words.length && words[0] === parts[0]) words[0] = words[0].charAt(0).toUpperCase() + words[0].slice(1);
  return words.join(" ") + (unit ? ` (${unit})` : "");
}

function deref(schema, root) {
  let s = schema || {};
  for (let hops = 0; s.$ref && hops < 16; hops += 1) {
    const match = /^#\/\$defs\/(.+)$/.exec(s.$ref);
    const target = match && root && root.$defs ? root.$defs[match[1]] : null;
    if (!target) break;
    const { $ref, ...rest } = s;
    s = { ...target, ...rest };
  }
  return s;
}

// The property's schema with anyOf [X, null] folded into X; `nullable` says whether null was allowed.
export function resolveSchema(schema, root) {
  let s = deref(schema, root);
  let nullable = false;
  const variants = s.anyOf || s.oneOf;
  if (Array.isArray(variants)) {
    const others = variants.filter((v) => v.type !== "null");
    nullable = others.length < variants.length;
    if (others.length === 1) {
      const { anyOf, oneOf, ...outer } = s;
      s = { ...deref(others[0], root), ...outer };
    }
  }
  if (Array.isArray(s.type)) {
    nullable = nullable || s.type.includes("null");
    const others = s.type.filter((t) => t !== "null");
    s = { ...s, type: others.length === 1 ? others[0] : others };
  }
  return { schema: s, nullable };
}

function kindOf(s, root) {
  if (Array.isArray(s.enum)) return "enum";
  if (s.type === "boolean") return "boolean";
  if (s.type === "integer" || s.type === "number") return "number";
  if (s.type === "string") return "string";
  if (s.type === "array") {
    const items = resolveSchema(s.items || {}, root).schema;
    if (items.type === "integer" || items.type === "number") return "numbers";
    if (items.type === "string" && !items.enum) return "strings";
    if (items.type === "object" && items.properties) return "rows";
  }
  return "json";
}

function boundsText(s) {
  const low = s.exclusiveMinimum !== undefined ? `more than ${s.exclusiveMinimum}`
    : s.minimum !== undefined ? `at least ${s.minimum}` : null;
  const high = s.exclusiveMaximum !== undefined ? `less than ${s.exclusiveMaximum}`
    : s.maximum !== undefined ? `at most ${s.maximum}` : null;
  if (s.minimum !== undefined && s.maximum !== undefined) return `${s.minimum} to ${s.maximum}`;
  return [low, high].filter(Boolean).join(", ") || null;
}

function hintText(s, kind) {
  const parts = [];
  if (s.description) {
    const text = s.description.replace(/`([^`]*)`/g, "“$1”");
    parts.push(text.charAt(0).toUpperCase() + text.slice(1));
  }
  if (kind === "number") parts.push(boundsText(s));
  if (kind === "numbers") parts.push(`${s.items && s.items.type === "integer" ? "Whole numbers" : "Numbers"} separated by commas`);
  if (kind === "strings") parts.push("One per line");
  if (kind === "json") parts.push("A JSON value");
  const hasDefault = s.default !== undefined && s.default !== null && kind !== "boolean"
    && !(Array.isArray(s.default) && !s.default.length);
  if (hasDefault) parts.push(`default ${Array.isArray(s.default) ? s.default.join(", ") : s.default}`);
  return parts.filter(Boolean).join(" · ");
}

// Client-side range check for a number, in words (advisory; the server has the last word).
function rangeProblem(s, value) {
  if (s.type === "integer" && !Number.isInteger(value)) return "Must be a whole number.";
  if (s.minimum !== undefined && value < s.minimum) return `Must be at least ${s.minimum}.`;
  if (s.exclusiveMinimum !== undefined && value <= s.exclusiveMinimum) return `Must be more than ${s.exclusiveMinimum}.`;
  if (s.maximum !== undefined && value > s.maximum) return `Must be at most ${s.maximum}.`;
  if (s.exclusiveMaximum !== undefined && value >= s.exclusiveMaximum) return `Must be less than ${s.exclusiveMaximum}.`;
  return null;
}

function same(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

// One labelled field: {element, read() → {value, empty, error}}; `path` is the input's name.
function buildField(name, path, propSchema, root) {
  const { schema: s, nullable } = resolveSchema(propSchema, root);
  const kind = kindOf(s, root);
  const label = readableName(name);
  const id = `sf-${(serial += 1)}-${path.replace(/[^A-Za-z0-9_-]/g, "-")}`;
  const hint = hintText(s, kind);
  const hintId = hint ? `${id}-hint` : null;
  const common = { id, name: path, "aria-describedby": hintId };
  const hintNode = hint ? h("p.hint", { id: hintId }, hint) : null;

  if (kind === "rows") return buildRows(name, path, s, root, label, hintNode);

  if (kind === "boolean" && !nullable) {
    const box = h("input", { ...common, type: "checkbox", checked: s.default === true });
    return {
      element: h("div.field.check-field", h("label.check", { for: id }, box, ` ${label}`), hintNode),
      read: () => ({ value: box.checked, empty: box.checked === (s.default === true) }),
      write: (value) => { box.checked = value === undefined || value === null ? s.default === true : Boolean(value); },
    };
  }

  let input;
  const blank = nullable || s.default === undefined || s.default === null;
  if (kind === "boolean" || kind === "enum") {
    const choices = kind === "boolean" ? [["true", "Yes"], ["false", "No"]] : s.enum.map((v) => [String(v), String(v)]);
    input = h("select", common,
      blank ? h("option", { value: "" }, "Default") : null,
      choices.map(([value, text]) => h("option", { value }, text)));
    if (!blank) input.value = String(s.default);
  } else if (kind === "number") {
    input = h("input", { ...common, type: "number", step: s.type === "integer" ? "1" : "any",
      inputmode: s.type === "integer" ? "numeric" : "decimal",
      min: s.minimum, max: s.maximum,
      placeholder: s.default !== undefined && s.default !== null ? String(s.default) : null });
  } else if (kind === "strings" || kind === "json") {
    input = h("textarea", { ...common, rows: kind === "strings" ? "2" : "3", spellcheck: "false" });
  } else {
    input = h("input", { ...common, type: "text", autocomplete: "off", spellcheck: "false",
      inputmode: kind === "numbers" ? "numeric" : null,
      placeholder: kind === "numbers" ? "e.g. 0, 1" : (typeof s.default === "string" ? s.default : null) });
  }
  const element = h("div.field", h("label", { for: id }, label), input, hintNode);

  if (kind === "number") {
    // Flag an out-of-range value as soon as it is entered; sending it still asks the server.
    input.addEventListener("change", () => {
      clearNotes(element);
      const value = input.valueAsNumber;
      const problem = input.validity.badInput ? "Enter a number." : Number.isFinite(value) ? rangeProblem(s, value) : null;
      if (problem) placeNote(element, input, problem, "client");
    });
  }

  const read = () => {
    const raw = input.value;
    if (kind === "number") {
      if (input.validity.badInput) return { error: "Enter a number." };
      if (raw.trim() === "") return { empty: true };
      const value = Number(raw);
      return { value, empty: same(value, s.default) };
    }
    if (kind === "boolean") return raw === "" ? { empty: true } : { value: raw === "true", empty: raw === String(s.default) };
    if (kind === "enum") {
      if (raw === "") return { empty: true };
      const value = s.enum.find((v) => String(v) === raw);
      return { value, empty: same(value, s.default) };
    }
    if (kind === "numbers") {
      const parts = raw.split(/[\s,]+/).filter(Boolean);
      if (!parts.length) return { empty: true };
      if (!parts.every((p) => /^-?\d+(\.\d+)?$/.test(p))) return { error: "Write numbers separated by commas, e.g. 0, 1." };
      return { value: parts.map(Number) };
    }
    if (kind === "strings") {
      const lines = raw.split("\n").map((l) => l.replace(/\r$/, "")).filter((l) => l.trim() !== "");
      return lines.length ? { value: lines } : { empty: true };
    }
    if (kind === "json") {
      if (raw.trim() === "") return { empty: true };
      try {
        return { value: JSON.parse(raw) };
      } catch (_) {
        return { error: "Not valid JSON." };
      }
    }
    const text = raw.trim();
    return text === "" ? { empty: true } : { value: text, empty: same(text, s.default) };
  };
  const write = (value) => {
    clearNotes(element);
    if (value === undefined || value === null) {
      input.value = (kind === "boolean" || kind === "enum") && !blank ? String(s.default) : "";
    } else if (kind === "numbers") input.value = [].concat(value).join(", ");
    else if (kind === "strings") input.value = [].concat(value).join("\n");
    else if (kind === "json") input.value = JSON.stringify(value);
    else input.value = String(value);
  };
  return { element, read, write };
}

// An array of objects: a group of repeatable rows ("Extra arg 1", "Extra arg 2", …) with Add/Remove.
function buildRows(name, path, s, root, label, hintNode) {
  const item = resolveSchema(s.items, root).schema;
  const singular = label.replace(/s$/, "");
  const list = h("div.schema-rows");
  const rows = []; // {element, fields: [[prop, field]]}
  let sent = []; // the row index in the last collected value → its position on screen
  const addButton = h("button.button.small", { type: "button" }, `Add ${singular.toLowerCase()}`);
  const group = h("fieldset.field.schema-group", { name: path, id: `sf-${(serial += 1)}-${path}` },
    h("legend", label), hintNode, list, h("div.actions", addButton));

  const renumber = () => {
    rows.forEach((row, i) => {
      row.legend.textContent = `${singular} ${i + 1}`;
      for (const [prop, f] of row.fields) {
        for (const input of f.element.querySelectorAll("[name]")) input.name = `${path}.${i}.${prop}`;
      }
    });
  };
  const add = (focus = true) => {
    const legend = h("legend");
    const fields = Object.entries(item.properties).map(([prop, ps]) => [prop, buildField(prop, `${path}.${rows.length}.${prop}`, ps, root)]);
    const remove = h("button.button.small.quiet", { type: "button" }, "Remove");
    const element = h("fieldset.schema-row", legend, h("div.form-row", fields.map(([, f]) => f.element)), h("div.actions", remove));
    const row = { element, legend, fields };
    remove.addEventListener("click", () => {
      rows.splice(rows.indexOf(row), 1);
      element.remove();
      renumber();
      addButton.focus();
    });
    rows.push(row);
    list.append(element);
    renumber();
    if (focus) fields[0][1].element.querySelector("input, select, textarea").focus();
    return row;
  };
  addButton.addEventListener("click", () => {
    if (s.maxItems !== undefined && rows.length >= s.maxItems) return;
    add();
  });

  const read = () => {
    const values = [];
    const errors = {};
    sent = [];
    rows.forEach((row, i) => {
      const value = {};
      let filled = false;
      for (const [prop, f] of row.fields) {
        const got = f.read();
        if (got.error) errors[`${path}.${i}.${prop}`] = got.error;
        if (got.value !== undefined) filled = filled || !got.empty;
        if (got.value !== undefined && !got.empty) value[prop] = got.value;
      }
      if (filled) {
        sent.push(i);
        values.push(value);
      }
    });
    if (Object.keys(errors).length) return { errors };
    return values.length ? { value: values } : { empty: true };
  };
  // "extra_args.0.name" refers to the n-th row sent, which is not always the n-th on screen.
  const screenPath = (rest) => {
    const [index, ...tail] = rest;
    const onScreen = sent[Number(index)];
    return onScreen === undefined ? null : [String(onScreen), ...tail];
  };
  const write = (values) => {
    rows.splice(0).forEach((row) => row.element.remove());
    for (const value of Array.isArray(values) ? values : []) {
      const row = add(false);
      for (const [prop, f] of row.fields) f.write(value ? value[prop] : undefined);
    }
  };
  return { element: group, read, write, screenPath };
}

function clearNotes(scope) {
  for (const note of scope.querySelectorAll(".field-error")) {
    const owner = note.dataset.for ? document.getElementById(note.dataset.for) : null;
    if (owner) {
      owner.removeAttribute("aria-invalid");
      owner.setAttribute("aria-describedby", owner.dataset.hintId || "");
      if (!owner.getAttribute("aria-describedby")) owner.removeAttribute("aria-describedby");
    }
    note.remove();
  }
}

function placeNote(container, input, message, kind = "server") {
  const noteId = `${input.id || "sf"}-error-${(serial += 1)}`;
  const note = h(`p.field-error.${kind}`, { id: noteId, role: "alert", dataset: { for: input.id || "" } }, message);
  if (input.dataset.hintId === undefined) {
    input.dataset.hintId = (input.getAttribute("aria-describedby") || "").split(" ").filter((x) => !x.endsWith("-error")).join(" ");
  }
  if (input.tagName !== "FIELDSET") input.setAttribute("aria-invalid", "true");
  input.setAttribute("aria-describedby", [input.dataset.hintId, noteId].filter(Boolean).join(" "));
  container.append(note);
  return note;
}

// pydantic says "Value error, GPU ids must be distinct": the part after the comma is the message.
function plainMessage(message) {
  return String(message).replace(/^Value error, /, "");
}

export function schemaForm(schema, { root = schema, omit = [] } = {}) {
  const object = resolveSchema(schema, root).schema;
  const fields = Object.entries(object.properties || {})
    .filter(([name]) => !omit.includes(name))
    .map(([name, ps]) => [name, buildField(name, name, ps, root)]);
  const simple = fields.filter(([, f]) => !f.screenPath);
  const grouped = fields.filter(([, f]) => f.screenPath);
  const element = h("div.schema-form",
    h("div.form-row", simple.map(([, f]) => f.element)),
    grouped.map(([, f]) => f.element));

  const collect = ({ complete = false } = {}) => {
    const values = {};
    const errors = {};
    for (const [name, f] of fields) {
      const got = f.read();
      if (got.error) errors[name] = got.error;
      if (got.errors) Object.assign(errors, got.errors);
      if (got.value !== undefined && (complete || !got.empty)) values[name] = got.value;
    }
    return { values, errors };
  };

  const fill = (values) => {
    for (const [name, f] of fields) f.write(values ? values[name] : undefined);
  };

  const clearErrors = () => clearNotes(element);

  // Put each error next to its input; `fieldErrors` is {path: message} (ApiError.fieldErrors or
  // collect().errors). With `prefix` ("options"), keys under it are ours. Returns {unplaced, first}:
  // the [key, message] pairs with no input here (other arguments, a check on the whole object)
  // and the first input that got a message.
  const showErrors = (fieldErrors, prefix = "") => {
    clearErrors();
    const unplaced = [];
    let first = null;
    for (const [key, message] of Object.entries(fieldErrors || {})) {
      if (prefix && !key.startsWith(`${prefix}.`)) {
        unplaced.push([key, plainMessage(message)]);
        continue;
      }
      let path = (prefix ? key.slice(prefix.length + 1) : key).split(".");
      const owner = fields.find(([name]) => name === path[0]);
      if (owner && owner[1].screenPath && path.length > 1) {
        const rest = owner[1].screenPath(path.slice(1));
        path = rest ? [path[0], ...rest] : [path[0]];
      }
      let target = null;
      for (let n = path.length; n > 0 && !target; n -= 1) {
        target = element.querySelector(`[name="${CSS.escape(path.slice(0, n).join("."))}"]`);
      }
      if (!target) {
        unplaced.push([key, plainMessage(message)]);
        continue;
      }
      placeNote(target.closest(".field") || target.parentElement, target, plainMessage(message));
      first = first || target;
    }
    return { unplaced, first };
  };

  const isEmpty = () => {
    const { values, errors } = collect();
    return !Object.keys(values).length && !Object.keys(errors).length;
  };

  // `values` without what equals the schema's default (or is null/empty), keys sorted: two
  // normalized objects can be compared as JSON (what the form holds vs. what runs now).
  const defaults = Object.fromEntries(Object.entries(object.properties || {})
    .map(([name, ps]) => [name, resolveSchema(ps, root).schema.default]));
  const normalize = (values) => Object.fromEntries(Object.entries(values || {})
    .filter(([name, v]) => v !== null && v !== undefined && !(Array.isArray(v) && !v.length) && !same(v, defaults[name]))
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));

  return { element, collect, fill, showErrors, clearErrors, isEmpty, normalize };
}
