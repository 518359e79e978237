// The chat page (/chat): a playground for the running model. The contract (names, DOM hooks,
// storage, streams, safety) is docs/chat.md.
//
// It talks to the gateway (/v1) with an inference key, never with the admin credential:
// GET /v1/models, POST /v1/chat/completions (streamed, X-Conversation-Id = the answer's id),
// POST /v1/streams/lookup, GET and DELETE /v1/stream. The only /api call is POST /api/keys, to
// create a "playground" key. Conversations live in IndexedDB (chat/store.js), as a tree of
// messages with branches (chat/tree.js); each answer streams through a Runner (chat/runner.js),
// which also resumes answers left `streaming` by a reload or a dropped connection.
//
// Modules: chat/conversations.js (the list), chat/controls.js (model, parameters), chat/view.js
// (one message), chat/markdown.js (safe Markdown), chat/stream.js (the /v1 client), chat/key.js.

import { api } from "../api.js";
import { errorSlot, field, h, humanError, pageHeader, showError, toast } from "../ui.js";
import * as store from "../chat/store.js";
import { createSidebar } from "../chat/conversations.js";
import { createControls, requestFields } from "../chat/controls.js";
import { forgetInferenceKey, inferenceKey, keepInferenceKey } from "../chat/key.js";
import { Runner } from "../chat/runner.js";
import { lookupStreams, v1 } from "../chat/stream.js";
import { childrenOf, lineage, partnerOf, select, visiblePath } from "../chat/tree.js";
import { messageItem, updateItem } from "../chat/view.js";

const CURRENT = "vllm-use.chat.current"; // the conversation shown last (an id, not a secret)
const RENDER_MS = 50;
const TITLE_CHARS = 60;
const IMPORT_MAX_BYTES = 20 * 1024 * 1024;
const NARROW = "(max-width: 900px)"; // as in chat.css: the list folds above the messages
const NO_MODEL = "No model is running — start one on the Runtime page.";

// A new conversation's title: the start of its first message.
function titleFrom(text) {
  const line = text.trim().replace(/\s+/g, " ");
  if (line.length <= TITLE_CHARS) return line || "Untitled";
  const cut = line.slice(0, TITLE_CHARS);
  const space = cut.lastIndexOf(" ");
  return `${(space > TITLE_CHARS / 2 ? cut.slice(0, space) : cut).trimEnd()}…`;
}

function fileName(title) {
  const safe = String(title || "").replace(/[\\/:*?"<>|\x00-\x1f\x7f]/g, "_").trim();
  return `${safe || "conversation"}.json`;
}

const byCreation = (a, b) => (a.createdAt || 0) - (b.createdAt || 0);

export async function render(root, page) {
  root.append(pageHeader("Chat", "Talk to the running model through the /v1 gateway. Conversations stay in this browser."));

  let key = inferenceKey();
  let conversations = []; // the list (records from the store)
  const cache = new Map(); // conversation id → {conversation, messages: Map<id, message>}
  let current = null; // the entry shown, or null for a new chat
  const runners = new Map(); // "<conversation id>/<message id>" → Runner
  const items = new Map(); // message id → its <li> in the view
  let lastCreated = 0;

  const runnerKey = (m) => `${m.conversationId}/${m.id}`;
  const isBusy = (entry) => {
    if (!entry) return false;
    for (const r of runners.values()) if (r.message.conversationId === entry.conversation.id) return true;
    return false;
  };

  // --- the inference key -----------------------------------------------------------------------------
  const keyInput = h("input", { type: "password", name: "key", autocomplete: "off", spellcheck: "false",
    placeholder: "vu_…" });
  const keyNote = h("p.key-note", { hidden: true });
  const keyError = errorSlot();
  const createKey = h("button.button.primary", { type: "button" }, "Create a playground key");
  const keyForm = h("form.key-form", { novalidate: true },
    field("Inference key", keyInput), h("div.actions", h("button.button", { type: "submit" }, "Use this key")));
  // Named by `title`, not aria-labelledby, so that the label "Inference key" names only the input.
  const keyRegion = h("section.card.key-region", { role: "region", title: "Inference key", hidden: Boolean(key) },
    h("h2", "Inference key"),
    h("p", "The chat calls /v1 like any client, with an API key that has the inference scope. "
      + "Create one for this browser (it is listed as “playground” on the API keys page), or paste one."),
    keyNote,
    h("div.actions", createKey),
    keyForm,
    keyError);

  // --- model, parameters, messages, composer ---------------------------------------------------------
  const controls = createControls({ onChange: () => rememberChoices() });
  const modelError = errorSlot();
  const reloadModels = h("button.button.small", { type: "button", hidden: true, onclick: () => loadModels() }, "Reload models");
  const threadTitle = h("h2.thread-title", "New chat");
  const list = h("ol.messages", { "aria-label": "Messages" });
  const emptyHint = h("p.thread-empty", "Ask the running model something: Enter sends, Shift+Enter starts a new line.");
  const input = h("textarea.composer-input", { name: "message", rows: 3, placeholder: "Message the model…" });
  const send = h("button.button.primary", { type: "submit" }, "Send");
  const stop = h("button.button.danger", { type: "button", hidden: true, onclick: () => stopCurrent() }, "Stop");
  const composerError = errorSlot();
  const composer = h("form.composer", { novalidate: true },
    field("Message", input),
    h("div.composer-row", composerError, h("div.actions", stop, send)));

  const sidebar = createSidebar({
    onNew: () => newChat(),
    onSelect: (id) => openConversation(id),
    onRename: (id, title) => rename(id, title),
    onDelete: (id) => remove(id),
    onExport: () => exportCurrent(),
    onImport: (file) => importFile(file),
  });

  root.append(h("div.chat-layout",
    sidebar.element,
    h("div.chat-main",
      keyRegion,
      controls.element,
      h("div.model-status", modelError, reloadModels),
      // Not a named region: its name would be the conversation's title, and labels must stay unique.
      h("div.thread",
        threadTitle,
        emptyHint,
        list),
      composer)));

  // --- rendering ---------------------------------------------------------------------------------------
  const pending = new Set();
  let renderTimer = null;

  const nearBottom = () => window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 120;
  const toBottom = () => window.scrollTo({ top: document.documentElement.scrollHeight });

  const flush = () => {
    renderTimer = null;
    const follow = nearBottom();
    for (const m of pending) {
      const item = items.get(m.id);
      if (item && item.message === m) updateItem(item, m);
    }
    pending.clear();
    if (follow) toBottom();
  };

  // While an answer streams its Markdown is redrawn at most every RENDER_MS, not per chunk.
  const changed = (m, now = false) => {
    pending.add(m);
    if (now) {
      if (renderTimer) clearTimeout(renderTimer);
      flush();
    } else if (!renderTimer) {
      renderTimer = setTimeout(flush, RENDER_MS);
    }
  };

  const itemFor = (m, siblings, busy) => {
    const item = messageItem(m, { siblings, busy, onBranch: switchBranch, onEdit: startEdit, onRegenerate: regenerate });
    item.message = m;
    items.set(m.id, item);
    return item;
  };

  function renderThread() {
    items.clear();
    pending.clear();
    threadTitle.textContent = current ? current.conversation.title : "New chat";
    if (!current) {
      list.replaceChildren();
      emptyHint.hidden = false;
      updateComposer();
      return;
    }
    const { conversation, messages } = current;
    const busy = isBusy(current);
    const path = visiblePath(conversation, messages);
    const nodes = path.map((m) => {
      const siblings = childrenOf(messages, m.parentId).map((s) => s.id);
      const item = itemFor(m, siblings, busy);
      const partner = m.role === "assistant" ? partnerOf(messages, m.id) : null;
      if (!partner) return item;
      // Side by side: the two answers to one prompt, as two columns.
      return h("li.compare-row", h("ol.compare", { "aria-label": "Compared answers" }, item, itemFor(partner, [], busy)));
    });
    list.replaceChildren(...nodes);
    emptyHint.hidden = path.length > 0;
    updateComposer();
  }

  function updateComposer() {
    const busy = isBusy(current);
    // With a key, nothing is sent before /v1/models has named a model: a request without one
    // would go to whatever the server defaults to, or fail (docs/chat.md). Without a key, Send
    // stays clickable and says what is missing.
    send.disabled = busy || (Boolean(key) && !controls.hasModel());
    stop.hidden = !busy;
    stop.disabled = false;
    for (const button of list.querySelectorAll(".message-actions button")) button.disabled = busy;
  }

  // --- conversations -------------------------------------------------------------------------------------
  async function refreshList() {
    conversations = await store.listConversations();
    sidebar.show(conversations, current ? current.conversation.id : null);
  }

  async function entryFor(id) {
    if (cache.has(id)) return cache.get(id);
    const loaded = await store.getConversation(id);
    if (!loaded) return null;
    const entry = { conversation: loaded.conversation, messages: new Map(loaded.messages.map((m) => [m.id, m])) };
    cache.set(id, entry);
    return entry;
  }

  function show(entry) {
    current = entry;
    if (entry) localStorage.setItem(CURRENT, entry.conversation.id);
    else localStorage.removeItem(CURRENT);
    showError(composerError, null);
    sidebar.show(conversations, entry ? entry.conversation.id : null);
    renderThread();
  }

  async function openConversation(id) {
    const entry = await entryFor(id);
    if (!entry) {
      await refreshList();
      return;
    }
    const { conversation } = entry;
    controls.apply({ model: conversation.model, compareModel: conversation.compareModel, params: conversation.params });
    show(entry);
    if (matchMedia(NARROW).matches) sidebar.setCollapsed(true);
    toBottom();
  }

  function newChat() {
    show(null);
    input.focus();
  }

  // The model and parameters chosen are remembered by the conversation shown.
  function rememberChoices() {
    if (!current) return;
    const { model, compareModel, params } = controls.read();
    Object.assign(current.conversation, { model, compareModel, params });
    store.putConversation(current.conversation).catch((err) => showError(composerError, err));
  }

  async function rename(id, title) {
    const entry = await entryFor(id);
    if (!entry) return;
    entry.conversation.title = title;
    await store.putConversation(entry.conversation);
    await refreshList();
    if (current === entry) threadTitle.textContent = title;
  }

  async function remove(id) {
    for (const [k, r] of runners) {
      if (r.message.conversationId === id) {
        runners.delete(k);
        r.discard();
      }
    }
    await store.deleteConversation(id);
    cache.delete(id);
    if (current && current.conversation.id === id) show(null);
    await refreshList();
  }

  function exportCurrent() {
    if (!current) return;
    const messages = [...current.messages.values()].sort(byCreation);
    const doc = store.exportDocument(current.conversation, messages);
    const url = URL.createObjectURL(new Blob([JSON.stringify(doc, null, 2)], { type: "application/json" }));
    const link = h("a", { href: url, download: fileName(current.conversation.title), hidden: true });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  async function importFile(file) {
    if (file.size > IMPORT_MAX_BYTES) throw new Error("This file is larger than 20 MiB: it is not a conversation from this chat.");
    const parsed = store.parseImport(await file.text());
    const stored = await store.importConversation(parsed);
    await refreshList();
    await openConversation(stored.id);
    toast(`Imported “${stored.title}”.`, "ok");
    resumeAll();
  }

  // --- sending, branches ---------------------------------------------------------------------------------
  function newMessage(entry, fields) {
    lastCreated = Math.max(Date.now(), lastCreated + 1); // siblings keep their order
    const m = {
      conversationId: entry.conversation.id, id: store.newId(), parentId: null, role: "user", content: "",
      reasoning: "", status: "done", offset: 0, model: null, pairOf: null, createdAt: lastCreated, ...fields,
    };
    entry.messages.set(m.id, m);
    return m;
  }

  function requestBody(entry, user, model, params) {
    const messages = [];
    if (params.system && params.system.trim()) messages.push({ role: "system", content: params.system });
    for (const m of lineage(entry.messages, user.id)) {
      if (m.content) messages.push({ role: m.role, content: m.content });
    }
    const body = { messages, ...requestFields(params) };
    return model ? { model, ...body } : body;
  }

  // Checks the composer's preconditions; the model and parameters to use, or null.
  function ready() {
    if (!key) {
      showError(composerError, "Create or paste an inference key first (above).");
      keyRegion.hidden = false;
      createKey.focus();
      return null;
    }
    const choice = controls.read();
    if (!controls.check(choice.errors)) return null;
    if (!choice.model) {
      showError(composerError, NO_MODEL);
      return null;
    }
    return choice;
  }

  // Answers `user` (already in entry.messages): one answer, or two side by side. `fresh` are the
  // new messages to save with it.
  async function answer(entry, user, choice, fresh) {
    const { conversation } = entry;
    Object.assign(conversation, { model: choice.model, compareModel: choice.compareModel, params: choice.params,
      updatedAt: Date.now() });
    select(conversation, user);
    const startedAt = Date.now();
    const first = newMessage(entry, { role: "assistant", parentId: user.id, model: choice.model || null,
      status: "streaming", startedAt });
    select(conversation, first);
    const answers = [first];
    if (choice.compareModel) {
      answers.push(newMessage(entry, { role: "assistant", parentId: user.id, model: choice.compareModel,
        status: "streaming", startedAt, pairOf: first.id }));
    }
    try {
      await store.putConversation(conversation, [...fresh, ...answers]);
    } catch (err) {
      for (const m of [...fresh, ...answers]) entry.messages.delete(m.id);
      showError(composerError, `The conversation could not be saved: ${humanError(err)}`);
      return false;
    }
    cache.set(conversation.id, entry);
    showError(composerError, null);
    current = entry;
    localStorage.setItem(CURRENT, conversation.id);
    await refreshList();
    for (const m of answers) {
      const body = requestBody(entry, user, m.model, choice.params);
      run(m, (runner) => runner.start(body));
    }
    renderThread();
    if (matchMedia(NARROW).matches) sidebar.setCollapsed(true);
    toBottom();
    return true;
  }

  async function sendMessage() {
    const text = input.value;
    if (!text.trim()) {
      showError(composerError, "Type a message first.");
      input.focus();
      return;
    }
    if (isBusy(current)) return;
    if (!key && keyPending) await keyPending;
    if (key && modelsLoading) await modelsLoading;
    const choice = ready();
    if (!choice) return;
    let entry = current;
    if (!entry) {
      const now = Date.now();
      entry = { conversation: { id: store.newId(), title: titleFrom(text), createdAt: now, updatedAt: now,
        model: choice.model, compareModel: choice.compareModel, params: choice.params, selected: {} }, messages: new Map() };
    }
    const path = visiblePath(entry.conversation, entry.messages);
    const parent = path.length ? path[path.length - 1] : null;
    const user = newMessage(entry, { role: "user", content: text, parentId: parent ? parent.id : null });
    if (await answer(entry, user, choice, [user])) input.value = "";
    input.focus();
  }

  function switchBranch(id) {
    if (!current) return;
    const m = current.messages.get(id);
    if (!m) return;
    select(current.conversation, m);
    store.putConversation(current.conversation).catch((err) => showError(composerError, err));
    renderThread();
    const again = items.get(id);
    const button = again && (again.querySelector(".branches button:not(:disabled)"));
    if (button) button.focus();
  }

  function regenerate(m) {
    if (!current || isBusy(current)) return;
    const user = current.messages.get(m.parentId);
    const choice = user && ready();
    if (choice) answer(current, user, choice, []);
  }

  function startEdit(m, item) {
    if (!current || isBusy(current) || item.querySelector(".edit-form")) return;
    const entry = current;
    const area = h("textarea", { name: "edit", rows: 3 });
    area.value = m.content;
    const error = errorSlot();
    const body = item.querySelector(".message-body");
    const foot = item.querySelector(".message-foot");
    const close = () => {
      form.remove();
      body.hidden = false;
      foot.hidden = false;
      const edit = foot.querySelector("button");
      if (edit) edit.focus();
    };
    const form = h("form.edit-form", { novalidate: true },
      field("Edit message", area),
      h("div.actions",
        h("button.button.small.primary", { type: "submit" }, "Save and send"),
        h("button.button.small", { type: "button", onclick: close }, "Cancel")),
      error);
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      if (!area.value.trim()) {
        showError(error, "The message is empty.");
        area.focus();
        return;
      }
      if (isBusy(entry)) return;
      const choice = ready();
      if (!choice) return;
      // A sibling of the edited message: a new branch; the old one stays as it was.
      const user = newMessage(entry, { role: "user", content: area.value, parentId: m.parentId });
      if (!(await answer(entry, user, choice, [user]))) close();
    });
    area.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        event.preventDefault();
        close();
      } else if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        form.requestSubmit();
      }
    });
    body.hidden = true;
    foot.hidden = true;
    body.after(form);
    area.focus();
  }

  // --- streams ---------------------------------------------------------------------------------------
  function run(m, go) {
    const runner = new Runner(m, {
      key,
      onChange: (msg) => changed(msg, msg.status !== "streaming"),
      onEnd: (r) => ended(r),
      onUnauthorized: () => dropKey(),
      onSaveError: (err) => showError(composerError, `The answer could not be saved in this browser: ${humanError(err)}`),
    });
    runners.set(runnerKey(m), runner);
    go(runner);
    return runner;
  }

  function ended(runner) {
    const m = runner.message;
    if (runners.get(runnerKey(m)) === runner) runners.delete(runnerKey(m));
    changed(m, true);
    if (current && current.conversation.id === m.conversationId) {
      if (m.status === "error") showError(composerError, m.model ? `${m.model}: ${m.note}` : m.note);
      updateComposer();
    }
  }

  async function stopCurrent() {
    stop.disabled = true;
    const mine = [...runners.values()].filter((r) => current && r.message.conversationId === current.conversation.id);
    await Promise.all(mine.map((r) => r.stop()));
    input.focus();
  }

  let resuming = false;
  // Answers left `streaming` (a reload, another page of the console): continued from their saved
  // offset when the gateway still has them, else marked `error` with their partial text kept.
  async function resumeAll() {
    if (!key || resuming) return;
    resuming = true;
    try {
      const stale = (await store.streamingMessages()).filter((m) => !runners.has(runnerKey(m)));
      if (!stale.length) return;
      const found = await lookupStreams(key, [...new Set(stale.map((m) => m.id))], page.signal);
      for (const record of stale) {
        const entry = await entryFor(record.conversationId);
        const m = entry && entry.messages.get(record.id);
        if (!m || runners.has(runnerKey(m)) || m.status !== "streaming") continue;
        if (found.has(m.id)) {
          run(m, (runner) => runner.resume());
        } else {
          m.status = "error";
          m.note = "The server no longer has this stream: the answer is incomplete.";
          m.finishedAt = m.finishedAt || Date.now();
          await store.putMessage({ ...m });
          changed(m, true);
        }
      }
      updateComposer();
    } catch (err) {
      if (err.name === "AbortError") return;
      if (err.status === 401) dropKey();
      else showError(composerError, `Unfinished answers could not be looked up: ${humanError(err)}`);
    } finally {
      resuming = false;
    }
  }

  // --- key and models --------------------------------------------------------------------------------
  function useKey(value) {
    key = value;
    keepInferenceKey(value);
    keyRegion.hidden = true;
    keyNote.hidden = true;
    showError(keyError, null);
    showError(composerError, null);
    loadModels();
    resumeAll();
  }

  function dropKey() {
    if (!key) return;
    key = "";
    forgetInferenceKey();
    keyNote.textContent = "The inference key was refused (deleted or disabled?). Create a new one or paste another.";
    keyNote.hidden = false;
    keyRegion.hidden = false;
  }

  let modelsLoading = null; // the /v1/models request in flight: a message sent meanwhile waits for it
  function loadModels() {
    if (!key) return Promise.resolve();
    const loading = listModels(key).finally(() => {
      if (modelsLoading === loading) modelsLoading = null;
      updateComposer();
    });
    modelsLoading = loading;
    updateComposer();
    return loading;
  }

  async function listModels(asked) {
    showError(modelError, null);
    reloadModels.hidden = true;
    try {
      const listing = await v1("GET", "/models", undefined, { key: asked, signal: page.signal });
      const models = ((listing && listing.data) || []).filter((m) => m && typeof m.id === "string");
      controls.setModels(models);
      if (!models.length) {
        showError(modelError, NO_MODEL);
        reloadModels.hidden = false;
      }
    } catch (err) {
      if (err.name === "AbortError") return;
      if (err.status === 401) {
        if (asked === key) dropKey();
        return;
      }
      controls.setModels([]);
      // The gateway answers 502 while no model is ready to take requests.
      showError(modelError, err.status === 502 ? NO_MODEL : `Models could not be listed: ${humanError(err)}`);
      reloadModels.hidden = false;
    }
  }

  let keyPending = null; // a key being created: a message sent meanwhile waits for it
  createKey.addEventListener("click", () => {
    keyPending = createPlaygroundKey().finally(() => { keyPending = null; });
  });
  async function createPlaygroundKey() {
    createKey.disabled = true;
    showError(keyError, null);
    try {
      // The secret goes to the key's storage (chat/key.js) and nowhere else.
      const created = await api("POST", "/keys", { name: "playground", scopes: ["inference"] }, { signal: page.signal });
      useKey(created.secret);
      toast("Created the key “playground” for this chat; it is kept in this browser.", "ok");
      input.focus();
    } catch (err) {
      if (err.name === "AbortError" || err.status === 401) return;
      showError(keyError, `The key could not be created: ${humanError(err)}`);
    } finally {
      createKey.disabled = false;
    }
  }

  keyForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    const value = keyInput.value.trim();
    showError(keyError, null);
    if (!value) {
      showError(keyError, "Paste a key first.");
      keyInput.focus();
      return;
    }
    try {
      await v1("GET", "/models", undefined, { key: value, signal: page.signal });
    } catch (err) {
      if (err.name === "AbortError") return;
      if (err.status === 401) {
        showError(keyError, "This key is not accepted by /v1: it needs the inference scope and must be enabled.");
        keyInput.focus();
        return;
      }
      // Anything else (no model running) says nothing against the key.
    }
    keyInput.value = "";
    useKey(value);
    input.focus();
  });

  // --- composer keys, leaving the page ---------------------------------------------------------------
  composer.addEventListener("submit", (event) => {
    event.preventDefault();
    sendMessage();
  });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing && !event.altKey) {
      event.preventDefault();
      if (!send.disabled) composer.requestSubmit();
    }
  });
  const onVisible = () => {
    if (document.visibilityState === "visible" && key && reloadModels.hidden === false) loadModels();
  };
  document.addEventListener("visibilitychange", onVisible);
  page.cleanup.push(() => {
    document.removeEventListener("visibilitychange", onVisible);
    if (renderTimer) clearTimeout(renderTimer);
    // Leaving the page: the server goes on generating; the next visit resumes these answers.
    for (const r of runners.values()) r.detach();
    runners.clear();
  });

  // --- start ---------------------------------------------------------------------------------------
  try {
    await refreshList();
  } catch (err) {
    sidebar.error(err);
    return;
  }
  const remembered = localStorage.getItem(CURRENT);
  if (remembered && conversations.some((c) => c.id === remembered)) {
    await openConversation(remembered);
  } else {
    renderThread();
  }
  if (key) {
    loadModels();
    resumeAll();
  }
}
