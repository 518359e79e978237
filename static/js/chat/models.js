// The models the gateway serves (docs/chat.md, Model and Composer): GET /v1/models fills the
// "Model" and "Compare with" selects (chat/controls.js), each deployment with its status
// ("qwen — unloaded"); the status line under them says when no model is running or when a model
// chosen is no longer listed, next to a "Reload models" button.
//
// `createModelStatus({controls, signal, key(), onRefused(), onChange(), onListed()})`: `element`
// is the status line; `load()` lists the models with the key now (it never rejects; asked while a
// listing runs, it lists once more after it, so the answer is never older than the asking);
// `loading` is that listing while it runs (a message sent meanwhile waits for it);
// `check()` updates the status line after a choice; `needsLoad(name)`: whether the last listing said that a request for `name` has to wait for a load.
// `onChange` runs as a listing starts and as it ends (Send depends on it); `onListed` after each
// listing that answered; `onRefused` when /v1 refused the key that is still the page's (401).
//
// When the models are listed (no polling: each listing is a request in the audit log): at the
// start, when the user opens or focuses a picker (controls.js `onOpen`), when a message is sent
// and when its answer ends (pages/chat.js), when the tab becomes visible again, and on "Reload
// models". All of it ends when `signal` aborts (the page is left).

import { errorSlot, h, humanError, showError } from "../ui.js";
import { v1 } from "./stream.js";

export const NO_MODEL = "No model is running — create or load one on the Deployments page.";

// A deployment's `status.value` in /v1/models (docs/router.md) → the words the picker shows.
// Models of the runtime (or --upstream) have no status and show their name alone.
const STATUS_WORDS = { loaded: "loaded", loading: "loading…", sleeping: "sleeping", unloaded: "unloaded",
  failed: "failed" };
// The states in which a request waits for a load first (a failed one is started again by it).
const NEEDS_LOAD = new Set(["loading", "sleeping", "unloaded", "failed"]);

export const statusOf = (entry) => (entry && entry.status && typeof entry.status.value === "string"
  ? entry.status.value : null);

// What an option says: "qwen — unloaded", or "tiny" for a model without a status.
export function labelOf(entry) {
  const status = statusOf(entry);
  return status ? `${entry.id} — ${STATUS_WORDS[status] || status}` : entry.id;
}

export const goneText = (names) => `${names.join(" and ")} ${names.length > 1 ? "are" : "is"} not served any more: `
  + "choose another model.";

export function createModelStatus({ controls, signal, key, onRefused, onChange, onListed = () => {} }) {
  const error = errorSlot();
  const reload = h("button.button.small", { type: "button", hidden: true, onclick: () => load() }, "Reload models");
  let loading = null;
  let again = false;
  let statuses = new Map(); // id → status value, from the last listing that answered
  let listed = null; // how many models the last listing named; null when it failed

  // After a listing, or a choice: what the status line says about the models chosen.
  function check() {
    if (listed === null) return;
    const gone = controls.unavailable();
    showError(error, !listed ? NO_MODEL : gone.length ? goneText(gone) : null);
  }

  async function list(asked) {
    try {
      const listing = await v1("GET", "/models", undefined, { key: asked, signal });
      const models = ((listing && listing.data) || []).filter((m) => m && typeof m.id === "string");
      statuses = new Map(models.map((m) => [m.id, statusOf(m)]));
      listed = models.length;
      controls.setModels(models);
      reload.hidden = models.length > 0;
      check();
      onListed();
    } catch (err) {
      if (err.name === "AbortError") return;
      if (err.status === 401) {
        if (asked === key()) onRefused();
        return;
      }
      reload.hidden = false;
      listed = null;
      if (err.network) {
        // The server is not answering: what was listed last is still the best guess.
        showError(error, `Models could not be listed: ${humanError(err)}`);
        return;
      }
      statuses = new Map();
      controls.setModels([]);
      // The gateway answers 502 while no model is ready to take requests.
      showError(error, err.status === 502 ? NO_MODEL : `Models could not be listed: ${humanError(err)}`);
    }
  }

  function load() {
    if (!key() || signal.aborted) return Promise.resolve();
    if (loading) {
      again = true;
      return loading;
    }
    const run = async () => {
      do {
        again = false;
        await list(key());
      } while (again && key() && !signal.aborted);
    };
    const listing = run().finally(() => {
      loading = null;
      onChange();
    });
    loading = listing;
    onChange();
    return listing;
  }

  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") load();
  }, { signal });

  return {
    element: h("div.model-status", error, reload),
    load,
    check,
    get loading() {
      return loading;
    },
    needsLoad(name) {
      return NEEDS_LOAD.has(statuses.get(name));
    },
  };
}
