// The chat's inference key (an `inference`-scoped API key for /v1), docs/chat.md, "Key".
//
// One playground key per browser profile, made on first use: the first time the page needs /v1
// (to list the models, or to send) and holds no key, it creates one, named after the browser and
// the day ("playground · Chrome · 2026-12-02"), with POST /api/keys (the admin credential: the
// chat's only /api calls are here). Its secret is kept in localStorage under
// `vllm-use.playground-key` (shared by every tab of the profile; session.js's sign-out forgets it),
// its id under `vllm-use.playground-key-id` (not a secret). Tabs opened at once make one key, not
// one each: the creation runs under a lock (navigator.locks where the browser has it, which is on
// https and on localhost; else a lease in localStorage), and each tab looks in the storage again
// once it holds the lock.
//
// A key /v1 refuses (deleted or disabled on the API keys page) is replaced by a new one the next
// time the page needs /v1, which says so once (a toast); the refused key is left as the admin left
// it. A key whose secret was forgotten (sign-out) is deleted when its successor is created, so the
// API keys page lists one playground key per browser profile.
//
// `createKeyPanel({signal, onUse(key)})`: `element` is a small disclosure "Use another key" (a
// region named "Inference key") to paste a key instead, tried on GET /v1/models first; it opens by
// itself when a key cannot be created (an admin credential without admin.write, say).
// `panel.key` is the key now ("" for none); `ensure()` resolves to a key, creating one if needed
// ("" when that failed: the disclosure says why); `refused(key)` forgets a key /v1 refused, so
// that the next `ensure()` replaces it; `failed` is true once a creation failed (the page then
// lets Send say what is missing).

import { api } from "../api.js";
import { errorSlot, field, h, humanError, showError, sleep, toast } from "../ui.js";
import { v1 } from "./stream.js";

const KEY = "vllm-use.playground-key"; // the secret (also the name session.js forgets at sign-out)
const KEY_ID = "vllm-use.playground-key-id"; // the id of the key this browser created
const LOCK = "vllm-use.playground-key";
const LEASE = "vllm-use.playground-key-lease"; // the lock where navigator.locks is missing
const LEASE_MS = 15_000; // a lease older than this is a tab that died holding it
const SETTLE_MS = 100; // a lease written is read back after this, to see which tab won

export function inferenceKey() {
  return localStorage.getItem(KEY) || "";
}

function keep(secret, id = null) {
  localStorage.setItem(KEY, secret);
  sessionStorage.removeItem(KEY); // an earlier version kept it per tab
  if (id) localStorage.setItem(KEY_ID, id);
}

// The browser's name, simply: what userAgentData's brands say, else the user agent string.
export function browserName() {
  const brands = ((navigator.userAgentData && navigator.userAgentData.brands) || []).map((b) => b.brand);
  const named = [["Microsoft Edge", "Edge"], ["Opera", "Opera"], ["Brave", "Brave"], ["Google Chrome", "Chrome"],
    ["Chromium", "Chromium"]];
  for (const [brand, name] of named) if (brands.includes(brand)) return name;
  const ua = navigator.userAgent || "";
  const byAgent = [[/Edg\//, "Edge"], [/OPR\//, "Opera"], [/Firefox\//, "Firefox"], [/Chromium\//, "Chromium"],
    [/Chrome\//, "Chrome"], [/Safari\//, "Safari"]];
  for (const [pattern, name] of byAgent) if (pattern.test(ua)) return name;
  return "browser";
}

function today() {
  const d = new Date();
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
}

export const playgroundName = () => `playground · ${browserName()} · ${today()}`;

// Runs `fn` while no other tab of this profile runs it.
async function exclusively(fn, signal) {
  if (navigator.locks && navigator.locks.request) return navigator.locks.request(LOCK, { signal }, fn);
  // A lease in localStorage: written, read back a moment later (the last writer wins), kept while
  // `fn` runs. Best effort where the browser has no locks (a plain-http address that is not localhost).
  const me = `${Date.now()}-${Math.random().toString(36).slice(2)}`;
  const lease = () => {
    try {
      return JSON.parse(localStorage.getItem(LEASE) || "null");
    } catch (_) {
      return null;
    }
  };
  for (;;) {
    if (signal && signal.aborted) throw new DOMException("aborted", "AbortError");
    const held = lease();
    if (!held || held.at + LEASE_MS < Date.now()) {
      localStorage.setItem(LEASE, JSON.stringify({ id: me, at: Date.now() }));
      await sleep(SETTLE_MS, signal);
      const now = lease();
      if (now && now.id === me) break;
    }
    if (inferenceKey()) return fn(); // another tab made it meanwhile: `fn` finds it
    await sleep(SETTLE_MS * 2, signal);
  }
  try {
    return await fn();
  } finally {
    const held = lease();
    if (held && held.id === me) localStorage.removeItem(LEASE);
  }
}

export function createKeyPanel({ signal, onUse }) {
  let ensuring = null;
  let failed = false;
  let replaced = ""; // a key refused by /v1: the next one made says it replaces it

  const keyInput = h("input", { type: "password", name: "key", autocomplete: "off", spellcheck: "false",
    placeholder: "vu_…" });
  const error = errorSlot();
  const form = h("form.chat-key-form", { novalidate: true },
    field("Inference key", keyInput), h("div.actions", h("button.button", { type: "submit" }, "Use this key")));
  // Named by `title`, not aria-labelledby, so that the label "Inference key" names only the input.
  const region = h("details.chat-key", { role: "region", title: "Inference key" },
    h("summary", "Use another key"),
    h("p.chat-key-about", "The chat calls /v1 like any client, with a key that has the inference scope: "
      + "this browser's playground key (listed on the API keys page, where it can be revoked), "
      + "or one pasted here."),
    form,
    error);

  const create = async () => {
    const previous = localStorage.getItem(KEY_ID);
    const created = await api("POST", "/keys", { name: playgroundName(), scopes: ["inference"] }, { signal });
    // The secret goes to the key's storage (above) and nowhere else.
    keep(created.secret, created.key.id);
    if (previous && previous !== created.key.id) {
      // Its secret was forgotten here (a sign-out): nothing can use it any more.
      api("DELETE", `/keys/${encodeURIComponent(previous)}`).catch(() => {});
    }
    if (replaced) {
      toast(`The chat's key was refused (deleted or disabled?); it now uses a new one, “${created.key.name}”.`, "info");
      replaced = "";
    }
    return created.secret;
  };

  // A key, created under the lock when this profile has none.
  const ensure = () => {
    const now = inferenceKey();
    if (now) return Promise.resolve(now);
    if (ensuring) return ensuring;
    ensuring = (async () => {
      try {
        const key = await exclusively(() => inferenceKey() || create(), signal);
        failed = false;
        showError(error, null);
        return key;
      } catch (err) {
        if (err.name === "AbortError" || err.status === 401) return "";
        failed = true;
        region.open = true;
        showError(error, `A playground key could not be created: ${humanError(err)}. Paste an inference key instead.`);
        return "";
      } finally {
        ensuring = null;
      }
    })();
    return ensuring;
  };

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
    keep(value);
    failed = false;
    region.open = false;
    toast("The chat now uses the key you pasted; it is kept in this browser.", "ok");
    onUse(value);
  });

  return {
    element: region,
    get key() {
      return inferenceKey();
    },
    get failed() {
      return failed;
    },
    ensure,
    refused(key) {
      if (!key || inferenceKey() !== key) return; // already replaced (by another tab, say)
      localStorage.removeItem(KEY);
      // Left as the admin left it (disabled stays listed as disabled): not ours to delete.
      if (localStorage.getItem(KEY_ID)) localStorage.removeItem(KEY_ID);
      replaced = key;
    },
    ask() {
      region.open = true;
      keyInput.focus();
    },
  };
}
