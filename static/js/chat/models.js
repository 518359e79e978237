// The models the gateway serves (docs/chat.md, Model and Composer): GET /v1/models fills the
// "Model" and "Compare with" selects (chat/controls.js); the status line under them says when no
// model is running, next to a "Reload models" button.
//
// `createModelStatus({controls, signal, key(), onRefused(), onChange()})`: `element` is the status
// line; `load()` lists the models with the key now (it never rejects); `loading` is that listing
// while it runs (a message sent meanwhile waits for it). `onChange` runs as a listing starts and
// as it ends (Send depends on it); `onRefused` when /v1 refused the key that is still the page's
// (401). After a failed listing, the models are listed again when the tab becomes visible, until
// `signal` aborts (the page is left).

import { errorSlot, h, humanError, showError } from "../ui.js";
import { v1 } from "./stream.js";

export const NO_MODEL = "No model is running — start one on the Runtime page.";

export function createModelStatus({ controls, signal, key, onRefused, onChange }) {
  const error = errorSlot();
  const reload = h("button.button.small", { type: "button", hidden: true, onclick: () => load() }, "Reload models");
  let loading = null;

  async function list(asked) {
    showError(error, null);
    reload.hidden = true;
    try {
      const listing = await v1("GET", "/models", undefined, { key: asked, signal });
      const models = ((listing && listing.data) || []).filter((m) => m && typeof m.id === "string");
      controls.setModels(models);
      if (!models.length) {
        showError(error, NO_MODEL);
        reload.hidden = false;
      }
    } catch (err) {
      if (err.name === "AbortError") return;
      if (err.status === 401) {
        if (asked === key()) onRefused();
        return;
      }
      controls.setModels([]);
      // The gateway answers 502 while no model is ready to take requests.
      showError(error, err.status === 502 ? NO_MODEL : `Models could not be listed: ${humanError(err)}`);
      reload.hidden = false;
    }
  }

  function load() {
    const asked = key();
    if (!asked) return Promise.resolve();
    const listing = list(asked).finally(() => {
      if (loading === listing) loading = null;
      onChange();
    });
    loading = listing;
    onChange();
    return listing;
  }

  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible" && key() && !reload.hidden) load();
  }, { signal });

  return {
    element: h("div.model-status", error, reload),
    load,
    get loading() {
      return loading;
    },
  };
}
