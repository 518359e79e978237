// The model picker and the parameters (docs/chat.md, Model and Parameters): selects "Model" and
// "Compare with" (models from GET /v1/models, aliases included, each deployment with its state in
// the console's words: "qwen — deployed", "qwen — serving"), and the <details> "Parameters"
// (chat/params.js). Values are kept per conversation by the page (`read()` / `apply()`).
// `canChoose(name)` (the page's) may refuse a model, in words: the select goes back to the model
// chosen before and says why (a conversation with images and a model that takes none).
//
// A model chosen that the last listing no longer names (deleted, or its runtime stopped) stays
// chosen, as a disabled option "<name> — unavailable", and `unavailable()` names it: the page sends
// nothing until another is chosen, rather than switching models behind the user's back.
// `onOpen()` runs when a picker is opened or focused (the page lists the models again then).

import { field, h, showFieldErrors } from "../ui.js";
import { labelOf } from "./models.js";
import { createParams } from "./params.js";

// What a /v1/models entry says its model takes; an entry without `input_modalities` (a runtime's
// or --upstream's model) is taken for text only.
export const modalitiesOf = (entry) => (entry && Array.isArray(entry.input_modalities)
  ? entry.input_modalities : ["text"]);

export function createControls({ onChange, onOpen = () => {}, canChoose = () => null }) {
  const model = h("select", { name: "model" });
  const compare = h("select", { name: "compare" }, h("option", { value: "" }, "Off"));
  const parameters = createParams({ onChange: () => onChange() });
  const details = parameters.element;
  const refused = h("p.error-text.model-refused", { role: "alert", hidden: true });
  // No accessible name on the form: "Model" must label the select alone.
  const form = h("form.chat-controls", { novalidate: true },
    h("div.model-row", field("Model", model), field("Compare with", compare)),
    refused,
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
    // A model the page refuses (canChoose) is not chosen: the select goes back, saying why.
    let before = select.value;
    select.addEventListener("focus", () => { before = select.value; });
    select.addEventListener("change", (event) => {
      const refusal = select.value ? canChoose(select.value) : null;
      refused.hidden = !refusal;
      refused.textContent = refusal || "";
      if (refusal) {
        event.stopImmediatePropagation(); // nothing changed: the form's onChange is not told
        select.value = before;
        return;
      }
      before = select.value;
    });
    // Choosing another model drops an unavailable one from the options.
    select.addEventListener("change", () => {
      fill(model, model.value, false);
      fill(compare, compare.value, true);
    });
  }
  const unlisted = (name) => loaded && name !== "" && !known.some((m) => m.id === name);

  // The model's defaults and context length, when /v1/models says them, in the placeholders.
  const hint = () => parameters.setModel(known.find((m) => m.id === model.value));
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

    // What the model `name` takes, as the last listing says ("text", "image", "audio").
    modalities(name) {
      return modalitiesOf(known.find((m) => m.id === name));
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
      parameters.apply(params);
      refused.hidden = true;
      showFieldErrors(form, null);
    },

    // {model, compareModel, params} as chosen now; `errors` lists fields out of range.
    read() {
      const errors = {};
      const params = parameters.read(errors);
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
