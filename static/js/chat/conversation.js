// Conversations in memory, as the page works on them: an entry is {conversation, messages: Map<id,
// message>} (the records of store.js). `createEntries()` loads each conversation from IndexedDB
// once and keeps it, makes new messages (creation times strictly increasing, so that siblings keep
// their order) and adds the answers to a prompt, saved with it. Also here: a new conversation, its
// title (the start of its first message), the body of a completion request for an answer, Import
// of a file, and Export as a download of `<title>.json`.

import { h } from "../ui.js";
import { contentOf } from "./attachments.js";
import { requestFields } from "./params.js";
import * as store from "./store.js";
import { lineage, select } from "./tree.js";

const TITLE_CHARS = 60;
const IMPORT_MAX_BYTES = 20 * 1024 * 1024;

const byCreation = (a, b) => (a.createdAt || 0) - (b.createdAt || 0);

// A new conversation's title: the start of its first message.
export function titleFrom(text) {
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

export function createEntries() {
  const cache = new Map(); // conversation id → entry
  let lastCreated = 0;

  // A message record with `fields`, added to the entry (not saved yet).
  const newMessage = (entry, fields) => {
    lastCreated = Math.max(Date.now(), lastCreated + 1); // siblings keep their order
    const m = {
      conversationId: entry.conversation.id, id: store.newId(), parentId: null, role: "user", content: "",
      reasoning: "", status: "done", offset: 0, model: null, pairOf: null, createdAt: lastCreated, ...fields,
    };
    entry.messages.set(m.id, m);
    return m;
  };

  return {
    // The entry of a stored conversation, or null when there is none.
    async get(id) {
      if (cache.has(id)) return cache.get(id);
      const loaded = await store.getConversation(id);
      if (!loaded) return null;
      const entry = { conversation: loaded.conversation, messages: new Map(loaded.messages.map((m) => [m.id, m])) };
      cache.set(id, entry);
      return entry;
    },

    forget(id) {
      cache.delete(id);
    },

    newMessage,

    // The answer to `user` (already in the entry), `streaming`: one, or two side by side when
    // `choice` has a compareModel. The conversation takes the choices of `choice`; it is saved with
    // the answers and the new messages `fresh`. Resolves to the answers; when saving fails, the new
    // messages leave the entry again and the error is thrown.
    async addAnswers(entry, user, choice, fresh) {
      const { conversation } = entry;
      Object.assign(conversation, { model: choice.model, compareModel: choice.compareModel, params: choice.params,
        tools: choice.tools || [], updatedAt: Date.now() });
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
        throw err;
      }
      cache.set(conversation.id, entry);
      return answers;
    },
  };
}

// The entry of a conversation started by `text`, with the model and parameters of `choice` (not saved yet).
export function newEntry(text, choice) {
  const now = Date.now();
  return { conversation: { id: store.newId(), title: titleFrom(text), createdAt: now, updatedAt: now,
    model: choice.model, compareModel: choice.compareModel, params: choice.params, tools: choice.tools || [],
    selected: {} }, messages: new Map() };
}

// The completion request answering `user` (or continuing after an answer's tool calls): the system
// prompt, the messages from the first down to `user` (with their attachments), the parameters that
// are set, and the `tools` definitions selected. An answer with tool calls is an assistant message
// with `tool_calls` (its content null when it has none) followed by one `tool` message per call
// (docs/chat.md, "Tools").
export function requestBody(entry, user, model, params, tools = []) {
  const messages = [];
  if (params.system && params.system.trim()) messages.push({ role: "system", content: params.system });
  for (const m of lineage(entry.messages, user.id)) {
    if (m.role === "assistant" && m.toolCalls && m.toolCalls.length) messages.push(...toolMessages(m));
    // A prompt with attachments is a list of content parts (chat/attachments.js).
    else if (m.content || (m.attachments && m.attachments.length)) messages.push({ role: m.role, content: contentOf(m) });
  }
  const body = { messages, ...requestFields(params) };
  if (tools.length) body.tools = tools;
  return model ? { model, ...body } : body;
}

const NOT_RUN = JSON.stringify({ error: "this call was not run" });

function toolMessages(m) {
  const id = (call, i) => call.id || `call-${m.id}-${i}`;
  return [
    { role: "assistant", content: m.content || null, tool_calls: m.toolCalls.map((call, i) => ({ id: id(call, i),
      type: "function", function: { name: call.name, arguments: call.arguments || "{}" } })) },
    ...m.toolCalls.map((call, i) => ({ role: "tool", tool_call_id: id(call, i), content: call.result ?? NOT_RUN })),
  ];
}

// Import: a file exported by this chat, stored as a new conversation (store.js checks it and says
// in words what is wrong). Resolves to the stored conversation record.
export async function importConversation(file) {
  if (file.size > IMPORT_MAX_BYTES) throw new Error("This file is larger than 20 MiB: it is not a conversation from this chat.");
  const parsed = store.parseImport(await file.text());
  return store.importConversation(parsed);
}

// Export: the conversation as `<title>.json` (store.exportDocument), downloaded by the browser.
export function exportEntry(entry) {
  const messages = [...entry.messages.values()].sort(byCreation);
  const doc = store.exportDocument(entry.conversation, messages);
  const url = URL.createObjectURL(new Blob([JSON.stringify(doc, null, 2)], { type: "application/json" }));
  const link = h("a", { href: url, download: fileName(entry.conversation.title), hidden: true });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}
