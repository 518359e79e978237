// API keys: the keys that clients (/v1), agents (/mcp), scripts (/api) and tools (/tools) use, and a form to
// create one. A new key's secret is shown once, in a dialog; closing it removes the secret from
// the page, and it is never stored (not in storage, not in the URL, not in a variable that lives on).
//
// API: GET /api/keys; POST /api/keys {name, scopes, limits…}; PATCH /api/keys/{id} {name?, limits…}
// (the Edit dialog, key-limits.js); POST /api/keys/{id}/disable and /enable; DELETE /api/keys/{id};
// GET /api/usage for today (UTC) only: each key's tokens and requests today.
//
// Each key shows its limits (expiry, models, requests per minute, at once, tokens per day; "no
// limit" when unset; docs/observability.md, "Key limits") and an "expired" badge once its expiry
// has passed.
//
// A new key with the inference scope gets "Connect a client" (js/connect.js) in its dialog, the
// secret filled into the snippets; it goes with the dialog.
import { api } from "../api.js";
import { connectPanel, servedModels } from "../connect.js";
import { editKeyDialog, limitFields, limitsSummary, todaySummary } from "./key-limits.js";
import {
  badge, clear, confirmDialog, copyButton, empty, errorSlot, field, formatShortTime, h, humanError, pageHeader,
  placeholder, showError, showFieldErrors, toast, utcRange,
} from "../ui.js";

// The scopes (vllm_use/scopes.py), grouped by where the key is used, each with what it allows.
const SCOPE_GROUPS = [
  ["Inference gateway (/v1)", [
    ["inference", "Call the /v1 gateway (chat, completions, models) with this key."],
  ]],
  ["Console and admin API (/api)", [
    ["admin.read", "Read everything in this console and /api: system, GPUs, models, downloads, runtime, keys, settings."],
    ["admin.write", "Change things through /api: models, downloads, runtime, keys, settings (reading needs admin.read too)."],
  ]],
  ["Tools (/tools), for the chat page and tool clients", [
    ["tools", "Call the tools enabled at /tools; with write tools it changes files in the tools folder, with exec_shell_command it runs any command as the server's user."],
  ]],
  ["MCP tools (/mcp), for agents", [
    ["mcp.read", "The read-only MCP tools."],
    ["mcp.models", "MCP tools that register and delete models and start or cancel downloads."],
    ["mcp.runtime", "MCP tools that start, switch, restart and stop vLLM."],
    ["mcp.admin", "Every MCP tool, keys and settings included (not /api, not /v1)."],
  ]],
  ["Monitoring (/metrics), for Prometheus", [
    ["metrics", "Read GET /metrics: request counts, latencies, token totals and each vLLM's own metrics; no prompts, no key ids."],
  ]],
];

export async function render(root, page) {
  root.append(pageHeader("API keys", "Keys for clients (/v1), agents (/mcp) and scripts (/api). A key's secret is shown once, when it is created."));

  // --- the list ----------------------------------------------------------------------------------
  const listBody = h("div.keys-list", placeholder(4));
  const listError = errorSlot();
  const listHeading = h("h2#keys-list", { tabindex: "-1" }, "Keys");
  root.append(h("section.card.keys-card", { "aria-labelledby": "keys-list" }, listHeading, listError, listBody));

  // --- the form ----------------------------------------------------------------------------------
  const nameInput = h("input", { name: "name", type: "text", autocomplete: "off", spellcheck: "false",
    placeholder: "e.g. open-webui, ci-agent" });
  const scopes = h("fieldset.field.scopes", { name: "scopes", id: "key-scopes" },
    h("legend", "Scopes"),
    h("p.hint", "Choose what the key may do; no scope includes another."),
    SCOPE_GROUPS.map(([title, items]) => h("div.scope-group",
      h("h3", title),
      items.map(([scope, meaning]) => {
        const id = `scope-${scope.replace(/\./g, "-")}`;
        return h("div.check.scope-choice",
          h("input", { type: "checkbox", name: "scopes", value: scope, id, "aria-describedby": `${id}-meaning` }),
          h("div", h("label", { for: id }, h("code", scope)), h("p.hint", { id: `${id}-meaning` }, meaning)));
      }))));
  const limits = limitFields();
  const submit = h("button.button.primary", { type: "submit" }, "Create key");
  const formError = errorSlot();
  const form = h("form.card.key-form", { novalidate: true, "aria-labelledby": "keys-create" },
    h("h2#keys-create", "Create a key"),
    field("Name", nameInput, "To recognise it later: who or what uses it."),
    scopes,
    limits.element,
    h("div.actions", submit),
    formError);
  root.append(form);

  // --- loading and showing the keys ---------------------------------------------------------------
  // After an action, focus goes back to the same row's new button (or to the heading).
  const load = async (focus = null) => {
    let keys;
    let today = null; // key id → today's use; null when usage could not be read
    try {
      const [listed, used] = await Promise.all([
        api("GET", "/keys", undefined, { signal: page.signal }),
        api("GET", "/usage", undefined, { query: utcRange(1), signal: page.signal }).catch((error) => {
          if (error.name === "AbortError" || error.status === 401) throw error;
          return null; // the keys are still worth showing
        }),
      ]);
      keys = listed.keys;
      if (used) today = new Map(used.keys.map((k) => [k.key_id, k]));
    } catch (error) {
      if (error.name === "AbortError" || error.status === 401) return;
      clear(listBody, h("p.error-text", { role: "alert" }, `Could not load the keys: ${humanError(error)}`));
      return;
    }
    if (!keys.length) {
      clear(listBody, empty("No API keys yet. Clients need a key with the inference scope to call the /v1 gateway; "
        + "agents need an mcp.* key to use the MCP tools. Create one with the form below."));
    } else {
      clear(listBody, h("div.table-wrap", h("table.keys-table",
        h("thead", h("tr", ["Name", "Key", "Scopes", "Status", "Limits", "Today", "Last used", "Actions"]
          .map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", keys.map((key) => row(key, today))))));
    }
    if (focus) {
      const target = focus.keyId && listBody.querySelector(`tr[data-key-id="${CSS.escape(focus.keyId)}"] [data-action="${focus.action}"]`);
      (target || listHeading).focus();
    }
  };

  const row = (key, today) => {
    const label = key.name || key.id;
    const actions = [];
    if (!key.problem) {
      actions.push(h("button.button.small", { type: "button", dataset: { action: "edit" },
        onclick: (event) => edit(event.currentTarget, key) }, "Edit"));
    }
    if (key.problem === null || key.problem === undefined) {
      const action = key.enabled ? "disable" : "enable";
      actions.push(h("button.button.small", { type: "button", dataset: { action },
        onclick: (event) => toggle(event.currentTarget, key, action) }, key.enabled ? "Disable" : "Enable"));
    }
    if (key.id !== "<malformed>") {
      actions.push(h("button.button.small.danger", { type: "button", dataset: { action: "delete" },
        onclick: (event) => remove(event.currentTarget, key) }, "Delete"));
    }
    const status = key.problem ? "corrupt" : !key.enabled ? "disabled" : key.expired ? "expired" : "enabled";
    return h("tr", { dataset: { keyId: key.id } },
      h("td.key-name", key.name || "—", key.problem ? h("p.error-text", key.problem) : null),
      h("td", key.prefix ? h("code", `${key.prefix}…`) : "—", h("div.muted.key-id", "id ", h("code", key.id)),
        key.created_at ? h("div.muted.key-created", `created ${formatShortTime(key.created_at)}`) : null),
      h("td", key.scopes.length ? h("ul.scope-list", key.scopes.map((s) => h("li", h("code", s)))) : "—"),
      h("td", badge(status)),
      h("td.key-limits-cell", key.problem ? "—" : limitsSummary(key)),
      h("td.key-today-cell", todaySummary(today ? today.get(key.id) || 0 : null)),
      h("td.key-used", key.last_used_at ? formatShortTime(key.last_used_at) : "never"),
      h("td", h("div.actions.row-actions", { role: "group", "aria-label": `Actions for ${label}` }, actions)));
  };

  const toggle = async (button, key, action) => {
    button.disabled = true;
    showError(listError, null);
    try {
      await api("POST", `/keys/${encodeURIComponent(key.id)}/${action}`, undefined, { signal: page.signal });
      toast(`Key “${key.name}” ${action}d.`, "ok");
      await load({ keyId: key.id, action: action === "disable" ? "enable" : "disable" });
    } catch (error) {
      if (error.name === "AbortError" || error.status === 401) return;
      button.disabled = false;
      showError(listError, `Could not ${action} “${key.name}”: ${humanError(error)}`);
    }
  };

  const edit = async (button, key) => {
    showError(listError, null);
    if (await editKeyDialog(key, page)) await load({ keyId: key.id, action: "edit" });
    else if (button.isConnected) button.focus();
  };

  const remove = async (button, key) => {
    const label = key.name || key.id;
    const ok = await confirmDialog(`Delete the key “${label}”?`,
      "Anything using it is refused from its next request. This cannot be undone.", "Delete");
    if (!ok) {
      button.focus();
      return;
    }
    button.disabled = true;
    showError(listError, null);
    try {
      await api("DELETE", `/keys/${encodeURIComponent(key.id)}`, undefined, { signal: page.signal });
      toast(`Key “${label}” deleted.`, "ok");
      await load({});
    } catch (error) {
      if (error.name === "AbortError" || error.status === 401) return;
      button.disabled = false;
      showError(listError, `Could not delete “${label}”: ${humanError(error)}`);
    }
  };

  // --- creating a key -----------------------------------------------------------------------------
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    showError(formError, null);
    const name = nameInput.value.trim();
    const chosen = [...form.querySelectorAll('input[name="scopes"]:checked')].map((box) => box.value);
    const missing = {};
    const policy = Object.fromEntries(Object.entries(limits.collect()).filter(([, value]) => value !== null));
    if (!name) missing.name = "Give the key a name.";
    if (!chosen.length) missing.scopes = "Choose at least one scope.";
    if (Object.keys(missing).length) {
      showScopeErrors({ fieldErrors: missing });
      (missing.name ? nameInput : form.querySelector('input[name="scopes"]')).focus();
      return;
    }
    showScopeErrors(null);
    submit.disabled = true;
    try {
      // The answer holds the secret: it goes straight into the dialog and nowhere else.
      const created = await api("POST", "/keys", { name, scopes: chosen, ...policy }, { signal: page.signal });
      form.reset();
      showSecretOnce(created.key, created.secret, page, submit);
      load();
    } catch (error) {
      if (error.name === "AbortError" || error.status === 401) return;
      if (!showScopeErrors(error)) showError(formError, error);
    } finally {
      submit.disabled = false;
    }
  });

  // showFieldErrors finds [name="scopes"]: the fieldset comes first, so the note goes under the group.
  const showScopeErrors = (error) => showFieldErrors(form, error);

  await load();
}

// The secret, once: a modal dialog with the secret in a read-only input, Copy and Done. Closing it
// (Done or Esc) or leaving the page removes the dialog, and the secret with it, from the document.
function showSecretOnce(key, secret, page, returnFocus) {
  const input = h("input.secret", { type: "text", readonly: true, "aria-label": "Secret", value: secret,
    spellcheck: "false", autocomplete: "off" });
  const done = h("button.button.primary", { type: "button" }, "Done");
  const dialog = h("dialog.dialog.secret-dialog", { "aria-labelledby": "new-key-title", "aria-describedby": "new-key-warning" },
    h("h2#new-key-title", "Your new key"),
    h("p", "Key ", h("strong", key.name), " can use: ", key.scopes.map((s, i) => [i ? ", " : "", h("code", s)]), "."),
    h("div.secret-row", input, copyButton(() => input.value)),
    h("p#new-key-warning.secret-warning", h("strong", "Copy it now: it will not be shown again."),
      " vllm-use keeps only a hash of it. If it is lost, create a new key and delete this one."),
    connectSection(key, secret, page),
    h("div.actions", done));
  // Synchronous: the "close" event comes a task later, and the secret must be gone at once.
  let finished = false;
  const finish = (restoreFocus = true) => {
    if (finished) return;
    finished = true;
    if (dialog.open) dialog.close();
    input.value = "";
    dialog.remove();
    if (restoreFocus && returnFocus && returnFocus.isConnected) returnFocus.focus();
  };
  done.addEventListener("click", () => finish());
  dialog.addEventListener("cancel", (event) => { // Esc
    event.preventDefault();
    finish();
  });
  dialog.addEventListener("close", () => finish());
  page.cleanup.push(() => finish(false));
  document.body.append(dialog);
  dialog.showModal();
  input.focus();
  input.select();
}

// For an inference key: the base URL, the served models and the snippets with this secret in them.
function connectSection(key, secret, page) {
  if (!key.scopes.includes("inference")) return null;
  const panel = connectPanel({ page, secret, canCreate: false });
  servedModels(page.signal).then(panel.setModels, (error) => {
    if (error.name === "AbortError" || error.status === 401) return;
    panel.element.prepend(h("p.error-text", { role: "alert" }, `Could not list the models: ${humanError(error)}`));
  });
  return h("section.secret-connect", { "aria-labelledby": "new-key-connect" },
    h("h3#new-key-connect", "Connect a client with it"),
    panel.element);
}
