// A key's limits on the API keys page (docs/observability.md, "Key limits"): how a key shows
// them, the limit fields of the create form, and the Edit dialog (PATCH /api/keys/{id}).
//
// The limits are `expires_at` (an ISO time; the input is local time, sent with its zone),
// `models` (deployment names or aliases the key may use), `rpm`, `max_concurrent` and
// `tokens_per_day`; an empty field is "no limit" (null). Each input is named after its argument,
// so a 400's field error lands under it (ui.js `showFieldErrors`). A number field sends what was
// typed: digits as a number, anything else as it is, for the server to name what is wrong.
import { api } from "../api.js";
import { badge, errorSlot, field, formatShortTime, h, humanError, reportFailure, showError, showFieldErrors, toast } from "../ui.js";

const NUMBERS = [
  ["rpm", "Requests per minute", "Over it: 429 with Retry-After."],
  ["max_concurrent", "Requests at once", "Streams and other requests in flight together."],
  ["tokens_per_day", "Tokens per day", "Prompt and completion tokens per UTC day."],
];

// "2026-12-02T10:30:00Z" → "2026-12-02T11:30" (a datetime-local input's value, in local time).
function localInput(iso) {
  if (!iso) return "";
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return "";
  const pad = (n) => String(n).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}T${pad(date.getHours())}:${pad(date.getMinutes())}`;
}

function readNumber(input) {
  const text = input.value.trim();
  if (!text) return null;
  return /^\d+$/.test(text) ? Number(text) : text;
}

function readModels(input) {
  const names = input.value.split(/[\s,]+/).filter(Boolean);
  return names.length ? names : null;
}

function readExpiry(input) {
  if (!input.value) return null;
  const date = new Date(input.value); // a datetime-local value is local time
  return Number.isNaN(date.getTime()) ? input.value : date.toISOString();
}

// The limit fields, filled from `key` (the edit form) or empty (the create form). `collect()` gives
// every limit's value; `changed()` only those that differ from what `key` holds (the edit's PATCH:
// an expiry already past is not sent back, which the server would refuse).
export function limitFields(key = null) {
  const expires = h("input", { type: "datetime-local", name: "expires_at", value: localInput(key && key.expires_at) });
  const models = h("input", { type: "text", name: "models", autocomplete: "off", spellcheck: "false",
    placeholder: "any model", value: key && key.models ? key.models.join(", ") : "" });
  const numbers = NUMBERS.map(([name]) => h("input", { type: "text", name, inputmode: "numeric", autocomplete: "off",
    placeholder: "no limit", value: key && key[name] !== null && key[name] !== undefined ? String(key[name]) : "" }));
  const element = h("fieldset.field.key-limits",
    h("legend", "Limits"),
    h("p.hint", "Leave a field empty for no limit."),
    h("div.form-row",
      field("Expires", expires, "Local time. After it the key is refused like a disabled one."),
      field("Models", models, "Deployment names or aliases, separated by commas; others answer 404 as if unknown."),
      NUMBERS.map(([, label, hint], i) => field(label, numbers[i], hint))));
  const collect = () => ({
    expires_at: readExpiry(expires),
    models: readModels(models),
    ...Object.fromEntries(NUMBERS.map(([name], i) => [name, readNumber(numbers[i])])),
  });
  const changed = () => {
    const now = collect();
    const before = key ? { ...key, models: key.models && key.models.length ? key.models : null } : {};
    return Object.fromEntries(Object.entries(now).filter(([name, value]) => {
      if (name === "expires_at") return expires.value !== localInput(before.expires_at);
      return JSON.stringify(value) !== JSON.stringify(before[name] ?? null);
    }));
  };
  return { element, collect, changed };
}

// What a key may do, for its row: each limit or "no limit".
export function limitsSummary(key) {
  const none = h("span.muted", "no limit");
  const value = (v, text) => (v === null || v === undefined ? none.cloneNode(true) : text);
  const rows = [
    ["Expires", key.expires_at ? h("span", formatShortTime(key.expires_at), key.expired ? [" ", badge("expired")] : null)
      : h("span.muted", "never")],
    ["Models", key.models && key.models.length ? key.models.join(", ") : h("span.muted", "any")],
    ["Requests/min", value(key.rpm, String(key.rpm))],
    ["At once", value(key.max_concurrent, String(key.max_concurrent))],
    ["Tokens/day", value(key.tokens_per_day, Number(key.tokens_per_day).toLocaleString())],
  ];
  return h("dl.facts.key-limit-list", rows.map(([k, v]) => [h("dt", k), h("dd", { dataset: { limit: k } }, v)]));
}

// Today's use of a key (UTC day), from usage.summary's `keys`; null: it could not be read.
export function todaySummary(used) {
  if (used === null) return h("span.muted", "—");
  const tokens = used ? used.prompt_tokens + used.completion_tokens : 0;
  const requests = used ? used.requests : 0;
  return h("span.key-today", `${tokens.toLocaleString()} tokens`, h("br"),
    h("span.muted", `${requests.toLocaleString()} request${requests === 1 ? "" : "s"}`));
}

// Edit a key's name and limits in a modal dialog; resolves after a save (true) or a cancel (false).
export function editKeyDialog(key, page) {
  return new Promise((resolve) => {
    const name = h("input", { type: "text", name: "name", autocomplete: "off", spellcheck: "false", value: key.name || "" });
    const limits = limitFields(key);
    const slot = errorSlot();
    const save = h("button.button.primary", { type: "submit" }, "Save");
    const title = `edit-key-${key.id}`;
    const form = h("form.key-edit-form", { method: "dialog", novalidate: true },
      field("Name", name), limits.element, slot,
      h("div.actions", h("button.button", { type: "button", onclick: () => done(false) }, "Cancel"), save));
    const dialog = h("dialog.dialog.key-edit-dialog", { "aria-labelledby": title },
      h("h2", { id: title }, `Edit “${key.name || key.id}”`), form);
    let finished = false;
    const done = (saved) => {
      if (finished) return;
      finished = true;
      if (dialog.open) dialog.close();
      dialog.remove();
      resolve(saved);
    };
    dialog.addEventListener("cancel", (event) => {
      event.preventDefault();
      done(false);
    });
    page.cleanup.push(() => done(false));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      showError(slot, null);
      showFieldErrors(form, null);
      const body = limits.changed();
      if (name.value.trim() !== (key.name || "")) body.name = name.value.trim();
      if (!Object.keys(body).length) {
        done(false);
        return;
      }
      save.disabled = true;
      try {
        await api("PATCH", `/keys/${encodeURIComponent(key.id)}`, body, { signal: page.signal });
        toast(`Key “${body.name || key.name}” saved.`, "ok");
        done(true);
      } catch (error) {
        save.disabled = false;
        reportFailure(form, slot, error);
        if (error.status === 404) showError(slot, `The key is gone: ${humanError(error)}`);
      }
    });
    document.body.append(dialog);
    dialog.showModal();
    name.focus();
  });
}
