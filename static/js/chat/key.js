// The chat's inference key (an `inference`-scoped API key for /v1), docs/chat.md, "Key".
//
// One playground key per browser profile, made on first use: the first time the page needs /v1
// (to list the models, or to send) and holds no key, it creates one, named after the browser and
// the day ("playground · Chrome · 2026-12-02"), with POST /api/keys (the admin credential: the
// chat's only /api calls are here). Its secret is kept in localStorage under
// `vllm-use.playground-key` (shared by every tab of the profile; session.js's sign-out forgets it),
// its id under `vllm-use.playground-key-id` (not a secret). Tabs opened at once make one key, not
// one each: the creation runs under a lock (navigator.locks where the browser has it, which is on
// https and on localhost; else a lease in IndexedDB), each tab looks in the storage again once
// it holds the lock, and the tab that made the key keeps the lock a moment after storing it (the
// storage reaches the other tabs asynchronously).
//
// A key /v1 refuses (deleted or disabled on the API keys page) is replaced by a new one the next
// time the page needs /v1, which says so once (a toast); the refused key is left as the admin left
// it. A key whose secret was forgotten (sign-out) is deleted when its successor is created, so the
// API keys page lists one playground key per browser profile.
//
// `createKeyPanel({signal, onUse(key)})`: `element` is a small disclosure "Use another key" (a
// region named "Inference key") to paste a key instead, tried on GET /v1/models first; it opens by
// itself when a key cannot be created (an admin credential without admin.write, say).
// `panel.key` is the usable key now ("" for none); `ensure()` resolves to a usable key, making one
// if needed ("" when that failed: the disclosure says why); `refused(key)` notes a key /v1 refused,
// which the next `ensure()` replaces; `failed` is true once a creation failed (the page then lets
// Send say what is missing).

import { api } from "../api.js";
import { errorSlot, field, h, humanError, showError, sleep, toast } from "../ui.js";
import { v1 } from "./stream.js";

// The keys this page makes, one of each per browser profile: `secret` and `id` are their
// localStorage names (session.js forgets the secrets at sign-out), `lock` the name of the lock
// their creation runs under. The tool key (chat/tools.js, docs/chat.md "Tools") is made the same way.
export const PLAYGROUND = { secret: "vllm-use.playground-key", id: "vllm-use.playground-key-id",
  lock: "vllm-use.playground-key", scopes: ["inference"], label: "playground" };
export const TOOLS = { secret: "vllm-use.chat-tools-key", id: "vllm-use.chat-tools-key-id",
  lock: "vllm-use.chat-tools-key", scopes: ["tools"], label: "chat tools" };
const LEASES = "vllm-use-chat-key"; // an IndexedDB database: the lock where navigator.locks is missing
const LEASE_MS = 15_000; // a lease older than this is a tab that died holding it
const RETRY_MS = 200; // a tab that found the lease taken looks again after this
// How long the tab that made the key keeps the lock after storing it. localStorage reaches the
// other tabs' processes asynchronously, on another channel than the lock's release: a tab given
// the lock at once could still read no key there, and make a second one (seen in Chromium).
const PUBLISH_MS = 500;

const storedKey = (kind) => localStorage.getItem(kind.secret) || "";

function keep(kind, secret, id = null) {
  localStorage.setItem(kind.secret, secret);
  sessionStorage.removeItem(kind.secret); // an earlier version kept the playground key per tab
  if (id) localStorage.setItem(kind.id, id);
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

const keyName = (kind) => `${kind.label} · ${browserName()} · ${today()}`;
export const playgroundName = () => keyName(PLAYGROUND);

// Runs `fn` while no other tab of this profile runs it (for the key `kind`).
async function exclusively(kind, fn, signal) {
  if (navigator.locks && navigator.locks.request) return navigator.locks.request(kind.lock, { signal }, fn);
  // No navigator.locks (a plain-http address that is not localhost): a lease in IndexedDB, whose
  // read-write transactions on one store never overlap, in any tab of the profile.
  const me = `${Date.now()}-${Math.random().toString(36).slice(2)}`;
  let db;
  try {
    db = await openLeases();
  } catch (_) {
    return fn(); // no IndexedDB either (a private window of some browsers): no lock to take
  }
  try {
    for (;;) {
      if (signal.aborted) throw new DOMException("aborted", "AbortError");
      if (await lease(db, kind.lock, me, true)) break;
      if (storedKey(kind)) return await fn(); // another tab made it meanwhile: `fn` finds it
      await sleep(RETRY_MS, signal);
    }
    try {
      return await fn();
    } finally {
      await lease(db, kind.lock, me, false).catch(() => {});
    }
  } finally {
    db.close();
  }
}

function openLeases() {
  return new Promise((resolve, reject) => {
    const request = indexedDB.open(LEASES, 1);
    request.onupgradeneeded = () => request.result.createObjectStore("lease");
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}

// In one read-write transaction: takes the lease (`take`, when it is free, stale or already `me`'s)
// or gives it back (when it is `me`'s). Resolves to whether `me` holds it afterwards.
function lease(db, name, me, take) {
  return new Promise((resolve, reject) => {
    const tx = db.transaction("lease", "readwrite");
    const leases = tx.objectStore("lease");
    let mine = false;
    const read = leases.get(name);
    read.onsuccess = () => {
      const held = read.result;
      const free = !held || held.at + LEASE_MS < Date.now() || held.id === me;
      if (take && free) {
        leases.put({ id: me, at: Date.now() }, name);
        mine = true;
      } else if (!take && held && held.id === me) {
        leases.delete(name);
      }
    };
    tx.oncomplete = () => resolve(mine);
    tx.onerror = () => reject(tx.error);
    tx.onabort = () => reject(tx.error);
  });
}

// The machinery of one kind of key (PLAYGROUND or TOOLS): `key` is the usable key now ("" for
// none); `ensure()` resolves to a usable key, made under the lock when this profile has none;
// `refused(key)` notes a key its API refused, which the next `ensure()` replaces; `failed` is true
// once a creation failed; `use(secret)` keeps a key pasted by the user. `onFailure(err)` hears why a
// creation failed (an abort or a 401, the console signing out, is not a failure).
export function createKeeper(kind, { signal, onFailure = () => {} }) {
  let ensuring = null;
  let failed = false;
  const refused = new Set(); // keys the API refused to this page
  const usable = () => {
    const now = storedKey(kind);
    return now && !refused.has(now) ? now : "";
  };

  // Runs under the lock, with no usable key in the storage. Its secret goes to the key's storage
  // (above) and nowhere else.
  const create = async () => {
    const stored = storedKey(kind);
    // A key id without its secret: forgotten at sign-out, nothing can use that key any more. (A
    // refused key is left as the admin left it: a disabled one stays listed as disabled.)
    const orphan = stored ? null : localStorage.getItem(kind.id);
    const created = await api("POST", "/keys", { name: keyName(kind), scopes: kind.scopes }, { signal });
    keep(kind, created.secret, created.key.id);
    if (orphan && orphan !== created.key.id) api("DELETE", `/keys/${encodeURIComponent(orphan)}`).catch(() => {});
    if (stored) {
      toast(`The chat's ${kind.label} key was refused (deleted or disabled?); it now uses a new one, `
        + `“${created.key.name}”.`, "info");
    }
    return created.secret;
  };

  const ensure = () => {
    const now = usable();
    if (now) return Promise.resolve(now);
    if (ensuring) return ensuring;
    ensuring = (async () => {
      try {
        const key = await exclusively(kind, async () => {
          const found = usable(); // made by another tab while this one waited for the lock
          if (found) return found;
          const made = await create();
          await sleep(PUBLISH_MS, signal);
          return made;
        }, signal);
        failed = false;
        return key;
      } catch (err) {
        if (err.name === "AbortError" || err.status === 401) return "";
        failed = true;
        onFailure(err);
        return "";
      } finally {
        ensuring = null;
      }
    })();
    return ensuring;
  };

  return {
    get key() {
      return usable();
    },
    get failed() {
      return failed;
    },
    ensure,
    // Only noted here: the storage is looked at (and the key replaced) under the lock, by ensure().
    refused(key) {
      if (key) refused.add(key);
    },
    use(secret) {
      refused.delete(secret);
      keep(kind, secret);
      failed = false;
    },
  };
}

export function createKeyPanel({ signal, onUse }) {
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

  const keeper = createKeeper(PLAYGROUND, {
    signal,
    onFailure: (err) => {
      region.open = true;
      showError(error, `A playground key could not be created: ${humanError(err)}. Paste an inference key instead.`);
    },
  });
  const ensure = async () => {
    const key = await keeper.ensure();
    if (key) showError(error, null);
    return key;
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
    keeper.use(value);
    region.open = false;
    toast("The chat now uses the key you pasted; it is kept in this browser.", "ok");
    onUse(value);
  });

  return {
    element: region,
    get key() {
      return keeper.key;
    },
    get failed() {
      return keeper.failed;
    },
    ensure,
    refused: (key) => keeper.refused(key),
    ask() {
      region.open = true;
      keyInput.focus();
    },
  };
}
