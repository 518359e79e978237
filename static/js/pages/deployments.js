// Deployments (router mode, docs/router.md): named, saved ways to serve a registered model, each with
// its vLLM instance. The list shows each deployment's live state; a form creates one, another edits
// one; Load, Unload and Delete (confirmed) act on one, and Sleep and Wake where its instance says
// it supports sleep (`instance.sleep_supported`). Log opens its instance's vLLM output. The forms
// are in ./deployment-forms.js, the log panel in ./deployment-log.js. A line at the top links to the
// Runtime page (/runtime), which runs one model alone.
//
// The first ten minutes (docs/router.md, "The Deployments page"): `/deployments?model=<model id>`
// (the Models page's Deploy) opens the create form with that model chosen and a name made from its
// name; where no GPU is found (GET /api/gpus: NVML missing, or no GPU) the form applies the CPU
// preset and keeps the GPU options under their own disclosure; "Create and load" creates the
// deployment, then loads it, and its card shows it loading, then serving. A serving deployment's
// card offers the next steps: Chat (/chat?model=<name>) and Connect a client
// (/?model=<name>#connect). A failed load says vLLM's reason (the instance's `error`,
// docs/runtime.md "Failed starts") right by the Load button, with the last lines below. States are
// shown in the console's words (../states.js): deployed, loading, serving, sleeping, stopping, failed.
//
// API: GET /api/deployments, GET /api/models (the ready models to choose from, and names for ids),
// GET /api/gpus (whether to lead with the CPU preset; a failure only leaves it off) and
// GET /api/methods (the forms are generated from deployments.create's published input schema, and
// edit only what deployments.update takes; see ../schema-form.js) once; then the Server-Sent
// Events of GET /api/deployments/events: `deployment` {deployment} for each one at once and at each
// change, `deleted` {name} once one is gone (no polling; one GET /api/deployments each time the
// stream reconnects). POST /api/deployments (create), PATCH /api/deployments/{name} (edit: every
// field, so what the form shows is what is saved), DELETE /api/deployments/{name},
// POST /api/deployments/{name}/load (202, state starting: the events say how it ends),
// …/unload, …/sleep, …/wake. GET /api/deployments/{name}/logs?tail= while a card's log is open: when
// it opens, when its events show a change, and by its Refresh button (no polling).
// A name is sent percent-encoded (org/model → org%2Fmodel).
//
// DOM hooks for tests: each deployment is <article class="deployment" data-name="…" data-state="…">
// (data-state: the server's state), named by its heading (the deployment's name); once serving it has
// a[data-action="chat"] and a[data-action="connect"]; a failure's reason is .deployment-reason, in
// .deployment-control with the buttons.
import { api, events, readWithMethods } from "../api.js";
import { instanceWord, stateBadge } from "../states.js";
import {
  clear, confirmDialog, empty, errorSlot, formatDuration, formatTime, h, humanError, pageHeader,
  placeholder, showError, sleep, toast,
} from "../ui.js";
import { createForm, editForm, formSchemas, noGpu } from "./deployment-forms.js";
import { instanceLog } from "./deployment-log.js";

const RECONNECT_MS = 2000;
const LOADABLE = new Set(["unloaded", "failed"]); // no live instance: Load starts one
const NOTES = {
  unloaded: "Saved, not running: press Load, or send it a /v1 request (it loads when named, "
    + "unless vllm-use runs with --no-autoload).",
  starting: "vLLM is loading the model; this can take minutes. Unload cancels it.",
  stopping: "The instance is stopping.",
  sleeping: "The instance sleeps: its weights are off the GPU. Wake it, or send it a request.",
  waking: "The instance is waking up.",
};
let serial = 0;

export async function render(root, page) {
  const { signal } = page;
  const body = h("div.deployments", placeholder(8));
  root.append(pageHeader("Deployments",
    "Named ways to serve a model: /v1 clients send the name (or an alias) as model, and it loads when asked for."),
  h("p.page-aside", "Run one model alone, stopping the others: ", h("a", { href: "/runtime" }, "Runtime page"), "."),
  body);

  const get = (path) => api("GET", path, undefined, { signal });
  let listed;
  let models;
  let methods;
  let gpus;
  try {
    // GET /api/gpus only decides the CPU preset: when NVML fails, the form leads as on a GPU machine.
    const gpuList = get("/gpus").catch(() => null);
    [listed, models, methods] = await readWithMethods(["/deployments", "/models"], { signal });
    gpus = await gpuList;
  } catch (error) {
    if (error.name === "AbortError" || error.status === 401) return;
    clear(body, h("p.error-text", { role: "alert" }, `Could not load the deployments: ${humanError(error)}`));
    return;
  }
  const schemas = formSchemas(methods);
  const ready = models.models.filter((m) => m.status === "ready");
  const modelNames = new Map(models.models.map((m) => [m.id, m.name]));
  const wanted = new URLSearchParams(location.search).get("model");
  const ctx = {
    signal, schemas, ready, modelNames, noGpu: noGpu(gpus), wanted, taken: () => new Set(cards.keys()),
  };

  const cards = new Map(); // name → card
  const deletedAt = new Map(); // name → when an event said it was gone (a stale listing must not bring it back)
  const list = h("div.deployment-list");
  const listError = h("p.error-text", { role: "alert", hidden: true });
  const live = h("p.deployment-live.muted", { role: "status" }, "Connecting to live updates…");
  const emptyState = empty("No deployment yet: create one below from a downloaded model.");

  const remove = (name) => {
    const card = cards.get(name);
    if (card) {
      card.el.remove();
      cards.delete(name);
    }
    if (!cards.size) list.append(emptyState);
  };

  // One deployment as the server shows it: update its card in place, or add one in name order.
  const upsert = (deployment, eventAt = 0) => {
    let card = cards.get(deployment.name);
    if (card) {
      card.update(deployment);
    } else {
      card = deploymentCard(deployment, ctx, { removed: () => remove(deployment.name), upsert });
      cards.set(deployment.name, card);
      const after = [...cards.keys()].filter((n) => n > deployment.name).sort()[0];
      list.insertBefore(card.el, after ? cards.get(after).el : null);
    }
    if (eventAt) card.eventAt = eventAt;
    deletedAt.delete(deployment.name);
    emptyState.remove();
    return card;
  };

  // A listing (GET /api/deployments, sent at `sentAt`): what an event said since is newer.
  const showList = (deployments, sentAt) => {
    const seen = new Set();
    for (const d of deployments) {
      seen.add(d.name);
      const known = cards.get(d.name);
      if ((deletedAt.get(d.name) || 0) > sentAt || (known && known.eventAt > sentAt)) continue;
      upsert(d);
    }
    for (const [name, card] of [...cards]) if (!seen.has(name) && card.eventAt < sentAt) remove(name);
    if (!cards.size && !emptyState.isConnected) list.append(emptyState);
  };

  const refresh = async () => {
    const sentAt = performance.now();
    try {
      showList((await get("/deployments")).deployments, sentAt);
      listError.hidden = true;
    } catch (error) {
      if (error.name === "AbortError" || error.status === 401) return;
      listError.hidden = false;
      listError.textContent = `Could not refresh the deployments: ${humanError(error)}`;
    }
  };

  showList(listed.deployments, performance.now()); // first: the create form's name avoids theirs
  const create = createForm(ctx, (deployment) => upsert(deployment, performance.now()));
  clear(body,
    h("section.deployment-section", { "aria-labelledby": "deployments-title" },
      h("div.deployment-section-head", h("h2#deployments-title", "Deployments"), live),
      listError, list),
    create);
  if (wanted) create.scrollIntoView({ block: "start" }); // came from a model's Deploy: the form first

  // Follow the event stream until the page is left; after it ends or fails, list again and reconnect.
  const setLive = (on) => {
    const text = on ? "Live updates are on." : "Live updates were interrupted; reconnecting…";
    if (live.textContent === text) return; // a status region: say it once, not at every event
    live.textContent = text;
    live.classList.toggle("lost", !on);
  };
  const follow = async () => {
    let first = true;
    while (!signal.aborted) {
      if (!first) await refresh();
      first = false;
      // events() says nothing when it connects: a stream still open after a second counts as on.
      const settled = setTimeout(() => setLive(true), 1000);
      try {
        await events("/deployments/events", (type, data) => {
          setLive(true);
          if (type === "deployment" && data && data.deployment) upsert(data.deployment, performance.now());
          else if (type === "deleted" && data && typeof data.name === "string") {
            deletedAt.set(data.name, performance.now());
            remove(data.name);
          }
        }, { signal });
      } catch (error) {
        if (signal.aborted || error.name === "AbortError" || error.status === 401) return;
      } finally {
        clearTimeout(settled);
      }
      if (signal.aborted) return;
      setLive(false); // failed, or the server closed the stream (it is stopping): try again
      await sleep(RECONNECT_MS, signal);
    }
  };
  follow();
}

// --- one deployment ------------------------------------------------------------------------------

function deploymentCard(initial, ctx, { removed, upsert }) {
  const { signal } = ctx;
  let d = initial;
  let busy = null; // the action whose request is out: "load" | "unload" | "sleep" | "wake" | "delete"
  serial += 1;
  const titleId = `deployment-${serial}`;
  const title = h(`h3#${titleId}`);
  const flags = h("span.deployment-flags");
  const facts = h("dl.deployment-facts");
  const note = h("p.hint.deployment-note", { hidden: true });
  // Why its last start failed, in vLLM's words, right by the button that started it (Load).
  const reason = h("p.deployment-reason", { role: "alert", hidden: true });
  const failure = h("div.deployment-failure", { hidden: true });
  const next = {
    chat: h("a.button.primary", { "data-action": "chat" }, "Chat"),
    connect: h("a.button", { "data-action": "connect" }, "Connect a client"),
  };
  const buttons = {
    load: h("button.button.primary", { type: "button" }, "Load"),
    unload: h("button.button", { type: "button" }, "Unload"),
    sleep: h("button.button", { type: "button" }, "Sleep"),
    wake: h("button.button", { type: "button" }, "Wake"),
    edit: h("button.button", { type: "button", "aria-expanded": "false" }, "Edit"),
    log: h("button.button", { type: "button", "aria-expanded": "false" }, "Log"),
    delete: h("button.button.danger", { type: "button" }, "Delete"),
  };
  const actionError = errorSlot();
  const editor = h("div.deployment-editor");
  const path = (suffix = "") => `/deployments/${encodeURIComponent(d.name)}${suffix}`;
  const log = instanceLog(initial.name, path, signal);
  buttons.log.setAttribute("aria-controls", log.element.id);
  const el = h("article.card.deployment", { "aria-labelledby": titleId },
    h("div.deployment-head", title, flags),
    facts, note,
    h("div.deployment-control",
      h("div.actions.deployment-actions", Object.values(next), Object.values(buttons)),
      reason, actionError),
    failure, log.element, editor);
  let failureShown = "";
  // eventAt: when an event last updated it (set by the page); load(): as its Load button ("Create and load").
  const self = { el, update, eventAt: 0, load: () => loadIt() };

  const modelLabel = () => ctx.modelNames.get(d.model_id) || d.model_id;

  const draw = () => {
    const inst = d.instance || {};
    const state = String(inst.state || "unknown");
    el.dataset.name = d.name;
    el.dataset.state = state;
    title.textContent = d.name;
    clear(flags, stateBadge(instanceWord(state)),
      inst.restart_required ? h("span.deployment-flag.restart", { title: "Changed since it was loaded: unload and load it to apply the change." }, "restart required") : null,
      d.pinned ? h("span.deployment-flag", "pinned") : null,
      d.load_on_start ? h("span.deployment-flag", "loads at start") : null);
    const idle = d.idle_timeout_s ? `${d.idle_action} after ${formatDuration(d.idle_timeout_s)} idle` : "never";
    const rows = [
      ["Aliases", d.aliases && d.aliases.length ? d.aliases.join(", ") : "—"],
      ["Model", modelLabel()],
      ["Port", inst.port ? String(inst.port) : "—"],
      ["In flight", String(inst.in_flight ?? 0)],
      ["Last used", inst.last_used ? formatTime(inst.last_used) : "—"],
      ["Idle deadline", inst.idle_deadline ? formatTime(inst.idle_deadline) : "—"],
      ["When idle", idle],
    ];
    if (inst.error && state !== "failed") rows.push(["Last error", inst.error]);
    clear(facts, rows.map(([k, v]) => h("div.deployment-fact", h("dt", k), h("dd", v))));
    const noteText = inst.restart_required
      ? "Changed since it was loaded: it runs as it was started until it is unloaded and loaded again."
      : NOTES[state];
    note.hidden = !noteText;
    note.textContent = noteText || "";
    showFailure(state, inst);
    const serving = state === "ready";
    for (const link of Object.values(next)) link.hidden = !serving;
    next.chat.href = `/chat?model=${encodeURIComponent(d.name)}`;
    next.connect.href = `/?model=${encodeURIComponent(d.name)}#connect`;
    sync();
  };

  const showFailure = (state, inst) => {
    const key = state === "failed" ? JSON.stringify([inst.error, inst.last_lines]) : "";
    if (key === failureShown) return;
    failureShown = key;
    failure.hidden = !key;
    reason.hidden = !key;
    if (!key) {
      clear(failure);
      reason.textContent = "";
      return;
    }
    const lines = inst.last_lines || [];
    reason.textContent = `Failed to load: ${sentence(inst.error || "vLLM stopped on its own")}`
      + " Fix the options (Edit) and press Load again.";
    const pre = lines.length
      ? h("pre.log", { "aria-label": `Last lines of ${d.name} before the failure`, tabindex: "0" }, lines.join("\n")) : null;
    clear(failure, h("h4", "vLLM's last lines"), pre || h("p.hint", "vLLM wrote nothing before it stopped."));
    if (pre) pre.scrollTop = pre.scrollHeight; // its last lines, where vLLM says why, in view
  };

  const sync = () => {
    const inst = d.instance || {};
    const state = String(inst.state || "");
    const sleepy = inst.sleep_supported === true;
    buttons.load.hidden = !(LOADABLE.has(state) || busy === "load");
    buttons.load.textContent = busy === "load" ? "Loading…" : "Load";
    buttons.unload.hidden = LOADABLE.has(state) && busy !== "unload";
    buttons.unload.textContent = busy === "unload" ? "Unloading…" : "Unload";
    buttons.unload.disabled = state === "stopping";
    buttons.sleep.hidden = !(sleepy && (state === "ready" || busy === "sleep"));
    buttons.sleep.textContent = busy === "sleep" ? "Putting to sleep…" : "Sleep";
    // Wake once the sleep is done (`asleep`): while it is still going to sleep a wake is refused.
    buttons.wake.hidden = !(sleepy && ((state === "sleeping" && inst.asleep === true) || busy === "wake"));
    buttons.wake.textContent = busy === "wake" ? "Waking…" : "Wake";
    buttons.delete.textContent = busy === "delete" ? "Deleting…" : "Delete";
    for (const [name, button] of Object.entries(buttons)) {
      if (name !== "edit" && name !== "log") button.disabled = Boolean(busy) || (name === "unload" && state === "stopping");
      button.toggleAttribute("aria-busy", busy === name);
    }
  };

  // One action's request; its answer updates the card unless an event said something newer since it
  // was sent (the events come in order; an answer may cross them).
  let sentAt = 0;
  const act = async (name, call) => {
    if (busy) return;
    busy = name;
    showError(actionError, null);
    sync();
    try {
      sentAt = performance.now();
      await call();
    } catch (error) {
      if (error.name === "AbortError" || error.status === 401) return;
      showError(actionError, error);
      if (error.status === 404) await recheck(); // deleted meanwhile, or a route this server lacks
    } finally {
      busy = null;
      if (!signal.aborted) sync();
    }
  };

  // After a 404: the card goes only when the deployment itself is gone.
  const recheck = async () => {
    try {
      update(await api("GET", path(), undefined, { signal }));
    } catch (error) {
      if (error.status === 404) removed();
    }
  };

  const withInstance = (answer) => {
    if (self.eventAt > sentAt) return;
    const { name, ...instance } = answer;
    update({ ...d, instance: { ...d.instance, ...instance } });
  };

  const loadIt = () => act("load", async () => {
    withInstance(await api("POST", path("/load"), undefined, { signal }));
  });
  buttons.load.addEventListener("click", loadIt);
  buttons.unload.addEventListener("click", () => act("unload", async () => {
    const inst = d.instance || {};
    if (inst.in_flight > 0) {
      const ok = await confirmDialog(`Unload ${d.name}?`,
        `It is answering ${inst.in_flight} request(s) now; they fail when it stops.`, "Unload");
      if (!ok) return;
    }
    withInstance(await api("POST", path("/unload"), undefined, { signal }));
  }));
  buttons.sleep.addEventListener("click", () => act("sleep", async () => {
    withInstance(await api("POST", path("/sleep"), undefined, { signal }));
  }));
  buttons.wake.addEventListener("click", () => act("wake", async () => {
    withInstance(await api("POST", path("/wake"), undefined, { signal }));
  }));
  buttons.delete.addEventListener("click", async () => {
    if (busy) return;
    const ok = await confirmDialog(`Delete ${d.name}?`,
      `Its instance is stopped first; /v1 requests for ${d.name} then fail. This cannot be undone.`, "Delete");
    if (!ok) return;
    await act("delete", async () => {
      await api("DELETE", path(), undefined, { signal });
      toast(`${d.name} was deleted.`, "ok");
      removed();
    });
  });

  buttons.log.addEventListener("click", () => {
    const open = buttons.log.getAttribute("aria-expanded") !== "true";
    buttons.log.setAttribute("aria-expanded", String(open));
    log.toggle(open);
  });

  let editing = null;
  const closeEditor = () => {
    editing = null;
    clear(editor);
    buttons.edit.setAttribute("aria-expanded", "false");
  };
  buttons.edit.addEventListener("click", () => {
    if (editing) {
      closeEditor();
      return;
    }
    editing = editForm(d, ctx, {
      saved: (deployment) => {
        closeEditor();
        upsert(deployment, performance.now());
        toast(deployment.instance && deployment.instance.restart_required
          ? `${deployment.name} was saved; the change applies at its next load.` : `${deployment.name} was saved.`, "ok");
        buttons.edit.focus();
      },
      canceled: () => {
        closeEditor();
        buttons.edit.focus();
      },
    });
    clear(editor, editing);
    buttons.edit.setAttribute("aria-expanded", "true");
    const first = editing.querySelector("select, input, textarea");
    if (first) first.focus();
  });

  function update(next) {
    d = next;
    draw();
    log.changed(d.instance);
  }

  draw();
  return self;
}

function sentence(text) {
  const t = String(text).trim();
  return /[.!?…]$/.test(t) ? t : `${t}.`;
}
