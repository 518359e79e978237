// The chat's inference key (an `inference`-scoped API key for /v1) and the region that asks for one
// (docs/chat.md, Key). The key is kept where the admin credential is kept (static/js/session.js):
// localStorage when the admin chose "remember", else sessionStorage, under
// `vllm-use.playground-key`. It is only ever sent in an Authorization header to /v1.
//
// `createKeyPanel({signal, onUse(key)})`: the region "Inference key", shown while there is no usable
// key: "Create a playground key" (POST /api/keys, name "playground", scope `inference`: the chat's
// only /api call) or paste one ("Use this key", tried on GET /v1/models first). `panel.key` is the
// key now ("" for none), `panel.pending` a key being created (a message sent meanwhile waits for
// it), `drop()` forgets a key /v1 refused and asks again, `ask()` shows the region.

import { api } from "../api.js";
import { errorSlot, field, h, humanError, showError, toast } from "../ui.js";
import { v1 } from "./stream.js";

const KEY = "vllm-use.playground-key";
const CREDENTIAL = "vllm-use.credential";

export function inferenceKey() {
  return sessionStorage.getItem(KEY) || localStorage.getItem(KEY) || "";
}

export function keepInferenceKey(value) {
  forgetInferenceKey();
  const remembered = Boolean(localStorage.getItem(CREDENTIAL));
  (remembered ? localStorage : sessionStorage).setItem(KEY, value);
}

export function forgetInferenceKey() {
  sessionStorage.removeItem(KEY);
  localStorage.removeItem(KEY);
}

export function createKeyPanel({ signal, onUse }) {
  let key = inferenceKey();
  let pending = null;

  const keyInput = h("input", { type: "password", name: "key", autocomplete: "off", spellcheck: "false",
    placeholder: "vu_…" });
  const note = h("p.key-note", { hidden: true });
  const error = errorSlot();
  const createKey = h("button.button.primary", { type: "button" }, "Create a playground key");
  const form = h("form.chat-key-form", { novalidate: true },
    field("Inference key", keyInput), h("div.actions", h("button.button", { type: "submit" }, "Use this key")));
  // Named by `title`, not aria-labelledby, so that the label "Inference key" names only the input.
  const region = h("section.card.key-region", { role: "region", title: "Inference key", hidden: Boolean(key) },
    h("h2", "Inference key"),
    h("p", "The chat calls /v1 like any client, with an API key that has the inference scope. "
      + "Create one for this browser (it is listed as “playground” on the API keys page), or paste one."),
    note,
    h("div.actions", createKey),
    form,
    error);

  const use = (value) => {
    key = value;
    keepInferenceKey(value);
    region.hidden = true;
    note.hidden = true;
    showError(error, null);
    onUse(value);
  };

  const createPlaygroundKey = async () => {
    createKey.disabled = true;
    showError(error, null);
    try {
      // The secret goes to the key's storage (above) and nowhere else.
      const created = await api("POST", "/keys", { name: "playground", scopes: ["inference"] }, { signal });
      use(created.secret);
      toast("Created the key “playground” for this chat; it is kept in this browser.", "ok");
    } catch (err) {
      if (err.name === "AbortError" || err.status === 401) return;
      showError(error, `The key could not be created: ${humanError(err)}`);
    } finally {
      createKey.disabled = false;
    }
  };
  createKey.addEventListener("click", () => {
    pending = createPlaygroundKey().finally(() => { pending = null; });
  });

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const value = keyInput.value.trim();
    showError(error, null);
    if (!value) {
      showError(error, "Paste a key first.");
      keyInput.focus();
      return;
    }
    try {
      await v1("GET", "/models", undefined, { key: value, signal });
    } catch (err) {
      if (err.name === "AbortError") return;
      if (err.status === 401) {
        showError(error, "This key is not accepted by /v1: it needs the inference scope and must be enabled.");
        keyInput.focus();
        return;
      }
      // Anything else (no model running) says nothing against the key.
    }
    keyInput.value = "";
    use(value);
  });

  return {
    element: region,
    get key() {
      return key;
    },
    get pending() {
      return pending;
    },
    drop() {
      if (!key) return;
      key = "";
      forgetInferenceKey();
      note.textContent = "The inference key was refused (deleted or disabled?). Create a new one or paste another.";
      note.hidden = false;
      region.hidden = false;
    },
    ask() {
      region.hidden = false;
      createKey.focus();
    },
  };
}
