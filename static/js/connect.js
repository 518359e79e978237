// Connect a client: what a colleague's program needs to use a model through this server
// (docs/console.md, "Connect a client"). Shown as the Overview's card and inside the API keys page's
// one-time secret dialog.
//
// - The base URL is the one this browser reached: `location.origin + "/v1"` (the Anthropic SDK
//   takes the origin, it adds /v1 itself). Never the internal vLLM address (GET /api/runtime's
//   `upstream`): that one skips keys and audit.
// - The model names are what /v1 routes (docs/router.md): every deployment's name and aliases
//   (GET /api/deployments), and the model the runtime serves alone when it serves one that is no
//   deployment (GET /api/runtime: `options.served_model_name`, else `model`).
// - Snippets (curl, Python `openai`, Python `anthropic`) for the chosen model, each with Copy, that
//   run as written once the key is in: a secret just created is filled in; otherwise "Create a key
//   for this client" creates an `inference` key (POST /api/keys) and fills it in, with the warning
//   that it is shown once. The secret lives only in this panel's DOM: it goes when the panel goes.
import { api } from "./api.js";
import { instanceWord } from "./states.js";
import { clear, copyButton, errorSlot, field, h, reportFailure, showError } from "./ui.js";

const KEY_PLACEHOLDER = "<a key with the inference scope>";
const MODEL_PLACEHOLDER = "<model name>";
const PROMPT = "Say hello in one sentence.";
let panels = 0;

// The names /v1 answers to, each {name, note}: deployments (with their aliases), then the runtime's own.
export async function servedModels(signal) {
  const [listed, runtime] = await Promise.all([
    api("GET", "/deployments", undefined, { signal }),
    api("GET", "/runtime", undefined, { signal }),
  ]);
  return modelNames(listed.deployments, runtime);
}

export function modelNames(deployments, runtime) {
  const names = [];
  for (const d of deployments || []) {
    const word = instanceWord(d.instance && d.instance.state);
    names.push({ name: d.name, note: word === "deployed" ? "loads on first request" : word });
    for (const alias of d.aliases || []) names.push({ name: alias, note: `alias of ${d.name}` });
  }
  if (runtime && runtime.state === "ready" && !runtime.deployment) {
    const own = (runtime.options && runtime.options.served_model_name) || runtime.model;
    if (own && !names.some((n) => n.name === own)) names.push({ name: own, note: "run alone on the runtime" });
  }
  return names;
}

export function baseUrl() {
  return `${location.origin}/v1`;
}

// Single-quoted for a POSIX shell.
const shellQuote = (text) => `'${String(text).replace(/'/g, "'\\''")}'`;
// A JSON string is a valid Python string literal (the same escapes), quotes included.
const py = (text) => JSON.stringify(String(text));

export function snippets(model, secret) {
  const url = baseUrl();
  const key = secret || KEY_PLACEHOLDER;
  const name = model || MODEL_PLACEHOLDER;
  const body = JSON.stringify({ model: name, messages: [{ role: "user", content: PROMPT }] });
  return {
    curl: [
      `curl -s ${shellQuote(`${url}/chat/completions`)} \\`,
      `  -H ${shellQuote(`Authorization: Bearer ${key}`)} \\`,
      "  -H 'Content-Type: application/json' \\",
      `  -d ${shellQuote(body)}`,
    ].join("\n"),
    openai: [
      "from openai import OpenAI",
      "",
      `client = OpenAI(base_url=${py(url)}, api_key=${py(key)})`,
      "answer = client.chat.completions.create(",
      `    model=${py(name)},`,
      `    messages=[{"role": "user", "content": ${py(PROMPT)}}],`,
      ")",
      "print(answer.choices[0].message.content)",
    ].join("\n"),
    anthropic: [
      "from anthropic import Anthropic",
      "",
      `client = Anthropic(base_url=${py(location.origin)}, api_key=${py(key)})`,
      "message = client.messages.create(",
      `    model=${py(name)},`,
      "    max_tokens=256,",
      `    messages=[{"role": "user", "content": ${py(PROMPT)}}],`,
      ")",
      "print(message.content[0].text)",
    ].join("\n"),
  };
}

const SNIPPETS = [
  ["curl", "curl"],
  ["openai", "Python (openai)"],
  ["anthropic", "Python (anthropic)"],
];

// The panel. `secret`: a key's secret just shown (filled in; no create button). `canCreate`: offer
// "Create a key for this client" when no secret is given, then `onCreated(created)`. `preselect`: a
// model name to choose. Returns {element, setModels(names)}; `element` is a <div class="connect-panel">.
export function connectPanel({ page, secret = null, canCreate = true, preselect = null, models = null,
  onCreated = null } = {}) {
  panels += 1;
  const id = (part) => `connect-${panels}-${part}`;
  let known = secret;
  let names = [];

  const select = h("select", { name: "model", id: id("model") });
  const noModel = h("p.hint.connect-no-model", { hidden: true },
    "No model is served yet: ", h("a", { href: "/deployments" }, "create a deployment"),
    ", then its name is the model clients ask for.");
  const blocks = new Map(SNIPPETS.map(([kind]) => [kind,
    h("pre.connect-snippet", { tabindex: "0", dataset: { snippet: kind } })]));
  const render = () => {
    const texts = snippets(select.value || preselect, known);
    for (const [kind, pre] of blocks) pre.textContent = texts[kind];
  };
  select.addEventListener("change", render);

  const keySlot = h("div.connect-key");
  const showKeyPart = () => {
    if (known) {
      clear(keySlot, h("p.connect-key-filled", "The key's secret is filled in below."));
    } else if (canCreate) {
      clear(keySlot, createForm());
    } else {
      clear(keySlot, h("p.hint", "Replace ", h("code", KEY_PLACEHOLDER), " with an API key that has the inference scope."));
    }
  };

  const createForm = () => {
    const today = new Date().toISOString().slice(0, 10);
    const name = h("input", { name: "name", type: "text", autocomplete: "off", spellcheck: "false",
      value: `client ${today}`, maxlength: "128" });
    const button = h("button.button.primary", { type: "submit" }, "Create a key for this client");
    const slot = errorSlot();
    const form = h("form.connect-create", { novalidate: true },
      field("Key name", name, "A key with the inference scope only: it can call /v1, nothing else."),
      h("div.actions", button), slot);
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      showError(slot, null);
      if (!name.value.trim()) {
        reportFailure(form, slot, { fieldErrors: { name: "Give the key a name." } });
        return;
      }
      button.disabled = true;
      try {
        const created = await api("POST", "/keys", { name: name.value.trim(), scopes: ["inference"] },
          { signal: page.signal });
        known = created.secret;
        clear(keySlot, createdNote(created));
        render();
        if (onCreated) onCreated(created);
      } catch (error) {
        button.disabled = false;
        reportFailure(form, slot, error);
      }
    });
    return form;
  };

  const createdNote = (created) => {
    const input = h("input.secret", { type: "text", readonly: true, "aria-label": "Secret", value: created.secret,
      spellcheck: "false", autocomplete: "off" });
    return h("div.connect-created",
      h("p", "Key ", h("strong", created.key.name), " created with the inference scope; its secret is filled in below."),
      h("div.connect-secret-row", input, copyButton(() => input.value)),
      h("p.connect-warning", { role: "status" }, h("strong", "Copy it now: it will not be shown again."),
        " vllm-use keeps only a hash of it. Leaving this page removes it from the page."));
  };

  const setModels = (list) => {
    const wanted = select.value || preselect;
    names = list.slice();
    if (preselect && !names.some((n) => n.name === preselect)) names.push({ name: preselect, note: "not served now" });
    clear(select, names.map((n) => h("option", { value: n.name }, n.note ? `${n.name} (${n.note})` : n.name)));
    if (wanted && names.some((n) => n.name === wanted)) select.value = wanted;
    select.disabled = !names.length;
    noModel.hidden = names.length > 0;
    render();
  };

  const urlCode = h("code.connect-url", baseUrl());
  const element = h("div.connect-panel",
    h("dl.facts.connect-facts",
      h("dt", "Base URL"), h("dd", h("span.connect-url-row", urlCode, copyButton(() => baseUrl()))),
      h("dt", h("label", { for: select.id }, "Model")), h("dd", select, noModel)),
    keySlot,
    SNIPPETS.map(([kind, title]) => h("div.connect-block",
      h("div.connect-block-head", h("h3", title), copyButton(() => blocks.get(kind).textContent)),
      blocks.get(kind))),
    h("p.hint", "Any OpenAI- or Anthropic-compatible client works the same way: this base URL, the key as a "
      + "Bearer token, and a model name from the list."));
  showKeyPart();
  setModels(models || []);
  return { element, setModels };
}
