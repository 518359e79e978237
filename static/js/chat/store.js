// Conversations kept in this browser: IndexedDB database `vllm-use-chat` (docs/chat.md).
//
// Two object stores:
// - `conversations` (key `id`): {id, title, createdAt, updatedAt, model, compareModel,
//   params: {system, stop, and the sampling fields of params.js}, selected: {<parent id or "root">: <child id>}}
// - `messages` (key [conversationId, id], indexes `conversation` and `status`): {conversationId, id,
//   parentId (null for a first message), role, content, reasoning, status (streaming|done|stopped|error),
//   offset (bytes of the stream consumed), model, pairOf (the answer this one is compared with),
//   createdAt, startedAt, firstTokenAt, finishedAt, tokens, usageTokens, finishReason, note,
//   attachments (a prompt's: [{kind, name, mime, size, data | text}], chat/attachments.js),
//   toolCalls: [{id, name, arguments, state, output, result, error}], round, toolNote, toolsEnded}
//   (the tool loop, chat/toolloop.js); a conversation's `tools` are the tool names selected.
// Messages form a tree through parentId; `selected` says which sibling each parent shows.
//
// Export is one JSON document {format: "vllm-use-chat", version: 1, conversation, messages};
// `parseImport` checks a file's shape and says in words what is wrong.

import { attachmentProblem } from "./attachments.js";
import { paramsProblem } from "./params.js";

const DB_NAME = "vllm-use-chat";
const DB_VERSION = 1;
export const FORMAT = "vllm-use-chat";
const STATUSES = ["streaming", "done", "stopped", "error"];

let opening = null;

function open() {
  if (!opening) {
    opening = new Promise((resolve, reject) => {
      if (!window.indexedDB) {
        reject(new Error("This browser keeps no IndexedDB here (a private window?): conversations cannot be saved."));
        return;
      }
      const request = indexedDB.open(DB_NAME, DB_VERSION);
      request.onupgradeneeded = () => {
        const db = request.result;
        if (!db.objectStoreNames.contains("conversations")) db.createObjectStore("conversations", { keyPath: "id" });
        if (!db.objectStoreNames.contains("messages")) {
          const messages = db.createObjectStore("messages", { keyPath: ["conversationId", "id"] });
          messages.createIndex("conversation", "conversationId");
          messages.createIndex("status", "status");
        }
      };
      request.onsuccess = () => {
        const db = request.result;
        db.onversionchange = () => db.close(); // a newer page wants to upgrade: let it
        resolve(db);
      };
      request.onerror = () => reject(new Error(`The chat's storage could not be opened: ${request.error && request.error.message}`));
      request.onblocked = () => reject(new Error("The chat's storage is busy in another tab; close it and reload."));
    });
    opening.catch(() => { opening = null; });
  }
  return opening;
}

function done(request) {
  return new Promise((resolve, reject) => {
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}

function finished(tx) {
  return new Promise((resolve, reject) => {
    tx.oncomplete = () => resolve();
    tx.onerror = () => reject(tx.error);
    tx.onabort = () => reject(tx.error || new Error("The chat's storage refused the change."));
  });
}

// A random id of visible ASCII without ':' (usable as X-Conversation-Id). crypto.randomUUID only
// exists on secure origins; getRandomValues exists everywhere.
export function newId() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

export async function listConversations() {
  const db = await open();
  const all = await done(db.transaction("conversations").objectStore("conversations").getAll());
  return all.sort((a, b) => (b.updatedAt || 0) - (a.updatedAt || 0) || (b.createdAt || 0) - (a.createdAt || 0));
}

export async function getConversation(id) {
  const db = await open();
  const tx = db.transaction(["conversations", "messages"]);
  const [conversation, messages] = await Promise.all([
    done(tx.objectStore("conversations").get(id)),
    done(tx.objectStore("messages").index("conversation").getAll(id)),
  ]);
  return conversation ? { conversation, messages } : null;
}

export async function putConversation(conversation, messages = []) {
  const db = await open();
  const tx = db.transaction(["conversations", "messages"], "readwrite");
  tx.objectStore("conversations").put(conversation);
  for (const message of messages) tx.objectStore("messages").put(message);
  await finished(tx);
}

// Transactions on one store run in the order they were made, so the last put wins.
export async function putMessage(message) {
  const db = await open();
  const tx = db.transaction("messages", "readwrite");
  tx.objectStore("messages").put(message);
  await finished(tx);
}

export async function deleteConversation(id) {
  const db = await open();
  const tx = db.transaction(["conversations", "messages"], "readwrite");
  tx.objectStore("conversations").delete(id);
  tx.objectStore("messages").delete(IDBKeyRange.bound([id], [id, []]));
  await finished(tx);
}

// Every message still marked `streaming` (after a reload: streams to resume).
export async function streamingMessages() {
  const db = await open();
  return done(db.transaction("messages").objectStore("messages").index("status").getAll("streaming"));
}

// --- export / import --------------------------------------------------------------------------------

export function exportDocument(conversation, messages) {
  return {
    format: FORMAT,
    version: 1,
    conversation: { ...conversation },
    messages: messages.map(({ conversationId, ...rest }) => rest),
  };
}

export class ImportError extends Error {}

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const isId = (v) => typeof v === "string" && /^[\x21-\x39\x3b-\x7e]{1,128}$/.test(v);
const optionalString = (v) => v === undefined || v === null || typeof v === "string";
const optionalNumber = (v) => v === undefined || v === null || (typeof v === "number" && Number.isFinite(v));

const CALL_STATES = ["waiting", "running", "done", "denied", "failed", "interrupted", "skipped"];

// A message's tool calls (chat/toolloop.js), as an export has them.
function checkToolCalls(m, where, bad) {
  if (!optionalString(m.toolNote)) bad(`${where}.toolNote should be text`);
  if (m.toolsEnded !== undefined && typeof m.toolsEnded !== "boolean") bad(`${where}.toolsEnded should be true or false`);
  if (m.toolCalls === undefined) return;
  if (!Array.isArray(m.toolCalls) || m.role !== "assistant") bad(`${where}.toolCalls should be a list, on an answer`);
  m.toolCalls.forEach((call, j) => {
    const at = `${where}.toolCalls[${j}]`;
    if (!isObject(call)) bad(`${at} should be an object`);
    for (const key of ["id", "name", "arguments"]) if (typeof call[key] !== "string") bad(`${at}.${key} should be text`);
    for (const key of ["output", "result", "error"]) if (!optionalString(call[key])) bad(`${at}.${key} should be text`);
    if (call.state !== undefined && !CALL_STATES.includes(call.state)) {
      bad(`${at}.state should be one of ${CALL_STATES.join(", ")}`);
    }
  });
}

// The conversation and messages from an exported file's text; throws ImportError saying what is wrong.
export function parseImport(text) {
  let doc;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw new ImportError(`The file is not JSON (${err.message}).`);
  }
  const bad = (what) => { throw new ImportError(`This is not a conversation exported from this chat: ${what}.`); };
  if (!isObject(doc) || doc.format !== FORMAT) bad(`"format" should be "${FORMAT}"`);
  if (doc.version !== 1) bad(`version ${JSON.stringify(doc.version)} is not known (expected 1)`);
  const c = doc.conversation;
  if (!isObject(c)) bad(`"conversation" should be an object`);
  if (!isId(c.id)) bad("conversation.id should be 1-128 visible characters without ':'");
  if (typeof c.title !== "string") bad("conversation.title should be text");
  if (!optionalNumber(c.createdAt) || !optionalNumber(c.updatedAt)) bad("conversation.createdAt and updatedAt should be numbers");
  if (!optionalString(c.model) || !optionalString(c.compareModel)) bad("conversation.model and compareModel should be text");
  if (c.params !== undefined && !isObject(c.params)) bad("conversation.params should be an object");
  const paramsWrong = paramsProblem(c.params || {});
  if (paramsWrong) bad(paramsWrong);
  if (c.tools !== undefined && !(Array.isArray(c.tools) && c.tools.every((t) => typeof t === "string"))) {
    bad("conversation.tools should be a list of tool names");
  }
  if (c.selected !== undefined && !(isObject(c.selected) && Object.values(c.selected).every(isId))) {
    bad("conversation.selected should map message ids to message ids");
  }
  if (!Array.isArray(doc.messages)) bad(`"messages" should be a list`);
  const ids = new Set();
  doc.messages.forEach((m, i) => {
    const where = `messages[${i}]`;
    if (!isObject(m)) bad(`${where} should be an object`);
    if (!isId(m.id)) bad(`${where}.id should be 1-128 visible characters without ':'`);
    if (ids.has(m.id)) bad(`${where}.id "${m.id}" appears twice`);
    ids.add(m.id);
    if (m.role !== "user" && m.role !== "assistant") bad(`${where}.role should be "user" or "assistant"`);
    if (typeof m.content !== "string") bad(`${where}.content should be text`);
    if (!optionalString(m.reasoning) || !optionalString(m.model) || !optionalString(m.note)
        || !optionalString(m.finishReason)) bad(`${where}: reasoning, model, note and finishReason should be text`);
    if (!STATUSES.includes(m.status)) bad(`${where}.status should be one of ${STATUSES.join(", ")}`);
    if (m.attachments !== undefined) {
      if (m.role !== "user" || !Array.isArray(m.attachments)) bad(`${where}.attachments should be a list, on a user message`);
      m.attachments.forEach((a, j) => {
        const wrong = attachmentProblem(a);
        if (wrong) bad(`${where}.attachments[${j}]${wrong.startsWith(".") ? "" : " "}${wrong}`);
      });
    }
    for (const key of ["offset", "createdAt", "startedAt", "firstTokenAt", "finishedAt", "tokens", "usageTokens",
      "round"]) {
      if (!optionalNumber(m[key])) bad(`${where}.${key} should be a number`);
    }
    checkToolCalls(m, where, bad);
  });
  const byId = new Map(doc.messages.map((m) => [m.id, m]));
  doc.messages.forEach((m, i) => {
    if (m.parentId !== null && m.parentId !== undefined && !byId.has(m.parentId)) {
      bad(`messages[${i}].parentId names no message in the file`);
    }
    if (m.pairOf !== null && m.pairOf !== undefined && !byId.has(m.pairOf)) {
      bad(`messages[${i}].pairOf names no message in the file`);
    }
    // Walking up must reach a first message: no cycles.
    let steps = 0;
    for (let p = m.parentId; p !== null && p !== undefined; p = byId.get(p).parentId) {
      if ((steps += 1) > doc.messages.length) bad(`messages[${i}] is part of a cycle of parents`);
    }
  });
  return { conversation: { ...c }, messages: doc.messages.map((m) => ({ ...m })) };
}

// Stores a parsed import; a conversation whose id is already here gets a new one. Returns it.
export async function importConversation({ conversation, messages }) {
  const db = await open();
  const existing = await done(db.transaction("conversations").objectStore("conversations").getKey(conversation.id));
  const id = existing === undefined ? conversation.id : newId();
  const stored = { ...conversation, id };
  await putConversation(stored, messages.map((m) => ({ ...m, conversationId: id })));
  return stored;
}
