// Small DOM helpers shared by every page. Text always goes in as text (textContent), never as
// HTML: nothing the server or a user typed can become markup.

// h("button.button.primary", {onclick, type: "submit"}, "Save", child, …); "h2#some-id.title" sets the id.
export function h(tag, attrs = {}, ...children) {
  const [head, ...classes] = tag.split(".");
  const [name, id] = head.split("#");
  const node = document.createElement(name || "div");
  if (id) node.id = id;
  if (classes.length) node.className = classes.join(" ");
  if (attrs === null || typeof attrs !== "object" || attrs instanceof Node || Array.isArray(attrs)) {
    children.unshift(attrs);
    attrs = {};
  }
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "value") node.value = value;
    else if (key === "checked") node.checked = Boolean(value);
    else if (key === "class") node.className = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function clear(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

// A page header: title, one line saying what the page is for, optional actions.
export function pageHeader(title, purpose, ...actions) {
  return h(
    "header.page-header",
    h("div", h("h1", title), purpose ? h("p.purpose", purpose) : null),
    actions.length ? h("div.actions", actions) : null,
  );
}

// An empty state that says what to do next.
export function empty(message, ...actions) {
  return h("div.empty", h("p", message), actions.length ? h("div.actions", actions) : null);
}

// Placeholder rows of a fixed height while data loads (no layout jump when it arrives).
export function placeholder(lines = 3) {
  return h("div.placeholder", { "aria-busy": "true", "aria-label": "Loading" },
    Array.from({ length: lines }, () => h("div.placeholder-line")));
}

// An error next to the action that caused it. `target` is an element made by errorSlot().
export function errorSlot() {
  return h("p.error-text", { role: "alert", hidden: true });
}

export function showError(slot, error) {
  if (!slot) return;
  if (!error) {
    slot.hidden = true;
    slot.textContent = "";
    return;
  }
  slot.hidden = false;
  slot.textContent = humanError(error);
}

export function humanError(error) {
  if (!error) return "";
  if (typeof error === "string") return error;
  const message = error.message || String(error);
  // "invalid arguments: name: …" → the part a person needs.
  return message.replace(/^invalid arguments: /, "");
}

// Put each field error from an ApiError under its form field (inputs with name=…); returns
// true if at least one was placed. Clears earlier ones first.
export function showFieldErrors(form, error) {
  for (const old of form.querySelectorAll(".field-error")) old.remove();
  for (const input of form.querySelectorAll("[aria-invalid]")) input.removeAttribute("aria-invalid");
  let placed = false;
  for (const [field, message] of Object.entries((error && error.fieldErrors) || {})) {
    // A path into a list or an object ("models.1") lands under the field that holds it ("models").
    const input = form.querySelector(`[name="${CSS.escape(field)}"]`)
      || form.querySelector(`[name="${CSS.escape(field.split(".")[0])}"]`);
    if (!input || input.getAttribute("aria-invalid") === "true") continue;
    const id = `${input.id || field}-error`;
    const note = h("p.field-error", { id, role: "alert" }, message);
    input.setAttribute("aria-invalid", "true");
    input.setAttribute("aria-describedby", id);
    (input.closest(".field") || input).append(note);
    placed = true;
  }
  return placed;
}

// After a failed call from a form: field errors under their fields, anything else in `slot`, and
// focus on the first invalid field. Aborts and 401s are left alone (the sign-in page takes over).
export function reportFailure(form, slot, err) {
  if (err.name === "AbortError" || err.status === 401) return;
  if (!showFieldErrors(form, err)) showError(slot, err);
  const invalid = form.querySelector("[aria-invalid='true']");
  if (invalid) invalid.focus();
}

// A labelled form field.
export function field(label, input, hint) {
  if (!input.id) input.id = `f-${Math.random().toString(36).slice(2, 9)}`;
  return h("div.field", h("label", { for: input.id }, label), input, hint ? h("p.hint", hint) : null);
}

export function toast(message, kind = "info") {
  const box = document.getElementById("toasts");
  const item = h(`div.toast.${kind}`, message);
  box.append(item);
  setTimeout(() => item.remove(), kind === "error" ? 8000 : 4000);
}

// A modal confirmation; resolves true/false. Uses <dialog> (focus is trapped, Esc cancels).
export function confirmDialog(title, message, confirmLabel = "Confirm", danger = true) {
  return new Promise((resolve) => {
    const dialog = h("dialog.dialog", { "aria-labelledby": "confirm-title" });
    const done = (value) => {
      dialog.close();
      dialog.remove();
      resolve(value);
    };
    dialog.append(
      h("h2#confirm-title", title),
      h("p", message),
      h("div.actions",
        h("button.button", { type: "button", onclick: () => done(false) }, "Cancel"),
        h(`button.button.${danger ? "danger" : "primary"}`, { type: "button", onclick: () => done(true) }, confirmLabel)),
    );
    dialog.addEventListener("cancel", (event) => {
      event.preventDefault();
      done(false);
    });
    document.body.append(dialog);
    dialog.showModal();
  });
}

// A status badge: the text says it, the colour helps.
export function badge(status) {
  return h(`span.badge.status-${String(status).replace(/[^a-z_-]/gi, "")}`, String(status));
}

export function copyButton(getText, label = "Copy") {
  const button = h("button.button.small", { type: "button" }, label);
  button.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(getText());
      button.textContent = "Copied";
    } catch (_) {
      button.textContent = "Select and copy";
    }
    setTimeout(() => { button.textContent = label; }, 1500);
  });
  return button;
}

export function formatBytes(bytes) {
  if (bytes === null || bytes === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = Number(bytes);
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(unit && value < 10 ? 1 : 0)} ${units[unit]}`;
}

export function formatDuration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "—";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  const hours = Math.floor(s / 3600);
  if (hours < 48) return `${hours} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(hours / 24)} d ${hours % 24} h`;
}

// The last `days` UTC days ending today, as the API's {since, until} (YYYY-MM-DD; usage.summary).
export function utcRange(days, now = new Date()) {
  const until = new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate()));
  const since = new Date(until.getTime() - (days - 1) * 86400_000);
  return { since: since.toISOString().slice(0, 10), until: until.toISOString().slice(0, 10) };
}

export function formatTime(iso) {
  if (!iso) return "—";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? String(iso) : date.toLocaleString();
}

// The same to the minute, month in words ("Dec 2, 2026, 4:13 PM"): for a table's narrow cells.
export function formatShortTime(iso) {
  if (!iso) return "—";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? String(iso) : date.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" });
}

// A bar for a fraction 0..1 (or null: indeterminate), with its text for screen readers.
export function progressBar(fraction, label) {
  const bar = h("div.progress", { role: "progressbar", "aria-label": label || "Progress",
    "aria-valuemin": "0", "aria-valuemax": "100" });
  const fill = h("div.progress-fill");
  bar.append(fill);
  setProgress(bar, fraction);
  return bar;
}

export function setProgress(bar, fraction) {
  const fill = bar.firstElementChild;
  if (fraction === null || fraction === undefined || !Number.isFinite(fraction)) {
    bar.classList.add("indeterminate");
    bar.removeAttribute("aria-valuenow");
    fill.style.width = "";
    return;
  }
  const pct = Math.max(0, Math.min(100, fraction * 100));
  bar.classList.remove("indeterminate");
  bar.setAttribute("aria-valuenow", pct.toFixed(0));
  fill.style.width = `${pct}%`;
}

// Resolves after `ms`, or at once when `signal` aborts (leaving a page ends its waits).
export function sleep(ms, signal) {
  return new Promise((resolve) => {
    const stop = () => {
      clearTimeout(timer);
      resolve();
    };
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", stop);
      resolve();
    }, ms);
    signal.addEventListener("abort", stop, { once: true });
  });
}

// Run `fn` every `ms` while the page is shown; the page's cleanup stops it.
export function every(ms, fn, page) {
  const timer = setInterval(() => {
    if (document.visibilityState === "visible") fn();
  }, ms);
  page.cleanup.push(() => clearInterval(timer));
  return timer;
}
