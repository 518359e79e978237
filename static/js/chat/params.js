// The parameters of a conversation (docs/chat.md, Parameters): a <details> "Parameters" with
// "System prompt", the sampling fields of `NUMBERS` (bounds as vLLM checks them) and "Stop" (one
// per line), and a button "Reset to model defaults". An empty field sends nothing, so the server's
// default applies: the model's own where its generation_config.json has one (vLLM applies those;
// GET /v1/models lists them as `generation_defaults`, docs/router.md), which the placeholder says
// ("model default 0.7"), else "server default".
//
// `createParams({onChange})`: `element` (its inputs named as the request fields, so that
// showFieldErrors finds them); `apply(params)`; `read(errors)` (fills `errors[name]` for a field
// out of its bounds); `setModel(entry)` (the /v1/models entry of the model chosen: its defaults
// and context length). The bounds are also vllm_use/models/files.py's GENERATION_KEYS'.
// `requestFields(params)` turns saved parameters into a completion request's fields.

import { field, h } from "../ui.js";

const number = (v) => typeof v === "number" && Number.isFinite(v);
const whole = (v) => Number.isSafeInteger(v);

// One home for each sampling field: its label, the input's hints and the check of a value.
export const NUMBERS = [
  { key: "temperature", label: "Temperature", step: "0.05", min: "0", max: "2",
    ok: (v) => v >= 0 && v <= 2, words: "Between 0 and 2." },
  { key: "top_p", label: "Top p", step: "0.05", min: "0", max: "1",
    ok: (v) => v > 0 && v <= 1, words: "More than 0, at most 1." },
  { key: "top_k", label: "Top k", step: "1", min: "-1",
    ok: (v) => whole(v) && v >= -1, words: "A whole number: -1 or 0 for none, else at least 1." },
  { key: "min_p", label: "Min p", step: "0.01", min: "0", max: "1",
    ok: (v) => v >= 0 && v <= 1, words: "Between 0 and 1." },
  { key: "presence_penalty", label: "Presence penalty", step: "0.1", min: "-2", max: "2",
    ok: (v) => v >= -2 && v <= 2, words: "Between -2 and 2." },
  { key: "frequency_penalty", label: "Frequency penalty", step: "0.1", min: "-2", max: "2",
    ok: (v) => v >= -2 && v <= 2, words: "Between -2 and 2." },
  { key: "repetition_penalty", label: "Repetition penalty", step: "0.05", min: "0", max: "2",
    ok: (v) => v > 0 && v <= 2, words: "More than 0, at most 2." },
  { key: "seed", label: "Seed", step: "1",
    ok: (v) => whole(v), words: "A whole number." },
  { key: "max_tokens", label: "Max tokens", step: "1", min: "1",
    ok: (v) => whole(v) && v >= 1, words: "A whole number, at least 1." },
];

export const PARAM_KEYS = ["system", "stop", ...NUMBERS.map((p) => p.key)];
export const EMPTY_PARAMS = { system: "", stop: [], ...Object.fromEntries(NUMBERS.map((p) => [p.key, null])) };

// What is wrong with saved parameters (an import), in words; null when nothing is.
export function paramsProblem(params) {
  for (const key of Object.keys(params)) {
    if (!PARAM_KEYS.includes(key)) return `conversation.params.${key} is not a known parameter`;
  }
  if (!(params.system === undefined || params.system === null || typeof params.system === "string")) {
    return "conversation.params.system should be text";
  }
  for (const { key, ok, words } of NUMBERS) {
    const v = params[key];
    if (v !== undefined && v !== null && !(number(v) && ok(v))) return `conversation.params.${key}: ${words}`;
  }
  const { stop } = params;
  if (stop !== undefined && stop !== null && !(Array.isArray(stop) && stop.every((s) => typeof s === "string"))) {
    return "conversation.params.stop should be a list of strings";
  }
  return null;
}

export function createParams({ onChange }) {
  const system = h("textarea.system-prompt", { name: "system", rows: 3, placeholder: "server default (none)" });
  const stop = h("textarea.stop-list", { name: "stop", rows: 2, placeholder: "server default (none)" });
  const inputs = new Map(NUMBERS.map(({ key, step, min, max }) => [key, h("input", { name: key, type: "number",
    inputmode: step === "1" ? "numeric" : "decimal", step, min, max, placeholder: "server default" })]));
  const reset = h("button.button.small", { type: "button", onclick: () => {
    for (const input of inputs.values()) input.value = "";
    onChange();
  } }, "Reset to model defaults");
  const element = h("details.parameters",
    h("summary", "Parameters"),
    h("div.parameters-grid",
      h("div.parameters-wide", field("System prompt", system)),
      NUMBERS.map(({ key, label }) => field(label, inputs.get(key))),
      field("Stop", stop, "One stop sequence per line."),
      h("div.parameters-wide.parameters-reset", h("p.hint", "Empty fields use the model's defaults."), reset)));

  return {
    element,

    apply(params) {
      const p = { ...EMPTY_PARAMS, ...(params || {}) };
      system.value = p.system || "";
      for (const [key, input] of inputs) input.value = p[key] ?? "";
      stop.value = (p.stop || []).join("\n");
    },

    read(errors) {
      const params = { system: system.value, stop: stop.value.split("\n").filter((line) => line !== "") };
      for (const { key, ok, words } of NUMBERS) {
        const input = inputs.get(key);
        const raw = input.value.trim();
        params[key] = null;
        // A field left empty by the browser because it could not parse it (e.g. "abc") is invalid too.
        if (input.validity && input.validity.badInput) errors[key] = "Not a number.";
        if (!raw) continue;
        const value = Number(raw);
        if (Number.isFinite(value) && ok(value)) params[key] = value;
        else errors[key] = words;
      }
      return params;
    },

    // The placeholders say what applies when a field is empty: the model's own default, else the
    // server's (with the context length for Max tokens).
    setModel(entry) {
      const defaults = (entry && entry.generation_defaults) || {};
      for (const [key, input] of inputs) {
        let text = number(defaults[key]) ? `model default ${defaults[key]}` : "server default";
        if (key === "max_tokens" && !number(defaults[key]) && entry && entry.max_model_len) {
          text = `server default (context ${entry.max_model_len})`;
        }
        input.placeholder = text;
      }
    },
  };
}

// The fields a completion request gets from the parameters: only those that are set.
export function requestFields(params) {
  const out = {};
  for (const { key } of NUMBERS) {
    if (params[key] !== null && params[key] !== undefined) out[key] = params[key];
  }
  if (params.stop && params.stop.length) out.stop = params.stop;
  return out;
}
