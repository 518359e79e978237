// Settings: the plain key/value settings kept in vllm-use's database, and a form to set one.
// API: GET /api/settings (settings.list), PUT /api/settings (settings.update; the body is the JSON
// array of {key, value} itself, not an object), DELETE /api/settings/{key} (settings.delete).
//
// The server refuses keys that look like secrets; its field errors come back with
// loc ["settings", 0, "key"|"value"], so the inputs are named settings.0.key / settings.0.value and
// showFieldErrors() puts each message under its input.
import { api } from "../api.js";
import {
  clear, confirmDialog, empty, errorSlot, field, formatTime, h, humanError, pageHeader, placeholder, showError,
  showFieldErrors, toast,
} from "../ui.js";

const KEY_FIELD = "settings.0.key";
const VALUE_FIELD = "settings.0.value";

export async function render(root, page) {
  const body = h("div.settings-list", placeholder(4));
  const listSlot = errorSlot();
  const form = settingForm(page, (settings) => show(settings));

  root.append(
    pageHeader("Settings",
      "Named values kept in vllm-use's database for you and your MCP agents to read and write "
      + "(the settings.* tools), e.g. a team convention such as default.model = qwen3. vllm-use itself "
      + "does not act on them. Secrets are never stored here: keys that look like tokens, passwords or "
      + "API keys are refused; credentials are given as flags or environment variables."),
    h("section.card", { "aria-labelledby": "settings-current" }, h("h2#settings-current", "Current settings"), listSlot, body),
    form.element);

  const load = async () => {
    try {
      const data = await api("GET", "/settings", undefined, { signal: page.signal });
      showError(listSlot, null);
      show(data.settings);
    } catch (error) {
      if (error.name === "AbortError" || error.status === 401) return;
      clear(body);
      showError(listSlot, `Could not load the settings: ${humanError(error)}`);
    }
  };

  const show = (settings) => {
    if (!settings.length) {
      clear(body, empty("No settings yet. Set one with the form below.",
        h("button.button", { type: "button", onclick: () => form.focusKey() }, "Set a value")));
      return;
    }
    const hasTime = settings.some((s) => s.updated_at);
    clear(body, h("div.table-wrap",
      h("table.settings-table", { "aria-label": "Settings" },
        h("thead", h("tr",
          h("th", { scope: "col" }, "Key"),
          h("th", { scope: "col" }, "Value"),
          hasTime ? h("th", { scope: "col" }, "Updated") : null,
          h("th", { scope: "col" }, h("span.visually-hidden", "Actions")))),
        h("tbody", settings.map((s) => row(s, hasTime))))));
  };

  const row = (setting, hasTime) => {
    const slot = errorSlot();
    const remove = h("button.button.small.delete", { type: "button" }, "Delete");
    remove.addEventListener("click", async () => {
      if (remove.getAttribute("aria-disabled") === "true") return; // a delete is on its way
      showError(slot, null);
      if (setting.key === "." || setting.key === "..") {
        // A URL path cannot carry these (the browser resolves them as "this/parent folder").
        showError(slot, `"${setting.key}" cannot be deleted from here: a URL cannot name it. `
          + "Use the settings.delete MCP tool instead.");
        return;
      }
      const ok = await confirmDialog("Delete this setting?",
        `"${setting.key}" will be removed; agents that read it will no longer find it.`, "Delete");
      if (!ok) {
        remove.focus();
        return;
      }
      remove.setAttribute("aria-disabled", "true"); // not .disabled: that would drop the keyboard focus
      try {
        await api("DELETE", `/settings/${encodeURIComponent(setting.key)}`, undefined, { signal: page.signal });
        toast(`Deleted ${setting.key}`, "ok");
      } catch (error) {
        if (error.name === "AbortError" || error.status === 401) return;
        if (error.status !== 404) {
          remove.removeAttribute("aria-disabled");
          showError(slot, humanError(error));
          return;
        }
        toast(`${setting.key} was already deleted`);
      }
      const next = tr.nextElementSibling || tr.previousElementSibling;
      const nextKey = next && next.dataset.key;
      await load();
      // Keep the keyboard where it was: on the neighbouring row's Delete, else on the form.
      const target = nextKey != null && [...body.querySelectorAll("tr[data-key]")].find((r) => r.dataset.key === nextKey);
      if (target) target.querySelector("button.delete").focus();
      else form.focusKey();
    });
    const edit = h("button.button.small.quiet", { type: "button", onclick: () => form.fill(setting) }, "Edit");
    const tr = h("tr", { dataset: { key: setting.key } },
      h("td.settings-key", h("code", setting.key)),
      h("td.settings-value", setting.value === "" ? h("span.muted", "(empty)") : setting.value),
      hasTime ? h("td.nowrap", setting.updated_at
        ? h("time", { datetime: setting.updated_at, title: setting.updated_at }, formatTime(setting.updated_at)) : "—") : null,
      h("td.settings-actions", h("div.actions", edit, remove), slot));
    return tr;
  };

  await load();
}

// The "Set a value" form. onSaved(settings) gets the full list the server answers with.
function settingForm(page, onSaved) {
  const key = h("input", { name: KEY_FIELD, autocomplete: "off", spellcheck: "false" });
  const value = h("input", { name: VALUE_FIELD, autocomplete: "off", spellcheck: "false" });
  const save = h("button.button.primary", { type: "submit" }, "Save");
  const slot = errorSlot();
  const element = h("form.card.settings-form", { novalidate: true },
    h("h2#settings-set", "Set a value"),
    h("div.form-row",
      field("Key", key, "Up to 128 characters. Setting an existing key replaces its value. Keys containing "
        + "token, password, passwd, secret, credential or api key (in any spelling) are refused."),
      field("Value", value, "One line, up to 8192 characters; may be empty.")),
    h("div.actions", save, slot));

  element.addEventListener("submit", async (event) => {
    event.preventDefault();
    showError(slot, null);
    showFieldErrors(element, null);
    if (key.value === "") {
      showFieldErrors(element, { fieldErrors: { [KEY_FIELD]: "Enter a key." } });
      key.focus();
      return;
    }
    if (save.getAttribute("aria-disabled") === "true") return; // a save is on its way
    save.setAttribute("aria-disabled", "true"); // not .disabled: that would drop the keyboard focus
    try {
      const data = await api("PUT", "/settings", [{ key: key.value, value: value.value }], { signal: page.signal });
      toast(`Saved ${key.value}`, "ok");
      key.value = "";
      value.value = "";
      onSaved(data.settings);
      key.focus();
    } catch (error) {
      if (error.name === "AbortError" || error.status === 401) return;
      if (showFieldErrors(element, error)) {
        element.querySelector("[aria-invalid]").focus();
      } else {
        showError(slot, humanError(error));
      }
    } finally {
      save.removeAttribute("aria-disabled");
    }
  });

  return {
    element,
    focusKey: () => key.focus(),
    fill(setting) {
      showFieldErrors(element, null);
      showError(slot, null);
      key.value = setting.key;
      value.value = setting.value;
      value.focus();
      value.select();
    },
  };
}

