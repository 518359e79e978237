// Models: what vLLM can run. Lists the registered models (GET /api/models, refreshed every 3 s)
// with their source, status, size and directory, and lets you
//   - register a Hugging Face repository at a revision (POST /api/models/huggingface),
//   - register a directory already under the models directory (POST /api/models/local),
//   - register every unregistered model directory found there (POST /api/models/scan),
//   - delete a model, optionally with its files (DELETE /api/models/{id}?files=true|false).
// Downloads are started on the Downloads page: a Hugging Face model's "Download" link opens
// /downloads?model=<id> with the model chosen.
//
// DOM hooks for tests: each table row is <tr data-model-id="…" data-status="…">; the delete
// dialog is <dialog class="dialog model-delete-dialog">.
import { api } from "../api.js";
import { badge, clear, empty, errorSlot, every, field, formatBytes, h, humanError, pageHeader, placeholder, reportFailure, showError, showFieldErrors, toast } from "../ui.js";

// Model statuses from which downloads.start accepts a Hugging Face model.
const DOWNLOADABLE = new Set(["registered", "failed", "canceled"]);

export async function render(root, page) {
  const { signal } = page;
  const listError = h("p.error-text", { role: "alert", hidden: true });
  const list = h("div.models-list", placeholder(4));
  const heading = h("h2#models-list-title", { tabindex: "-1" }, "Registered models");
  let tbody = null; // set once the table exists

  const refresh = async () => {
    try {
      const { models } = await api("GET", "/models", undefined, { signal });
      listError.hidden = true;
      showModels(models);
    } catch (error) {
      if (error.name === "AbortError" || error.status === 401) return;
      if (list.querySelector(".placeholder")) clear(list);
      listError.hidden = false;
      listError.textContent = `Could not load the models: ${humanError(error)}`;
    }
  };

  const showModels = (models) => {
    if (!models.length) {
      tbody = null;
      clear(list, empty("No models yet. Register a Hugging Face repository (then download it on the Downloads "
        + "page) or a directory that already holds a model, with the forms above; or scan the models "
        + "directory to register every model directory found there."));
      return;
    }
    if (!tbody) {
      tbody = h("tbody");
      clear(list, h("div.table-wrap",
        h("table.models-table", { "aria-labelledby": "models-list-title" },
          h("thead", h("tr",
            h("th", { scope: "col" }, "Name"),
            h("th", { scope: "col" }, "Source"),
            h("th", { scope: "col" }, "Status"),
            h("th.num", { scope: "col" }, "Size"),
            h("th", { scope: "col" }, "Path"),
            h("th", { scope: "col" }, "Actions"))),
          tbody)));
    }
    syncRows(tbody, models, (model) => modelRow(model, { onDelete: () => openDelete(model) }));
  };

  const openDelete = (model) => deleteDialog(model, async () => {
    toast(`Deleted ${model.name}.`, "ok");
    await refresh();
    const next = tbody && tbody.querySelector("button[data-action='delete']");
    (next || heading).focus();
  });

  const scan = scanControl(signal, refresh);
  root.append(
    pageHeader("Models", "Models vLLM can run: Hugging Face repositories downloaded here, or directories "
      + "already under the models directory.", scan.button),
    scan.result,
    h("div.models-forms", huggingFaceForm(signal, refresh), localForm(signal, refresh)),
    h("section.models-section", { "aria-labelledby": "models-list-title" }, heading, listError, list),
  );
  await refresh();
  every(3000, refresh, page);
}

// --- the table -----------------------------------------------------------------------------------

function modelRow(model, { onDelete }) {
  const hub = model.source === "huggingface";
  const actions = [];
  if (hub && DOWNLOADABLE.has(model.status)) {
    actions.push(h("a.button.small.primary", {
      href: `/downloads?model=${encodeURIComponent(model.id)}`, "data-action": "download",
      onclick: followInPage,
    }, "Download"));
  }
  actions.push(h("button.button.small", { type: "button", "data-action": "delete", onclick: onDelete }, "Delete"));
  return h("tr", { dataset: { modelId: model.id, status: model.status } },
    h("td.model-name", h("strong", model.name)),
    h("td.model-source", hub
      ? ["Hugging Face", h("br"), h("code", `${model.repository}@${model.revision}`)]
      : "Local"),
    h("td.model-status", badge(model.status), model.error ? h("p.model-error", model.error) : null),
    h("td.num", formatBytes(model.size_bytes)),
    h("td.model-path", model.path ? h("code", model.path) : "—"),
    h("td.model-actions", h("div.actions", actions)));
}

// main.js routes same-origin links by their pathname only, which would drop "?model=…": push the
// whole URL ourselves and let main.js's popstate handler show the page (it keeps location.search).
function followInPage(event) {
  if (event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
  event.preventDefault();
  history.pushState({}, "", event.currentTarget.getAttribute("href"));
  window.dispatchEvent(new PopStateEvent("popstate"));
}

// Update `container`'s rows in place, keyed by item id: unchanged rows stay the same nodes (focus and
// selection survive the 3-s refresh); a changed row is rebuilt and gets the focus back on the same
// action if it had it. Rows carry the item's JSON so a change is seen.
const rowData = new WeakMap();

function syncRows(container, items, build) {
  const old = new Map([...container.children].map((row) => [row.dataset.modelId, row]));
  let cursor = container.firstElementChild;
  for (const item of items) {
    const json = JSON.stringify(item);
    let row = old.get(item.id);
    old.delete(item.id);
    if (row && rowData.get(row) !== json) {
      const fresh = build(item);
      const focused = row.contains(document.activeElement) ? document.activeElement.dataset.action : null;
      row.replaceWith(fresh);
      if (cursor === row) cursor = fresh;
      if (focused) {
        const target = fresh.querySelector(`[data-action="${focused}"]`) || fresh.querySelector("[data-action]");
        if (target) target.focus();
      }
      row = fresh;
    } else if (!row) {
      row = build(item);
    }
    rowData.set(row, json);
    if (row === cursor) cursor = cursor.nextElementSibling;
    else container.insertBefore(row, cursor);
  }
  for (const row of old.values()) row.remove();
}

// --- the delete dialog ---------------------------------------------------------------------------

// confirmDialog() has no checkbox, so this is the same <dialog> with "Also delete files". It makes
// the call itself, so an error (e.g. 409 while downloading) is shown in the dialog, next to the button.
function deleteDialog(model, onDeleted) {
  const files = h("input", { type: "checkbox", name: "files" });
  const error = errorSlot();
  const cancel = h("button.button", { type: "button", autofocus: true }, "Cancel");
  const confirm = h("button.button.danger", { type: "button" }, "Delete");
  const dialog = h("dialog.dialog.model-delete-dialog", { "aria-labelledby": "model-delete-title",
    "aria-describedby": "model-delete-text" },
    h("h2#model-delete-title", `Delete ${model.name}?`),
    h("p#model-delete-text", "The model's record is removed. Its directory stays on disk unless you tick the box."),
    h("label.check", files, " Also delete files"),
    h("p.hint", model.path ? ["Removes ", h("code", model.path), " and everything in it."] : "This model has no directory."),
    error,
    h("div.actions", cancel, confirm));
  let busy = false;
  const close = () => {
    dialog.close();
    dialog.remove();
  };
  cancel.addEventListener("click", () => { if (!busy) close(); });
  dialog.addEventListener("cancel", (event) => {
    event.preventDefault(); // Esc: close ourselves (and not while the delete is in flight)
    if (!busy) close();
  });
  confirm.addEventListener("click", async () => {
    busy = true;
    confirm.disabled = true;
    cancel.disabled = true;
    showError(error, null);
    try {
      await api("DELETE", `/models/${encodeURIComponent(model.id)}`, undefined, { query: { files: files.checked } });
      busy = false;
      close();
      await onDeleted();
    } catch (err) {
      busy = false;
      confirm.disabled = false;
      cancel.disabled = false;
      if (err.status === 401) {
        close();
        return;
      }
      showError(error, `Not deleted: ${humanError(err)}`);
      confirm.focus();
    }
  });
  document.body.append(dialog);
  dialog.showModal();
}

// --- the forms -----------------------------------------------------------------------------------

function huggingFaceForm(signal, refresh) {
  const repository = h("input", { name: "repository", required: true, placeholder: "org/model",
    autocomplete: "off", spellcheck: "false", autocapitalize: "off" });
  const revision = h("input", { name: "revision", autocomplete: "off", spellcheck: "false", autocapitalize: "off" });
  revision.defaultValue = "main"; // form.reset() goes back to it
  const name = h("input", { name: "name", autocomplete: "off" });
  const submit = h("button.button.primary", { type: "submit" }, "Register");
  const error = errorSlot();
  const form = h("form.card.models-form", { novalidate: true },
    h("h2#models-hf-title", "Register from Hugging Face"),
    field("Repository", repository, "owner/name on the Hub, e.g. Qwen/Qwen2.5-0.5B-Instruct."),
    h("div.form-row",
      field("Revision", revision, "A branch, tag or commit."),
      field("Name (optional)", name, "Defaults to the repository.")),
    h("div.actions", submit, error));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const body = { repository: repository.value.trim() };
    if (revision.value.trim()) body.revision = revision.value.trim();
    body.name = name.value.trim() || null;
    send(form, submit, error, () => api("POST", "/models/huggingface", body, { signal }), async ({ model }) => {
      toast(`Registered ${model.name}. Start its download with "Download" in the list.`, "ok");
      form.reset();
      await refresh();
      repository.focus();
    });
  });
  return form;
}

function localForm(signal, refresh) {
  const name = h("input", { name: "name", required: true, autocomplete: "off" });
  const path = h("input", { name: "path", required: true, autocomplete: "off", spellcheck: "false",
    autocapitalize: "off", placeholder: "my-model" });
  const hint = h("span.models-dir-hint", "A directory directly under the models directory, absolute or relative to it.");
  const submit = h("button.button.primary", { type: "submit" }, "Register directory");
  const error = errorSlot();
  const form = h("form.card.models-form", { novalidate: true },
    h("h2#models-local-title", "Register a local directory"),
    field("Name", name),
    field("Directory", path, hint),
    h("div.actions", submit, error));
  showModelsDir(hint, signal);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const body = { name: name.value.trim(), path: path.value.trim() };
    send(form, submit, error, () => api("POST", "/models/local", body, { signal }), async ({ model }) => {
      toast(`Registered ${model.name}; it is ready to run.`, "ok");
      form.reset();
      await refresh();
      name.focus();
    });
  });
  return form;
}

// Submit a form: field errors under their fields, any other error next to the button.
async function send(form, submit, error, call, onDone) {
  submit.disabled = true;
  showError(error, null);
  showFieldErrors(form, null);
  try {
    const result = await call();
    await onDone(result);
  } catch (err) {
    reportFailure(form, error, err);
  } finally {
    submit.disabled = false;
  }
}

// Name the models directory in the local form's hint (GET /api/system); the hint stays generic without it.
async function showModelsDir(hint, signal) {
  try {
    const { models_dir: dir } = await api("GET", "/system", undefined, { signal });
    if (dir) {
      clear(hint, "A directory directly under the models directory ", h("code", dir),
        ", given as an absolute path or relative to it.");
    }
  } catch (_) {
    // only a hint
  }
}

// --- scan ----------------------------------------------------------------------------------------

function scanControl(signal, refresh) {
  const result = h("div.models-scan", h("p.models-scan-result", { role: "status" }), errorSlot());
  const [text, error] = result.children;
  const button = h("button.button", { type: "button" }, "Scan models directory");
  button.addEventListener("click", async () => {
    button.disabled = true;
    text.textContent = "Scanning…";
    showError(error, null);
    try {
      const { models } = await api("POST", "/models/scan", undefined, { signal });
      text.textContent = models.length
        ? `Registered ${models.length} new ${models.length === 1 ? "model" : "models"}: `
          + `${models.map((m) => m.name).join(", ")}.`
        : "No new models found: every subdirectory with a config.json is already registered.";
      await refresh();
    } catch (err) {
      if (err.name === "AbortError" || err.status === 401) return;
      text.textContent = "";
      showError(error, `Scan failed: ${humanError(err)}`);
    } finally {
      button.disabled = false;
    }
  });
  return { button, result };
}
