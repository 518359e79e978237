// The chat's tools (docs/chat.md, "Tools"; the API is docs/tools.md): the "Tools" disclosure in the
// conversation's settings, the tool listing (GET /tools) and a call (POST /tools), with the tool key.
//
// - The tool key: an API key with the `tools` scope, made on first need like the playground key and
//   by the same machinery (chat/key.js `createKeeper(TOOLS)`: under a lock, named "chat tools ·
//   <browser> · <date>", its secret in localStorage under `vllm-use.chat-tools-key`). It is sent
//   to /tools only, in an Authorization header.
// - The listing is asked for when the disclosure is first opened, or when a conversation with tools
//   selected needs it (a send, a tool loop): a chat that never uses tools never makes a tool key.
//   Without a stored key the page first asks GET /tools with none: a 404 says tools are off on this
//   server (no key is made), a 401 that they are on (the key is made then).
// - Each listed tool is a checkbox: its display name, a "write" mark, its rough cost in the prompt
//   ("~N tokens", the definition's JSON length / 4). An MCP server that is down shows disabled, with
//   its error. The selection (tool names) is kept per conversation by the page (`apply()`,
//   `selected()`); `definitions(names)` are what a completion request's `tools` gets.
// - `call({name, params, stream, signal, onChunk})` resolves to the text of the tool message
//   (plain_text_response as is, any other JSON object stringified; a stream's chunks joined); it
//   throws ToolsError, in words, when /tools refused the call (401, 404, 429, the network): then
//   the tool did not run.

import { UNREACHABLE, readEvents, send } from "../http.js";
import { h, humanError } from "../ui.js";
import { TOOLS, createKeeper } from "./key.js";

export class ToolsError extends Error {
  constructor(status, message) {
    super(message);
    this.name = "ToolsError";
    this.status = status;
  }
}

async function failure(response) {
  let said = "";
  try {
    const payload = await response.json();
    if (payload && typeof payload.error === "string") said = payload.error;
  } catch (_) { /* no JSON: the status says enough */ }
  const words = {
    401: "The tool key was refused (deleted, disabled, or without the tools scope)",
    404: "Not found",
    413: "The call is too large for /tools",
    429: "Too many tool calls at once with this key; try again in a moment",
  }[response.status];
  const text = [words, said].filter(Boolean).join(": ");
  return new ToolsError(response.status, text || `/tools answered ${response.status}.`);
}

const unreachable = () => new ToolsError(0, UNREACHABLE);
const tokensOf = (definition) => Math.max(1, Math.round(JSON.stringify(definition || {}).length / 4));

// The text a tool message gets from a (non-streamed) answer of POST /tools.
export function resultText(answer) {
  if (answer && typeof answer.plain_text_response === "string") return answer.plain_text_response;
  return JSON.stringify(answer);
}

export function createToolPicker({ signal, onChange }) {
  const keeper = createKeeper(TOOLS, { signal });
  const note = h("p.tools-note");
  const list = h("ul.tools-list");
  const count = h("span.tools-count");
  const details = h("details.chat-tools", h("summary", "Tools ", count), note, list);
  let listing = null; // the entries of GET /tools, once answered
  let off = false; // GET /tools said 404: tools are off on this server
  let loading = null;
  let chosen = []; // tool names selected in the conversation shown

  const showCount = () => {
    count.textContent = chosen.length ? `(${chosen.length} on)` : "";
  };

  const draw = () => {
    showCount();
    if (off) {
      note.textContent = "Tools are off on this server. Start vllm-use with --tools NAME[,NAME…] "
        + "(e.g. --tools get_datetime) to let the model call them.";
      list.replaceChildren();
      return;
    }
    if (!listing) return;
    note.textContent = listing.length ? "The model may call the tools checked here; a tool that can write "
      + "asks you first." : "No tool is enabled on this server.";
    list.replaceChildren(...listing.map((t) => {
      const box = h("input", { type: "checkbox", value: t.tool, name: "tool", checked: chosen.includes(t.tool),
        disabled: !t.available });
      box.addEventListener("change", () => {
        chosen = box.checked ? [...new Set([...chosen, t.tool])] : chosen.filter((n) => n !== t.tool);
        showCount();
        onChange();
      });
      return h("li.tool-option", { dataset: { tool: t.tool } },
        h("label", box, ` ${t.display_name || t.tool}`),
        t.permissions && t.permissions.write
          ? h("span.tool-write", { title: "This tool can write: each call asks you first." }, "write") : null,
        t.available ? h("span.tool-cost", `~${tokensOf(t.definition)} tokens`)
          : h("span.tool-unavailable.error-text", t.error || "unavailable"));
    }));
  };

  const get = (key) => send("/tools", { credential: key, signal, unreachable, failure });

  // GET /tools: the listing, or null when tools are off; the note says what went wrong otherwise.
  const load = async () => {
    note.textContent = "Listing the tools…";
    try {
      let key = keeper.key;
      if (!key) {
        try {
          await get(""); // (never answered 200 without a key)
        } catch (err) {
          if (err.status === 404) {
            off = true;
            draw();
            return null;
          }
          if (err.status !== 401) throw err;
        }
        key = await keeper.ensure();
        if (!key) throw new Error("no tool key could be made (an admin credential with admin.write is needed)");
      }
      let response;
      try {
        response = await get(key);
      } catch (err) {
        if (err.status !== 401) throw err;
        keeper.refused(key); // deleted or disabled on the API keys page: a new one, once
        response = await get(await keeper.ensure());
      }
      listing = (await response.json()).filter((t) => t && typeof t.tool === "string");
      off = false;
    } catch (err) {
      if (err.status === 404) off = true;
      else note.textContent = `The tools could not be listed: ${humanError(err)}`;
      if (!off) return null;
    }
    draw();
    return listing;
  };

  // The listing, asked for once (again after a failure).
  const ready = () => {
    if (listing || off) return Promise.resolve(listing);
    if (!loading) loading = load().finally(() => { loading = null; });
    return loading;
  };

  details.addEventListener("toggle", () => { if (details.open) ready(); });

  const find = (name) => (listing || []).find((t) => t.tool === name && t.available) || null;

  // One call; the key is replaced once when /tools refuses it (401), as the runner does for /v1.
  const call = async ({ name, params, stream, signal: callSignal, onChunk }) => {
    let key = await keeper.ensure();
    if (!key) throw new ToolsError(401, "No tool key could be made (an admin credential with admin.write is needed).");
    let response;
    const body = { tool: name, params, ...(stream ? { stream: true } : {}) };
    const post = (k) => send("/tools", { method: "POST", credential: k, body,
      accept: stream ? "text/event-stream" : "application/json", signal: callSignal, unreachable, failure });
    try {
      response = await post(key);
    } catch (err) {
      if (err.status !== 401) throw err;
      keeper.refused(key);
      key = await keeper.ensure();
      if (!key) throw err;
      response = await post(key);
    }
    if (!stream) return resultText(await response.json());
    let text = "";
    let end = null;
    await readEvents(response, ({ data }) => {
      if (data === null) return false;
      let event;
      try {
        event = JSON.parse(data);
      } catch (_) {
        return false;
      }
      if (typeof event.chunk === "string") {
        text += event.chunk;
        onChunk(text);
      }
      if (event.done) {
        end = event;
        return true;
      }
      return false;
    }, { keepRequest: true });
    if (!end) throw new ToolsError(0, "The tool's output broke off before it ended.");
    if (!end.error) return text;
    return text ? `${text}\n[error: ${end.error}]` : JSON.stringify({ error: end.error });
  };

  return {
    element: details,
    ready,
    find,
    call,
    // The conversation's selection (names), shown.
    apply(names) {
      chosen = Array.isArray(names) ? [...names] : [];
      draw();
    },
    selected: () => [...chosen],
    // The definitions of the tools `names` that the listing has (and can be called).
    definitions(names) {
      return (names || []).map(find).filter(Boolean).map((t) => t.definition);
    },
  };
}
