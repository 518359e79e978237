// The deployments page's forms (pages/deployments.js): create a deployment, and edit one.
// Both are generated from deployments.create's published input schema (GET /api/methods, read by
// the page; see ../schema-form.js): the deployment's own fields, a select of the ready models, and
// its runtime options under "Options"; the edit form shows only what deployments.update takes.
//
// The create form leads a new operator (docs/router.md, "The Deployments page"): `ctx.wanted` (the
// page's ?model=<id>) chooses the model and makes the name from the model's name; "Create and load"
// creates, then loads (the card follows it: loading, serving), "Create" only saves. The "CPU preset"
// toggle sets what vLLM's CPU build needs (docs/vllm-facts.md, docs/runtime.md "Trying it on a CPU"):
// dtype float32, --enforce-eager, a KV cache bounded by --kv-cache-memory-bytes, and a context of
// CPU_CONTEXT tokens when none is set (a bounded cache must hold one whole sequence). Where no GPU is
// found it is on from the start, and the GPU options (GPU_OPTIONS) sit under their own closed
// disclosure at the end of Options, so the form does not lead with them.
//
// API: POST /api/deployments (create), POST /api/deployments/{name}/load (through the new card),
// PATCH /api/deployments/{name} (edit: every field, so what the form shows is what is saved). A
// refused form shows each field's error by its field.
//
// `ctx`: {signal, schemas (formSchemas(methods)), ready (the ready models), modelNames (id → name),
// noGpu (true where GET /api/gpus found none), wanted (a model id, or null), taken() (names in use)}.
import { api } from "../api.js";
import { readableName, resolveSchema, schemaForm } from "../schema-form.js";
import { empty, errorSlot, field, h, humanError, showError, toast } from "../ui.js";

// Set by the deployment (docs/router.md): never in its options.
const OWN_OPTIONS = ["model", "served_model_name", "port"];
// Options that only mean something with GPUs: after the others, closed, where none is found.
const GPU_OPTIONS = ["tensor_parallel_size", "pipeline_parallel_size", "gpu_ids", "gpu_memory_utilization",
  "distributed_executor_backend", "quantization"];
// The CPU preset (docs/vllm-facts.md: without a bound, vLLM's CPU build takes most of the RAM).
const CPU_KV_CACHE = "1G"; // vLLM's form: 1 GiB
const CPU_KV_CACHE_TEXT = "1 GiB";
const CPU_CONTEXT = 2048;
const CPU_FLAGS = [{ name: "--enforce-eager" }, { name: "--kv-cache-memory-bytes", values: [CPU_KV_CACHE] }];
const PRESET_FLAGS = new Set(["--enforce-eager", "--no-enforce-eager", "--kv-cache-memory-bytes"]);
// A deployment's name (docs/router.md): a letter or digit, then up to 255 of these; not "events".
const NAME_CHARS = /[^A-Za-z0-9._:/@+-]+/g;

// Whether GET /api/gpus says there is no GPU here (NVML missing, or it shows none); false when unknown.
export function noGpu(gpus) {
  return Boolean(gpus) && (gpus.status === "missing" || (Array.isArray(gpus.gpus) && gpus.gpus.length === 0));
}

// A deployment name made from a model's name: invalid characters become "-", a valid first
// character, at most 256 characters, and a suffix (-2, -3…) while the name is taken.
export function deploymentName(modelName, taken) {
  let base = String(modelName || "model").replace(NAME_CHARS, "-").replace(/^[^A-Za-z0-9]+/, "").slice(0, 250)
    .replace(/-+$/, "");
  if (!base) base = "model";
  let name = base;
  for (let n = 2; taken.has(name) || name === "events"; n += 1) name = `${base}-${n}`;
  return name;
}

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
    choices.unshift({ id: currentModel, name: `${ctx.modelNames.get(currentModel) || currentModel} (not downloaded)` });
  }
  const select = h("select", { name: "model_id" }, choices.map((m) => h("option", { value: m.id }, m.name)));
  if (currentModel) select.value = currentModel;
  const modelField = field("Model", select, "A downloaded model (its files are here).");
  // The model right after the name (first when there is no name field): in the generated form's grid.
  const grid = own.element.querySelector(".form-row");
  grid.insertBefore(modelField, omit.includes("name") ? grid.firstChild : grid.children[1] || null);
  // No GPU here: the GPU options go last, under their own closed disclosure.
  let gpuDetails = null;
  if (options && ctx.noGpu) {
    const moved = GPU_OPTIONS.map((name) => options.element.querySelector(`[name="${name}"]`))
      .filter(Boolean).map((input) => input.closest(".field"));
    if (moved.length) {
      gpuDetails = h("details.deployment-gpu-options",
        h("summary", "GPU options"),
        h("p.hint", "No GPU was found on this machine (NVML): these apply only where vLLM runs on NVIDIA GPUs."),
        h("div.form-row", moved));
      options.element.append(gpuDetails);
    }
  }
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
    if (b.first && gpuDetails && gpuDetails.contains(b.first)) gpuDetails.open = true;
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

  return { element, own, options, select, details, gpuDetails, collect, showErrors, clearErrors, fill: (d) => {
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
    section.append(empty("No model is downloaded yet: download or register a model first.",
      h("a.button", { href: "/models" }, "Go to Models")));
    return section;
  }
  const fields = deploymentFields(ctx, { omit: [],
    note: "Empty fields leave vLLM's own default. The model, the served name and the port are set by the deployment." });
  const nameInput = fields.own.element.querySelector('[name="name"]');
  const wanted = ctx.wanted ? ctx.ready.find((m) => m.id === ctx.wanted) : null;
  const notReady = ctx.wanted && !wanted
    ? h("p.hint.deployment-wanted", { role: "status" },
      `The model ${ctx.modelNames.get(ctx.wanted) || ctx.wanted} is not downloaded yet: `
      + "choose a downloaded one, or wait for its download.")
    : null;
  const suggestName = () => {
    const model = ctx.ready.find((m) => m.id === fields.select.value);
    if (nameInput && model) nameInput.value = deploymentName(model.name, ctx.taken());
  };
  if (wanted) {
    fields.select.value = wanted.id;
    suggestName();
  }

  // The CPU preset: a toggle that sets (or takes back) its options in the generated Options.
  const presetBox = h("input#deployment-cpu-preset", { type: "checkbox", name: "cpu_preset", checked: Boolean(ctx.noGpu),
    "aria-describedby": "deployment-cpu-preset-hint" });
  const preset = h("div.field.check-field.deployment-preset",
    h("label.check", { for: "deployment-cpu-preset" }, presetBox, " CPU preset"),
    h("p#deployment-cpu-preset-hint.hint",
      `For vLLM's CPU build: dtype float32, no CUDA graphs (--enforce-eager), a KV cache of ${CPU_KV_CACHE_TEXT} `
      + `(--kv-cache-memory-bytes) and, unless set, a context of ${CPU_CONTEXT} tokens. `
      + (ctx.noGpu ? "On: no GPU was found on this machine." : "Off: a GPU was found, or none was looked for.")));
  const applyPreset = (on) => {
    if (!fields.options) return;
    const { values } = fields.options.collect();
    const kept = (values.extra_args || []).filter((arg) => !PRESET_FLAGS.has(arg.name));
    if (on) {
      values.dtype = "float32";
      if (values.max_model_len === undefined) values.max_model_len = CPU_CONTEXT;
      values.extra_args = [...kept, ...CPU_FLAGS];
    } else {
      if (values.dtype === "float32") delete values.dtype;
      if (values.max_model_len === CPU_CONTEXT) delete values.max_model_len;
      values.extra_args = kept;
    }
    fields.options.fill(values);
  };
  presetBox.addEventListener("change", () => applyPreset(presetBox.checked));
  if (presetBox.checked) applyPreset(true);
  fields.select.addEventListener("change", () => {
    if (nameInput && (!nameInput.value || nameInput.dataset.suggested === nameInput.value)) {
      suggestName();
      nameInput.dataset.suggested = nameInput.value;
    }
  });
  if (nameInput && wanted) nameInput.dataset.suggested = nameInput.value;

  const submit = h("button.button.primary", { type: "submit", value: "load" }, "Create and load");
  const saveOnly = h("button.button", { type: "submit", value: "save" }, "Create");
  const error = errorSlot();
  // The preset sits just above Options, right after the deployment's own fields.
  fields.element.insertBefore(preset, fields.details);
  const form = h("form.deployment-form", { novalidate: true }, notReady, fields.element,
    h("div.actions", submit, saveOnly), error);
  section.append(form);
  if (wanted && nameInput) nameInput.focus({ preventScroll: true });

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (submit.disabled) return;
    const loadToo = !event.submitter || event.submitter === submit; // Enter: the first button
    showError(error, null);
    const { values, errors } = fields.collect();
    if (Object.keys(errors).length) {
      report(fields, error, errors, null);
      return;
    }
    fields.clearErrors();
    submit.disabled = true;
    saveOnly.disabled = true;
    (loadToo ? submit : saveOnly).textContent = "Creating…";
    try {
      const deployment = await api("POST", "/deployments", values, { signal });
      const card = created(deployment);
      if (loadToo && card) {
        card.el.scrollIntoView({ block: "nearest" });
        card.load();
        toast(`${deployment.name} was created and is loading.`, "ok");
      } else {
        toast(`${deployment.name} was created. Load it, or send it a /v1 request.`, "ok");
      }
      fields.fill({ model_id: fields.select.value });
      if (presetBox.checked) applyPreset(true);
    } catch (err) {
      if (err.name === "AbortError" || err.status === 401) return;
      report(fields, error, err.fieldErrors, err);
    } finally {
      submit.disabled = false;
      saveOnly.disabled = false;
      submit.textContent = "Create and load";
      saveOnly.textContent = "Create";
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
