// The deployments page's forms (pages/deployments.js): create a deployment, and edit one.
// Both are generated from deployments.create's published input schema (GET /api/methods, read by
// the page; see ../schema-form.js): the deployment's own fields, a select of the ready models, and
// its runtime options under "Options"; the edit form shows only what deployments.update takes.
//
// API: POST /api/deployments (create), PATCH /api/deployments/{name} (edit: every field, so what the
// form shows is what is saved). A refused form shows each field's error by its field.
//
// `ctx`: {signal, schemas (formSchemas(methods)), ready (the ready models), modelNames (id → name)}.
import { api } from "../api.js";
import { readableName, resolveSchema, schemaForm } from "../schema-form.js";
import { empty, errorSlot, field, h, humanError, showError, toast } from "../ui.js";

// Set by the deployment (docs/router.md): never in its options.
const OWN_OPTIONS = ["model", "served_model_name", "port"];

// The input schemas of deployments.create and .update, from GET /api/methods; null when missing.
export function formSchemas(methods) {
  if (!methods || methods.error) return { error: methods && methods.error ? humanError(methods.error) : "no methods" };
  const input = (name) => {
    const method = (methods.methods || []).find((m) => m.name === name);
    return method && method.input_schema && method.input_schema.properties ? method.input_schema : null;
  };
  const create = input("deployments.create");
  const update = input("deployments.update");
  if (!create || !create.properties.options) return { error: "deployments.create publishes no input schema" };
  const options = resolveSchema(create.properties.options, create).schema;
  return { create, update, options: options.properties ? options : null };
}

// The fields of a deployment form: the deployment's own (generated from deployments.create's schema,
// less `omit`, name first), a model select, and its runtime options (generated) under "Options".
function deploymentFields(ctx, { omit, currentModel = null, note }) {
  const { create } = ctx.schemas;
  const { name, ...rest } = create.properties;
  const props = name && !omit.includes("name") ? { name, ...rest } : rest;
  const own = schemaForm({ ...create, properties: props }, { root: create, omit: [...omit, "model_id", "options"] });
  const options = ctx.schemas.options
    ? schemaForm(ctx.schemas.options, { root: create, omit: OWN_OPTIONS }) : null;

  const choices = [...ctx.ready];
  if (currentModel && !choices.some((m) => m.id === currentModel)) {
    choices.unshift({ id: currentModel, name: `${ctx.modelNames.get(currentModel) || currentModel} (not ready)` });
  }
  const select = h("select", { name: "model_id" }, choices.map((m) => h("option", { value: m.id }, m.name)));
  if (currentModel) select.value = currentModel;
  const modelField = field("Model", select, "A registered model whose files are ready.");
  // The model right after the name (first when there is no name field): in the generated form's grid.
  const grid = own.element.querySelector(".form-row");
  grid.insertBefore(modelField, omit.includes("name") ? grid.firstChild : grid.children[1] || null);
  const details = h("details.deployment-options",
    h("summary", "Options"),
    h("p.hint", note),
    options ? options.element : h("p.error-text", "The runtime options could not be loaded: vLLM's defaults apply."));
  const element = h("div.deployment-fields", own.element, details);

  const clearModelNote = () => {
    for (const old of modelField.querySelectorAll(".field-error")) old.remove();
    select.removeAttribute("aria-invalid");
  };

  // Errors by field: the model's under the select, the options' in Options (opened), the others
  // under their generated fields. Returns what has no field here, as text, and whether one was placed.
  const showErrors = (fieldErrors) => {
    const top = {};
    const opts = {};
    const unplaced = [];
    let modelMessage = null;
    for (const [key, message] of Object.entries(fieldErrors || {})) {
      if (key === "model_id") modelMessage = message;
      else if (key.startsWith("options.")) opts[key] = message;
      else top[key] = message;
    }
    const a = own.showErrors(top); // clears every note in its grid, the model's included
    clearModelNote();
    if (modelMessage) {
      select.setAttribute("aria-invalid", "true");
      modelField.append(h("p.field-error", { role: "alert" }, String(modelMessage).replace(/^Value error, /, "")));
    }
    const b = options ? options.showErrors(opts, "options") : { unplaced: Object.entries(opts), first: null };
    if (b.first) details.open = true;
    const first = a.first || (modelMessage ? select : null) || b.first;
    unplaced.push(...a.unplaced, ...b.unplaced);
    if (first) first.focus();
    return { unplaced: unplaced.map(([k, m]) => `${readableName(k.split(".").pop())}: ${m}`).join("; "), placed: Boolean(first) };
  };

  const clearErrors = () => {
    clearModelNote();
    own.clearErrors();
    if (options) options.clearErrors();
  };

  // {values, errors}: the deployment's fields as the form holds them (`complete`: also those left at
  // their default, for an edit), and the options that differ from vLLM's defaults.
  const collect = ({ complete = false } = {}) => {
    const a = own.collect({ complete });
    const b = options ? options.collect() : { values: {}, errors: {} };
    const errors = { ...a.errors };
    for (const [k, m] of Object.entries(b.errors)) errors[`options.${k}`] = m;
    const values = { ...a.values, model_id: select.value };
    if (complete || Object.keys(b.values).length) values.options = b.values;
    return { values, errors };
  };

  return { element, own, options, select, collect, showErrors, clearErrors, fill: (d) => {
    own.fill(d);
    if (options) options.fill(d.options);
    select.value = d.model_id;
  } };
}

export function createForm(ctx, created) {
  const { signal } = ctx;
  const section = h("section.card.deployment-create", { "aria-labelledby": "deployment-create-title" },
    h("h2#deployment-create-title", "Create a deployment"));
  if (ctx.schemas.error) {
    section.append(h("p.error-text", { role: "alert" }, `The form could not be loaded: ${ctx.schemas.error}.`));
    return section;
  }
  if (!ctx.ready.length) {
    section.append(empty("No model is ready to deploy: download or register a model first.",
      h("a.button", { href: "/models" }, "Go to Models")));
    return section;
  }
  const fields = deploymentFields(ctx, { omit: [],
    note: "Empty fields leave vLLM's own default. The model, the served name and the port are set by the deployment." });
  const submit = h("button.button.primary", { type: "submit" }, "Create");
  const error = errorSlot();
  const form = h("form.deployment-form", { novalidate: true }, fields.element, h("div.actions", submit), error);
  section.append(form);

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (submit.disabled) return;
    showError(error, null);
    const { values, errors } = fields.collect();
    if (Object.keys(errors).length) {
      report(fields, error, errors, null);
      return;
    }
    fields.clearErrors();
    submit.disabled = true;
    submit.textContent = "Creating…";
    try {
      const deployment = await api("POST", "/deployments", values, { signal });
      created(deployment);
      toast(`${deployment.name} was created. Load it, or send it a /v1 request.`, "ok");
      fields.fill({ model_id: fields.select.value });
    } catch (err) {
      if (err.name === "AbortError" || err.status === 401) return;
      report(fields, error, err.fieldErrors, err);
    } finally {
      submit.disabled = false;
      submit.textContent = "Create";
    }
  });
  return section;
}

export function editForm(d, ctx, { saved, canceled }) {
  const { signal } = ctx;
  if (ctx.schemas.error) return h("p.error-text", { role: "alert" }, `The form could not be loaded: ${ctx.schemas.error}.`);
  // What deployments.update takes (the name is in the path); the rest of create's fields cannot change.
  const editable = ctx.schemas.update ? Object.keys(ctx.schemas.update.properties) : Object.keys(ctx.schemas.create.properties);
  const omit = ["name", ...Object.keys(ctx.schemas.create.properties).filter((k) => !editable.includes(k))];
  const fields = deploymentFields(ctx, { omit, currentModel: d.model_id,
    note: "Empty fields leave vLLM's own default. Saved options replace the options as a whole." });
  fields.fill(d);
  const save = h("button.button.primary", { type: "submit" }, "Save");
  const cancel = h("button.button", { type: "button" }, "Cancel");
  const error = errorSlot();
  const form = h("form.deployment-form.deployment-edit", { novalidate: true, "aria-label": `Edit ${d.name}` },
    h("h4", `Edit ${d.name}`),
    fields.element, h("div.actions", save, cancel), error,
    h("p.hint", "A loaded instance keeps running as it was started until it is unloaded and loaded again."));
  cancel.addEventListener("click", canceled);

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (save.disabled) return;
    showError(error, null);
    const { values, errors } = fields.collect({ complete: true });
    if (Object.keys(errors).length) {
      report(fields, error, errors, null);
      return;
    }
    // Every editable field is sent: one left empty takes its default (no aliases: an empty list).
    const body = {};
    for (const name of editable) {
      if (name === "name") continue;
      const schema = resolveSchema(ctx.schemas.create.properties[name] || {}, ctx.schemas.create).schema;
      if (name in values) body[name] = values[name];
      else if (schema.type === "array") body[name] = [];
      else if (schema.default !== undefined) body[name] = schema.default;
    }
    fields.clearErrors();
    save.disabled = true;
    save.textContent = "Saving…";
    try {
      saved(await api("PATCH", `/deployments/${encodeURIComponent(d.name)}`, body, { signal }));
    } catch (err) {
      if (err.name === "AbortError" || err.status === 401) return;
      report(fields, error, err.fieldErrors, err);
    } finally {
      save.disabled = false;
      save.textContent = "Save";
    }
  });
  return form;
}

// A refused form: field errors next to their fields; what has none (a conflict, a check across
// fields, an unreachable server) by the button, in the server's words.
function report(fields, slot, fieldErrors, error) {
  const { unplaced, placed } = fields.showErrors(fieldErrors);
  if (unplaced) showError(slot, unplaced);
  else if (placed) showError(slot, "Some fields need a change: see the messages next to them.");
  else showError(slot, error);
}
