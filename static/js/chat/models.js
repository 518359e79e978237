// The models the gateway serves (docs/chat.md, Model and Composer): GET /v1/models fills the
// "Model" and "Compare with" selects (chat/controls.js), each deployment with its state in the
// console's words (static/js/states.js `listedWord`: "qwen — deployed", "qwen — serving"). When
// nothing serves the model chosen (the listing no longer names it, or names nothing at all, or the
// gateway answers 502 because nothing runs) one banner says so, with a link to the Deployments
// page, next to a "Reload models" button; Send stays disabled meanwhile (pages/chat.js). A
// deployment that is only unloaded is served: a request loads it.
//
// `createModelStatus({controls, signal, ensureKey(), onRefused(key), onChange(), onListed()})`:
// `element` is the status line; `load()` lists the models with the page's key (made on first use
// by `ensureKey()`, chat/key.js; it never rejects; asked while a listing runs, it lists once more
// after it, so the answer is never older than the asking); `loading` is that listing while it
// runs; `check()` updates the banner after a choice; `needsLoad(name)`: whether the last listing
// said that a request for `name` has to wait for a load; `unserved`: whether the banner is up.
// `onChange` runs as a listing starts and as it ends (Send depends on it); `onListed` after each
// listing that answered; `onRefused(key)` when /v1 refused the key (401): the listing then asks
// once more, with a new key.
//
// When the models are listed (no polling: each listing is a request in the audit log): at the
// start, when the user opens or focuses a picker (controls.js `onOpen`), before a message is sent
// and when its answer ends (pages/chat.js), when the tab becomes visible again, and on "Reload
// models". All of it ends when `signal` aborts (the page is left).

import { errorSlot, h, humanError, showError } from "../ui.js";
import { listedWord } from "../states.js";
import { v1 } from "./stream.js";

// The banner's words (its link, "Deployments page", is an <a href="/deployments">); NO_MODEL is
// also what the composer says when nothing can be sent.
export const NO_MODEL = "No model is running — create or load one on the Deployments page.";
const DEPLOYMENTS = "Deployments page";

// The states in which a request waits for a load first (a failed one is started again by it).
const NEEDS_LOAD = new Set(["loading", "sleeping", "unloaded", "failed"]);

export const statusOf = (entry) => (entry && entry.status && typeof entry.status.value === "string"
  ? entry.status.value : null);

// What an option says: "qwen — deployed", or "tiny" for a model without a status (the runtime's,
// or --upstream's).
export function labelOf(entry) {
  const status = statusOf(entry);
  return status ? `${entry.id} — ${listedWord(status)}` : entry.id;
}

export const goneText = (names) => `${names.join(" and ")} ${names.length > 1 ? "are" : "is"} not served any more: `
  + `choose another model, or load one on the ${DEPLOYMENTS}.`;

// `text` with its "Deployments page" as a link.
function withLink(text) {
  const at = text.lastIndexOf(DEPLOYMENTS);
  if (at < 0) return [text];
  return [text.slice(0, at), h("a", { href: "/deployments" }, DEPLOYMENTS), text.slice(at + DEPLOYMENTS.length)];
}

export function createModelStatus({ controls, signal, ensureKey, onRefused, onChange, onListed = () => {} }) {
  const error = errorSlot();
  const banner = h("p.chat-banner", { role: "alert", hidden: true });
  const reload = h("button.button.small", { type: "button", hidden: true, onclick: () => load() }, "Reload models");
  let loading = null;
  let again = false;
  let statuses = new Map(); // id → status value, from the last listing that answered
  let listed = null; // how many models the last listing named; null when it failed

  const showBanner = (text) => {
    banner.hidden = !text;
    banner.replaceChildren(...(text ? withLink(text) : []));
  };

  // After a listing, or a choice: whether the models chosen are served; one banner when not.
  function check() {
    if (listed === null) return;
    const gone = controls.unavailable();
    showBanner(!listed ? NO_MODEL : gone.length ? goneText(gone) : null);
  }

  // Lists with `asked`; returns true when /v1 refused it.
  async function list(asked) {
    try {
      const listing = await v1("GET", "/models", undefined, { key: asked, signal });
      const models = ((listing && listing.data) || []).filter((m) => m && typeof m.id === "string");
      statuses = new Map(models.map((m) => [m.id, statusOf(m)]));
      listed = models.length;
      showError(error, null);
      controls.setModels(models);
      reload.hidden = models.length > 0;
      check();
      onListed();
    } catch (err) {
      if (err.name === "AbortError") return false;
      if (err.status === 401) {
        onRefused(asked);
        return true;
      }
      reload.hidden = false;
      if (err.network) {
        // The server is not answering: what was listed last is still the best guess.
        listed = null;
        showBanner(null);
        showError(error, `Models could not be listed: ${humanError(err)}`);
        return false;
      }
      statuses = new Map();
      controls.setModels([]);
      if (err.status === 502) {
        // The gateway answers 502 while nothing runs: the banner says so, not the upstream's words.
        listed = 0;
        showError(error, null);
        check();
      } else {
        listed = null;
        showBanner(null);
        showError(error, `Models could not be listed: ${humanError(err)}`);
      }
    }
    return false;
  }

  function load() {
    if (signal.aborted) return Promise.resolve();
    if (loading) {
      again = true;
      return loading;
    }
    const run = async () => {
      let replaced = false; // a refused key is replaced once per listing, not in a loop
      do {
        again = false;
        const key = await ensureKey();
        if (!key || signal.aborted) return;
        if ((await list(key)) && !replaced) {
          replaced = true;
          again = true;
        }
      } while (again && !signal.aborted);
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
    element: h("div.model-status", banner, error, reload),
    load,
    check,
    get loading() {
      return loading;
    },
    // Whether the banner says that nothing serves the model chosen.
    get unserved() {
      return !banner.hidden;
    },
    needsLoad(name) {
      return NEEDS_LOAD.has(statuses.get(name));
    },
  };
}
