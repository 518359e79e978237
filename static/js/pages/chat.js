// The chat page (/chat): a playground for the running model; the contract (names, DOM hooks,
// storage, streams, safety) is docs/chat.md. This module wires the parts of chat/ together:
// conversations.js (the list), key.js (the inference key), controls.js (model, parameters),
// models.js (GET /v1/models), thread.js (the messages, drawn by view.js), composer.js;
// conversation.js (conversations in memory; store.js keeps them in IndexedDB, tree.js walks their
// branches), runners.js (the answers streaming, one runner.js each, over the /v1 client stream.js);
// attach.js (the composer's attachments; attachments.js reads them and checks the 16 MiB cap);
// tools.js (the "Tools" settings, /tools with the tool key) and toolloop.js (the calls an answer
// asks for, run, then the next answer; drawn by toolcalls.js).
// It talks to /v1 with the inference key and to /tools with the tool key, never with the admin
// credential; its only /api calls are key.js's (the keys made on first use).
//
// `/chat?model=<name>` opens a new conversation with that model chosen (the Deployments page's
// "Chat" link); the address then becomes `/chat` again, so a reload shows the conversation.

import { h, humanError, pageHeader, showError, toast } from "../ui.js";
import * as store from "../chat/store.js";
import { createAttachPicker, modalityChecks } from "../chat/attach.js";
import { BODY_MAX_BYTES, bodyBytes, tooLargeText } from "../chat/attachments.js";
import { createComposer } from "../chat/composer.js";
import { createEntries, exportEntry, importConversation, newEntry, requestBody } from "../chat/conversation.js";
import { createSidebar } from "../chat/conversations.js";
import { createControls } from "../chat/controls.js";
import { createKeyPanel } from "../chat/key.js";
import { NO_MODEL, createModelStatus, goneText } from "../chat/models.js";
import { Runners } from "../chat/runners.js";
import { createToolLoop } from "../chat/toolloop.js";
import { createToolPicker } from "../chat/tools.js";
import { createThread, toBottom } from "../chat/thread.js";
import { select, visiblePath } from "../chat/tree.js";
import { editMessage } from "../chat/view.js";

const CURRENT = "vllm-use.chat.current"; // the conversation shown last (an id, not a secret)
const NARROW = "(max-width: 900px)"; // as in chat.css: the list folds above the messages

export async function render(root, page) {
  root.append(pageHeader("Chat", "Talk to the running model through the /v1 gateway. Conversations stay in this browser."));

  let conversations = []; // the list (records from the store)
  let current = null; // the entry shown, or null for a new chat
  const entries = createEntries();

  const keys = createKeyPanel({
    signal: page.signal,
    onUse: () => {
      showError(composer.error, null);
      models.load();
      resumeAll();
      composer.input.focus();
    },
  });
  // Attachments a model cannot take are refused (chat/attach.js): at the picker, at sending, and a
  // model chosen for a conversation that has them.
  const modalities = modalityChecks({ controls: () => controls, attached: () => [
    ...(current ? current.messages.values() : []), { attachments: picker.list }] });
  const controls = createControls({ onChange: rememberChoices, onOpen: () => models.load(),
    canChoose: modalities.canChoose });
  const models = createModelStatus({ controls, signal: page.signal, ensureKey: () => keys.ensure(),
    onRefused: (key) => keys.refused(key), onChange: () => updateComposer(),
    onListed: () => runners.markLoading((name) => models.needsLoad(name)) });
  const tools = createToolPicker({ signal: page.signal, onChange: rememberChoices });
  const thread = createThread({ onBranch: switchBranch, onEdit: startEdit, onRegenerate: regenerate,
    onToolDecision: (m, index, choice) => toolLoop.decide(m, index, choice) });
  const picker = createAttachPicker({
    check: (kind) => modalities.refusal(kind),
    onProblem: (text) => showError(composer.error, text),
  });
  const composer = createComposer({
    extra: picker.element,
    onSend: sendMessage,
    onStop: () => {
      if (!current) return Promise.resolve();
      toolLoop.stop(current.conversation.id);
      return runners.stop(current.conversation.id);
    },
  });
  const sidebar = createSidebar({ onNew: newChat, onSelect: openConversation, onRename: rename, onDelete: remove,
    onExport: () => { if (current) exportEntry(current); }, onImport: importFile });
  const runners = new Runners({
    key: () => keys.key,
    onChange: (m) => thread.changed(m, m.status !== "streaming"),
    onEnd: (m) => {
      thread.changed(m, true);
      // An error shows on its message, once; the models' statuses have changed (loaded, failed).
      if (current && current.conversation.id === m.conversationId) updateComposer();
      models.load();
      toolLoop.after(m).catch((err) => showError(composer.error, `The tool calls stopped: ${humanError(err)}`));
    },
    onUnauthorized: (err, key) => {
      keys.refused(key);
      return keys.ensure(); // the next key (chat/key.js); the runner asks once more with it
    },
    onSaveError: (err) => showError(composer.error, `The answer could not be saved in this browser: ${humanError(err)}`),
  });
  picker.dropTarget(composer.element);
  // An answer's tool calls, run; then the next answer (after the user's Allow where a tool writes).
  const toolLoop = createToolLoop({
    entries,
    picker: tools,
    onChange: (m) => thread.changed(m, true),
    onBusy: () => updateComposer(),
    onContinue: (entry, previous, next) => {
      const { params, tools: names } = entry.conversation;
      runners.start(next, requestBody(entry, previous, next.model, params || {}, tools.definitions(names)));
      if (current === entry) renderThread();
      toBottom();
    },
  });
  const isBusy = (entry) => Boolean(entry)
    && (runners.busy(entry.conversation.id) || toolLoop.busy(entry.conversation.id));
  let sending = false; // a message on its way to the composer's checks (ready())

  root.append(h("div.chat-layout",
    sidebar.element,
    h("div.chat-main", controls.element, tools.element, models.element, thread.element, composer.element,
      keys.element)));
  // On a narrow screen the list starts folded, so that the composer is in view ("Show list").
  if (matchMedia(NARROW).matches) sidebar.setCollapsed(true);

  function renderThread() {
    thread.render(current, isBusy(current));
    updateComposer();
  }

  function updateComposer() {
    const busy = isBusy(current);
    // Nothing is sent before /v1/models has named the model chosen: a request without one would
    // go to whatever the server defaults to, or fail (docs/chat.md). When no key could be made,
    // Send stays clickable and says what is missing.
    composer.update(busy, !(keys.failed && !keys.key) && !controls.hasModel());
    models.check(); // a model chosen that is no longer served says so
    thread.setBusy(busy);
  }

  // --- conversations -------------------------------------------------------------------------------------
  async function refreshList() {
    conversations = await store.listConversations();
    sidebar.show(conversations, current ? current.conversation.id : null);
  }

  function show(entry) {
    current = entry;
    if (entry) localStorage.setItem(CURRENT, entry.conversation.id);
    else localStorage.removeItem(CURRENT);
    showError(composer.error, null);
    sidebar.show(conversations, entry ? entry.conversation.id : null);
    renderThread();
  }

  async function openConversation(id) {
    const entry = await entries.get(id);
    if (!entry) {
      await refreshList();
      return;
    }
    const { conversation } = entry;
    controls.apply({ model: conversation.model, compareModel: conversation.compareModel, params: conversation.params });
    tools.apply(conversation.tools);
    show(entry);
    toolLoop.resume(entry); // a loop the page left (a reload) goes on: see chat/toolloop.js
    if (matchMedia(NARROW).matches) sidebar.setCollapsed(true);
    toBottom();
  }

  function newChat() {
    show(null);
    composer.input.focus();
  }

  // The model and parameters chosen are remembered by the conversation shown.
  function rememberChoices() {
    updateComposer(); // Send and the model status follow the choice (e.g. away from a model gone)
    if (!current) return;
    const { model, compareModel, params } = controls.read();
    Object.assign(current.conversation, { model, compareModel, params, tools: tools.selected() });
    store.putConversation(current.conversation).catch((err) => showError(composer.error, err));
  }

  async function rename(id, title) {
    const entry = await entries.get(id);
    if (!entry) return;
    entry.conversation.title = title;
    await store.putConversation(entry.conversation);
    await refreshList();
    if (current === entry) thread.setTitle(title);
  }

  async function remove(id) {
    runners.discard(id);
    await store.deleteConversation(id);
    entries.forget(id);
    if (current && current.conversation.id === id) show(null);
    await refreshList();
  }

  async function importFile(file) {
    const stored = await importConversation(file);
    await refreshList();
    await openConversation(stored.id);
    toast(`Imported “${stored.title}”.`, "ok");
    resumeAll();
  }

  // --- sending, branches ---------------------------------------------------------------------------------
  // Checks the composer's preconditions, with a key (made on first use) and the models listed
  // again (what the listing says decides whether anything is sent); the model and parameters to
  // use, or null. Where the banner already says that nothing serves the model, it is not repeated.
  async function ready() {
    if (await keys.ensure()) await models.load();
    if (!keys.key) {
      showError(composer.error, "No inference key: paste one under “Use another key” (below).");
      keys.ask();
      return null;
    }
    const choice = { ...controls.read(), tools: tools.selected() };
    if (!controls.check(choice.errors)) return null;
    if (choice.tools.length) await tools.ready(); // their definitions go with the request
    const gone = controls.unavailable();
    if (!choice.model || gone.length) {
      showError(composer.error, models.unserved ? null : choice.model ? goneText(gone) : NO_MODEL);
      return null;
    }
    return choice;
  }

  // Answers `user` (already in entry.messages): one answer, or two side by side. `fresh` are the
  // new messages to save with it.
  async function answer(entry, user, choice, fresh) {
    // The gateway takes at most 16 MiB: a request over it is not sent at all.
    for (const model of [choice.model, choice.compareModel].filter(Boolean)) {
      const bytes = bodyBytes(requestBody(entry, user, model, choice.params, tools.definitions(choice.tools)));
      if (bytes > BODY_MAX_BYTES) {
        for (const m of fresh) entry.messages.delete(m.id);
        showError(composer.error, tooLargeText(bytes));
        return false;
      }
    }
    let answers;
    try {
      answers = await entries.addAnswers(entry, user, choice, fresh);
    } catch (err) {
      showError(composer.error, `The conversation could not be saved: ${humanError(err)}`);
      return false;
    }
    showError(composer.error, null);
    current = entry;
    localStorage.setItem(CURRENT, entry.conversation.id);
    await refreshList();
    const definitions = tools.definitions(choice.tools);
    for (const m of answers) runners.start(m, requestBody(entry, user, m.model, choice.params, definitions));
    // "loading <model>…" at once where the listing made before sending says so (or a later one).
    runners.markLoading((name) => models.needsLoad(name));
    renderThread();
    if (matchMedia(NARROW).matches) sidebar.setCollapsed(true);
    toBottom();
    return true;
  }

  async function sendMessage() {
    const { input } = composer;
    const text = input.value;
    const attachments = [...picker.list];
    if (picker.busy) {
      showError(composer.error, "The attachments are still being read.");
      return;
    }
    if (!text.trim() && !attachments.length) {
      showError(composer.error, "Type a message first.");
      input.focus();
      return;
    }
    if (isBusy(current) || sending) return;
    sending = true; // (a second press while the models are listed sends nothing more)
    try {
      const choice = await ready();
      if (!choice || isBusy(current)) return;
      const refused = attachments.map((a) => modalities.refusal(a.kind)).find(Boolean);
      if (refused) {
        showError(composer.error, refused);
        return;
      }
      const entry = current || newEntry(text.trim() ? text : attachments[0].name, choice);
      const path = visiblePath(entry.conversation, entry.messages);
      const parent = path.length ? path[path.length - 1] : null;
      const user = entries.newMessage(entry, { role: "user", content: text, parentId: parent ? parent.id : null,
        ...(attachments.length ? { attachments } : {}) });
      if (await answer(entry, user, choice, [user])) {
        input.value = "";
        picker.clear();
      }
    } finally {
      sending = false;
      input.focus();
    }
  }

  function switchBranch(id) {
    if (!current) return;
    const m = current.messages.get(id);
    if (!m) return;
    select(current.conversation, m);
    store.putConversation(current.conversation).catch((err) => showError(composer.error, err));
    renderThread();
    thread.focusBranches(id);
  }

  async function regenerate(m) {
    if (!current || isBusy(current)) return;
    const entry = current;
    const user = entry.messages.get(m.parentId);
    const choice = user && (await ready());
    if (choice && !isBusy(entry)) answer(entry, user, choice, []);
  }

  function startEdit(m, item) {
    if (!current || isBusy(current)) return;
    const entry = current;
    editMessage(item, m, async (text) => {
      if (isBusy(entry)) return false;
      const choice = await ready();
      if (!choice || isBusy(entry)) return false;
      // A sibling of the edited message: a new branch; the old one stays as it was.
      const user = entries.newMessage(entry, { role: "user", content: text, parentId: m.parentId,
        ...(m.attachments ? { attachments: m.attachments } : {}) });
      return !(await answer(entry, user, choice, [user]));
    });
  }

  // Answers left `streaming` by a reload or another page: resumed, or marked as incomplete.
  async function resumeAll() {
    if (!(await keys.ensure())) return;
    try {
      if (await runners.resumeStale(entries, page.signal)) {
        runners.markLoading((name) => models.needsLoad(name)); // as the last listing said, if it has answered
        updateComposer();
      }
    } catch (err) {
      if (err.name === "AbortError") return;
      if (err.status === 401) keys.refused(keys.key);
      else showError(composer.error, `Unfinished answers could not be looked up: ${humanError(err)}`);
    }
  }

  // --- leaving the page, start ---------------------------------------------------------------------------
  page.cleanup.push(() => {
    thread.dispose();
    // Leaving the page: the server goes on generating; the next visit resumes these answers.
    runners.detachAll();
    toolLoop.detachAll();
  });

  try {
    await refreshList();
  } catch (err) {
    sidebar.error(err);
    return;
  }
  const wanted = new URLSearchParams(location.search).get("model");
  const remembered = localStorage.getItem(CURRENT);
  if (wanted) {
    // /chat?model=<name>: a new conversation with that model (shown unavailable if nothing serves it).
    controls.apply({ model: wanted });
    show(null);
    history.replaceState(history.state, "", "/chat");
  } else if (remembered && conversations.some((c) => c.id === remembered)) {
    await openConversation(remembered);
  } else {
    renderThread();
  }
  // The first use of the chat in this browser profile makes its key (chat/key.js).
  models.load();
  resumeAll();
}
