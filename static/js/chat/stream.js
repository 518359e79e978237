// The chat's client for the inference gateway (/v1), beside api.js (which speaks to /api with the
// admin credential); both go through http.js (the one fetch wrapper and SSE reader). Every call
// here sends `Authorization: Bearer <inference key>`.
//
// - `v1(method, path, body, {key, signal})`: a JSON call (GET /v1/models, POST /v1/streams/lookup,
//   DELETE /v1/stream); throws GatewayError for a non-2xx answer.
// - `openCompletion(...)` / `openReplay(...)`: POST /v1/chat/completions with `stream: true` and
//   `X-Conversation-Id`, or GET /v1/stream?conv_id=&from=<byte offset> (docs/gateway.md); both
//   resolve to the Response once its headers say 2xx. Its body is read with http.js's
//   `readEvents()`, whose `end` (bytes consumed, at event boundaries only) is the offset to
//   resume from.
// - `applyChunk(message, data)`: folds one `data:` payload into a message record.
// A 401 from /v1 is the chat's own business (its key was refused): it never signs the console out.

import { UNREACHABLE, send } from "../http.js";

export class GatewayError extends Error {
  constructor(status, message, code = "", retryAfter = null) {
    super(message);
    this.name = "GatewayError";
    this.status = status;
    this.code = code; // the error document's `code` (e.g. "model_loading"), "" without one
    this.retryAfter = retryAfter; // seconds, from a `Retry-After` header in seconds; null without one
  }
}

// The gateway answers in the OpenAI shape ({"error": {"message", "code"}}); an upstream may relay
// its own. A 502 with a message is vllm-use's own words (e.g. "the model qwen failed to load"),
// shown as they are; one without says what a bare 502 from the gateway means.
async function failure(response) {
  let message = "";
  let code = "";
  try {
    const text = await response.text();
    try {
      const payload = JSON.parse(text);
      const error = payload && payload.error;
      message = (error && (error.message || (typeof error === "string" ? error : "")))
        || payload.message || payload.detail || "";
      if (typeof message !== "string") message = JSON.stringify(message);
      if (error && typeof error.code === "string") code = error.code;
    } catch (_) {
      message = text.slice(0, 300);
    }
  } catch (_) { /* the body could not be read: the status says enough */ }
  let prefix = "";
  if (response.status === 401) prefix = "The inference key was refused";
  else if (response.status === 502 && !message) prefix = "No model is answering (load one on the Deployments page)";
  else if (response.status === 404 && !message) prefix = "Not found";
  const text = [prefix, message].filter(Boolean).join(": ") || `The gateway answered ${response.status}.`;
  const retry = Number.parseInt(response.headers.get("Retry-After") || "", 10);
  return new GatewayError(response.status, text, code, Number.isFinite(retry) && retry >= 0 ? retry : null);
}

// A fetch that failed: the server cannot be reached (Runner retries these).
function unreachable() {
  const wrapped = new GatewayError(0, UNREACHABLE, "unreachable");
  wrapped.network = true;
  return wrapped;
}

const gateway = (path, options) => send(`/v1${path}`, { ...options, unreachable, failure });

export async function v1(method, path, body, { key, signal } = {}) {
  const response = await gateway(path, { method, credential: key, body, signal });
  if (response.status === 204) return null;
  return response.json();
}

export function openCompletion({ key, conversationId, body, signal }) {
  return gateway("/chat/completions", {
    method: "POST",
    credential: key,
    accept: "text/event-stream",
    headers: { "X-Conversation-Id": conversationId },
    body: { ...body, stream: true },
    signal,
  });
}

export function openReplay({ key, conversationId, from, signal }) {
  return gateway("/stream", { credential: key, accept: "text/event-stream", query: { conv_id: conversationId, from },
    signal });
}

// Stop a generation (idempotent on the server).
export function stopStream(key, conversationId) {
  return v1("DELETE", `/stream?conv_id=${encodeURIComponent(conversationId)}`, undefined, { key });
}

// {id: describe()} for the ids the gateway still has (POST /v1/streams/lookup, ≤ 1000 ids a call).
export async function lookupStreams(key, ids, signal) {
  const found = new Map();
  for (let i = 0; i < ids.length; i += 1000) {
    const { sessions } = await v1("POST", "/streams/lookup", { conversation_ids: ids.slice(i, i + 1000) }, { key, signal });
    for (const session of sessions || []) found.set(session.conversation_id, session);
  }
  return found;
}

// Streamed tool calls (vLLM's shape, docs/chat.md "Tools"): the first delta of a call carries its
// `index`, `id`, `function.name` and "" arguments; later ones the same `index` and a fragment of
// `function.arguments`. Folded into `message.toolCalls` [{id, name, arguments}], by index.
function foldToolCalls(message, deltas) {
  const calls = message.toolCalls || (message.toolCalls = []);
  for (const d of deltas) {
    if (!d || !Number.isInteger(d.index) || d.index < 0 || d.index > 127) continue;
    const call = calls[d.index] || (calls[d.index] = { id: "", name: "", arguments: "" });
    const fn = d.function || {};
    if (typeof d.id === "string" && d.id) call.id = d.id;
    if (typeof fn.name === "string" && fn.name) call.name += fn.name;
    if (typeof fn.arguments === "string") call.arguments += fn.arguments;
  }
  for (let i = 0; i < calls.length; i += 1) if (!calls[i]) calls[i] = { id: "", name: "", arguments: "" };
}

// Fold one event's data into `message` ({content, reasoning, toolCalls, tokens, firstTokenAt,
// usageTokens, finishReason}). Returns "done" for [DONE], an Error for an error event, otherwise null.
export function applyChunk(message, data) {
  if (data === null) return null;
  if (data.trim() === "[DONE]") return "done";
  let chunk;
  try {
    chunk = JSON.parse(data);
  } catch (_) {
    return null; // not JSON: nothing a chat can show
  }
  if (chunk && chunk.error) {
    const e = chunk.error;
    return new Error(typeof e === "string" ? e : e.message || "The model reported an error.");
  }
  const choice = chunk && Array.isArray(chunk.choices) ? chunk.choices[0] : null;
  const delta = (choice && choice.delta) || {};
  const reasoning = delta.reasoning_content ?? delta.reasoning;
  let token = false;
  if (typeof reasoning === "string" && reasoning) {
    message.reasoning = (message.reasoning || "") + reasoning;
    token = true;
  }
  if (typeof delta.content === "string" && delta.content) {
    message.content += delta.content;
    token = true;
  }
  if (Array.isArray(delta.tool_calls)) {
    foldToolCalls(message, delta.tool_calls);
    token = true;
  }
  if (token) {
    message.tokens = (message.tokens || 0) + 1;
    if (!message.firstTokenAt) message.firstTokenAt = Date.now();
  }
  if (choice && choice.finish_reason) message.finishReason = choice.finish_reason;
  if (chunk && chunk.usage && Number.isFinite(chunk.usage.completion_tokens)) {
    message.usageTokens = chunk.usage.completion_tokens;
  }
  return null;
}
