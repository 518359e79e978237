// One vocabulary for where a model stands, on every page (docs/console.md, "State words"):
//
//   not downloaded · downloading · downloaded        a model's files (models.list → status)
//   deployed · loading · serving · sleeping · stopping · failed    a deployment's instance (docs/router.md)
//
// The server's own words stay in the API (a model `ready` = its files are here; an instance `ready`
// = it answers); the console never shows them raw, so "ready" never means two things. The runtime's
// states (docs/runtime.md) map like an instance's: `stopped` → "stopped" (nothing runs).
//
// `modelWord(status)`, `instanceWord(state)`, `runtimeWord(state)` → the word; `stateBadge(word)`
// → a badge coloured by the word (console.css `.state-…`).
import { h } from "./ui.js";

const MODEL = { registered: "not downloaded", downloading: "downloading", ready: "downloaded", error: "failed",
  failed: "failed", canceled: "canceled" };
const INSTANCE = { unloaded: "deployed", starting: "loading", waking: "loading", ready: "serving",
  sleeping: "sleeping", stopping: "stopping", failed: "failed" };
const RUNTIME = { stopped: "stopped", starting: "loading", ready: "serving", stopping: "stopping", failed: "failed" };
// /v1/models `status.value` of a deployment (docs/router.md) → the same words.
const LISTED = { loaded: "serving", loading: "loading", sleeping: "sleeping", unloaded: "deployed", failed: "failed" };

const word = (table, value) => table[value] || String(value || "unknown");

export const modelWord = (status) => word(MODEL, status);
export const instanceWord = (state) => word(INSTANCE, state);
export const runtimeWord = (state) => word(RUNTIME, state);
export const listedWord = (value) => word(LISTED, value);

// Words that mean "something answers /v1 for it now".
export const SERVING = "serving";

export function stateBadge(text) {
  return h(`span.badge.state-${String(text).replace(/[^a-z]+/gi, "-")}`, String(text));
}
