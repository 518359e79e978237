// The chat's client for the inference gateway (/v1), separate from api.js (which speaks to /api
// with the admin credential): every call here sends `Authorization: Bearer <inference key>`.
//
// - `v1(method, path, body, {key, signal})`: a JSON call (GET /v1/models, POST /v1/streams/lookup,
//   DELETE /v1/stream); throws GatewayError for a non-2xx answer.
// - `openCompletion(...)` / `openReplay(...)`: POST /v1/chat/completions with `stream: true` and
//   `X-Conversation-Id`, or GET /v1/stream?conv_id=&from=<byte offset> (docs/gateway.md); both
//   resolve to the Response once its headers say 2xx.
// - `readEvents(response, onEvent)`: reads the body as bytes and calls `onEvent(data, end)` for each
//   complete SSE event, `end` being the byte count consumed so far (the offset to resume from: it
//   only ever advances at an event boundary, "\n\n").
// - `applyChunk(message, data)`: folds one `data:` payload into a message record.

export class GatewayError extends Error {
  constructor(status, message, code = "") {
    super(message);
    this.name = "GatewayError";
    this.status = status;
    this.code = code;
  }
}

// The gateway answers in the OpenAI shape ({"error": {"message"}}); an upstream may relay its own.
async function failure(response) {
  let message = "";
  try {
    const text = await response.text();
    try {
      const payload = JSON.parse(text);
      const error = payload && payload.error;
      message = (error && (error.message || (typeof error === "string" ? error : "")))
        || payload.message || payload.detail || "";
      if (typeof message !== "string") message = JSON.stringify(message);
    } catch (_) {
      message = text.slice(0, 300);
    }
  } catch (_) { /* the body could not be read: the status says enough */ }
  let prefix = "";
  if (response.status === 401) prefix = "The inference key was refused";
  else if (response.status === 502) prefix = "No model is answering (start one on the Runtime page)";
  else if (response.status === 404 && !message) prefix = "Not found";
  const text = [prefix, message].filter(Boolean).join(": ") || `The gateway answered ${response.status}.`;
  return new GatewayError(response.status, text);
}

function unreachable(err) {
  if (err && err.name === "AbortError") return err;
  const wrapped = new GatewayError(0, "The server is not answering. Check that vllm-use is running.", "unreachable");
  wrapped.network = true;
  return wrapped;
}

export async function v1(method, path, body, { key, signal } = {}) {
  const headers = { Accept: "application/json", Authorization: `Bearer ${key}` };
  const init = { method, headers, signal, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(`/v1${path}`, init);
  } catch (err) {
    throw unreachable(err);
  }
  if (!response.ok) throw await failure(response);
  if (response.status === 204) return null;
  return response.json();
}

export async function openCompletion({ key, conversationId, body, signal }) {
  let response;
  try {
    response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: {
        Authorization: `Bearer ${key}`,
        "Content-Type": "application/json",
        Accept: "text/event-stream",
        "X-Conversation-Id": conversationId,
      },
      body: JSON.stringify({ ...body, stream: true }),
      signal,
      cache: "no-store",
    });
  } catch (err) {
    throw unreachable(err);
  }
  if (!response.ok) throw await failure(response);
  return response;
}

export async function openReplay({ key, conversationId, from, signal }) {
  const query = new URLSearchParams({ conv_id: conversationId, from: String(from) });
  let response;
  try {
    response = await fetch(`/v1/stream?${query}`, {
      headers: { Authorization: `Bearer ${key}`, Accept: "text/event-stream" },
      signal,
      cache: "no-store",
    });
  } catch (err) {
    throw unreachable(err);
  }
  if (!response.ok) throw await failure(response);
  return response;
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

// --- SSE over bytes ---------------------------------------------------------------------------------

// Index just past the first event separator ("\n\n" or "\r\n\r\n") in `bytes`, or -1.
function eventEnd(bytes, from) {
  for (let i = Math.max(0, from); i < bytes.length - 1; i += 1) {
    if (bytes[i] !== 10) continue;
    if (bytes[i + 1] === 10) return i + 2;
    if (bytes[i + 1] === 13 && bytes[i + 2] === 10) return i + 3; // "\n\r\n" (CRLF lines)
  }
  return -1;
}

// Reads `response.body` to its end. `onEvent(data, consumed)` gets each event's `data:` lines joined
// (or null for an event without data) and the number of bytes consumed through the end of that
// event, counted from the start of this response; once it returns true, later events are ignored
// but the body is still read to its end (cancelling it would show as a failed request).
export async function readEvents(response, onEvent) {
  // Chromium cancels a fetch whose body a reader drains before the request has completed
  // (DevTools shows "(canceled)", net::ERR_ABORTED, and the connection may be closed). A clone
  // read with text() keeps the request alive until it completes; its copy is dropped.
  const keeper = response.clone().text().catch(() => "");
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let pending = new Uint8Array(0);
  let consumed = 0;
  let finished = false;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) {
      await keeper;
      return finished;
    }
    if (finished || !value || !value.length) continue;
    const joined = new Uint8Array(pending.length + value.length);
    joined.set(pending, 0);
    joined.set(value, pending.length);
    pending = joined;
    let start = 0;
    let end;
    while (!finished && (end = eventEnd(pending, start)) >= 0) {
      // A whole event: its bytes decode on their own (a character split across reads is whole here).
      const text = decoder.decode(pending.subarray(start, end));
      consumed += end - start;
      start = end;
      const data = [];
      for (const line of text.split(/\r?\n/)) {
        if (line.startsWith("data:")) data.push(line.slice(line.startsWith("data: ") ? 6 : 5));
      }
      if (onEvent(data.length ? data.join("\n") : null, consumed) === true) finished = true;
    }
    pending = pending.slice(start);
  }
}

// Fold one event's data into `message` ({content, reasoning, tokens, firstTokenAt, usageTokens,
// finishReason}). Returns "done" for [DONE], an Error for an error event, otherwise null.
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
