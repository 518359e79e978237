// The console's one HTTP layer, under both of its clients: api.js (/api, with the admin credential)
// and chat/stream.js (/v1, with the chat's inference key). Each client maps errors to its own type.
//
// - `send(url, options)`: every fetch. Sends `Authorization: Bearer <credential>` (never a query
//   parameter), a JSON body, query parameters, the abort signal, `cache: "no-store"`. Resolves to
//   the Response once its status is 2xx. An abort rethrows the AbortError as it is; a failed fetch
//   (the server unreachable) throws `unreachable(err)` (the fetch's own TypeError without one); any
//   other status throws `await failure(response)`.
// - `readEvents(response, onEvent, {keepRequest})`: every Server-Sent-Events body (the /api event
//   streams, the chat's completions and replays), read as bytes so that a caller can count them.

export const UNREACHABLE = "The server is not answering. Check that vllm-use is running.";

// options: {method, credential, accept, headers, query, body, signal, unreachable(err), failure(response)}
// (`failure` is required). An empty credential sends no Authorization header; `query` skips null
// and undefined values; `body` (any JSON value) is sent as JSON when given.
export async function send(url, {
  method = "GET", credential, accept = "application/json", headers = {}, query, body, signal, unreachable, failure,
} = {}) {
  const all = { Accept: accept, ...headers };
  if (credential) all.Authorization = `Bearer ${credential}`;
  if (query) {
    const params = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== null) params.set(k, String(v));
    if ([...params].length) url += `?${params}`;
  }
  const init = { method, headers: all, signal, cache: "no-store" };
  if (body !== undefined) {
    all["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (err) {
    if (err.name === "AbortError" || !unreachable) throw err;
    throw unreachable(err);
  }
  if (!response.ok) throw await failure(response);
  return response;
}

// --- Server-Sent Events over bytes ------------------------------------------------------------------

// Index just past the first event separator ("\n\n" or "\r\n\r\n") in `bytes`, or -1.
function eventEnd(bytes, from) {
  for (let i = Math.max(0, from); i < bytes.length - 1; i += 1) {
    if (bytes[i] !== 10) continue;
    if (bytes[i + 1] === 10) return i + 2;
    if (bytes[i + 1] === 13 && bytes[i + 2] === 10) return i + 3; // "\n\r\n" (CRLF lines)
  }
  return -1;
}

// Reads `response.body` to its end. `onEvent({type, data, end})` gets each complete event: its
// `event:` name ("message" without one); its `data:` lines joined with "\n" (null for an event
// without data, such as a ": heartbeat" comment); and `end`, the number of bytes of this body
// consumed through that event, counted before decoding: the offset a replay resumes from
// (`from=`, docs/gateway.md), which only ever advances at an event boundary. Once `onEvent`
// returns true, later events are ignored but the body is still read to its end (cancelling it
// would show as a failed request). Resolves to whether `onEvent` ended it.
//
// `keepRequest`: for a body that ends (a completion). Chromium cancels a fetch whose body a reader
// drains before the request has completed (DevTools shows "(canceled)", net::ERR_ABORTED, and the
// connection may be closed). A clone read with text() keeps the request alive until it completes;
// its copy is dropped. Not for an endless stream: the clone would keep all of it in memory.
export async function readEvents(response, onEvent, { keepRequest = false } = {}) {
  const keeper = keepRequest ? response.clone().text().catch(() => "") : null;
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
      let type = "message";
      const data = [];
      for (const line of text.split(/\r?\n/)) {
        if (line.startsWith("event:")) type = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(line.startsWith("data: ") ? 6 : 5));
      }
      if (onEvent({ type, data: data.length ? data.join("\n") : null, end: consumed }) === true) finished = true;
    }
    pending = pending.slice(start);
  }
}
