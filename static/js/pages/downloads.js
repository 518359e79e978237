// Downloads: fetch registered Hugging Face models into the models directory with the hf CLI
// (docs/console.md, "Downloads"; the Models page's "Add model" starts a download by itself).
//   - "Start a download": POST /api/downloads {model_id, token?}; the models to choose from come
//     from GET /api/models (the ?model=<id> of the address preselects one). The token is sent
//     once and the field is emptied as soon as the request has left. When no model is left to
//     download the form says so and points to the Models page.
//   - The tasks (GET /api/downloads), newest first, each with its state (states.js words: queued,
//     downloading, downloaded, failed, canceled), progress, rate, the server's time estimate (null
//     until the rate is measured: docs/models-and-downloads.md), a "stalled" marker, Cancel (POST
//     /api/downloads/{id}/cancel), Retry (POST …/{id}/retry) and Logs (GET /api/downloads/{id}/logs);
//     a finished one offers Deploy (→ /deployments?model=<id>), a failed one Remove (the model and
//     its partial files, after a confirm).
// Live progress comes from the Server-Sent Events of GET /api/downloads/events (`event: task`,
// data {type: "task", task}); each card is updated in place. The stream reconnects 2 s after it
// ends, and the list is also polled every 5 s.
//
// DOM hooks for tests: each task is <article class="download" data-download-id="…"
// data-model-id="…" data-status="…" data-stalled="true|false">; its log is <pre class="log">;
// the finished card's <a data-action="deploy">, the failed card's <button data-action="remove">.
import { api } from "../api.js";
import { clear, empty, errorSlot, every, field, formatBytes, formatDuration, formatTime, h, humanError, pageHeader, placeholder, progressBar, reportFailure, setProgress, showError, showFieldErrors, toast } from "../ui.js";
import { modelWord, stateBadge } from "../states.js";
import { deployLink, followDownloads, removeModel } from "./model-actions.js";

const ACTIVE = new Set(["pending", "running"]);
const RETRYABLE = new Set(["failed", "canceled"]);
// Model statuses downloads.start accepts.
const DOWNLOADABLE = new Set(["registered", "failed", "error", "canceled"]);
// A task's state in the console's words (static/js/states.js): its model's files, as on Models.
const TASK_WORD = { pending: "queued", running: "downloading", succeeded: "downloaded", failed: "failed",
  canceled: "canceled" };
const taskWord = (status) => TASK_WORD[status] || String(status || "unknown");

export async function render(root, page) {
  const { signal } = page;
  const models = new Map(); // id → model, for names and the select
  const cards = new Map(); // task id → card
  const list = h("div.download-list", placeholder(4));
  const listError = h("p.error-text", { role: "alert", hidden: true });
  const live = h("p.download-live.muted", "Live updates are on.");
  const emptyState = empty("No downloads yet. Add a model on the Models page: its download starts at once "
    + "and shows here.", h("a.button", { href: "/models" }, "Add a model"));
  const start = startForm(signal, models, (task) => upsert(task));

  root.append(h("div.downloads-page",
    pageHeader("Downloads", "Fetch registered Hugging Face models into the models directory; progress updates live."),
    start.form,
    h("section.download-section", { "aria-labelledby": "downloads-list-title" },
      h("div.download-section-head", h("h2#downloads-list-title", "Downloads"), live),
      listError, list)));

  let modelsLoaded = false;
  // The model's name and status; `gone` once the list is known and the model is not in it (deleted).
  const nameOf = (modelId) => (models.has(modelId)
    ? { name: models.get(modelId).name, status: models.get(modelId).status, gone: false }
    : { name: null, status: null, gone: modelsLoaded });

  // One task snapshot: update its card in place, or add a card where it belongs (newest first).
  const upsert = (task) => {
    let card = cards.get(task.id);
    if (card) {
      card.update(task);
    } else {
      card = downloadCard(task, { signal, nameOf, onRemoved: refresh });
      cards.set(task.id, card);
      const older = [...list.querySelectorAll(".download")]
        .find((el) => cards.get(el.dataset.downloadId).task().created_at < task.created_at);
      list.insertBefore(card.el, older || null);
    }
    emptyState.remove();
    return card;
  };

  const showList = (tasks, sentAt) => {
    if (list.querySelector(".placeholder")) clear(list);
    const seen = new Set();
    let cursor = list.querySelector(".download");
    for (const task of tasks) {
      seen.add(task.id);
      const known = cards.get(task.id);
      // An event that arrived after this request left is newer than what the list says.
      if (!(known && known.eventAt > sentAt)) upsert(task);
      const { el } = cards.get(task.id);
      if (el === cursor) cursor = cursor.nextElementSibling;
      else list.insertBefore(el, cursor); // only moves a card when the server's order differs
    }
    for (const [id, card] of cards) {
      if (!seen.has(id) && card.eventAt < sentAt) {
        card.el.remove();
        cards.delete(id);
      }
    }
    if (!cards.size && !emptyState.isConnected) list.append(emptyState);
  };

  const loadModels = async () => {
    const { models: all } = await api("GET", "/models", undefined, { signal });
    models.clear();
    for (const m of all) models.set(m.id, m);
    modelsLoaded = true;
    start.showModels(all);
    for (const card of cards.values()) card.redraw();
  };

  const loadDownloads = async () => {
    const sentAt = performance.now();
    const { downloads } = await api("GET", "/downloads", undefined, { signal });
    showList(downloads, sentAt);
  };

  const refresh = async () => {
    try {
      await Promise.all([loadModels(), loadDownloads()]);
      listError.hidden = true;
      for (const card of cards.values()) card.refreshLogs();
    } catch (error) {
      if (error.name === "AbortError" || error.status === 401) return;
      if (list.querySelector(".placeholder")) clear(list);
      listError.hidden = false;
      listError.textContent = `Could not load the downloads: ${humanError(error)}`;
    }
  };

  await refresh();
  every(5000, refresh, page);
  followDownloads(signal, (task) => {
    const card = upsert(task);
    card.eventAt = performance.now();
  }, (on) => {
    live.textContent = on ? "Live updates are on."
      : "Live updates were interrupted; reconnecting… The list still refreshes every 5 s.";
    live.classList.toggle("lost", !on);
  });
}

// --- the start form ------------------------------------------------------------------------------

function startForm(signal, models, onStarted) {
  const wanted = new URLSearchParams(location.search).get("model");
  const select = h("select", { name: "model_id", required: true });
  const token = h("input", { type: "password", name: "token", autocomplete: "off", spellcheck: "false",
    autocapitalize: "off" });
  const submit = h("button.button.primary", { type: "submit" }, "Start download");
  const error = errorSlot();
  const note = h("p.hint.download-model-note", { hidden: true });
  // Why the picker offers nothing (every model downloaded, or none registered), with the way on.
  const nothing = h("p.download-nothing", { role: "status", hidden: true });
  const form = h("form.card.download-form", { novalidate: true },
    h("h2#download-start-title", "Start a download"),
    h("div.form-row",
      field("Model", select, ["Hugging Face models registered on the ", h("a", { href: "/models" }, "Models page"),
        ". Only a model not downloaded yet, or whose download failed or was canceled, can be downloaded."]),
      field("Access token (optional)", token, "For gated or private repositories. Used for this download "
        + "only: handed to hf, never stored or logged.")),
    nothing,
    note,
    h("div.actions", submit, error));

  let shown = null; // the option list last rendered, to leave an unchanged select alone
  let first = true;
  const showModels = (all) => {
    const hub = all.filter((m) => m.source === "huggingface");
    const options = hub.map((m) => ({ id: m.id, label: optionLabel(m), disabled: !DOWNLOADABLE.has(m.status) }));
    const key = JSON.stringify(options);
    if (key === shown) return;
    shown = key;
    const previous = select.value;
    const startable = options.filter((o) => !o.disabled);
    if (!options.length) {
      clear(select, h("option", { value: "" }, "No Hugging Face model is registered"));
      clear(nothing, "No Hugging Face model is registered yet. ",
        h("a", { href: "/models" }, "Add a model on the Models page"), ": its download starts at once.");
    } else if (!startable.length) {
      // Every option disabled used to leave the select looking blank: say why instead.
      const all = hub.every((m) => m.status === "ready");
      clear(select, h("option", { value: "" }, all ? "Every registered model is downloaded" : "Nothing to download now"),
        options.map((o) => h("option", { value: o.id, disabled: true }, o.label)));
      select.value = "";
      clear(nothing, all ? "Every registered model is downloaded. " : "No registered model can be downloaded "
        + "now (each is downloading or downloaded). ",
      h("a", { href: "/models" }, "Add another model on the Models page"), ".");
    } else {
      clear(select, options.map((o) => h("option", { value: o.id, disabled: o.disabled }, o.label)));
      const choice = [first && wanted, previous].find((id) => id && startable.some((o) => o.id === id))
        || startable[0].id;
      select.value = choice;
    }
    nothing.hidden = startable.length > 0;
    if (first && wanted) {
      const asked = all.find((m) => m.id === wanted);
      const why = !asked ? "The model named in the address is not registered."
        : asked.source !== "huggingface" ? `${asked.name} is a local model; only Hugging Face models are downloaded.`
          : !DOWNLOADABLE.has(asked.status) ? `${asked.name} is ${modelWord(asked.status)}; it cannot be downloaded now.` : "";
      note.hidden = !why;
      note.textContent = why;
    }
    first = false;
  };

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    showError(error, null);
    showFieldErrors(form, null);
    note.hidden = true;
    if (!select.value) {
      showFieldErrors(form, { fieldErrors: { model_id: "Choose a model: register a Hugging Face model on the Models page first." } });
      token.value = "";
      select.focus();
      return;
    }
    const body = { model_id: select.value };
    if (token.value.trim()) body.token = token.value.trim();
    submit.disabled = true;
    const request = api("POST", "/downloads", body, { signal });
    token.value = ""; // the request has left with it; it is not kept anywhere
    delete body.token;
    try {
      const { task } = await request;
      const name = models.has(task.model_id) ? models.get(task.model_id).name : task.repository;
      toast(task.status === "pending" && task.queue_position
        ? `Download of ${name} queued (position ${task.queue_position}).`
        : `Download of ${name} started.`, "ok");
      onStarted(task);
    } catch (err) {
      reportFailure(form, error, err);
    } finally {
      submit.disabled = false;
    }
  });
  return { form, showModels };
}

function optionLabel(m) {
  const what = m.name === m.repository ? m.repository : `${m.name} (${m.repository})`;
  return `${what} @ ${m.revision} — ${modelWord(m.status)}`;
}

// --- one task ------------------------------------------------------------------------------------

let cardCount = 0;

function downloadCard(initial, { signal, nameOf, onRemoved }) {
  const n = ++cardCount;
  let task = initial;
  let sample = null; // {t, done}: the last progress seen, for a client-side rate when the server has none
  let clientRate = null;

  const title = h(`h3#download-${n}-title`);
  const gone = h("span.muted.download-gone", { hidden: true }, "model no longer registered");
  const statusSlot = h("span.download-status");
  const stalled = h("span.badge.status-stalled.download-stalled-badge", { hidden: true }, "stalled");
  const source = h("code");
  const idText = h("span.muted");
  const bar = progressBar(0, "Download progress");
  const numbers = h("p.download-numbers");
  const stalledNote = h("p.download-stalled-note", { hidden: true },
    "Stalled: no bytes have arrived for a while. hf is still running; cancel it if it does not recover.");
  const failure = h("p.error-text.download-error", { hidden: true });
  const times = h("p.download-times.muted");
  const cancel = h("button.button.small", { type: "button" }, "Cancel");
  const retry = h("button.button.small", { type: "button" }, "Retry");
  const remove = h("button.button.small", { type: "button", "data-action": "remove" }, "Remove");
  const deploySlot = h("span.download-deploy");
  const logsButton = h("button.button.small", { type: "button", "aria-expanded": "false",
    "aria-controls": `download-${n}-log` }, "Logs");
  const actionError = errorSlot();
  const log = h(`pre#download-${n}-log.log`, { hidden: true, tabindex: "0" });

  const el = h("article.card.download", { "aria-labelledby": `download-${n}-title` },
    h("div.download-head", title, statusSlot, stalled, gone),
    h("p.download-source", source, " ", idText),
    bar, numbers, stalledNote, failure, times,
    h("div.actions", deploySlot, cancel, retry, remove, logsButton, actionError),
    log);
  el.dataset.downloadId = initial.id;

  const card = { el, eventAt: 0, task: () => task };

  card.redraw = () => render(); // the model list changed (a name, or the model was deleted)

  card.update = (next) => {
    const wasActive = ACTIVE.has(task.status);
    trackRate(next);
    task = next;
    render();
    // A task that just finished: show the end of its log if it is open.
    if (wasActive && !ACTIVE.has(task.status) && !log.hidden) loadLogs();
  };

  card.refreshLogs = () => {
    if (!log.hidden && ACTIVE.has(task.status)) loadLogs();
  };

  function trackRate(next) {
    const now = performance.now();
    if (next.status !== "running") {
      sample = null;
      clientRate = null;
      return;
    }
    if (sample && next.bytes_done > sample.done && now > sample.t) {
      const rate = ((next.bytes_done - sample.done) * 1000) / (now - sample.t);
      clientRate = clientRate === null ? rate : 0.5 * clientRate + 0.5 * rate;
    }
    if (!sample || next.bytes_done !== sample.done) sample = { t: now, done: next.bytes_done };
  }

  function render() {
    const t = task;
    el.dataset.modelId = t.model_id;
    el.dataset.status = t.status;
    el.dataset.stalled = String(Boolean(t.stalled));
    const model = nameOf(t.model_id);
    title.textContent = model.name || t.repository;
    gone.hidden = !model.gone;
    clear(statusSlot, stateBadge(taskWord(t.status)));
    stalled.hidden = !t.stalled;
    stalledNote.hidden = !t.stalled;
    source.textContent = `${t.repository}@${t.revision}`;
    idText.textContent = `task ${t.id}`;

    const total = t.bytes_total;
    let fraction;
    if (t.status === "succeeded") fraction = 1;
    else if (total) fraction = t.bytes_done / total;
    else fraction = ACTIVE.has(t.status) ? null : 0; // unknown total while it runs: indeterminate
    setProgress(bar, fraction);
    bar.setAttribute("aria-label", `Download progress of ${title.textContent}`);
    numbers.textContent = describeProgress(t, rateOf(t));

    failure.hidden = !(t.status === "failed" && t.error);
    failure.textContent = t.status === "failed" && t.error ? t.error : "";
    times.textContent = describeTimes(t);

    const focused = el.contains(document.activeElement) ? document.activeElement : null;
    cancel.hidden = !ACTIVE.has(t.status);
    retry.hidden = !RETRYABLE.has(t.status) || model.gone; // retry needs the model's record
    remove.hidden = t.status !== "failed" || model.gone || model.name === null;
    // The next step: a finished download's model can be deployed (while it is still registered).
    const deployable = t.status === "succeeded" && model.status === "ready";
    if (deployable !== Boolean(deploySlot.firstChild)) clear(deploySlot, deployable ? deployLink(t.model_id) : null);
    // A button that just disappeared had the focus: hand it to the one that replaced it.
    if (focused && focused.hidden) visibleAction().focus();
  }

  function rateOf(t) {
    if (t.status !== "running") return { rate: null, eta: null };
    const server = typeof t.rate_bytes_per_s === "number" && t.rate_bytes_per_s > 0 ? t.rate_bytes_per_s : null;
    const rate = server ?? (clientRate && clientRate > 0 ? clientRate : null);
    // Only the server's estimate: it is null until the rate has been measured over enough time and
    // bytes (docs/models-and-downloads.md), so no "3 d 15 h left" from hf's first second.
    const eta = typeof t.eta_s === "number" ? t.eta_s : null;
    return { rate, eta };
  }

  cancel.addEventListener("click", async () => {
    const ok = await cancelDialog(title.textContent);
    if (!ok) {
      cancel.focus();
      return;
    }
    act(cancel, `/downloads/${encodeURIComponent(task.id)}/cancel`, undefined, "Not canceled");
  });
  remove.addEventListener("click", async () => {
    showError(actionError, null);
    try {
      if (await removeModel(title.textContent, task.model_id)) {
        toast(`Removed ${title.textContent}.`, "ok");
        await onRemoved();
      }
    } catch (err) {
      if (err.name === "AbortError" || err.status === 401) return;
      showError(actionError, `Not removed: ${humanError(err)}`);
    }
    if (el.isConnected && !document.querySelector("dialog[open]")) visibleAction().focus();
  });
  retry.addEventListener("click", () => {
    act(retry, `/downloads/${encodeURIComponent(task.id)}/retry`, {}, "Not retried");
  });

  async function act(button, path, body, failed) {
    button.disabled = true; // this drops the focus: it is given back below
    showError(actionError, null);
    try {
      const { task: next } = await api("POST", path, body, { signal });
      card.update(next);
    } catch (err) {
      if (err.name === "AbortError" || err.status === 401) return;
      showError(actionError, `${failed}: ${humanError(err)}`);
    } finally {
      button.disabled = false;
      const lost = !document.activeElement || document.activeElement === document.body;
      if (lost && el.isConnected && !document.querySelector("dialog[open]")) {
        (button.hidden ? visibleAction() : button).focus();
      }
    }
  }

  function visibleAction() {
    return [cancel, retry, remove].find((b) => !b.hidden) || logsButton;
  }

  logsButton.addEventListener("click", () => {
    const open = log.hidden;
    log.hidden = !open;
    logsButton.setAttribute("aria-expanded", String(open));
    if (open) {
      log.textContent = "Loading the log…";
      loadLogs();
    }
  });

  let loading = false;
  async function loadLogs() {
    if (loading) return;
    loading = true;
    try {
      const { lines } = await api("GET", `/downloads/${encodeURIComponent(task.id)}/logs`, undefined, { signal });
      const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
      log.textContent = lines.length ? lines.join("\n") : "No output yet.";
      if (atEnd) log.scrollTop = log.scrollHeight;
    } catch (err) {
      if (err.name === "AbortError" || err.status === 401) return;
      log.textContent = `Could not load the log: ${humanError(err)}`;
    } finally {
      loading = false;
    }
  }

  trackRate(task);
  render();
  return card;
}

// Like confirmDialog(), but its buttons can't be mistaken for each other: confirmDialog's "Cancel"
// next to "Cancel download" would be ambiguous. Resolves true to cancel the download.
function cancelDialog(name) {
  return new Promise((resolve) => {
    const keep = h("button.button", { type: "button", autofocus: true }, "Keep downloading");
    const stop = h("button.button.danger", { type: "button" }, "Cancel download");
    const dialog = h("dialog.dialog.download-cancel-dialog", { "aria-labelledby": "download-cancel-title",
      "aria-describedby": "download-cancel-text" },
      h("h2#download-cancel-title", `Cancel the download of ${name}?`),
      h("p#download-cancel-text", "hf is stopped and the partly downloaded files are removed. "
        + "Retry starts it again from the beginning."),
      h("div.actions", keep, stop));
    const done = (value) => {
      dialog.close();
      dialog.remove();
      resolve(value);
    };
    keep.addEventListener("click", () => done(false));
    stop.addEventListener("click", () => done(true));
    dialog.addEventListener("cancel", (event) => { // Esc keeps the download
      event.preventDefault();
      done(false);
    });
    document.body.append(dialog);
    dialog.showModal();
  });
}

function describeProgress(t, { rate, eta }) {
  const done = formatBytes(t.bytes_done);
  const total = t.bytes_total ? formatBytes(t.bytes_total) : null;
  const amount = total ? `${done} of ${total}` : `${done} (total not known yet)`;
  switch (t.status) {
    case "pending":
      return t.queue_position
        ? `Waiting for a free download worker (position ${t.queue_position} in the queue).`
        : "Waiting to start.";
    case "running": {
      const parts = [amount];
      parts.push(rate ? `${formatBytes(rate)}/s` : "measuring speed…");
      if (eta !== null && eta !== undefined) parts.push(`${formatDuration(eta)} left`);
      return parts.join(" · ");
    }
    case "succeeded":
      return `Done: ${formatBytes(t.bytes_total ?? t.bytes_done)} downloaded.`;
    case "failed":
      return `Failed after ${amount}.`;
    case "canceled":
      return `Canceled after ${amount}.`;
    default:
      return amount;
  }
}

function describeTimes(t) {
  const parts = [`Created ${formatTime(t.created_at)}`];
  if (t.started_at) parts.push(`started ${formatTime(t.started_at)}`);
  if (t.finished_at) parts.push(`finished ${formatTime(t.finished_at)}`);
  return parts.join(", ") + ".";
}
