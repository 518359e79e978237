// MCP: how to connect an MCP client (an AI agent) to this server's /mcp endpoint.
// API: GET /api/mcp (mcp.status: endpoint, protocol version, transport, tool count) and
// GET /api/methods (each method's MCP scope, to list which tools each mcp.* scope gives).
//
// The examples carry a placeholder where the key goes, never the console's own credential: the
// admin token is refused on /mcp anyway, and an agent should get its own mcp.* key (API keys page).
import { api } from "../api.js";
import { clear, copyButton, h, humanError, pageHeader, placeholder } from "../ui.js";

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
  clear(body, endpointCard(status), configCard(status), curlCard(status), scopes.element);
  scopes.load(page);
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
  const config = JSON.stringify({
    mcpServers: {
      "vllm-use": { type: "http", url: s.endpoint, headers: { Authorization: `Bearer ${KEY_PLACEHOLDER}` } },
    },
  }, null, 2);
  return h("section.card", { "aria-labelledby": "mcp-config" },
    h("div.mcp-card-head", h("h2#mcp-config", "Client configuration"), copyButton(() => config)),
    h("p", "For an MCP client that speaks streamable HTTP (most take this shape). Replace ",
      h("code", KEY_PLACEHOLDER), " with an API key that has an mcp.* scope: ",
      h("a", { href: "/keys" }, "create one on the API keys page"),
      ". The admin token you signed in with is not accepted on /mcp."),
    h("pre#mcp-config-json.mcp-code", { tabindex: "0", "aria-label": "Client configuration (JSON)" }, config));
}

function curlCard(s) {
  const version = s.protocol_version;
  // Valid JSON across lines (the shell keeps the newlines inside the quotes), as in the README.
  const body = [
    `{"jsonrpc": "2.0", "id": 1, "method": "tools/list",`,
    `       "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "${version}",`,
    `                            "io.modelcontextprotocol/clientCapabilities": {}}}}`,
  ].join("\n");
  const command = [
    `KEY='${KEY_PLACEHOLDER}'`,
    `curl -s '${s.endpoint}' \\`,
    `  -H "Authorization: Bearer $KEY" \\`,
    "  -H 'Accept: application/json, text/event-stream' \\",
    "  -H 'Content-Type: application/json' \\",
    `  -H 'MCP-Protocol-Version: ${version}' \\`,
    "  -H 'Mcp-Method: tools/list' \\",
    `  -d '${body}'`,
  ].join("\n");
  return h("section.card", { "aria-labelledby": "mcp-curl" },
    h("div.mcp-card-head", h("h2#mcp-curl", "Try it with curl"), copyButton(() => command)),
    h("p", "Lists the tools your key may call. Every request needs the MCP-Protocol-Version and Mcp-Method "
      + "headers and the same protocol version in params._meta; a tools/call also needs an Mcp-Name header "
      + "equal to the tool's name."),
    h("pre#mcp-curl-command.mcp-code", { tabindex: "0", "aria-label": "curl command" }, command));
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
