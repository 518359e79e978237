// The model picker and the parameters (docs/chat.md, Model and Parameters): selects "Model" and
// "Compare with" (models from GET /v1/models, aliases included, each deployment with its state in
// the console's words: "qwen — deployed", "qwen — serving"), and a <details> "Parameters" with "System prompt", "Temperature", "Top p",
// "Max tokens" and "Stop" (one per line). Empty means the server's default, which the placeholders
// say. Values are kept per conversation by the page (`read()` / `apply()`), and `request()` turns
// them into the fields of a completion request.
//
// A model chosen that the last listing no longer names (deleted, or its runtime stopped) stays
// chosen, as a disabled option "<name> — unavailable", and `unavailable()` names it: the page sends
// nothing until another is chosen, rather than switching models behind the user's back.
// `onOpen()` runs when a picker is opened or focused (the page lists the models again then).

import { field, h, showFieldErrors } from "../ui.js";
import { labelOf } from "./models.js";

export const EMPTY_PARAMS = { system: "", temperature: null, top_p: null, max_tokens: null, stop: [] };

export function createControls({ onChange, onOpen = () => {} }) {
  const model = h("select", { name: "model" });
  const compare = h("select", { name: "compare" }, h("option", { value: "" }, "Off"));
  const system = h("textarea.system-prompt", { name: "system", rows: 3, placeholder: "server default (none)" });
  const temperature = h("input", { name: "temperature", type: "number", inputmode: "decimal", min: "0", max: "2",
    step: "0.05", placeholder: "server default" });
  const topP = h("input", { name: "top_p", type: "number", inputmode: "decimal", min: "0", max: "1", step: "0.05",
    placeholder: "server default" });
  const maxTokens = h("input", { name: "max_tokens", type: "number", inputmode: "numeric", min: "1", step: "1",
    placeholder: "server default" });
  const stop = h("textarea.stop-list", { name: "stop", rows: 2, placeholder: "server default (none)" });
  const details = h("details.parameters",
    h("summary", "Parameters"),
    h("div.parameters-grid",
      h("div.parameters-wide", field("System prompt", system)),
      field("Temperature", temperature),
      field("Top p", topP),
      field("Max tokens", maxTokens),
      field("Stop", stop, "One stop sequence per line.")));
  // No accessible name on the form: "Model" must label the select alone.
  const form = h("form.chat-controls", { novalidate: true },
    h("div.model-row", field("Model", model), field("Compare with", compare)),
    details);
  form.addEventListener("submit", (event) => event.preventDefault());
  form.addEventListener("change", () => onChange());

  let known = []; // the entries of the last listing

  // Options for a select: the served models, labelled with their status; a remembered name is kept
  // while the list is unknown, and shown as unavailable once a listing no longer names it. The
  // option elements are changed in place, so that a picker open meanwhile stays as it is.
  let loaded = false; // whether /v1/models has answered yet
  const fill = (select, chosen, off) => {
    const wanted = known.map((m) => ({ value: m.id, label: labelOf(m), disabled: false }));
    const listed = wanted.some((o) => o.value === chosen);
    if (chosen && !listed) {
      wanted.push({ value: chosen, label: loaded ? `${chosen} — unavailable` : chosen, disabled: loaded });
    }
    if (off) wanted.unshift({ value: "", label: "Off", disabled: false });
    else if (!wanted.length) wanted.push({ value: "", label: loaded ? "No model running" : "—", disabled: false });
    const existing = new Map([...select.options].map((o) => [o.value, o]));
    const options = wanted.map(({ value, label, disabled }) => {
      const option = existing.get(value) || h("option", { value });
      if (option.textContent !== label) option.textContent = label;
      option.disabled = disabled;
      return option;
    });
    if (options.length !== select.options.length || options.some((o, i) => select.options[i] !== o)) {
      select.replaceChildren(...options);
    }
    select.value = chosen && wanted.some((o) => o.value === chosen) ? chosen : off ? "" : wanted[0].value;
  };
  fill(model, "", false);

  // Opening a picker lists the models again: a press (also on a picker that has the focus) or the
  // focus from the keyboard; the focus that follows a press is the same opening.
  let pressed = null;
  for (const select of [model, compare]) {
    select.addEventListener("pointerdown", () => {
      pressed = select;
      onOpen();
    });
    select.addEventListener("focus", () => {
      if (pressed !== select) onOpen();
      pressed = null;
    });
    select.addEventListener("blur", () => { pressed = null; });
    // Choosing another model drops an unavailable one from the options.
    select.addEventListener("change", () => {
      fill(model, model.value, false);
      fill(compare, compare.value, true);
    });
  }
  const unlisted = (name) => loaded && name !== "" && !known.some((m) => m.id === name);

  // The model's context length, when /v1/models says it, in the Max tokens placeholder.
  const hint = () => {
    const info = known.find((m) => m.id === model.value);
    maxTokens.placeholder = info && info.max_model_len ? `server default (context ${info.max_model_len})` : "server default";
  };
  model.addEventListener("change", hint);

  return {
    element: form,
    details,

    // models: [{id, root, max_model_len, status?}] from /v1/models.
    setModels(models) {
      known = models;
      loaded = true;
      fill(model, model.value, false);
      fill(compare, compare.value, true);
      hint();
    },

    // Whether a model can be asked for: /v1/models has answered, and listed the ones chosen.
    hasModel() {
      return loaded && model.value !== "" && !this.unavailable().length;
    },

    // The models chosen (model, compare) that the last listing does not name.
    unavailable() {
      return [model.value, compare.value].filter(unlisted);
    },

    // The conversation's remembered choices (or a new chat's: the current ones stay).
    apply({ model: chosenModel, compareModel, params }) {
      if (chosenModel) fill(model, chosenModel, false);
      fill(compare, compareModel || "", true);
      hint();
      const p = { ...EMPTY_PARAMS, ...(params || {}) };
      system.value = p.system || "";
      temperature.value = p.temperature ?? "";
      topP.value = p.top_p ?? "";
      maxTokens.value = p.max_tokens ?? "";
      stop.value = (p.stop || []).join("\n");
      showFieldErrors(form, null);
    },

    // {model, compareModel, params} as chosen now; `errors` lists fields out of range.
    read() {
      const errors = {};
      const number = (input, name, check, message) => {
        const raw = input.value.trim();
        if (!raw) return null;
        const value = Number(raw);
        if (!Number.isFinite(value) || !check(value)) {
          errors[name] = message;
          return null;
        }
        return value;
      };
      const params = {
        system: system.value,
        temperature: number(temperature, "temperature", (v) => v >= 0 && v <= 2, "Between 0 and 2."),
        top_p: number(topP, "top_p", (v) => v > 0 && v <= 1, "More than 0, at most 1."),
        max_tokens: number(maxTokens, "max_tokens", (v) => Number.isInteger(v) && v >= 1, "A whole number, at least 1."),
        stop: stop.value.split("\n").filter((line) => line !== ""),
      };
      // A field left empty by the browser because it could not parse it (e.g. "abc") is invalid too.
      for (const [input, name] of [[temperature, "temperature"], [topP, "top_p"], [maxTokens, "max_tokens"]]) {
        if (input.validity && input.validity.badInput) errors[name] = "Not a number.";
      }
      return { model: model.value, compareModel: compare.value, params, errors };
    },

    // Shows range errors under their fields; true when there are none.
    check(errors) {
      showFieldErrors(form, { fieldErrors: errors });
      if (Object.keys(errors).length) {
        details.open = true;
        const first = form.querySelector("[aria-invalid='true']");
        if (first) first.focus();
        return false;
      }
      return true;
    },
  };
}

// The fields a completion request gets from the parameters: only those that are set.
export function requestFields(params) {
  const out = {};
  if (params.temperature !== null && params.temperature !== undefined) out.temperature = params.temperature;
  if (params.top_p !== null && params.top_p !== undefined) out.top_p = params.top_p;
  if (params.max_tokens !== null && params.max_tokens !== undefined) out.max_tokens = params.max_tokens;
  if (params.stop && params.stop.length) out.stop = params.stop;
  return out;
}
