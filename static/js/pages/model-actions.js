// What the Models and Downloads pages share (docs/console.md, "Models"): the next step after a
// download ("Deploy"), removing a failed model with its partial files ("Remove"), and following the
// downloads' event stream for live progress.
//
//   deployLink(modelId)        a[data-action="deploy"] "Deploy" → /deployments?model=<id>
//   removeModel(name, id)      asks first; DELETE /api/models/{id}?files=true; resolves true when removed
//   followDownloads(signal, onTask, onState)   GET /api/downloads/events, reconnecting after it ends
import { api, events } from "../api.js";
import { confirmDialog, h, sleep } from "../ui.js";

const RECONNECT_MS = 2000;

export function deployLink(modelId, { primary = true } = {}) {
  return h(`a.button.small${primary ? ".primary" : ""}`, {
    href: `/deployments?model=${encodeURIComponent(modelId)}`, "data-action": "deploy",
  }, "Deploy");
}

// Remove a model whose download failed: the record and whatever hf left in its directory. The
// server refuses while it downloads or while a deployment uses it (the error is thrown to the caller).
export async function removeModel(name, modelId) {
  const ok = await confirmDialog(`Remove ${name}?`,
    "Its record and its partly downloaded files are deleted. To try again later, add it again.", "Remove");
  if (!ok) return false;
  await api("DELETE", `/models/${encodeURIComponent(modelId)}`, undefined, { query: { files: true } });
  return true;
}

// Follow the event stream until the page is left; reconnect RECONNECT_MS after it ends or fails.
// `onState(true|false)`: live or not (events() says nothing when it connects: a stream still open
// after a second counts as live).
export async function followDownloads(signal, onTask, onState = () => {}) {
  while (!signal.aborted) {
    const settled = setTimeout(() => onState(true), 1000);
    try {
      await events("/downloads/events", (type, data) => {
        if (type !== "task" || !data || !data.task) return;
        onState(true);
        onTask(data.task);
      }, { signal });
    } catch (error) {
      if (signal.aborted || error.name === "AbortError") return;
      if (error.status === 401) return; // main.js shows the sign-in page
    } finally {
      clearTimeout(settled);
    }
    if (signal.aborted) return;
    onState(false); // failed, or the server closed the stream (it is stopping): try again
    await sleep(RECONNECT_MS, signal);
  }
}
