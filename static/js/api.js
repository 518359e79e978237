// The one API client: every call to /api goes through `api()`, every /api event stream through
// `events()`, both over http.js (the console's one fetch wrapper and SSE reader).
//
// - Sends `Authorization: Bearer <credential>` (never a query parameter) and JSON bodies.
// - Resolves to the parsed JSON body (or null for 204).
// - Throws ApiError for any non-2xx answer, carrying the server's code, message and, for invalid
//   arguments, the per-field errors (`fieldErrors`: {"revision": "not of the expected form: …"}).
// - A 401 anywhere signs the console out: listeners of "vllm-use:unauthenticated" on window show
//   the sign-in page with the server's reason.

import { UNREACHABLE, readEvents, send } from "./http.js";
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

const unauthenticated = (detail = null) => window.dispatchEvent(new CustomEvent("vllm-use:unauthenticated", { detail }));

// A non-2xx answer as an ApiError, from the server's {"error": {code, message, errors, loc}}.
async function failure(response) {
  let payload = null;
  try {
    payload = await response.json();
  } catch (_) {
    payload = null;
  }
  const error = (payload && payload.error) || {};
  // Invalid arguments list each field's problem in `errors`; other errors about one field
  // (a conflict on a path, say) name it in `loc`.
  let errors = error.errors || [];
  if (!errors.length && Array.isArray(error.loc) && error.loc.length) errors = [{ loc: error.loc, msg: error.message }];
  const failed = new ApiError(
    response.status,
    error.code || `http_${response.status}`,
    error.message || `The server answered ${response.status}.`,
    errors,
  );
  if (response.status === 401) unauthenticated(failed.message);
  return failed;
}

export async function api(method, path, body = undefined, { query, signal } = {}) {
  const response = await send(`/api${path}`, {
    method, credential: credential(), query, body, signal, failure,
    unreachable: () => new ApiError(0, "unreachable", UNREACHABLE),
  });
  if (response.status === 204) return null;
  try {
    return await response.json();
  } catch (_) {
    return null;
  }
}

// Server-sent events from /api (downloads, runtime, deployments). EventSource cannot send headers,
// so this reads the stream with fetch; `onOpen()` runs once the server has answered (it sends its
// headers before any event), `onEvent(type, data)` gets each event with data, its data parsed as
// JSON (the text when it is not JSON). Resolves when the server ends the stream.
// A page's first reads: `paths` (in order) and the published methods, whose schemas its forms are
// built from. The methods failing leaves `{error}` in their place (the page still shows what it
// lists); any other failure, an abort or a lost sign-in, is thrown.
export async function readWithMethods(paths, { signal } = {}) {
  const get = (path) => api("GET", path, undefined, { signal });
  const methods = get("/methods").catch((error) => {
    if (error.name === "AbortError" || error.status === 401) throw error;
    return { error };
  });
  return Promise.all([...paths.map(get), methods]);
}

export async function events(path, onEvent, { signal, onOpen } = {}) {
  const response = await send(`/api${path}`, {
    credential: credential(), accept: "text/event-stream", signal,
    failure: (answer) => {
      if (answer.status === 401) unauthenticated();
      return new ApiError(answer.status, `http_${answer.status}`, `The event stream answered ${answer.status}.`);
    },
  });
  if (onOpen) onOpen();
  await readEvents(response, ({ type, data }) => {
    if (data === null) return;
    let value;
    try {
      value = JSON.parse(data);
    } catch (_) {
      value = data;
    }
    onEvent(type, value);
  });
}
