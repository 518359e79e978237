// MCP: how to connect an MCP client (an AI agent) to this server's /mcp endpoint.
// API: GET /api/mcp (mcp.status: endpoint, protocol version, transport, tool count) and
// GET /api/methods (each method's MCP scope, to list which tools each mcp.* scope gives).
//
// The examples carry a placeholder where the key goes, never the console's own credential: the
// admin token is refused on /mcp anyway, and an agent should get its own mcp.* key. "Create a key
// for this agent" makes one here (POST /api/keys with the chosen mcp.* scopes) and fills its secret
// into the examples, shown once: it lives only in this page's DOM and goes when the page is left.
import { api } from "../api.js";
import { clear, copyButton, errorSlot, field, h, humanError, pageHeader, placeholder, reportFailure, showError } from "../ui.js";

const KEY_PLACEHOLDER = "<an mcp.* key>";

// What each scope allows on /mcp (vllm_use/scopes.py). Only mcp.admin implies the others.
const SCOPES = [
  ["mcp.read", "Read tools: system, GPUs, models, downloads, runtime status and logs, settings, recent requests."],
  ["mcp.models", "Register, scan and delete models; start, cancel and retry downloads."],
  ["mcp.runtime", "Start, switch, restart and stop vLLM."],
  ["mcp.admin", "Every MCP tool, including API keys and changing settings."],
];

export async function render(root, page) {
  const body = h("div.mcp", placeholder(8));
  root.append(
    pageHeader("MCP",
      "Connect an AI agent to this server over the Model Context Protocol: it can do what an admin does "
      + "in this console, within the scopes of its API key."),
    body);
  let status;
  try {
    status = await api("GET", "/mcp", undefined, { signal: page.signal });
  } catch (error) {
    if (error.name === "AbortError" || error.status === 401) return;
    clear(body, h("p.error-text", { role: "alert" }, `Could not load the MCP endpoint: ${humanError(error)}`));
    return;
  }
  const scopes = scopesCard();
  const config = configCard(status);
  const curl = curlCard(status);
  const fill = (secret) => {
    config.fill(secret);
    curl.fill(secret);
  };
  clear(body, endpointCard(status), keyCard(page, fill), config.element, curl.element, scopes.element);
  scopes.load(page);
}

// Which mcp.* scopes a key made here gets (scopes do not include each other, except mcp.admin).
const PRESETS = [
  ["read", ["mcp.read"], "Read only (mcp.read)"],
  ["manage", ["mcp.read", "mcp.models", "mcp.runtime"], "Read, manage models and run them (mcp.read, mcp.models, mcp.runtime)"],
  ["admin", ["mcp.admin"], "Everything, keys and settings included (mcp.admin)"],
];

// "Create a key for this agent": a name, the scopes, and the secret filled into the examples below.
function keyCard(page, fill) {
  const today = new Date().toISOString().slice(0, 10);
  const name = h("input", { name: "name", type: "text", autocomplete: "off", spellcheck: "false",
    value: `agent ${today}`, maxlength: "128" });
  const preset = h("select", { name: "scopes" },
    PRESETS.map(([value, , label]) => h("option", { value }, label)));
  const button = h("button.button.primary", { type: "submit" }, "Create a key for this agent");
  const slot = errorSlot();
  const result = h("div.mcp-key-result");
  const form = h("form.mcp-key-form", { novalidate: true },
    field("Key name", name, "To recognise it later on the API keys page."),
    field("Scopes", preset, "What the agent may do; a key works on /mcp only."),
    h("div.actions", button), slot);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    showError(slot, null);
    if (!name.value.trim()) {
      reportFailure(form, slot, { fieldErrors: { name: "Give the key a name." } });
      return;
    }
    const scopes = PRESETS.find(([value]) => value === preset.value)[1];
    button.disabled = true;
    try {
      const created = await api("POST", "/keys", { name: name.value.trim(), scopes }, { signal: page.signal });
      form.hidden = true;
      fill(created.secret);
      const secret = h("input.secret", { type: "text", readonly: true, "aria-label": "Secret", value: created.secret,
        spellcheck: "false", autocomplete: "off" });
      clear(result,
        h("p", "Key ", h("strong", created.key.name), " created with ",
          created.key.scopes.map((s, i) => [i ? ", " : "", h("code", s)]), "; its secret is filled in below."),
        h("div.mcp-secret-row", secret, copyButton(() => secret.value)),
        h("p.mcp-warning", { role: "status" }, h("strong", "Copy it now: it will not be shown again."),
          " vllm-use keeps only a hash of it. Leaving this page removes it from the page."));
    } catch (error) {
      button.disabled = false;
      reportFailure(form, slot, error);
    }
  });
  return h("section.card", { "aria-labelledby": "mcp-key" },
    h("h2#mcp-key", "A key for this agent"),
    h("p", "An agent needs its own API key with an mcp.* scope. Create one here and it is filled into the "
      + "examples below, or use one from the ", h("a", { href: "/keys" }, "API keys page"), "."),
    form, result);
}

function endpointCard(s) {
  const here = `${location.origin}/mcp`;
  return h("section.card", { "aria-labelledby": "mcp-endpoint" },
    h("h2#mcp-endpoint", "Endpoint"),
    facts([
      ["Endpoint URL", h("code.mcp-endpoint-url", s.endpoint)],
      ["Protocol version", s.protocol_version],
      ["Transport", s.transport],
      ["Tools", `${s.tool_count} in all; a key sees only those its scopes allow`],
    ]),
    here !== s.endpoint
      ? h("p.hint", "This browser reaches the server at ", h("code", here),
        ": a client on this computer may need that address instead.")
      : null);
}

function configCard(s) {
  const text = (key) => JSON.stringify({
    mcpServers: {
      "vllm-use": { type: "http", url: s.endpoint, headers: { Authorization: `Bearer ${key}` } },
    },
  }, null, 2);
  const pre = h("pre#mcp-config-json.mcp-code", { tabindex: "0", "aria-label": "Client configuration (JSON)" },
    text(KEY_PLACEHOLDER));
  const note = h("p", "For an MCP client that speaks streamable HTTP (most take this shape). Replace ",
    h("code", KEY_PLACEHOLDER), " with an API key that has an mcp.* scope (create one above). "
    + "The admin token you signed in with is not accepted on /mcp.");
  const element = h("section.card", { "aria-labelledby": "mcp-config" },
    h("div.mcp-card-head", h("h2#mcp-config", "Client configuration"), copyButton(() => pre.textContent)),
    note, pre);
  const fill = (key) => {
    pre.textContent = text(key);
    clear(note, "For an MCP client that speaks streamable HTTP (most take this shape), with the key just created.");
  };
  return { element, fill };
}

function curlCard(s) {
  const pre = h("pre#mcp-curl-command.mcp-code", { tabindex: "0", "aria-label": "curl command" }, curlText(s, KEY_PLACEHOLDER));
  const element = h("section.card", { "aria-labelledby": "mcp-curl" },
    h("div.mcp-card-head", h("h2#mcp-curl", "Try it with curl"), copyButton(() => pre.textContent)),
    h("p", "Lists the tools your key may call. Every request needs the MCP-Protocol-Version and Mcp-Method "
      + "headers and the same protocol version in params._meta; a tools/call also needs an Mcp-Name header "
      + "equal to the tool's name."),
    pre);
  return { element, fill: (key) => { pre.textContent = curlText(s, key); } };
}

function curlText(s, key) {
  const version = s.protocol_version;
  // Valid JSON across lines (the shell keeps the newlines inside the quotes), as in the README.
  const body = [
    `{"jsonrpc": "2.0", "id": 1, "method": "tools/list",`,
    `       "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "${version}",`,
    `                            "io.modelcontextprotocol/clientCapabilities": {}}}}`,
  ].join("\n");
  return [
    `KEY='${key}'`,
    `curl -s '${s.endpoint}' \\`,
    `  -H "Authorization: Bearer $KEY" \\`,
    "  -H 'Accept: application/json, text/event-stream' \\",
    "  -H 'Content-Type: application/json' \\",
    `  -H 'MCP-Protocol-Version: ${version}' \\`,
    "  -H 'Mcp-Method: tools/list' \\",
    `  -d '${body}'`,
  ].join("\n");
}

// The scopes, each with the tools it gives (read from GET /api/methods, so it matches the server).
function scopesCard() {
  const tools = new Map(SCOPES.map(([scope]) => [scope, h("div.mcp-tools", h("span.muted", "Loading the tools…"))]));
  const slot = h("p.error-text", { role: "alert", hidden: true });
  const element = h("section.card", { "aria-labelledby": "mcp-scopes" },
    h("h2#mcp-scopes", "Scopes and tools"),
    h("p", "A key's scopes decide which tools it sees in tools/list and may call. Scopes do not include each "
      + "other, except mcp.admin: a key with only mcp.runtime cannot read runtime.status, so give it mcp.read "
      + "too. Keys with mcp.* scopes work on /mcp only, not on /api or /v1."),
    h("ul.mcp-scope-list", SCOPES.map(([scope, text]) => h("li", { dataset: { scope } },
      h("h3", h("code", scope)),
      h("div", h("p", text), tools.get(scope))))),
    slot);

  const load = async (page) => {
    let methods;
    try {
      methods = (await api("GET", "/methods", undefined, { signal: page.signal })).methods;
    } catch (error) {
      if (error.name === "AbortError" || error.status === 401) return;
      slot.hidden = false;
      slot.textContent = `Could not load the list of tools: ${humanError(error)}`;
      for (const cell of tools.values()) clear(cell);
      return;
    }
    for (const [scope, cell] of tools) {
      const own = methods.filter((m) => m.scope && m.scope.mcp === scope).map((m) => m.name);
      clear(cell, own.length
        ? h("ul.mcp-tool-list", { "aria-label": `Tools for ${scope}` }, own.map((n) => h("li", h("code", n))))
        : null,
      scope === "mcp.admin" ? h("p.hint", "… and every tool above.") : null);
    }
    const anyKey = methods.filter((m) => m.public).map((m) => m.name);
    if (anyKey.length) {
      element.append(h("p.hint", "Any key with an mcp.* scope may also call ",
        anyKey.map((n, i) => [i ? ", " : "", h("code", n)]), "."));
    }
  };
  return { element, load };
}

// A facts list (<dl class="facts">) of [term, value] pairs.
function facts(rows) {
  return h("dl.facts", rows.map(([term, value]) => [h("dt", term), h("dd", value)]));
}
