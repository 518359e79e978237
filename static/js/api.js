// The one API client: every call to /api goes through `api()`.
//
// - Sends `Authorization: Bearer <credential>` (never a query parameter) and JSON bodies.
// - Resolves to the parsed JSON body (or null for 204).
// - Throws ApiError for any non-2xx answer, carrying the server's code, message and, for invalid
//   arguments, the per-field errors (`fieldErrors`: {"revision": "not of the expected form: …"}).
// - A 401 anywhere signs the console out: listeners of "vllm-use:unauthenticated" on window show
//   the sign-in page with the server's reason.

import { credential } from "./session.js";

export class ApiError extends Error {
  constructor(status, code, message, errors = []) {
    super(message);
    this.status = status;
    this.code = code;
    this.errors = errors;
    this.fieldErrors = {};
    for (const e of errors) {
      const field = (e.loc || []).join(".");
      if (field && !(field in this.fieldErrors)) this.fieldErrors[field] = e.msg;
    }
  }
}

export async function api(method, path, body = undefined, { query, signal } = {}) {
  const headers = { Accept: "application/json" };
  const token = credential();
  if (token) headers.Authorization = `Bearer ${token}`;
  let url = `/api${path}`;
  if (query) {
    const params = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== null) params.set(k, String(v));
    if ([...params].length) url += `?${params}`;
  }
  const init = { method, headers, signal, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, "unreachable", "The server is not answering. Check that vllm-use is running.");
  }
  if (response.status === 204) return null;
  let payload = null;
  try {
    payload = await response.json();
  } catch (_) {
    payload = null;
  }
  if (response.ok) return payload;
  const error = (payload && payload.error) || {};
  // Invalid arguments list each field's problem in `errors`; other errors about one field
  // (a conflict on a path, say) name it in `loc`.
  let errors = error.errors || [];
  if (!errors.length && Array.isArray(error.loc) && error.loc.length) errors = [{ loc: error.loc, msg: error.message }];
  const failure = new ApiError(
    response.status,
    error.code || `http_${response.status}`,
    error.message || `The server answered ${response.status}.`,
    errors,
  );
  if (response.status === 401) {
    window.dispatchEvent(new CustomEvent("vllm-use:unauthenticated", { detail: failure.message }));
  }
  throw failure;
}

// Server-sent events from /api (downloads progress). EventSource cannot send headers, so this
// reads the stream with fetch; `onEvent(type, data)` gets each event's parsed JSON.
export async function events(path, onEvent, { signal } = {}) {
  const response = await fetch(`/api${path}`, {
    headers: { Authorization: `Bearer ${credential()}`, Accept: "text/event-stream" },
    signal,
    cache: "no-store",
  });
  if (!response.ok) {
    if (response.status === 401) window.dispatchEvent(new CustomEvent("vllm-use:unauthenticated"));
    throw new ApiError(response.status, `http_${response.status}`, `The event stream answered ${response.status}.`);
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let type = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) type = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
      }
      if (data.length) {
        try {
          onEvent(type, JSON.parse(data.join("\n")));
        } catch (_) {
          onEvent(type, data.join("\n"));
        }
      }
    }
  }
}
