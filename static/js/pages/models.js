// Models: what vLLM can run (docs/console.md, "Models"). Lists the registered models with their
// source, state, size and directory, and what serves them, and lets you
//   - add a model in one step (POST /api/models {source, revision?, token?, name?}): a Hugging Face
//     repository (owner/name) is checked on the hub, registered and its download started at once;
//     a directory under the models directory is registered as it is. The hub's answer (not found,
//     gated, needs a token) shows under the field; nothing is saved then;
//   - register every unregistered model directory found there (POST /api/models/scan),
//   - deploy a downloaded model ("Deploy" → /deployments?model=<id>),
//   - retry a failed download (POST /api/downloads/{task}/retry) or remove it with its partial files,
//   - delete a model, optionally with its files (DELETE /api/models/{id}?files=true|false); a model
//     a deployment uses is refused before the dialog, naming the deployment.
// State words come from states.js: not downloaded / downloading / downloaded / failed, and "serving"
// when a deployment's instance (GET /api/deployments) or the runtime (GET /api/runtime) answers for it.
// The list refreshes every 3 s; a download's percentage follows GET /api/downloads/events live.
//
// DOM hooks for tests: the form is <form class="add-model-form"> (input name="source", button "Add
// model"); each table row is <tr data-model-id="…" data-status="…" data-serving="true|false">; a
// downloaded model's row has <a data-action="deploy">; the delete dialog is <dialog class="dialog
// model-delete-dialog">.
import { api } from "../api.js";
import { clear, empty, errorSlot, every, formatBytes, h, humanError, pageHeader, placeholder, showError, toast } from "../ui.js";
import { SERVING, instanceWord, modelWord, runtimeWord, stateBadge } from "../states.js";
import { addModelForm } from "../add-model.js";
import { deployLink, followDownloads, removeModel } from "./model-actions.js";

// Model statuses from which downloads.start accepts a Hugging Face model.
const DOWNLOADABLE = new Set(["registered", "failed", "error", "canceled"]);
const RETRYABLE_TASK = new Set(["failed", "canceled"]);

export async function render(root, page) {
  const { signal } = page;
  const listError = h("p.error-text", { role: "alert", hidden: true });
  const list = h("div.models-list", placeholder(4));
  const heading = h("h2#models-list-title", { tabindex: "-1" }, "Registered models");
  let tbody = null; // set once the table exists
  const tasks = new Map(); // model id → its newest download task
  let lastModels = [];
  let users = new Map(); // model id → [{name, word}] of the deployments (and the runtime) using it

  const refresh = async () => {
    try {
      const [{ models }, { downloads }, using] = await Promise.all([
        api("GET", "/models", undefined, { signal }),
        api("GET", "/downloads", undefined, { signal }),
        whoUses(signal),
      ]);
      listError.hidden = true;
      tasks.clear();
      for (const task of downloads) { // newest first: keep the first seen per model
        if (!tasks.has(task.model_id)) tasks.set(task.model_id, task);
      }
      users = using;
      lastModels = models;
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
      clear(list, empty("No models yet. Add one above: a Hugging Face repository such as acme/tiny-chat is "
        + "downloaded at once; a directory under the models directory is registered as it is. Or scan the models "
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
            h("th", { scope: "col" }, "State"),
            h("th.num", { scope: "col" }, "Size"),
            h("th", { scope: "col" }, "Path"),
            h("th", { scope: "col" }, "Actions"))),
          tbody)));
    }
    // A row shows its model, its newest download and who uses it: a change in any rebuilds it.
    const items = models.map((model) => ({ id: model.id, model, task: progressOf(tasks.get(model.id)),
      users: users.get(model.id) || [] }));
    syncRows(tbody, items, ({ model, task, users: using }) => modelRow(model, {
      task, users: using, signal, refresh, onDelete: (row) => askDelete(model, row),
    }));
  };

  // A model in use is refused before any dialog, naming what uses it (the server would refuse too).
  const askDelete = (model, row) => {
    const using = users.get(model.id) || [];
    const slot = row.querySelector(".model-row-error");
    if (using.length) {
      showError(slot, `${model.name} can't be deleted: it is used by ${describeUsers(using)}. `
        + "Delete the deployment (or give it another model) on the Deployments page first.");
      return;
    }
    showError(slot, null);
    deleteDialog(model, async () => {
      toast(`Deleted ${model.name}.`, "ok");
      await refresh();
      const next = tbody && tbody.querySelector("button[data-action='delete']");
      (next || heading).focus();
    });
  };

  // Live progress: a task event updates its model's row; a finished one reloads the list.
  const onTask = (task) => {
    const before = tasks.get(task.model_id);
    if (before && before.created_at > task.created_at) return;
    tasks.set(task.model_id, task);
    if (before && before.status !== task.status && !["pending", "running"].includes(task.status)) {
      refresh();
      return;
    }
    if (tbody) showModels(lastModels);
  };

  const scan = scanControl(signal, refresh);
  root.append(h("div.models-page",
    pageHeader("Models", "Models vLLM can run: Hugging Face repositories downloaded here, or directories "
      + "already under the models directory.", scan.button),
    scan.result,
    addModelForm({ signal, onAdded: async (task) => { if (task) onTask(task); await refresh(); } }),
    h("section.models-section", { "aria-labelledby": "models-list-title" }, heading, listError, list)));
  await refresh();
  every(3000, refresh, page);
  followDownloads(signal, onTask);
}

// Who uses each model: the deployments naming it (with their instance's word) and the runtime when
// it runs the model outside any deployment. Best effort: without them the list still shows.
async function whoUses(signal) {
  const using = new Map();
  const add = (modelId, user) => {
    if (!using.has(modelId)) using.set(modelId, []);
    using.get(modelId).push(user);
  };
  const quietly = (path) => api("GET", path, undefined, { signal }).catch((error) => {
    if (error.name === "AbortError") throw error;
    return null;
  });
  const [deployments, runtime] = await Promise.all([quietly("/deployments"), quietly("/runtime")]);
  const named = new Set();
  for (const d of (deployments && deployments.deployments) || []) {
    add(d.model_id, { name: d.name, word: instanceWord(d.instance && d.instance.state) });
    named.add(d.name);
  }
  if (runtime && runtime.active_model_id && !(runtime.deployment && named.has(runtime.deployment))
    && !["stopped", "failed"].includes(runtime.state)) {
    add(runtime.active_model_id, { name: null, word: runtimeWord(runtime.state) });
  }
  return using;
}

function describeUsers(users) {
  const names = users.map((u) => (u.name ? u.name : "the runtime"));
  const deployments = users.filter((u) => u.name);
  if (!deployments.length) return names.join(", ");
  return `${deployments.length === 1 ? "the deployment" : "the deployments"} ${names.join(", ")}`;
}

// --- the table -----------------------------------------------------------------------------------

function modelRow(model, { task, users, signal, refresh, onDelete }) {
  const hub = model.source === "huggingface";
  const serving = users.some((u) => u.word === SERVING);
  const rowError = h("p.error-text.model-row-error", { role: "alert", hidden: true });
  const actions = [];
  const failedTask = task && RETRYABLE_TASK.has(task.status) && DOWNLOADABLE.has(model.status) ? task : null;
  if (model.status === "ready") {
    actions.push(deployLink(model.id));
  } else if (hub && failedTask) {
    actions.push(h("button.button.small.primary", { type: "button", "data-action": "retry",
      onclick: async (event) => {
        event.currentTarget.disabled = true;
        showError(rowError, null);
        try {
          await api("POST", `/downloads/${encodeURIComponent(failedTask.id)}/retry`, {}, { signal });
          toast(`Downloading ${model.name} again.`, "ok");
        } catch (err) {
          if (err.name === "AbortError" || err.status === 401) return;
          showError(rowError, `Not retried: ${humanError(err)}`);
        }
        await refresh();
      } }, "Retry"));
  } else if (hub && DOWNLOADABLE.has(model.status)) {
    actions.push(h("a.button.small.primary", {
      href: `/downloads?model=${encodeURIComponent(model.id)}`, "data-action": "download",
    }, "Download"));
  }
  if (model.status === "downloading") {
    // The server refuses a delete while it downloads: cancel (and see the log) on the Downloads page.
    actions.push(h("a.button.small", { href: "/downloads", "data-action": "downloads" }, "Downloads"));
  } else if (hub && failedTask) {
    actions.push(h("button.button.small", { type: "button", "data-action": "remove", onclick: async () => {
      if (users.length) {
        showError(rowError, `${model.name} can't be removed: it is used by ${describeUsers(users)}.`);
        return;
      }
      showError(rowError, null);
      try {
        if (await removeModel(model.name, model.id)) {
          toast(`Removed ${model.name}.`, "ok");
          await refresh();
        }
      } catch (err) {
        if (err.name === "AbortError" || err.status === 401) return;
        showError(rowError, `Not removed: ${humanError(err)}`);
      }
    } }, "Remove"));
  } else {
    actions.push(h("button.button.small", { type: "button", "data-action": "delete",
      onclick: (event) => onDelete(event.currentTarget.closest("tr")) }, "Delete"));
  }
  return h("tr", { dataset: { modelId: model.id, status: model.status, serving: String(serving) } },
    h("td.model-name", h("strong", model.name)),
    h("td.model-source", hub
      ? ["Hugging Face", h("br"), h("code", `${model.repository}@${model.revision}`)]
      : "Local"),
    h("td.model-status",
      h("div.model-states", stateBadge(modelWord(model.status)), serving ? stateBadge(SERVING) : null,
        model.status === "downloading" ? h("span.model-progress", progressText(task)) : null),
      users.length ? h("p.model-users", "Deployed as ", users.map((u, i) => [i ? ", " : "",
        h("strong", u.name || "the runtime"), ` (${u.word})`])) : null,
      model.error ? h("p.model-error", model.error) : null),
    h("td.num", formatBytes(model.size_bytes)),
    h("td.model-path", model.path ? h("code", model.path) : "—"),
    h("td.model-actions", h("div.actions", actions), rowError));
}

// What a row needs of a task (so that a rate or ETA change alone does not rebuild the row).
function progressOf(task) {
  if (!task) return null;
  const { id, status, bytes_done, bytes_total, queue_position, created_at } = task;
  return { id, status, bytes_done, bytes_total, queue_position, created_at };
}

// "42 %" of a running download (or "queued", "starting"), from its newest task.
function progressText(task) {
  if (!task) return "";
  if (task.status === "pending") return task.queue_position ? `queued (${task.queue_position})` : "queued";
  if (!task.bytes_total) return task.bytes_done ? formatBytes(task.bytes_done) : "starting";
  return `${Math.min(100, Math.floor((100 * task.bytes_done) / task.bytes_total))} %`;
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
